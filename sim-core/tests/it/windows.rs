//! Link conditions over time under `flow` and `packet-steps` (`Topology::add_window`,
//! `Topology::set_latency_jitter`): a flow on a link that goes down stalls for exactly the
//! window, a degraded window and a periodic flap stretch a flow by their closed forms, max-min
//! sharing follows the capacity as it changes (bytes sent = delivered, no link over its
//! capacity), a ring allreduce stalls for a flap in both flow models, and latency jitter adds
//! its mean per link crossed.

use sim_core::exec::run;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, RankId, StreamId};
use sim_core::units::{Bytes, SimDuration};
use topology::{HostId, JitterShape, LatencyJitter, LinkId, LinkWindow, Topology};

use crate::{lone_collective, single_switch};

/// Both directions of host `host`'s cable to the switch.
fn nic_cable(topology: &Topology, host: u32) -> Vec<LinkId> {
    let up = topology.route(HostId(host), HostId((host + 1) % topology.host_count() as u32)).unwrap()[0];
    vec![up, topology.reverse_of(up).unwrap()]
}

fn window(
    links: Vec<LinkId>,
    factor: f64,
    start_us: u64,
    length_us: u64,
    every_us: Option<u64>,
) -> LinkWindow {
    LinkWindow {
        links,
        factor,
        start: SimDuration::from_us(start_us),
        length: SimDuration::from_us(length_us),
        every: every_us.map(SimDuration::from_us),
    }
}

/// One transfer of `bytes` from rank 0 to rank 1.
fn one_transfer(ranks: u32, bytes: u64) -> ExecGraph {
    let mut graph = GraphBuilder::new(ranks);
    graph.transfer(RankId(0), StreamId(0), RankId(1), Bytes(bytes), "send", &[]);
    graph.build().unwrap()
}

/// The makespan in seconds under `flow` (audited: no link over capacity, every byte sent is
/// delivered) and under `packet-steps`-style plain flows.
fn makespans(graph: &ExecGraph, topology: &Topology) -> (f64, f64) {
    let mut audited = FlowNetwork::new(topology).audited();
    let flow = run(graph, &mut audited).unwrap().makespan().as_secs_f64();
    let audit = audited.audit().unwrap();
    assert_eq!(audit.violation, None);
    assert!(
        (audit.bytes_sent - audit.bytes_delivered).abs() <= 1e-6 * audit.bytes_sent.max(1.0),
        "{audit:?}"
    );
    let steady = run(graph, &mut FlowNetwork::new(topology).steady_state()).unwrap().makespan().as_secs_f64();
    (flow, steady)
}

fn close(simulated: f64, expected: f64) {
    // Completions are rounded up to the picosecond at every rate change.
    assert!((simulated - expected).abs() < 1e-11, "simulated {simulated} s, expected {expected} s");
}

// 100 Gb/s = 12.5 GB/s and 1 us per link; 125 MB from host 0 to host 1 crosses two links:
// 2 us of latency, then 10 ms at 12.5 GB/s.
const BYTES: u64 = 125_000_000;
const LATENCY: f64 = 2e-6;
const ALONE: f64 = 10e-3;

#[test]
fn a_flow_on_a_link_that_goes_down_stalls_for_exactly_the_window() {
    let mut topology = single_switch(2, "100 Gb/s", "1 us");
    let cable = nic_cable(&topology, 0);
    topology.add_window(window(cable, 0.0, 2_000, 3_000, None)).unwrap();
    let (flow, steady) = makespans(&one_transfer(2, BYTES), &topology);
    close(flow, LATENCY + ALONE + 3e-3);
    close(steady, LATENCY + ALONE + 3e-3);
}

#[test]
fn a_degraded_window_delivers_at_its_factor_while_open() {
    // Half rate for 4 ms: 2 ms of data is late by 2 ms.
    let mut topology = single_switch(2, "100 Gb/s", "1 us");
    let cable = nic_cable(&topology, 1);
    topology.add_window(window(cable, 0.5, 2_000, 4_000, None)).unwrap();
    let (flow, _) = makespans(&one_transfer(2, BYTES), &topology);
    close(flow, LATENCY + ALONE + 2e-3);
}

#[test]
fn a_periodic_flap_stretches_a_flow_by_the_time_it_spends_down() {
    // Down 1 ms every 4 ms from 1 ms: the flow moves data only while the link is up. Step
    // through the up intervals until 10 ms of data has moved.
    let (start, length, every) = (1e-3, 1e-3, 4e-3);
    let mut topology = single_switch(2, "100 Gb/s", "1 us");
    let cable = nic_cable(&topology, 0);
    topology.add_window(window(cable, 0.0, 1_000, 1_000, Some(4_000))).unwrap();
    let (mut time, mut left, mut k) = (LATENCY, ALONE, 0.0);
    loop {
        let down = start + k * every;
        if time < down {
            let up = down - time;
            if up >= left {
                time += left;
                break;
            }
            left -= up;
        }
        time = time.max(down + length);
        k += 1.0;
    }
    let (flow, steady) = makespans(&one_transfer(2, BYTES), &topology);
    assert!((time - 14.002e-3).abs() < 1e-12, "closed form {time}");
    close(flow, time);
    close(steady, time);
}

#[test]
fn max_min_sharing_follows_a_capacity_that_changes() {
    // Hosts 0 and 1 both send 125 MB to host 2 and share its down-link. For the first 8 ms
    // host 0's cable runs at a quarter: max-min gives flow A a quarter of the down-link and
    // flow B the rest; then they share it half and half until B is done, and A finishes alone.
    let mut topology = single_switch(3, "100 Gb/s", "1 us");
    let cable = nic_cable(&topology, 0);
    topology.add_window(window(cable, 0.25, 0, 8_000, None)).unwrap();
    let mut graph = GraphBuilder::new(3);
    let a = graph.transfer(RankId(0), StreamId(0), RankId(2), Bytes(BYTES), "a", &[]);
    let b = graph.transfer(RankId(1), StreamId(0), RankId(2), Bytes(BYTES), "b", &[]);
    let graph = graph.build().unwrap();
    let mut network = FlowNetwork::new(&topology).audited();
    let timeline = run(&graph, &mut network).unwrap();
    assert_eq!(network.audit().unwrap().violation, None);
    let d1 = 8e-3 - LATENCY;
    let b_done = 8e-3 + 2.0 * (ALONE - 0.75 * d1);
    let a_done = b_done + 0.5 * d1;
    close(timeline.end[b.0 as usize].since_start().as_secs_f64(), b_done);
    close(timeline.end[a.0 as usize].since_start().as_secs_f64(), a_done);
}

#[test]
fn a_ring_allreduce_stalls_for_a_flap_under_both_flow_models() {
    let topology = single_switch(8, "100 Gb/s", "1 us");
    let graph = lone_collective(8, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(256 << 20));
    let healthy = makespans(&graph, &topology);
    let mut flapping = topology.clone();
    flapping.add_window(window(nic_cable(&topology, 3), 0.0, 10_000, 5_000, None)).unwrap();
    let flapped = makespans(&graph, &flapping);
    println!("healthy {healthy:?} s, one 5 ms flap {flapped:?} s");
    for (before, after) in [(healthy.0, flapped.0), (healthy.1, flapped.1)] {
        assert!(before > 20e-3, "the flap falls inside the allreduce: {before}");
        assert!(((after - before) - 5e-3).abs() < 0.01 * before, "{before} -> {after}");
    }
}

#[test]
fn periodic_windows_do_not_outlive_the_run() {
    // A flap every 10 us forever: the run still ends when its last op does.
    let mut topology = single_switch(2, "100 Gb/s", "1 us");
    topology.add_window(window(nic_cable(&topology, 0), 0.5, 0, 1, Some(10))).unwrap();
    let timeline = run(&one_transfer(2, 1_000), &mut FlowNetwork::new(&topology)).unwrap();
    assert!(timeline.makespan() < SimDuration::from_us(10));
}

/// A chain of `count` one-byte transfers from rank 0 to rank 1, each after the last.
fn chain(count: usize) -> ExecGraph {
    let mut graph = GraphBuilder::new(2);
    let mut last = None;
    for _ in 0..count {
        let deps: Vec<_> = last.into_iter().collect();
        last = Some(graph.transfer(RankId(0), StreamId(0), RankId(1), Bytes(1), "ping", &deps));
    }
    graph.build().unwrap()
}

fn jitter(topology: &Topology, mean_ns: u64, cv: f64, seed: u64) -> LatencyJitter {
    LatencyJitter {
        mean: SimDuration::from_ns(mean_ns),
        cv,
        shape: JitterShape::Lognormal,
        on: vec![true; topology.link_count()],
        seed,
    }
}

#[test]
fn latency_jitter_adds_its_mean_per_link_crossed() {
    let count = 2_000;
    let base = single_switch(2, "100 Gb/s", "1 us");
    let plain = run(&chain(count), &mut FlowNetwork::new(&base)).unwrap().makespan().as_secs_f64();
    // No spread: every crossing adds exactly the mean (two links per transfer).
    let mut exact = base.clone();
    exact.set_latency_jitter(jitter(&base, 500, 0.0, 1)).unwrap();
    let with = run(&chain(count), &mut FlowNetwork::new(&exact)).unwrap().makespan().as_secs_f64();
    close(with - plain, count as f64 * 2.0 * 500e-9);
    // Lognormal draws of cv 1: the sum of 4,000 draws is within 4 standard deviations of its
    // mean, and the same seed gives the same run while another seed does not.
    let noisy = |seed| {
        let mut topology = base.clone();
        topology.set_latency_jitter(jitter(&base, 500, 1.0, seed)).unwrap();
        run(&chain(count), &mut FlowNetwork::new(&topology)).unwrap().makespan().as_secs_f64()
    };
    let (first, again, other) = (noisy(7), noisy(7), noisy(8));
    let draws = 2.0 * count as f64;
    let (mean, sd) = (draws * 500e-9, 500e-9 * draws.sqrt());
    assert!(((first - plain) - mean).abs() < 4.0 * sd, "extra {} s, expected {mean} +- {sd}", first - plain);
    assert_eq!(first, again);
    assert_ne!(first, other);
}

#[test]
fn latency_jitter_only_on_the_links_it_marks() {
    let base = single_switch(2, "100 Gb/s", "1 us");
    let plain = run(&chain(100), &mut FlowNetwork::new(&base)).unwrap().makespan().as_secs_f64();
    let mut topology = base.clone();
    let mut only_up = jitter(&base, 500, 0.0, 1);
    only_up.on = vec![false; base.link_count()];
    only_up.on[nic_cable(&base, 0)[0].0 as usize] = true;
    topology.set_latency_jitter(only_up).unwrap();
    let with = run(&chain(100), &mut FlowNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
    close(with - plain, 100.0 * 500e-9);
}

#[test]
fn latency_jitter_adds_its_mean_to_every_step_of_a_ring_allreduce_in_both_flow_models() {
    // Every link marked, no spread: each of the 2 (p - 1) steps waits for messages that cross
    // two links, so the allreduce takes 2 (p - 1) x 2 x mean longer, message by message and in
    // its steady-state form alike.
    let (p, mean_ns) = (8u32, 3_000u64);
    let base = single_switch(p, "100 Gb/s", "1 us");
    let graph = lone_collective(p, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(64 << 20));
    let mut noisy = base.clone();
    noisy.set_latency_jitter(jitter(&base, mean_ns, 0.0, 1)).unwrap();
    let extra = 2.0 * f64::from(p - 1) * 2.0 * mean_ns as f64 * 1e-9;
    let (plain, plain_steady) = makespans(&graph, &base);
    let (with, with_steady) = makespans(&graph, &noisy);
    println!("message by message {plain} -> {with} s, steady state {plain_steady} -> {with_steady} s");
    close(with - plain, extra);
    close(with_steady - plain_steady, extra);
}
