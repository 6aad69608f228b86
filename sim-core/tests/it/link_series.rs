//! Link utilisation over time (`FlowNetwork::recording_link_series`): closed forms on a star,
//! conservation of bytes, and runs that recording does not change.

use sim_core::exec::run;
use sim_core::flow::{FlowNetwork, LinkSeries};
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind, GraphBuilder, RankId, StreamId};
use sim_core::units::{Bytes, SimDuration, SimTime};
use topology::{HostId, LinkId, Topology};

use crate::{lone_collective, single_switch};

/// `us` microseconds after the start.
fn at_us(us: u64) -> SimTime {
    SimTime::from_ps(us * 1_000_000)
}

/// `series` is `expected` point for point, times within 2 ps (completions are rounded up to
/// the picosecond) and values within 1e-9.
fn assert_points(series: &LinkSeries, expected: &[(SimTime, f64)]) {
    let got = &series.points;
    assert_eq!(got.len(), expected.len(), "link {}: {got:?}", series.link.0);
    for (&(time, value), &(want_time, want)) in got.iter().zip(expected) {
        assert!(time.as_ps().abs_diff(want_time.as_ps()) <= 2, "link {}: {got:?}", series.link.0);
        assert!((value - want).abs() < 1e-9, "link {}: {got:?}", series.link.0);
    }
}

/// The links of the route from host `src` to host `dst`.
fn route(topology: &Topology, src: u32, dst: u32) -> Vec<LinkId> {
    topology.route(HostId(src), HostId(dst)).unwrap().iter().copied().collect()
}

#[test]
fn a_late_flow_halves_the_first_and_the_survivor_runs_alone_at_full_rate() {
    // 100 Gb/s = 12.5 GB/s links, 1 us each; a (0 -> 2) starts at 0, b (1 -> 2) after a 5 ms
    // wait; both 125 MB, sharing the switch's down-link to host 2.
    let topology = single_switch(3, "100 Gb/s", "1 us");
    let mut graph = GraphBuilder::new(3);
    graph.transfer(RankId(0), StreamId(0), RankId(2), Bytes(125_000_000), "a", &[]);
    let wait = graph.compute(RankId(1), StreamId(0), SimDuration::from_ms(5), "wait", &[]);
    graph.transfer(RankId(1), StreamId(0), RankId(2), Bytes(125_000_000), "b", &[wait]);
    let graph = graph.build().unwrap();
    let a = route(&topology, 0, 2);
    let b = route(&topology, 1, 2);
    assert_eq!(a[1], b[1], "both cross the down-link to host 2");
    let links = [a[0], b[0], a[1]];
    let mut network = FlowNetwork::new(&topology).recording_link_series(&links);
    let timeline = run(&graph, &mut network).unwrap();
    let series = network.link_series().unwrap();
    assert_eq!(series.iter().map(|s| s.link).collect::<Vec<_>>(), links);
    // a enters after its 2 us of latency, alone at 12.5 GB/s: 62.5 MB by 5.002 ms, when b
    // enters; both at 6.25 GB/s until a's other 62.5 MB are done, 10 ms later (15.002 ms);
    // b, with 62.5 MB left, runs alone at full rate for 5 ms more (20.002 ms).
    assert_points(&series[0], &[(at_us(0), 0.0), (at_us(2), 1.0), (at_us(5_002), 0.5), (at_us(15_002), 0.0)]);
    assert_points(
        &series[1],
        &[(at_us(0), 0.0), (at_us(5_002), 0.5), (at_us(15_002), 1.0), (at_us(20_002), 0.0)],
    );
    // The shared down-link is full from a's entry to b's end (1.0 alone, then 0.5 + 0.5, then
    // b alone): one point.
    assert_points(&series[2], &[(at_us(0), 0.0), (at_us(2), 1.0), (at_us(20_002), 0.0)]);
    assert!(timeline.end[2].since_start().as_ps().abs_diff(SimDuration::from_us(20_002).as_ps()) <= 2);
}

#[test]
fn a_flow_at_half_a_links_capacity_shows_half_then_zero() {
    // Host 0 sends to 1 and 2 at once: its up-link is split between them, each runs at
    // 6.25 GB/s, so the down-links to 1 and 2 are each half full until both end together.
    let topology = single_switch(3, "100 Gb/s", "1 us");
    let mut graph = GraphBuilder::new(3);
    graph.transfer(RankId(0), StreamId(0), RankId(1), Bytes(125_000_000), "a", &[]);
    graph.transfer(RankId(0), StreamId(1), RankId(2), Bytes(125_000_000), "b", &[]);
    let graph = graph.build().unwrap();
    let down = route(&topology, 0, 1)[1];
    let up = route(&topology, 0, 1)[0];
    let mut network = FlowNetwork::new(&topology).recording_link_series(&[down, up]);
    run(&graph, &mut network).unwrap();
    let series = network.link_series().unwrap();
    assert_points(&series[0], &[(at_us(0), 0.0), (at_us(2), 0.5), (at_us(20_002), 0.0)]);
    assert_points(&series[1], &[(at_us(0), 0.0), (at_us(2), 1.0), (at_us(20_002), 0.0)]);
}

/// The integral of a series (utilisation x capacity over time) in bytes.
fn carried(series: &LinkSeries, capacity: f64) -> f64 {
    series
        .points
        .windows(2)
        .map(|w| w[0].1 * capacity * (w[1].0.saturating_since(w[0].0)).as_secs_f64())
        .sum()
}

#[test]
fn recording_changes_no_time_and_the_series_carry_every_byte() {
    // Collectives message by message and in their steady state, on a shared switch: every
    // link recorded, against a run that records nothing.
    let topology = single_switch(8, "100 Gb/s", "1 us");
    let all: Vec<LinkId> = (0..topology.link_count() as u32).map(LinkId).collect();
    for algorithm in [CollectiveAlgorithm::Ring, CollectiveAlgorithm::DoubleBinaryTree] {
        let graph = lone_collective(8, CollectiveKind::AllReduce, algorithm, Bytes(64 << 20));
        for steady in [false, true] {
            let network = |recording: bool| {
                let mut network = FlowNetwork::new(&topology).recording_link_bytes();
                if steady {
                    network = network.steady_state();
                }
                if recording { network.recording_link_series(&all) } else { network }
            };
            let mut plain = network(false);
            let mut recorded = network(true);
            let without = run(&graph, &mut plain).unwrap();
            let with = run(&graph, &mut recorded).unwrap();
            assert_eq!(without.end, with.end, "{algorithm:?} steady {steady}");
            assert!(plain.link_series().is_none());
            let series = recorded.link_series().unwrap();
            assert_eq!(series.len(), all.len());
            let bytes = recorded.link_bytes().unwrap();
            for line in series {
                assert!(line.points.iter().all(|&(_, u)| (0.0..=1.0).contains(&u)), "{line:?}");
                assert!(line.points.windows(2).all(|w| w[0].0 < w[1].0), "{line:?}");
                assert_eq!(line.points.last().map(|p| p.1), Some(0.0), "ends idle: {line:?}");
                if !steady {
                    // Message by message, every flow's bytes cross every link of its route at
                    // the rates the series show.
                    let capacity = topology.link(line.link).bandwidth.bytes_per_second();
                    let want = bytes[line.link.0 as usize];
                    let got = carried(line, capacity);
                    assert!(
                        (got - want).abs() <= 1e-6 * want.max(1.0),
                        "link {}: {got} of {want}",
                        line.link.0
                    );
                }
            }
            assert!(series.iter().any(|line| line.points.len() > 2), "{algorithm:?} steady {steady}");
        }
    }
}
