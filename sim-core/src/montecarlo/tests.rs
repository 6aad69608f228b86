use super::*;
use crate::exec::run;
use crate::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, RankId, StreamId,
};
use crate::network::AnalyticalNetwork;
use crate::units::{Bytes, SimDuration};
use crate::variability::{Distribution, HostInterrupt, Noise, SlowRanks};
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};

fn topology(ranks: u32) -> Topology {
    let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let cluster = ClusterSpec {
        nodes: ranks,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::single_switch(link),
        host_memory: None,
    };
    Topology::build(&cluster).unwrap()
}

/// Synchronous data parallelism in miniature: per rank, forward and backward compute on stream
/// 0, a gradient allreduce on stream 1 after the backward, a small ring of transfers, then an
/// optimizer step after the allreduce.
fn data_parallel(ranks: u32, compute: SimDuration) -> (ExecGraph, Vec<Vec<OpId>>) {
    let mut graph = GraphBuilder::new(ranks);
    let everyone = graph.add_group((0..ranks).map(RankId).collect());
    let allreduce = graph.add_collective(Collective {
        kind: CollectiveKind::AllReduce,
        group: everyone,
        bytes: Bytes(16 << 20),
        algorithm: CollectiveAlgorithm::Ring,
    });
    let mut ends = Vec::new();
    for rank in (0..ranks).map(RankId) {
        let forward = graph.compute(rank, StreamId(0), compute, "forward", &[]);
        let backward = graph.compute(rank, StreamId(0), compute, "backward", &[forward]);
        let send = graph.transfer(
            rank,
            StreamId(2),
            RankId((rank.0 + 1) % ranks),
            Bytes(1 << 20),
            "halo",
            &[forward],
        );
        let sync = graph.collective(rank, StreamId(1), allreduce, "allreduce", &[backward, send]);
        ends.push(graph.compute(rank, StreamId(0), SimDuration::from_us(50), "step", &[sync]));
    }
    (graph.build().unwrap(), vec![ends])
}

/// N ranks each computing `compute`, then a barrier-like allreduce of 8 bytes.
fn barrier(ranks: u32, compute: SimDuration) -> (ExecGraph, Vec<Vec<OpId>>) {
    let mut graph = GraphBuilder::new(ranks);
    let everyone = graph.add_group((0..ranks).map(RankId).collect());
    let allreduce = graph.add_collective(Collective {
        kind: CollectiveKind::AllReduce,
        group: everyone,
        bytes: Bytes(8),
        algorithm: CollectiveAlgorithm::Ring,
    });
    let mut ends = Vec::new();
    for rank in (0..ranks).map(RankId) {
        let work = graph.compute(rank, StreamId(0), compute, "work", &[]);
        ends.push(graph.collective(rank, StreamId(0), allreduce, "allreduce", &[work]));
    }
    (graph.build().unwrap(), vec![ends])
}

fn retimer(graph: &ExecGraph, ends: &[Vec<OpId>]) -> (Retimer, Timeline) {
    let topology = topology(graph.ranks());
    let timeline = run(graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
    (Retimer::new(graph, &timeline, ends).unwrap(), timeline)
}

fn lognormal(cv: f64) -> Variability {
    Variability { op_noise: Some(Noise::new(Distribution::LogNormal, cv).unwrap()), ..Variability::default() }
}

#[test]
fn without_variability_every_iteration_is_the_engines_run() {
    let (graph, ends) = data_parallel(8, SimDuration::from_us(700));
    let (retimer, timeline) = retimer(&graph, &ends);
    let result = retimer.run(&Variability::default(), 1, 20);
    assert_eq!(result.iteration_times.len(), 20);
    assert!(result.iteration_times.iter().all(|t| *t == timeline.makespan()), "{:?}", result.iteration_times);
    // Zero-cv noise is no noise at all.
    let zero = retimer.run(&lognormal(0.0), 1, 20);
    assert_eq!(zero.iteration_times, result.iteration_times);
}

#[test]
fn a_2x_straggler_sets_every_step() {
    let compute = SimDuration::from_us(500);
    let (graph, ends) = data_parallel(8, compute);
    let (retimer, timeline) = retimer(&graph, &ends);
    let allreduce = timeline.end[graph.members(crate::graph::CollectiveId(0))[0].0 as usize]
        .saturating_since(timeline.collective_begin[0]);
    let slow = Variability {
        slow_ranks: Some(SlowRanks::Named { ranks: vec![5], factor: 2.0 }),
        ..Variability::default()
    };
    let result = retimer.run(&slow, 3, 10);
    // The straggler's forward and backward (2 x 2 x 500 us), the allreduce, then its own
    // optimizer step (2 x 50 us: it is the last rank to finish).
    let step = SimDuration::from_us(2 * 2 * 500 + 2 * 50).checked_add(allreduce).unwrap();
    assert!(result.iteration_times.iter().all(|t| *t == step), "{:?} vs {step}", result.iteration_times);
    assert_eq!(result.critical_path_counts[5], 10);
    assert!(result.critical_path_counts.iter().enumerate().all(|(rank, count)| rank == 5 || *count == 0));
}

/// The standard normal CDF, through erfc (Numerical Recipes' Chebyshev fit, relative error
/// below 1.2e-7).
fn phi(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let erfc = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 { 1.0 - erfc / 2.0 } else { erfc / 2.0 }
}

/// E[max of n iid lognormal(mu, sigma)] = integral over x > 0 of 1 - F(x)^n, with x = e^y and
/// Simpson's rule over mu +- 12 sigma (below that the integrand is e^y, integrated exactly).
fn expected_max_lognormal(n: u32, mu: f64, sigma: f64) -> f64 {
    let (low, high) = (mu - 12.0 * sigma, mu + 12.0 * sigma);
    let steps = 20_000;
    let h = (high - low) / steps as f64;
    let f = |y: f64| (1.0 - phi((y - mu) / sigma).powi(n as i32)) * y.exp();
    let mut sum = f(low) + f(high);
    for i in 1..steps {
        sum += f(low + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    low.exp() + sum * h / 3.0
}

#[test]
fn the_slowest_of_n_lognormal_ranks_matches_its_expectation() {
    let (ranks, cv, iterations) = (16u32, 0.2, 4000u32);
    let compute = SimDuration::from_ms(10);
    let (graph, ends) = barrier(ranks, compute);
    let (retimer, timeline) = retimer(&graph, &ends);
    let allreduce = timeline.makespan().as_ps() - compute.as_ps();
    let result = retimer.run(&lognormal(cv), 11, iterations);
    // Each iteration: the slowest rank's compute, then the allreduce.
    let maxima: Vec<f64> = result
        .iteration_times
        .iter()
        .map(|t| (t.as_ps() - allreduce) as f64 / compute.as_ps() as f64)
        .collect();
    let n = f64::from(iterations);
    let mean = maxima.iter().sum::<f64>() / n;
    let stdev = (maxima.iter().map(|m| (m - mean) * (m - mean)).sum::<f64>() / (n - 1.0)).sqrt();
    let sigma2 = (1.0f64 + cv * cv).ln();
    let expected = expected_max_lognormal(ranks, -sigma2 / 2.0, sigma2.sqrt());
    // Sanity of the integral: n = 1 gives the mean, 1.
    assert!((expected_max_lognormal(1, -sigma2 / 2.0, sigma2.sqrt()) - 1.0).abs() < 1e-6);
    assert!(expected > 1.25 && expected < 1.45, "{expected}");
    let standard_error = stdev / n.sqrt();
    assert!(
        (mean - expected).abs() < 4.0 * standard_error,
        "mean {mean} vs expected {expected} (standard error {standard_error})"
    );
}

#[test]
fn same_seed_same_times_whatever_the_thread_count_and_other_seeds_differ() {
    let (graph, ends) = data_parallel(32, SimDuration::from_us(300));
    let (retimer, _) = retimer(&graph, &ends);
    let variability = Variability {
        op_noise: Some(Noise::new(Distribution::Gamma, 0.1).unwrap()),
        gpu_speed: Some(Noise::new(Distribution::Normal, 0.05).unwrap()),
        slow_ranks: Some(SlowRanks::Fraction { fraction: 0.1, factor: 1.3 }),
        host_interrupt: Some(HostInterrupt {
            every: SimDuration::from_us(400),
            duration: SimDuration::from_us(20),
            jitter: SimDuration::from_us(100),
        }),
    };
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| retimer.run(&variability, 42, 50))
    };
    let one = on(1);
    assert_eq!(one, on(2));
    assert_eq!(one, on(4));
    let other = retimer.run(&variability, 43, 50);
    assert_ne!(one.iteration_times, other.iteration_times);
    // Fresh draws each iteration.
    assert!(one.iteration_times.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn an_interruption_lengthens_the_op_it_hits_including_its_own_extension() {
    let setting = HostInterrupt {
        every: SimDuration::from_us(100),
        duration: SimDuration::from_us(10),
        jitter: SimDuration::ZERO,
    };
    let interrupts = Interrupts { setting: Some(setting), phases: vec![0], seed: 0 };
    let us = |n: u64| SimDuration::from_us(n).as_ps();
    // From 0, 1 ms of work: m interruptions at 0, 100, ... below 1000 + 10 m us: m = 12.
    assert_eq!(interrupts.lengthen(0, 0, us(1000)), us(1120));
    // An op between two interruptions is not touched.
    assert_eq!(interrupts.lengthen(0, us(1), us(50)), us(50));
    // Phase 30 us: an op from 20 to 40 us is hit once.
    let shifted = Interrupts { setting: Some(setting), phases: vec![us(30)], seed: 0 };
    assert_eq!(shifted.lengthen(0, us(20), us(20)), us(30));
}
