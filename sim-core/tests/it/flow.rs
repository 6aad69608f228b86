//! The `flow` model: textbook max-min cases, invariants on random traffic, and agreement with
//! the analytical model and the reference simulators where nothing contends.

use proptest::prelude::*;
use sim_core::exec::{Timeline, run};
use sim_core::flow::FlowNetwork;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind, GraphBuilder, OpId, RankId, StreamId};
use sim_core::network::AnalyticalNetwork;
use sim_core::units::{Bytes, SimDuration};
use topology::{ClusterSpec, FabricSpec, IntraNode, NetworkSpec, Routing, Topology, XgftSpec};

use crate::{lone_collective, single_switch};

/// 100 Gb/s = 12.5 GB/s links, 1 us each; every path between two hosts is 2 links.
fn star(hosts: u32) -> Topology {
    single_switch(hosts, "100 Gb/s", "1 us")
}

/// Runs simultaneous flows of `bytes` (src, dst) and returns each one's completion time.
/// FT3-k4 (16 hosts) with ECMP routing.
fn ecmp_fat_tree() -> Topology {
    let link = topology::LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let mut network = NetworkSpec::new(FabricSpec::FatTree(XgftSpec::k_ary(4, 3, vec![link; 3]).unwrap()));
    network.routing = Routing::Ecmp;
    let cluster = ClusterSpec {
        nodes: 16,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network,
        host_memory: None,
    };
    Topology::build(&cluster).unwrap()
}

/// SimGrid's DF16 Cascade dragonfly ("2,1;1,1;2,1;4": 2 groups of 2 routers of 4 hosts), one
/// global link between the groups: half the hosts' traffic funnels through it.
fn small_dragonfly() -> Topology {
    let link = topology::LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let spec = topology::CascadeSpec::from_simgrid("2,1;1,1;2,1;4", link).unwrap();
    let cluster = ClusterSpec {
        nodes: 16,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::new(FabricSpec::CascadeDragonfly(spec)),
        host_memory: None,
    };
    Topology::build(&cluster).unwrap()
}

fn flows(hosts: u32, pairs: &[(u32, u32)], bytes: u64) -> Vec<SimDuration> {
    let topology = star(hosts);
    let mut graph = GraphBuilder::new(hosts);
    for (i, &(src, dst)) in pairs.iter().enumerate() {
        graph.transfer(RankId(src), StreamId(i as u16), RankId(dst), Bytes(bytes), "flow", &[]);
    }
    let graph = graph.build().unwrap();
    let mut network = FlowNetwork::new(&topology).audited();
    let timeline = run(&graph, &mut network).unwrap();
    let audit = network.audit().unwrap();
    assert_eq!(audit.violation, None);
    // Flows that share a link are re-filled, and every re-fill is checked.
    let shared = pairs.iter().enumerate().any(|(i, a)| pairs[..i].iter().any(|b| a.0 == b.0 || a.1 == b.1));
    assert_eq!(audit.checks > 0, shared, "{} checks", audit.checks);
    (0..pairs.len()).map(|i| timeline.end[i].since_start()).collect()
}

/// Latency (2 links) plus `bytes` at `rate` (bytes per second), in picoseconds.
fn expected(bytes: f64, rate: f64) -> SimDuration {
    SimDuration::from_ps(2_000_000 + (bytes / rate * 1e12).ceil() as u64)
}

fn close(got: SimDuration, want: SimDuration) -> bool {
    got.as_ps().abs_diff(want.as_ps()) <= 2
}

const LINK: f64 = 12.5e9;

#[test]
fn two_flows_on_one_link_each_get_half() {
    let done = flows(3, &[(0, 2), (1, 2)], 125_000_000);
    for time in done {
        assert!(close(time, expected(125e6, LINK / 2.0)), "{time}");
    }
}

#[test]
fn a_lone_flow_runs_at_line_rate() {
    let done = flows(2, &[(0, 1)], 125_000_000);
    assert!(close(done[0], expected(125e6, LINK)), "{}", done[0]);
}

#[test]
fn two_link_parking_lot_on_a_star() {
    // The long flow 0->1 crosses host 0's up-link and host 1's down-link; one short flow shares
    // each of those links. Every link has two flows: everyone gets half.
    let done = flows(4, &[(0, 1), (0, 2), (3, 1)], 125_000_000);
    for time in done {
        assert!(close(time, expected(125e6, LINK / 2.0)), "{time}");
    }
}

#[test]
fn a_flow_bottlenecked_elsewhere_leaves_its_share_to_others() {
    // 0->1, 2->1, 3->1 share host 1's down-link (a third each). 2->4 shares host 2's up-link
    // with 2->1, which is held to a third by the down-link, so 2->4 gets the other two thirds.
    let done = flows(5, &[(0, 1), (2, 1), (3, 1), (2, 4)], 125_000_000);
    for &time in &done[..3] {
        assert!(close(time, expected(125e6, LINK / 3.0)), "{time}");
    }
    assert!(close(done[3], expected(125e6, 2.0 * LINK / 3.0)), "{}", done[3]);
}

#[test]
fn a_late_flow_slows_an_early_one_only_while_both_run() {
    // Flow a starts at 0, b joins 4 ms later on the same down-link.
    let topology = star(3);
    let mut graph = GraphBuilder::new(3);
    graph.transfer(RankId(0), StreamId(0), RankId(2), Bytes(100_000_000), "a", &[]);
    let wait = graph.compute(RankId(1), StreamId(0), SimDuration::from_ms(4), "wait", &[]);
    graph.transfer(RankId(1), StreamId(0), RankId(2), Bytes(100_000_000), "b", &[wait]);
    let graph = graph.build().unwrap();
    let timeline = run(&graph, &mut FlowNetwork::new(&topology)).unwrap();
    // a runs alone from 2 us to 4.002 ms (b enters after its own 2 us of latency) and delivers
    // 50 MB; the other 50 MB at half rate take 8 ms, so a ends at 12.002 ms. By then b has
    // delivered 50 MB and sends its other 50 MB alone at full rate: 4 ms more.
    assert!(close(timeline.end[0].since_start(), SimDuration::from_us(12_002)), "{}", timeline.end[0]);
    assert!(close(timeline.end[2].since_start(), SimDuration::from_us(16_002)), "{}", timeline.end[2]);
}

#[test]
fn simgrid_two_flow_micro_test_shape_on_a_star() {
    // simulators.md's micro-test: two 125 MB flows into one host; under plain max-min both get
    // 6.25 GB/s once both run and finish together (0.020000 s vs 0.020002 s there, whose
    // routes have 2 and 4 links). On a star both routes have 2 links: both end at 20.002 ms.
    let done = flows(3, &[(0, 1), (2, 1)], 125_000_000);
    assert_eq!(done[0], done[1]);
    assert!(close(done[0], SimDuration::from_us(20_002)));
}

fn ring_time(ranks: u32, bytes: Bytes, flow: bool) -> (Timeline, Option<sim_core::flow::Audit>) {
    let topology = star(ranks);
    let graph = lone_collective(ranks, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, bytes);
    if flow {
        let mut network = FlowNetwork::new(&topology).audited();
        let timeline = run(&graph, &mut network).unwrap();
        (timeline, network.audit().cloned())
    } else {
        (run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap(), None)
    }
}

#[test]
fn an_uncontended_ring_takes_the_same_time_in_both_models() {
    for (ranks, bytes) in [(8u32, 1u64 << 20), (16, 64 << 20), (64, 1 << 30)] {
        let (analytical, _) = ring_time(ranks, Bytes(bytes), false);
        let (flow, audit) = ring_time(ranks, Bytes(bytes), true);
        let audit = audit.unwrap();
        assert_eq!(audit.violation, None);
        assert!((audit.bytes_delivered - audit.bytes_sent).abs() <= 1e-6 * audit.bytes_sent);
        let (a, f) = (analytical.makespan().as_ps() as f64, flow.makespan().as_ps() as f64);
        assert!((a - f).abs() / a < 1e-6, "N={ranks} S={bytes}: analytical {a} ps, flow {f} ps");
    }
}

/// 16 hosts; flow `i` of `(src, offset, bytes, delay_us)` waits `delay_us` on its own stream of
/// `src`, then sends `bytes` to `(src + offset) % 16` (op `2 i + 1`).
fn random_flows(flows: &[(u32, u32, u64, u64)]) -> sim_core::graph::ExecGraph {
    let mut graph = GraphBuilder::new(16);
    for (i, &(src, offset, bytes, delay_us)) in flows.iter().enumerate() {
        let dst = (src + offset) % 16;
        let stream = StreamId(i as u16);
        let wait = graph.compute(RankId(src), stream, SimDuration::from_us(delay_us), "wait", &[]);
        graph.transfer(RankId(src), stream, RankId(dst), Bytes(bytes), "flow", &[wait]);
    }
    graph.build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random traffic: flows with random sizes start at random times between random hosts.
    /// After every re-fill no link is over capacity and every flow has a bottleneck, and every
    /// byte sent is delivered.
    #[test]
    fn max_min_invariants_hold_on_random_traffic(
        fat_tree in any::<bool>(),
        flows in prop::collection::vec((0u32..16, 1u32..16, 1u64..50_000_000, 0u64..3_000), 1..40)
    ) {
        // A star of 16 hosts, or a k = 4 fat-tree with ECMP (routes of 2, 4 and 6 links that
        // share core links in hashed ways).
        let topology = if fat_tree { ecmp_fat_tree() } else { star(16) };
        let graph = random_flows(&flows);
        let mut network = FlowNetwork::new(&topology).audited();
        let timeline = run(&graph, &mut network).unwrap();
        let audit = network.audit().unwrap();
        prop_assert_eq!(&audit.violation, &None);
        prop_assert!((audit.bytes_delivered - audit.bytes_sent).abs() <= 1e-6 * audit.bytes_sent);
        // No flow beats its size at line rate.
        for (i, &(_, _, bytes, delay_us)) in flows.iter().enumerate() {
            let transfer = OpId(2 * i as u32 + 1);
            let took = timeline.end[transfer.0 as usize].saturating_since(timeline.start[transfer.0 as usize]);
            let fastest = SimDuration::from_ps((bytes as f64 / LINK * 1e12) as u64);
            prop_assert!(took >= fastest, "flow {} ({} B after {} us) took {} < {}", i, bytes, delay_us, took, fastest);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// Re-filling only the flows at or above the level of what changed gives every flow the
    /// time the re-fill of its whole component gives (to rounding: the kept flows' rates are
    /// subtracted in another order), with fewer flows re-filled; on random traffic over a
    /// star, an ECMP fat-tree and a dragonfly whose global links congest.
    #[test]
    fn partial_refills_match_whole_component_refills(
        fabric in 0u8..3,
        flows in prop::collection::vec((0u32..16, 1u32..16, 1u64..50_000_000, 0u64..3_000), 1..60)
    ) {
        let topology = match fabric {
            0 => star(16),
            1 => ecmp_fat_tree(),
            _ => small_dragonfly(),
        };
        let graph = random_flows(&flows);
        let mut partial = FlowNetwork::new(&topology).audited();
        let mut whole = FlowNetwork::new(&topology).audited().refilling_whole_components();
        let (a, b) = (run(&graph, &mut partial).unwrap(), run(&graph, &mut whole).unwrap());
        prop_assert_eq!(&partial.audit().unwrap().violation, &None);
        for (op, (x, y)) in a.end.iter().zip(&b.end).enumerate() {
            let (x, y) = (x.since_start().as_ps(), y.since_start().as_ps());
            prop_assert!(x.abs_diff(y) <= 2 + y / 1_000_000_000, "op {}: {} ps against {} ps", op, x, y);
        }
        prop_assert!(partial.stats().refilled_flows <= whole.stats().refilled_flows);
    }
}

#[test]
fn host_device_copies_share_their_gpus_host_link() {
    // Two 250 MB copies on one GPU's 25 GB/s host link (two streams) share it: 20 ms each;
    // a copy on another GPU runs alone: 10 ms. The analytical model ignores the sharing.
    let link = topology::LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let pcie = topology::LinkSpec::new("25 GB/s".parse().unwrap(), "1 us".parse().unwrap());
    let cluster = ClusterSpec {
        nodes: 1,
        gpus_per_node: 2,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::single_switch(link),
        host_memory: Some(pcie),
    };
    let topology = Topology::build(&cluster).unwrap();
    let mut graph = GraphBuilder::new(2);
    use sim_core::graph::MemcpyDirection::{DeviceToHost, HostToDevice};
    graph.memcpy(RankId(0), StreamId(0), HostToDevice, Bytes(250_000_000), "weights in", &[]);
    graph.memcpy(RankId(0), StreamId(1), HostToDevice, Bytes(250_000_000), "activations in", &[]);
    graph.memcpy(RankId(1), StreamId(0), DeviceToHost, Bytes(250_000_000), "activations out", &[]);
    let graph = graph.build().unwrap();
    let flow = run(&graph, &mut FlowNetwork::new(&topology)).unwrap();
    assert_eq!(flow.end[0].since_start(), SimDuration::from_us(20_001));
    assert_eq!(flow.end[1].since_start(), SimDuration::from_us(20_001));
    assert_eq!(flow.end[2].since_start(), SimDuration::from_us(10_001));
    let analytical = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(analytical.end[0].since_start(), SimDuration::from_us(10_001));

    // Without host memory in the cluster, a copy is an error that says so.
    let topology = Topology::build(&ClusterSpec { host_memory: None, ..cluster }).unwrap();
    let error = run(&graph, &mut FlowNetwork::new(&topology)).unwrap_err().to_string();
    assert!(error.contains("host-memory") && error.contains("weights in"), "{error}");
}

#[test]
fn classic_three_link_parking_lot() {
    // A ring of 7 routers, one host each. The long flow h0->h3 crosses ring links R0->R1,
    // R1->R2 and R2->R3; three short flows each share exactly one of them (h6->h1 via R6, R0;
    // h1->h2; h2->h4 via R3). Max-min gives every flow half a link, the long one included.
    let link = topology::LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let cluster = ClusterSpec {
        nodes: 7,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::new(FabricSpec::Ring { link }),
        host_memory: None,
    };
    let topology = Topology::build(&cluster).unwrap();
    let pairs = [(0u32, 3u32), (6, 1), (1, 2), (2, 4)];
    let mut graph = GraphBuilder::new(7);
    for (i, &(src, dst)) in pairs.iter().enumerate() {
        graph.transfer(RankId(src), StreamId(i as u16), RankId(dst), Bytes(125_000_000), "flow", &[]);
    }
    let graph = graph.build().unwrap();
    let mut network = FlowNetwork::new(&topology).audited();
    let timeline = run(&graph, &mut network).unwrap();
    assert_eq!(network.audit().unwrap().violation, None);
    for (i, &(src, dst)) in pairs.iter().enumerate() {
        let route = topology.route(topology::HostId(src), topology::HostId(dst)).unwrap();
        let latency = route.len() as f64 * 1e-6;
        let took = timeline.end[i].since_start().as_secs_f64() - latency;
        // The flows enter a few microseconds apart; after that each runs at half a link.
        let at_half = 125e6 / (LINK / 2.0);
        assert!((took - at_half).abs() / at_half < 5e-4, "flow {src}->{dst}: {took} s vs {at_half} s");
    }
    // The long flow really crosses three ring links.
    assert_eq!(topology.route(topology::HostId(0), topology::HostId(3)).unwrap().len(), 5);
}

/// Eight senders into one receiver, four of 125 MB and four of 250 MB: they enter together, the
/// small ones leave together, then the large ones. Re-filled after every change (as before
/// batching) that is 7 + 4 + 3 re-fills; batched per instant, one per instant, with the same
/// completion times to the picosecond.
#[test]
fn flows_changing_at_one_instant_refill_once() {
    let topology = star(9);
    let mut graph = GraphBuilder::new(9);
    for src in 0..8u32 {
        let bytes = if src < 4 { 125_000_000 } else { 250_000_000 };
        graph.transfer(RankId(src), StreamId(0), RankId(8), Bytes(bytes), "flow", &[]);
    }
    let graph = graph.build().unwrap();
    let mut results = Vec::new();
    for immediate in [true, false] {
        let network = FlowNetwork::new(&topology).audited();
        let mut network = if immediate { network.refilling_immediately() } else { network };
        let timeline = run(&graph, &mut network).unwrap();
        let audit = network.audit().unwrap();
        assert_eq!(audit.violation, None);
        assert!((audit.bytes_sent - audit.bytes_delivered).abs() < 1.0, "{audit:?}");
        let ends: Vec<SimDuration> = (0..8).map(|i| timeline.end[i].since_start()).collect();
        results.push((ends, network.stats().recomputations, network.stats().refilled_flows));
    }
    let (immediate, batched) = (&results[0], &results[1]);
    assert_eq!(batched.0, immediate.0);
    assert_eq!(immediate.1, 7 + 4 + 3);
    assert_eq!(batched.1, 3);
    // Each instant re-fills its component once: the 8 flows entering, the 4 large ones left
    // after the small ones, and nobody after the large ones.
    assert_eq!(batched.2, 8 + 4);
    // Eight flows share the receiver's link: 1.5625 GB/s each; then four share it at 3.125 GB/s.
    let small = expected(125e6, LINK / 8.0);
    assert!(close(batched.0[0], small), "{}", batched.0[0]);
    let large = SimDuration::from_ps(small.as_ps() + (125e6 / (LINK / 4.0) * 1e12).ceil() as u64);
    assert!(batched.0[7].as_ps().abs_diff(large.as_ps()) <= 4, "{} vs {large}", batched.0[7]);
}

/// The work budget gives up at the same point on every run, whatever the machine: the work is
/// counted in flow and link updates, and a run within its budget is the unbudgeted run.
#[test]
fn a_work_budget_is_deterministic_and_does_not_change_a_run_within_it() {
    let topology = star(8);
    let mut graph = GraphBuilder::new(8);
    for i in 0..8u32 {
        // Every host sends to the next two: flows share links, so rates are re-filled.
        for k in 1..3u32 {
            graph.transfer(RankId(i), StreamId(k as u16), RankId((i + k) % 8), Bytes(1 << 20), "flow", &[]);
        }
    }
    let graph = graph.build().unwrap();
    let mut free = FlowNetwork::new(&topology);
    let unbudgeted = run(&graph, &mut free).unwrap();
    let work = free.stats().work;
    assert!(work > 16, "16 flows started and at least one re-fill: {work}");
    let mut again = FlowNetwork::new(&topology);
    run(&graph, &mut again).unwrap();
    assert_eq!(again.stats().work, work, "the same run does the same work");

    let mut enough = FlowNetwork::new(&topology).with_work_budget(Some(work));
    assert_eq!(run(&graph, &mut enough).unwrap().end, unbudgeted.end);
    let mut short = FlowNetwork::new(&topology).with_work_budget(Some(work - 1));
    let error = run(&graph, &mut short).unwrap_err().to_string();
    assert!(error.contains(&format!("work budget of {}", work - 1)), "{error}");
}

/// Flows that never share a link take the fast path that re-fills nothing: the budget still
/// bounds them, counted per flow started (a `packet-steps` chain over terabytes, one hop per
/// chunk, ran on past its budget until the flow itself was counted).
#[test]
fn a_work_budget_bounds_flows_that_never_share_a_link() {
    let topology = star(8);
    let mut graph = GraphBuilder::new(8);
    let mut previous = None;
    for step in 0..40u32 {
        // One flow at a time, each after the one before: nothing ever shares a link.
        let (from, to) = (step % 8, (step + 1) % 8);
        let after: Vec<_> = previous.into_iter().collect();
        previous = Some(graph.transfer(RankId(from), StreamId(0), RankId(to), Bytes(1 << 20), "hop", &after));
    }
    let graph = graph.build().unwrap();
    let mut free = FlowNetwork::new(&topology);
    run(&graph, &mut free).unwrap();
    assert_eq!(free.stats().flows, 40);
    let work = free.stats().work;
    let mut short = FlowNetwork::new(&topology).with_work_budget(Some(10));
    let error = run(&graph, &mut short).unwrap_err().to_string();
    assert!(error.contains("work budget of 10"), "{error} (the free run did {work} work)");
}

#[test]
fn a_movement_alone_is_its_floor_and_a_work_budget_bounds_the_timing_of_floors() {
    use sim_core::graph::{Collective, GroupId};
    use sim_core::network::{Movement, Network};
    // 64 hosts on one switch: a 64 MiB ring allreduce alone takes its alpha-beta time under
    // the steady state, and occupies each host's up-link for 2 (n - 1) / n of the buffer over
    // its capacity.
    let topology = single_switch(64, "100 Gb/s", "1 us");
    let group: Vec<RankId> = (0..64).map(RankId).collect();
    let collective = Collective {
        kind: CollectiveKind::AllReduce,
        group: GroupId(0),
        bytes: Bytes(64 << 20),
        algorithm: CollectiveAlgorithm::Ring,
    };
    let movement = Movement::Collective { collective: &collective, group: &group };
    let mut network = FlowNetwork::new(&topology).steady_state();
    let least = network.least(movement);
    let graph = lone_collective(64, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(64 << 20));
    let whole = run(&graph, &mut FlowNetwork::new(&topology).steady_state()).unwrap().makespan();
    assert!(
        least.time <= whole && least.time.as_secs_f64() > 0.999 * whole.as_secs_f64(),
        "{least:?} against {whole}"
    );
    let up = 2.0 * 63.0 / 64.0 * (64u64 << 20) as f64 / 12.5e9;
    let most = least.occupancy.iter().map(|&(_, time)| time.as_secs_f64()).fold(0.0, f64::max);
    assert!(most <= up && most > 0.999 * up, "busiest occupancy {most} s against {up} s");
    // Under a work budget of a few flows the movement alone runs past it: no floor, then or
    // after, and no unbounded work spent finding one.
    let mut budgeted = FlowNetwork::new(&topology).steady_state().with_work_budget(Some(3));
    assert_eq!(budgeted.least(movement), sim_core::network::Least::default());
    let transfer = Movement::Transfer { src: RankId(0), dst: RankId(1), bytes: Bytes(1 << 20) };
    assert_eq!(budgeted.least(transfer), sim_core::network::Least::default());
    assert!(network.least(transfer).time > SimDuration::ZERO);
}
