//! `[cluster.network]` in scenario files and `parasim topo`.

use crate::{QUICKSTART, assert_rejected, parasim, quickstart_with, scenario_file};

const SUPERPOD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/superpod-1024.toml");

#[test]
fn topo_describes_the_rail_optimized_fat_tree() {
    let output = parasim(&["topo", SUPERPOD]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "1024 x A100-SXM4-80GB",
        "rail-optimized",
        "fat-tree 3;8,8,16;1,8,8;1,1,1",
        "switches:   448",
        "diameter:   6 links",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// 256 GPUs (32 servers of 8, a NIC each) on a radix-32 fat-tree: `topo` reports the 16 leaves
/// and 16 spines they use (plus the 32 NVSwitches), not the 1,280 network switches of the
/// 8,192-NIC tree (issue 35; 1,312 switches and 17,152 cables before), and says how it pruned.
#[test]
fn topo_prunes_a_fat_tree_to_the_switches_the_hosts_need() {
    let text = quickstart_with("nodes = 8", "nodes = 32")
        .replace("data = 64", "data = 256")
        .replace("topology = \"switch\"", "topology = \"fat-tree\"\nradix = 32");
    let path = scenario_file("fat-tree-256.toml", &text);
    let output = parasim(&["topo", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "fat-tree 2;16,16;1,16;1,1",
        "switches:   64",
        "links:      2048 directed (1024 cables)",
        "pruned:     from fat-tree 3;16,16,32;1,16,16;1,1,1 (room for 8192 NICs) to the switches 256 NICs need",
        "1 top level dropped",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn topo_writes_graphviz() {
    let dot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("quickstart.dot");
    let output = parasim(&["topo", QUICKSTART, "--dot", dot.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let graph = fs_err::read_to_string(&dot).unwrap();
    assert!(graph.starts_with("digraph") || graph.starts_with("graph"), "{}", &graph[..graph.len().min(80)]);
    // 64 GPUs, 8 NVSwitches and one network switch.
    assert!(graph.matches("->").count() + graph.matches("--").count() >= 128);
}

#[test]
fn every_fabric_runs_from_a_scenario() {
    for (name, network) in [
        ("fat-tree", "topology = \"fat-tree\"\nradix = 8\nrouting = \"ecmp\""),
        ("leaf-spine", "topology = \"leaf-spine\"\nradix = 16\noversubscription = [1, 2]"),
        ("xgft", "topology = \"xgft\"\nsimgrid = \"2;8,16;1,8;1,1\""),
        (
            "dragonfly",
            "topology = \"dragonfly\"\ngroups = 5\nrouters-per-group = 4\nhosts-per-router = 4\nglobal-links-per-router = 1\nrouting = \"ugal\"",
        ),
        ("cascade", "topology = \"cascade-dragonfly\"\nsimgrid = \"4,1;2,1;4,1;4\""),
        ("torus", "topology = \"torus\"\ndims = [4, 4, 4]"),
        ("ring", "topology = \"ring\""),
        ("fully-connected", "topology = \"fully-connected\""),
    ] {
        let text = quickstart_with(
            "topology = \"switch\"            # one non-blocking switch; every GPU has its own NIC",
            network,
        )
        .replace("fidelity = \"analytical\"", "fidelity = \"flow\"")
        .replace("nodes = 8", "nodes = 2")
        .replace("data = 64", "data = 16");
        let path = scenario_file(&format!("{name}.toml"), &text);
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(json["iteration_time_s"].as_f64().unwrap() > 0.0, "{name}");
    }
}

#[test]
fn network_keys_are_checked_against_their_topology() {
    let switch = "topology = \"switch\"            # one non-blocking switch; every GPU has its own NIC";
    assert_rejected(
        "radix-on-switch.toml",
        &quickstart_with(switch, "topology = \"switch\"\nradix = 8"),
        &["cluster.network.radix", "does not apply to topology \"switch\"", "link-bandwidth"],
    );
    assert_rejected(
        "unknown-topology.toml",
        &quickstart_with(switch, "topology = \"hypercube\""),
        &["cluster.network.topology", "\"hypercube\"", "fat-tree", "dragonfly"],
    );
    assert_rejected(
        "missing-radix.toml",
        &quickstart_with(switch, "topology = \"fat-tree\""),
        &["cluster.network.radix", "required"],
    );
    assert_rejected(
        "bad-routing.toml",
        &quickstart_with(switch, "topology = \"fat-tree\"\nradix = 8\nrouting = \"valiant\""),
        &["cluster.network.routing", "valiant", "dmodk"],
    );
    assert_rejected(
        "too-small.toml",
        &quickstart_with(switch, "topology = \"fat-tree\"\nradix = 4"),
        &["cluster.network", "64"],
    );
    assert_rejected(
        "bad-tiers.toml",
        &quickstart_with(switch, "topology = \"fat-tree\"\nradix = 8\ntier-bandwidth = [\"200 Gb/s\"]"),
        &["cluster.network.tier-bandwidth", "3 levels"],
    );
}

#[test]
fn flow_fidelity_is_deterministic_and_agrees_with_analytical_when_uncontended() {
    let flow = scenario_file(
        "quickstart-flow.toml",
        &quickstart_with("fidelity = \"analytical\"", "fidelity = \"flow\""),
    );
    let steps = scenario_file(
        "quickstart-steps.toml",
        &quickstart_with("fidelity = \"analytical\"", "fidelity = \"packet-steps\""),
    );
    let first = parasim(&["run", flow.to_str().unwrap(), "--json"]);
    let second = parasim(&["run", flow.to_str().unwrap(), "--json"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(first.stdout, second.stdout);
    let iteration = |output: &std::process::Output| {
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        json["iteration_time_s"].as_f64().unwrap()
    };
    let analytical = iteration(&parasim(&["run", QUICKSTART, "--json"]));
    let packet_steps = iteration(&parasim(&["run", steps.to_str().unwrap(), "--json"]));
    for (name, seconds) in [("flow", iteration(&first)), ("packet-steps", packet_steps)] {
        assert!(
            (seconds - analytical).abs() / analytical < 0.01,
            "{name} {seconds} s vs analytical {analytical} s"
        );
    }
}
