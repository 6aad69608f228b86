//! The analytical model against closed forms and against the independent simulators' numbers
//! in `../shared/reference/simulators.md` (read from there, never copied).

use sim_core::exec::run;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind};
use sim_core::network::AnalyticalNetwork;
use sim_core::units::{Bytes, SimDuration};

use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};

use crate::{lone_collective, single_switch};

/// The shared reference file; CI has `../shared` beside the checkout, so its absence is a failure.
fn reference_table() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/reference/simulators.md");
    fs_err::read_to_string(path).unwrap_or_else(|error| {
        panic!("cannot read {path}: {error}. The reference results live in ../shared/reference beside the checkout")
    })
}

#[test]
fn ring_allreduce_equals_the_alpha_beta_closed_form() {
    // 2(p-1) alpha + 2(p-1)/p S/B, alpha = 2 links x 1.5 us, B = 25 GB/s (40 ps per byte).
    for (p, bytes) in [(2u64, 1000u64), (4, 1 << 20), (12, 12_000_000), (64, 1 << 30)] {
        let topology = single_switch(p as u32, "200 Gb/s", "1.5 us");
        let graph =
            lone_collective(p as u32, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(bytes));
        let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        let alpha = 3_000_000u64;
        let expected = 2 * (p - 1) * alpha + (2 * (p - 1) * bytes * 40).div_ceil(p);
        let got = timeline.makespan().as_ps();
        // Exact up to the per-step rounding of S/p to whole picoseconds.
        assert!(got.abs_diff(expected) <= 2 * p, "p={p} S={bytes}: {got} ps vs {expected} ps");
        assert_eq!(timeline.events, 1, "one collective, one completion event");
    }
}

#[test]
fn single_switch_ring_matches_simgrid_and_astra_sim_within_0_01_percent() {
    let table = reference_table();
    let section = table
        .split("## Single switch, ring all-reduce")
        .nth(1)
        .expect("simulators.md has no 'Single switch, ring all-reduce' section");
    let mut rows = 0;
    for line in section.lines().filter(|line| line.starts_with("| ") && line.as_bytes()[2].is_ascii_digit()) {
        let cells: Vec<&str> = line.split('|').map(str::trim).filter(|cell| !cell.is_empty()).collect();
        let ranks: u32 = cells[0].parse().unwrap();
        let bytes: Bytes = cells[1].parse().unwrap();
        let formula_ms: f64 = cells[2].parse().unwrap();
        let simgrid_ms: f64 = cells[3].parse().unwrap();
        let astra_unaware_ms: f64 = cells[4].parse().unwrap();

        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        let graph = lone_collective(ranks, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, bytes);
        let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        let ours_ms = timeline.makespan().as_secs_f64() * 1e3;
        for (name, reference) in [("formula", formula_ms), ("SimGrid MAXMIN", simgrid_ms)] {
            // The table prints 4 decimals of a millisecond; allow 0.01% or that rounding.
            let error = (ours_ms - reference).abs() / reference;
            let rounding = 0.5e-4 / reference;
            assert!(
                error < 1e-4_f64.max(rounding),
                "N={ranks} S={bytes}: parasim {ours_ms:.6} ms vs {name} {reference} ms ({:.4}%)",
                error * 100.0
            );
        }
        // ASTRA-sim's congestion-unaware backend adds a 1 ns endpoint delay per step and is
        // documented to match the formula within 2 us.
        let gap_ms = (ours_ms - astra_unaware_ms).abs();
        assert!(
            gap_ms < 2e-3 + 0.5e-4,
            "N={ranks} S={bytes}: {ours_ms:.6} ms vs ASTRA-sim {astra_unaware_ms} ms"
        );
        rows += 1;
    }
    assert_eq!(rows, 21, "expected the 21 rows N = 8..1024 x S = 1 MiB, 64 MiB, 1 GiB");
}

#[test]
fn broadcast_and_all_to_all_follow_their_closed_forms() {
    let topology = single_switch(16, "100 Gb/s", "1 us");
    let message = 2_000_000 + 80 * (1 << 20); // 2 us + 1 MiB at 12.5 GB/s
    let broadcast = lone_collective(
        16,
        CollectiveKind::Broadcast { root: 3 },
        CollectiveAlgorithm::BinomialTree,
        Bytes(1 << 20),
    );
    let timeline = run(&broadcast, &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(timeline.makespan(), SimDuration::from_ps(4 * message));
    let all_to_all =
        lone_collective(16, CollectiveKind::AllToAll, CollectiveAlgorithm::Pairwise, Bytes(16 << 20));
    let timeline = run(&all_to_all, &mut AnalyticalNetwork::new(&topology)).unwrap();
    assert_eq!(timeline.makespan(), SimDuration::from_ps(15 * message));
}

#[test]
fn multi_node_ring_uses_every_nic_like_nccl_on_dgx_a100() {
    // DGX-A100-like servers: 8 GPUs on an NVSwitch (300 GB/s per direction), one 200 Gb/s NIC
    // per GPU. NVIDIA measures 192 GB/s allreduce bus bandwidth on such systems (nccl issue
    // #1576, quoted in ../shared/data/published-measurements.md section 10). A single ring
    // would funnel everything through one NIC per server and reach only ~25 GB/s.
    let nvswitch = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    for nodes in [2u32, 8] {
        let topology = Topology::build(&ClusterSpec {
            nodes,
            gpus_per_node: 8,
            intra_node: IntraNode::NvSwitch(nvswitch),
            network: NetworkSpec::single_switch(nic),
            host_memory: None,
        })
        .unwrap();
        let ranks = nodes * 8;
        let bytes = Bytes(1 << 30);
        let graph = lone_collective(ranks, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, bytes);
        let seconds = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
        let p = f64::from(ranks);
        let bus_bandwidth = bytes.as_f64() / seconds * 2.0 * (p - 1.0) / p / 1e9;
        let error = (bus_bandwidth - 192.0).abs() / 192.0;
        println!("{nodes} nodes: busbw {bus_bandwidth:.1} GB/s vs 192 GB/s measured ({:.1}%)", error * 100.0);
        assert!(error < 0.05, "{nodes} nodes: busbw {bus_bandwidth:.1} GB/s, NVIDIA measures 192 GB/s");
    }
}
