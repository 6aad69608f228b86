//! Network faults on the topology (`Topology::degrade`, `Topology::take_down`): a degraded link
//! slows a ring allreduce by the alpha-beta closed form, a link down on a fat-tree with
//! redundant paths is routed around, and a link down on the only path cuts a host off.

use sim_core::exec::run;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind};
use sim_core::network::AnalyticalNetwork;
use sim_core::units::Bytes;
use topology::{ClusterSpec, FabricSpec, HostId, IntraNode, LinkSpec, NetworkSpec, Tier, Topology, XgftSpec};

use crate::{lone_collective, single_switch};

fn ring_allreduce(topology: &Topology, bytes: u64) -> (f64, f64) {
    let ranks = topology.host_count() as u32;
    let graph = lone_collective(ranks, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(bytes));
    let analytical = run(&graph, &mut AnalyticalNetwork::new(topology)).unwrap().makespan().as_secs_f64();
    let flow = run(&graph, &mut FlowNetwork::new(topology)).unwrap().makespan().as_secs_f64();
    (analytical, flow)
}

/// Both directions of host `host`'s cable to the switch.
fn nic_cable(topology: &Topology, host: u32) -> [topology::LinkId; 2] {
    let up = topology.route(HostId(host), HostId((host + 1) % topology.host_count() as u32)).unwrap()[0];
    [up, topology.reverse_of(up).unwrap()]
}

#[test]
fn a_degraded_link_slows_a_ring_allreduce_by_the_alpha_beta_closed_form() {
    // 8 hosts on one switch, 100 Gb/s and 1 us per link; a ring step sends S/p over two links
    // (NIC up, NIC down): 2 (p - 1) steps of 2 alpha + (S/p) / B, B the slowest link on the
    // ring. Host 3's cable at half rate halves B for every step (each step waits for its
    // slowest message).
    let (p, bytes, alpha, bandwidth) = (8.0, 256u64 << 20, 1e-6, 100e9 / 8.0);
    let closed = |b: f64| 2.0 * (p - 1.0) * (2.0 * alpha + bytes as f64 / p / b);
    let mut topology = single_switch(8, "100 Gb/s", "1 us");
    let (healthy, healthy_flow) = ring_allreduce(&topology, bytes);
    for link in nic_cable(&topology, 3) {
        topology.degrade(link, 0.5).unwrap();
    }
    let (degraded, degraded_flow) = ring_allreduce(&topology, bytes);
    println!(
        "healthy {healthy:.6} s (flow {healthy_flow:.6}), degraded {degraded:.6} s (flow {degraded_flow:.6})"
    );
    for (simulated, expected) in [
        (healthy, closed(bandwidth)),
        (healthy_flow, closed(bandwidth)),
        (degraded, closed(bandwidth / 2.0)),
        (degraded_flow, closed(bandwidth / 2.0)),
    ] {
        assert!(
            (simulated - expected).abs() / expected < 0.01,
            "simulated {simulated} s, closed form {expected} s"
        );
    }
}

/// 16 single-GPU hosts on a k = 4 three-level fat-tree.
fn fat_tree() -> Topology {
    let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes: 16,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::new(FabricSpec::FatTree(XgftSpec::k_ary(4, 3, vec![link; 3]).unwrap())),
        host_memory: None,
    })
    .unwrap()
}

#[test]
fn a_link_down_on_a_fat_tree_is_routed_around_and_the_job_finishes() {
    let mut topology = fat_tree();
    let (healthy, _) = ring_allreduce(&topology, 64 << 20);
    // The first fat-tree link of host 0's route to host 8 (another pod), both directions.
    let route = topology.route(HostId(0), HostId(8)).unwrap();
    let cable =
        route.iter().copied().find(|&l| matches!(topology.link(l).tier, Tier::FatTree { .. })).unwrap();
    let reverse = topology.reverse_of(cable).unwrap();
    topology.take_down(cable);
    topology.take_down(reverse);
    assert!(topology.unreachable_from(HostId(0)).unwrap().is_empty(), "redundant paths: nobody is cut off");
    for src in 0..16 {
        for dst in 0..16 {
            let route = topology.route(HostId(src), HostId(dst)).unwrap();
            assert!(
                route.iter().all(|&l| !topology.is_down(l)),
                "{src} -> {dst} crosses a link that is down"
            );
        }
    }
    let (analytical, flow) = ring_allreduce(&topology, 64 << 20);
    println!("healthy {healthy:.6} s, one cable down: analytical {analytical:.6} s, flow {flow:.6} s");
    assert!(analytical.is_finite() && analytical >= healthy * 0.999);
    assert!(flow.is_finite() && flow > 0.0);
}

#[test]
fn a_link_down_on_the_only_path_cuts_the_host_off_and_is_reported() {
    let mut topology = single_switch(4, "100 Gb/s", "1 us");
    for link in nic_cable(&topology, 2) {
        topology.take_down(link);
    }
    assert_eq!(topology.unreachable_from(HostId(0)).unwrap(), vec![HostId(2)]);
    assert_eq!(
        topology.route(HostId(0), HostId(2)),
        Err(topology::TopologyError::Unreachable { src: HostId(0), dst: HostId(2) })
    );
    // The engine reports it as an error, not a hang.
    let graph = lone_collective(4, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(1 << 20));
    assert!(run(&graph, &mut AnalyticalNetwork::new(&topology)).is_err());
    assert!(run(&graph, &mut FlowNetwork::new(&topology)).is_err());
}
