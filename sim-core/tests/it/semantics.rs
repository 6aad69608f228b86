//! Stream and dependency semantics on random graphs: an op starts exactly when its last
//! dependency and its stream predecessor are done, never earlier; ops on one stream never
//! overlap; a collective begins when its last member arrives and ends for all together.

use proptest::prelude::*;
use sim_core::exec::{EndLimit, ExecError, LimitHandle, Timeline, run, run_watching, run_within};
use sim_core::flow::FlowNetwork;
use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, OpId, OpKind, RankId, StreamId,
};
use sim_core::network::AnalyticalNetwork;
use sim_core::units::{Bytes, SimDuration, SimTime};

use crate::single_switch;

#[derive(Debug, Clone)]
enum Step {
    Compute {
        rank: u32,
        stream: u16,
        micros: u64,
        deps: Vec<prop::sample::Index>,
    },
    Transfer {
        rank: u32,
        stream: u16,
        to: u32,
        kilobytes: u64,
        deps: Vec<prop::sample::Index>,
    },
    /// One member op per rank, added in rank order, on `stream`.
    AllReduce {
        stream: u16,
        kilobytes: u64,
        deps: Vec<prop::sample::Index>,
    },
}

fn step(ranks: u32) -> impl Strategy<Value = Step> {
    let deps = || prop::collection::vec(any::<prop::sample::Index>(), 0..3);
    prop_oneof![
        4 => (0..ranks, 0u16..3, 0u64..50, deps()).prop_map(|(rank, stream, micros, deps)| Step::Compute { rank, stream, micros, deps }),
        2 => (0..ranks, 0u16..3, 1..ranks.max(2), 1u64..500, deps()).prop_map(move |(rank, stream, offset, kilobytes, deps)| {
            Step::Transfer { rank, stream, to: (rank + offset) % ranks.max(2), kilobytes, deps }
        }),
        1 => (0u16..3, 1u64..500, deps()).prop_map(|(stream, kilobytes, deps)| Step::AllReduce { stream, kilobytes, deps }),
    ]
}

/// Builds the graph; dependencies only point backwards, so it is acyclic by construction
/// except through collective rendezvous, which adding members in one global order keeps safe.
fn build(ranks: u32, steps: &[Step]) -> ExecGraph {
    let mut graph = GraphBuilder::new(ranks);
    let everyone = graph.add_group((0..ranks).map(RankId).collect());
    for step in steps {
        add_step(&mut graph, everyone, step);
    }
    graph.build().expect("graphs built this way are valid")
}

/// The ops `deps` picks among those `graph` has so far (none while it has none).
fn pick_deps(graph: &GraphBuilder, deps: &[prop::sample::Index]) -> Vec<OpId> {
    if graph.op_count() == 0 {
        Vec::new()
    } else {
        deps.iter().map(|d| OpId(d.index(graph.op_count()) as u32)).collect()
    }
}

/// Adds `step` to `graph`, whose group `everyone` holds all its ranks.
fn add_step(graph: &mut GraphBuilder, everyone: sim_core::graph::GroupId, step: &Step) {
    let ranks = graph.ranks();
    match step {
        Step::Compute { rank, stream, micros, deps } => {
            let deps = pick_deps(graph, deps);
            graph.compute(RankId(*rank), StreamId(*stream), SimDuration::from_us(*micros), "compute", &deps);
        }
        Step::Transfer { rank, stream, to, kilobytes, deps } if ranks > 1 => {
            let deps = pick_deps(graph, deps);
            graph.transfer(
                RankId(*rank),
                StreamId(*stream),
                RankId(*to),
                Bytes(kilobytes * 1000),
                "send",
                &deps,
            );
        }
        Step::Transfer { .. } => {}
        Step::AllReduce { stream, kilobytes, deps } => {
            let deps = pick_deps(graph, deps);
            let collective = graph.add_collective(Collective {
                kind: CollectiveKind::AllReduce,
                group: everyone,
                bytes: Bytes(kilobytes * 1000),
                algorithm: CollectiveAlgorithm::Ring,
            });
            for rank in 0..ranks {
                graph.collective(RankId(rank), StreamId(*stream), collective, "allreduce", &deps);
            }
        }
    }
}

fn check(graph: &ExecGraph, timeline: &Timeline) -> Result<(), TestCaseError> {
    for (index, op) in graph.ops().iter().enumerate() {
        let id = OpId(index as u32);
        // The run counted stream predecessors without the links (made here, after it).
        prop_assert_eq!(graph.has_previous_in_stream(id), graph.previous_in_stream(id).is_some());
        let ready = graph
            .deps(id)
            .iter()
            .chain(graph.previous_in_stream(id).as_ref())
            .map(|dep| timeline.end[dep.0 as usize])
            .max()
            .unwrap_or(SimTime::ZERO);
        prop_assert_eq!(
            timeline.start[index],
            ready,
            "{} must start exactly when released",
            graph.describe(id)
        );
        let length = timeline.end[index].saturating_since(timeline.start[index]);
        match op.kind {
            OpKind::Compute { duration } => prop_assert_eq!(length, duration),
            OpKind::Collective(collective) => {
                let members = graph.members(collective);
                let begin = members.iter().map(|m| timeline.start[m.0 as usize]).max().unwrap();
                prop_assert_eq!(timeline.collective_begin[collective.0 as usize], begin);
                for member in members {
                    prop_assert_eq!(timeline.end[member.0 as usize], timeline.end[index]);
                }
            }
            _ => prop_assert!(length > SimDuration::ZERO),
        }
    }
    // Ops on one (rank, stream) never overlap.
    let mut by_stream: std::collections::BTreeMap<(RankId, StreamId), Vec<(SimTime, SimTime)>> =
        Default::default();
    for (index, op) in graph.ops().iter().enumerate() {
        by_stream.entry((op.rank, op.stream)).or_default().push((timeline.start[index], timeline.end[index]));
    }
    for intervals in by_stream.values() {
        for pair in intervals.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0, "overlap on one stream: {:?}", pair);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn ops_start_exactly_when_released_and_streams_never_overlap(
        (ranks, steps) in (1u32..5).prop_flat_map(|ranks| (Just(ranks), prop::collection::vec(step(ranks), 1..60)))
    ) {
        let graph = build(ranks, &steps);
        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        check(&graph, &timeline)?;
        // Same graph, same network: the same timeline, event for event.
        let again = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        prop_assert_eq!(timeline, again);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A run that keeps only some ops' ends (`run_watching`, the validation suite's) gives
    /// those ends and the event count of the whole run, under the analytical model and the
    /// flow model (whose shared links make the order of events matter), watched ops given in
    /// any order and more than once.
    #[test]
    fn a_watching_run_ends_its_watched_ops_as_the_whole_run_does(
        (ranks, steps) in (1u32..5).prop_flat_map(|ranks| (Just(ranks), prop::collection::vec(step(ranks), 1..60))),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let graph = build(ranks, &steps);
        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        // A graph of steps that add no op has nothing to watch (an index into it would panic).
        let watched: Vec<OpId> = if graph.op_count() == 0 {
            Vec::new()
        } else {
            picks.iter().map(|pick| OpId(pick.index(graph.op_count()) as u32)).collect()
        };
        let whole = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        let watching = run_watching(&graph, &mut AnalyticalNetwork::new(&topology), &watched).unwrap();
        let expected: Vec<SimTime> = watched.iter().map(|op| whole.end[op.0 as usize]).collect();
        prop_assert_eq!(&watching.ends, &expected);
        prop_assert_eq!(watching.events, whole.events);
        let whole = run(&graph, &mut FlowNetwork::new(&topology)).unwrap();
        let watching = run_watching(&graph, &mut FlowNetwork::new(&topology), &watched).unwrap();
        let expected: Vec<SimTime> = watched.iter().map(|op| whole.end[op.0 as usize]).collect();
        prop_assert_eq!(&watching.ends, &expected);
        prop_assert_eq!(watching.events, whole.events);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A run given a limit on the last of some ends (`run_within`, plan's final) is the whole
    /// run, event for event, when those ends come by the limit, and gives up only when they
    /// do not: never a run that would have ended in time. Under the analytical and the flow
    /// model, limits below, at and above the last end.
    #[test]
    fn a_limited_run_gives_up_only_when_its_ends_come_after_the_limit(
        (ranks, steps) in (1u32..5).prop_flat_map(|ranks| (Just(ranks), prop::collection::vec(step(ranks), 1..60))),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        fraction in 0.0f64..1.5,
    ) {
        let graph = build(ranks, &steps);
        prop_assume!(graph.op_count() > 0);
        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        let ends: Vec<OpId> = picks.iter().map(|pick| OpId(pick.index(graph.op_count()) as u32)).collect();
        for flow in [false, true] {
            let whole = if flow {
                run(&graph, &mut FlowNetwork::new(&topology)).unwrap()
            } else {
                run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap()
            };
            let last = ends.iter().map(|op| whole.end[op.0 as usize]).max().unwrap();
            for limit in [(last.as_ps() as f64 * fraction) as u64, last.as_ps(), last.as_ps().saturating_sub(1)] {
                let limit = SimTime::from_ps(limit);
                let within = EndLimit::new(&graph, &ends, limit);
                let limited = if flow {
                    run_within(&graph, &mut FlowNetwork::new(&topology), within)
                } else {
                    run_within(&graph, &mut AnalyticalNetwork::new(&topology), within)
                };
                match limited {
                    Ok(timeline) => prop_assert_eq!(&timeline, &whole),
                    Err(ExecError::PastLimit { bound, .. }) => {
                        prop_assert!(last > limit, "gave up at limit {} though the ends came at {}", limit, last);
                        prop_assert!(bound <= last, "bound {} above the ends' {}", bound, last);
                    }
                    Err(other) => prop_assert!(false, "{}", other),
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// How far a run's bounds reached ([`LimitHandle::highest`]) tells exactly which limits
    /// would have given it up: a run under a loose limit (or none) that ends is given up under
    /// a limit from its start exactly when `highest` is past that limit; and a handle tightened
    /// from a loose limit (here before the run starts; plan's final stage also tightens runs in
    /// progress, which read the limit at each op start) gives the run the ending of its
    /// tightest limit. Under both models.
    #[test]
    fn how_far_a_runs_bounds_reached_tells_which_limits_give_it_up(
        (ranks, steps) in (1u32..5).prop_flat_map(|ranks| (Just(ranks), prop::collection::vec(step(ranks), 1..60))),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        fractions in prop::collection::vec(0.0f64..1.2, 1..5),
    ) {
        let graph = build(ranks, &steps);
        prop_assume!(graph.op_count() > 0);
        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        let ends: Vec<OpId> = picks.iter().map(|pick| OpId(pick.index(graph.op_count()) as u32)).collect();
        for flow in [false, true] {
            let limited = |limit: EndLimit| if flow {
                run_within(&graph, &mut FlowNetwork::new(&topology), limit)
            } else {
                run_within(&graph, &mut AnalyticalNetwork::new(&topology), limit)
            };
            let loose = LimitHandle::new(SimTime::from_ps(u64::MAX));
            let whole = limited(EndLimit::with_handle(&graph, &ends, loose.clone())).unwrap();
            let last = ends.iter().map(|op| whole.end[op.0 as usize]).max().unwrap();
            prop_assert!(loose.highest() <= last, "bounds reached {} past the ends' {}", loose.highest(), last);
            for &fraction in &fractions {
                let limit = SimTime::from_ps((last.as_ps() as f64 * fraction) as u64);
                let from_start = limited(EndLimit::new(&graph, &ends, limit));
                let gave_up = matches!(from_start, Err(ExecError::PastLimit { .. }));
                prop_assert_eq!(gave_up, loose.highest() > limit, "limit {} highest {}", limit, loose.highest());
                // Tightened from the loose limit to `limit` before the run starts, the handle
                // gives the run `limit`'s ending; and its own highest classifies it the same.
                let handle = LimitHandle::new(SimTime::from_ps(u64::MAX));
                handle.tighten(limit);
                handle.tighten(SimTime::from_ps(u64::MAX));
                prop_assert_eq!(handle.limit(), limit);
                let tightened = limited(EndLimit::with_handle(&graph, &ends, handle.clone()));
                prop_assert_eq!(matches!(tightened, Err(ExecError::PastLimit { .. })), gave_up);
                prop_assert_eq!(handle.highest() > limit, gave_up);
                if let (Ok(a), Ok(b)) = (&tightened, &from_start) {
                    prop_assert_eq!(a, b);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A graph appended onto other ranks of a larger builder (reversed, past its own) and
    /// held back by `not before`: every op ends exactly that much later than in the graph run
    /// alone (the analytical model has no contention, and the ranks are alike on one switch).
    #[test]
    fn an_appended_graph_on_other_ranks_runs_the_same_later(
        (ranks, steps) in (1u32..5).prop_flat_map(|ranks| (Just(ranks), prop::collection::vec(step(ranks), 1..40))),
        delay_us in 1u64..2000,
    ) {
        let graph = build(ranks, &steps);
        let topology = single_switch(2 * ranks, "100 Gb/s", "1 us");
        let alone = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        let mut merged = GraphBuilder::new(2 * ranks);
        let placed: Vec<RankId> = (0..ranks).map(|rank| RankId(2 * ranks - 1 - rank)).collect();
        let delay = SimDuration::from_us(delay_us);
        let first = merged.append(&graph, &placed, delay).unwrap();
        prop_assert_eq!(first, OpId(0));
        let merged = merged.build().unwrap();
        let timeline = run(&merged, &mut AnalyticalNetwork::new(&topology)).unwrap();
        check(&merged, &timeline)?;
        for (index, op) in graph.ops().iter().enumerate() {
            prop_assert_eq!(merged.ops()[index].rank, placed[op.rank.0 as usize]);
            prop_assert_eq!(timeline.end[index], alone.end[index].checked_add(delay).unwrap());
        }
    }
}

#[test]
fn compute_overlaps_communication_on_another_stream() {
    let topology = single_switch(2, "100 Gb/s", "1 us");
    let mut graph = GraphBuilder::new(2);
    // Rank 0 sends 1.25 MB (2 us + 100 us) on stream 1 while computing 60 us on stream 0.
    graph.transfer(RankId(0), StreamId(1), RankId(1), Bytes(1_250_000), "send", &[]);
    graph.compute(RankId(0), StreamId(0), SimDuration::from_us(60), "compute", &[]);
    let graph = graph.build().unwrap();
    let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(timeline.end[0].since_start(), SimDuration::from_us(102));
    assert_eq!(timeline.end[1].since_start(), SimDuration::from_us(60));
    let split = sim_core::stats::breakdown(&graph, &timeline, SimTime::ZERO, timeline.end[0]);
    assert_eq!(split[0].compute, SimDuration::from_us(60));
    assert_eq!(split[0].exposed_communication, SimDuration::from_us(42));
    assert_eq!(split[0].idle, SimDuration::ZERO);
    assert_eq!(split[1].idle, SimDuration::from_us(102));
}

/// A kernel slowed beside communication ([`GraphBuilder::compute_slowed`]): alone it takes its
/// duration, fully beside a transfer its slowed duration, and partly beside one in proportion:
/// `c + (1 - c / beside) x duration` when the transfer ends at `c`, before the kernel.
#[test]
fn a_kernel_beside_communication_runs_at_its_slowed_rate_while_it_lasts() {
    let topology = crate::single_switch(2, "100 Gb/s", "1 us");
    let (alone, beside) = (SimDuration::from_us(100), SimDuration::from_us(200));
    // A transfer of `bytes` from rank 0 on another stream, started with the kernel: 2 links of
    // 1 us and the bytes at 12.5 GB/s.
    let end = |bytes: Option<u64>| {
        let mut graph = GraphBuilder::new(2);
        let kernel = graph.compute_slowed(RankId(0), StreamId(0), alone, beside, "kernel", &[]);
        if let Some(bytes) = bytes {
            graph.transfer(RankId(0), StreamId(1), RankId(1), Bytes(bytes), "send", &[]);
        }
        let timeline = run(&graph.build().unwrap(), &mut AnalyticalNetwork::new(&topology)).unwrap();
        timeline.end[kernel.0 as usize].since_start()
    };
    assert_eq!(end(None), alone);
    // 1 MB: 2 + 80 = 82 us of transfer; the kernel did 82/200 of its work, 59 us left alone.
    assert_eq!(end(Some(1_000_000)), SimDuration::from_us(141));
    // 5 MB: 402 us of transfer, longer than the kernel even slowed.
    assert_eq!(end(Some(5_000_000)), beside);
    // The receiving rank's kernel is slowed too.
    let mut graph = GraphBuilder::new(2);
    let kernel = graph.compute_slowed(RankId(1), StreamId(0), alone, beside, "kernel", &[]);
    graph.transfer(RankId(0), StreamId(1), RankId(1), Bytes(5_000_000), "send", &[]);
    let timeline = run(&graph.build().unwrap(), &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(timeline.end[kernel.0 as usize].since_start(), beside);
    // A plain kernel and one whose slowed duration is no longer are not slowed.
    let mut graph = GraphBuilder::new(2);
    let plain = graph.compute(RankId(0), StreamId(0), alone, "plain", &[]);
    let same = graph.compute_slowed(RankId(0), StreamId(2), alone, alone, "same", &[]);
    graph.transfer(RankId(0), StreamId(1), RankId(1), Bytes(5_000_000), "send", &[]);
    let graph = graph.build().unwrap();
    assert!(!graph.has_slowdowns());
    let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(timeline.end[plain.0 as usize].since_start(), alone);
    assert_eq!(timeline.end[same.0 as usize].since_start(), alone);
}

/// The same beside a collective: its member's kernel occupies the GPU from its own launch, and
/// a kernel after the communication runs at full speed.
#[test]
fn a_kernel_is_slowed_from_its_ranks_collective_launch_to_its_end() {
    let topology = crate::single_switch(2, "100 Gb/s", "1 us");
    let (alone, beside) = (SimDuration::from_us(100), SimDuration::from_us(150));
    let mut graph = GraphBuilder::new(2);
    let group = graph.add_group(vec![RankId(0), RankId(1)]);
    let kernel = graph.compute_slowed(RankId(0), StreamId(0), alone, beside, "kernel", &[]);
    // Rank 1 arrives 30 us late: rank 0's member waits on its GPU from time 0.
    let late = graph.compute(RankId(1), StreamId(0), SimDuration::from_us(30), "late", &[]);
    let collective = graph.add_collective(Collective {
        kind: CollectiveKind::AllReduce,
        group,
        bytes: Bytes(5_000_000),
        algorithm: CollectiveAlgorithm::Ring,
    });
    let members = [
        graph.collective(RankId(0), StreamId(1), collective, "allreduce", &[]),
        graph.collective(RankId(1), StreamId(1), collective, "allreduce", &[late]),
    ];
    let after = graph.compute_slowed(RankId(0), StreamId(0), alone, beside, "after", &[members[0]]);
    let graph = graph.build().unwrap();
    let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
    let done = timeline.end[members[0].0 as usize].since_start();
    assert!(done > beside, "the allreduce ends at {done}, after the slowed kernel");
    assert_eq!(timeline.end[kernel.0 as usize].since_start(), beside);
    assert_eq!(timeline.end[after.0 as usize].since_start().as_ps(), done.as_ps() + alone.as_ps());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Graphs built alike are equal, with equal fingerprints, and run alike (what lets a caller
    /// run such twins once); one kernel's duration changed makes them differ.
    #[test]
    fn equal_graphs_have_equal_fingerprints_and_timelines_and_a_change_is_seen(
        (ranks, steps) in (1u32..5).prop_flat_map(|ranks| (Just(ranks), prop::collection::vec(step(ranks), 1..40)))
    ) {
        let graph = build(ranks, &steps);
        let twin = build(ranks, &steps);
        prop_assert!(graph == twin);
        prop_assert_eq!(graph.fingerprint(), twin.fingerprint());
        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        let timeline = run(&graph, &mut FlowNetwork::new(&topology).steady_state()).unwrap();
        prop_assert_eq!(&timeline, &run(&twin, &mut FlowNetwork::new(&topology).steady_state()).unwrap());
        // The first kernel a microsecond longer: another graph.
        let mut changed = steps.clone();
        if let Some(Step::Compute { micros, .. }) = changed.iter_mut().find(|s| matches!(s, Step::Compute { .. })) {
            *micros += 1;
            let other = build(ranks, &changed);
            prop_assert!(graph != other);
            prop_assert_ne!(graph.fingerprint(), other.fingerprint());
        }
    }
}

/// A limit on a graph whose dependencies name ops added later (ops not numbered in the order
/// they run, so the limit orders them itself): the chain through the later-numbered op counts,
/// and the run gives up exactly when its end is past the limit.
#[test]
fn a_limit_counts_the_chain_through_a_dependency_on_a_later_op() {
    let mut builder = GraphBuilder::new(1);
    let (rank, first, second) = (RankId(0), StreamId(0), StreamId(1));
    // Op 0 waits for op 1, added after it; op 2 follows op 0 on its stream.
    let waits = builder.compute(rank, first, SimDuration::from_us(10), "waits", &[OpId(1)]);
    let before = builder.compute(rank, second, SimDuration::from_us(5), "before", &[]);
    let last = builder.compute(rank, first, SimDuration::from_us(3), "last", &[]);
    assert_eq!((waits, before, last), (OpId(0), OpId(1), OpId(2)));
    let graph = builder.build().unwrap();
    let topology = single_switch(1, "100 Gb/s", "1 us");
    let whole = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(whole.end[2], SimTime::from_ps(18_000_000));
    for (limit_us, gives_up) in [(17, true), (18, false)] {
        let limit = EndLimit::new(&graph, &[last], SimTime::from_ps(limit_us * 1_000_000));
        let handle = limit.handle();
        let outcome = run_within(&graph, &mut AnalyticalNetwork::new(&topology), limit);
        assert_eq!(matches!(outcome, Err(ExecError::PastLimit { .. })), gives_up, "limit {limit_us} us");
        // Given up at time 0, at the start of the op the later-numbered dependency is on.
        if let Err(ExecError::PastLimit { op, .. }) = &outcome {
            assert!(op.contains("before"), "{op}");
        }
        // The bound the first op start showed is the whole chain: 5 + 10 + 3 us.
        assert_eq!(handle.highest(), SimTime::from_ps(18_000_000));
    }
}

/// A movement of a graph for [`the_floors_of_movements_never_take_a_bound_past_the_ends`].
#[derive(Debug, Clone)]
enum Move {
    /// A kernel, a transfer, or an allreduce over every rank ([`Step`]).
    Plain(Step),
    Copy {
        rank: u32,
        stream: u16,
        to_device: bool,
        kilobytes: u64,
        deps: Vec<prop::sample::Index>,
    },
    /// Every member of group `group` (0: all ranks, 1: each server's, 2: one GPU per server,
    /// 3: the first half) in rank order, on `stream`.
    Collective {
        group: u8,
        kind: u8,
        algorithm: u8,
        stream: u16,
        kilobytes: u64,
        deps: Vec<prop::sample::Index>,
    },
}

fn movement(ranks: u32) -> impl Strategy<Value = Move> {
    let deps = || prop::collection::vec(any::<prop::sample::Index>(), 0..3);
    prop_oneof![
        6 => step(ranks).prop_map(Move::Plain),
        1 => (0..ranks, 0u16..3, any::<bool>(), 1u64..4000, deps()).prop_map(|(rank, stream, to_device, kilobytes, deps)| {
            Move::Copy { rank, stream, to_device, kilobytes, deps }
        }),
        2 => (0u8..4, 0u8..4, 0u8..4, 0u16..3, 1u64..8000, deps()).prop_map(|(group, kind, algorithm, stream, kilobytes, deps)| {
            Move::Collective { group, kind, algorithm, stream, kilobytes, deps }
        }),
    ]
}

/// `nodes` servers of `gpus` GPUs on a fast switch each, one slower NIC per GPU into one
/// switch, and host memory behind a PCIe link per GPU: movements of different groups share
/// NICs, switch links and host links.
fn servers(nodes: u32, gpus: u32) -> topology::Topology {
    let nvswitch = topology::LinkSpec::new("2400 Gb/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = topology::LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let pcie = topology::LinkSpec::new("25 GB/s".parse().unwrap(), "1 us".parse().unwrap());
    topology::Topology::build(&topology::ClusterSpec {
        nodes,
        gpus_per_node: gpus,
        intra_node: topology::IntraNode::NvSwitch(nvswitch),
        network: topology::NetworkSpec::single_switch(nic),
        host_memory: Some(pcie),
    })
    .unwrap()
}

fn build_moves(nodes: u32, gpus: u32, moves: &[Move]) -> ExecGraph {
    use sim_core::graph::MemcpyDirection;
    let ranks = nodes * gpus;
    let mut graph = GraphBuilder::new(ranks);
    let all = graph.add_group((0..ranks).map(RankId).collect());
    let per_server: Vec<_> =
        (0..nodes).map(|n| graph.add_group((0..gpus).map(|g| RankId(n * gpus + g)).collect())).collect();
    let across = graph.add_group((0..nodes).map(|n| RankId(n * gpus)).collect());
    let half = graph.add_group((0..(ranks / 2).max(2)).map(RankId).collect());
    for movement in moves {
        match movement {
            Move::Plain(step) => add_step(&mut graph, all, step),
            Move::Copy { rank, stream, to_device, kilobytes, deps } => {
                let deps = pick_deps(&graph, deps);
                let direction =
                    if *to_device { MemcpyDirection::HostToDevice } else { MemcpyDirection::DeviceToHost };
                graph.memcpy(
                    RankId(*rank),
                    StreamId(*stream),
                    direction,
                    Bytes(kilobytes * 1000),
                    "copy",
                    &deps,
                );
            }
            Move::Collective { group, kind, algorithm, stream, kilobytes, deps } => {
                let deps = pick_deps(&graph, deps);
                let groups: Vec<_> = match group {
                    0 => vec![all],
                    1 => per_server.clone(),
                    2 => vec![across],
                    _ => vec![half],
                };
                let (kind, algorithm) = match (kind, algorithm) {
                    (0, a) => (
                        CollectiveKind::AllReduce,
                        [
                            CollectiveAlgorithm::Auto,
                            CollectiveAlgorithm::Ring,
                            CollectiveAlgorithm::Tree,
                            CollectiveAlgorithm::DoubleBinaryTree,
                        ][*a as usize],
                    ),
                    (1, a) => (
                        CollectiveKind::AllGather,
                        [CollectiveAlgorithm::Auto, CollectiveAlgorithm::Ring][*a as usize % 2],
                    ),
                    (2, a) => (
                        CollectiveKind::ReduceScatter,
                        [CollectiveAlgorithm::Auto, CollectiveAlgorithm::Ring][*a as usize % 2],
                    ),
                    (_, a) => (
                        CollectiveKind::AllToAll,
                        [
                            CollectiveAlgorithm::Auto,
                            CollectiveAlgorithm::Direct,
                            CollectiveAlgorithm::Pairwise,
                        ][*a as usize % 3],
                    ),
                };
                for group in groups {
                    let collective = graph.add_collective(Collective {
                        kind,
                        group,
                        bytes: Bytes(kilobytes * 1000),
                        algorithm,
                    });
                    for rank in graph.group(group).to_vec() {
                        graph.collective(rank, StreamId(*stream), collective, kind.name(), &deps);
                    }
                }
            }
        }
    }
    graph.build().expect("graphs built this way are valid")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// What a limit counts for transfers, copies and collectives (each one's floor, and the
    /// occupancy of the links they cross) never takes a run's bounds past its own ends, and a
    /// run limited at its own last end runs whole: on servers of several GPUs with a NIC each,
    /// movements of different groups sharing NICs, switch and host links, collectives of
    /// several kinds and algorithms, under the analytical model and under flow message by
    /// message and in its steady state, with and without protocol costs.
    #[test]
    fn the_floors_of_movements_never_take_a_bound_past_the_ends(
        (nodes, gpus, moves) in (2u32..4, 1u32..4).prop_flat_map(|(nodes, gpus)| {
            (Just(nodes), Just(gpus), prop::collection::vec(movement(nodes * gpus), 1..40))
        }),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        protocols in any::<bool>(),
    ) {
        use sim_core::nccl::protocol::ProtocolChoice;
        let graph = build_moves(nodes, gpus, &moves);
        let topology = servers(nodes, gpus);
        let ends: Vec<OpId> = picks.iter().map(|pick| OpId(pick.index(graph.op_count()) as u32)).collect();
        let choice = if protocols { ProtocolChoice::Auto } else { ProtocolChoice::Off };
        let launch = SimDuration::from_us(3);
        for model in 0..3 {
            let limited = |limit: Option<EndLimit>| {
                let analytical = || AnalyticalNetwork::new(&topology).with_protocols(choice).with_collective_launch(launch);
                let flow = || FlowNetwork::new(&topology).with_protocols(choice).with_collective_launch(launch);
                match (model, limit) {
                    (0, Some(limit)) => run_within(&graph, &mut analytical(), limit),
                    (0, None) => run(&graph, &mut analytical()),
                    (1, Some(limit)) => run_within(&graph, &mut flow(), limit),
                    (1, None) => run(&graph, &mut flow()),
                    (_, Some(limit)) => run_within(&graph, &mut flow().steady_state(), limit),
                    (_, None) => run(&graph, &mut flow().steady_state()),
                }
            };
            let Ok(whole) = limited(None) else {
                // An algorithm this group cannot run: the limit has nothing to add.
                continue;
            };
            let last = ends.iter().map(|op| whole.end[op.0 as usize]).max().unwrap();
            let loose = LimitHandle::new(SimTime::from_ps(u64::MAX));
            let unlimited = limited(Some(EndLimit::with_handle(&graph, &ends, loose.clone()))).unwrap();
            prop_assert_eq!(&unlimited, &whole);
            prop_assert!(loose.highest() <= last, "model {}: bounds reached {} past the ends' {}", model, loose.highest(), last);
            let at_last = limited(Some(EndLimit::new(&graph, &ends, last))).ok();
            prop_assert_eq!(at_last.as_ref(), Some(&whole), "model {}: given up at its own end", model);
        }
    }
}
