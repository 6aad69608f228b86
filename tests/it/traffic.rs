//! `parasim traffic`: closed forms on fat-trees and dragonflies, determinism, the work
//! budget, traffic files.

use crate::{parasim, scenario_file};

const FAT_TREE: &str = "scenarios/fat-tree-k16.toml";

/// A cluster of 1-GPU hosts with `network` as its `[cluster.network]` table.
fn cluster(name: &str, nodes: u32, network: &str) -> String {
    let text = format!(
        "[cluster]\nnodes = {nodes}\ngpus-per-node = 1\ndevice = \"a100-sxm4-80gb\"\n\n[cluster.network]\n{network}\nlink-bandwidth = \"100 Gb/s\"\nlink-latency = \"1 us\"\n"
    );
    scenario_file(name, &text).to_str().unwrap().to_string()
}

fn traffic(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["traffic"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = parasim(&all);
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn completion(json: &serde_json::Value) -> f64 {
    json["completion_time_s"].as_f64().unwrap()
}

fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
    (actual - expected).abs() <= tolerance * expected
}

/// 16 MiB at 100 Gb/s.
const LINE_RATE_TIME: f64 = 16.0 * 1048576.0 / 12.5e9;

#[test]
fn a_shift_runs_at_line_rate_on_a_full_bisection_fat_tree_and_at_half_with_2_to_1_at_the_core() {
    // Shift 512 sends every host into the other half of the pods: every flow crosses the core.
    for k in ["1", "512"] {
        let json = traffic(&["--cluster", FAT_TREE, "shift", k, "--size", "16M"]);
        // Route latency: at most 6 links of 1 us.
        assert!(close(completion(&json), LINE_RATE_TIME, 0.005), "shift {k}: {}", completion(&json));
        assert!(json["efficiency"].as_f64().unwrap() > 0.99, "shift {k}");
    }
    let oversubscribed = cluster(
        "oversubscribed.toml",
        1024,
        "topology = \"fat-tree\"\nradix = 16\noversubscription = [1, 1, 2]",
    );
    let json = traffic(&["--cluster", &oversubscribed, "shift", "512", "--size", "16M"]);
    assert!(close(completion(&json), 2.0 * LINE_RATE_TIME, 0.005), "{}", completion(&json));
    assert!(close(json["efficiency"].as_f64().unwrap(), 0.5, 0.005));
    assert_eq!(json["busiest_links"][0]["kind"], "spine-core");
    // Shift 1 stays inside a pod of 64 hosts except for each pod's last host: most flows run
    // at line rate, the 16 that cross the core at half of it.
    let json = traffic(&["--cluster", &oversubscribed, "shift", "1", "--size", "16M"]);
    let p50 = json["flow_completion"]["p50_s"].as_f64().unwrap();
    assert!(close(p50, LINE_RATE_TIME, 0.005), "p50 {p50}");
    assert!(close(completion(&json), 2.0 * LINE_RATE_TIME, 0.005), "completion {}", completion(&json));
    let slow = json["per_flow"].as_array().unwrap().iter().filter(|f| f["finish_s"].as_f64().unwrap() > 2e-3);
    assert_eq!(slow.count(), 16);
}

#[test]
fn incast_n_takes_n_times_a_lone_flow() {
    let lone = completion(&traffic(&["--cluster", FAT_TREE, "incast", "1", "--size", "16M"]));
    for n in [2u32, 8, 31] {
        let json = traffic(&["--cluster", FAT_TREE, "incast", &n.to_string(), "--size", "16M"]);
        assert!(close(completion(&json), f64::from(n) * lone, 0.005), "incast {n}: {json}");
        // The receiver's NIC link is the bottleneck, full for the whole run.
        assert_eq!(json["busiest_links"][0]["kind"], "NIC");
        assert!(json["busiest_links"][0]["utilisation"].as_f64().unwrap() > 0.99);
    }
}

/// Kim et al. (ISCA 2008), the adversarial (worst-case) pattern: every host of group g sends
/// to group g+1. Minimal routing funnels a group's a*p hosts through the one global link
/// between two groups of a balanced dragonfly (p = h), so each gets 1/(a*h) of its line rate;
/// Valiant and UGAL spread the load over every global link.
#[test]
fn the_dragonfly_adversarial_pattern_under_minimal_valiant_and_ugal() {
    let shape = "topology = \"dragonfly\"\ngroups = 9\nrouters-per-group = 4\nhosts-per-router = 2\nglobal-links-per-router = 2";
    let run = |routing: &str| {
        let path = cluster(&format!("df-{routing}.toml"), 72, &format!("{shape}\nrouting = \"{routing}\""));
        traffic(&["--cluster", &path, "adversarial", "--size", "16M"])
    };
    let minimal = run("minimal");
    // a = 4, h = p = 2: 1/8 of the offered load, every global link g -> g+1 full.
    assert!(close(minimal["efficiency"].as_f64().unwrap(), 1.0 / 8.0, 0.005), "{minimal}");
    assert_eq!(minimal["busiest_links"][0]["kind"], "global");
    assert!(close(completion(&minimal), 8.0 * LINE_RATE_TIME, 0.005));
    for routing in ["valiant", "ugal"] {
        let json = run(routing);
        let speedup = completion(&minimal) / completion(&json);
        assert!(speedup > 1.5, "{routing}: only {speedup}x faster than minimal");
    }
}

#[test]
fn the_same_seed_gives_the_same_output_and_another_seed_another() {
    let args = |seed: &'static str| {
        ["traffic", "--cluster", FAT_TREE, "permutation", "--seed", seed, "--size", "1M", "--csv"]
    };
    let first = parasim(&args("5"));
    assert!(first.status.success());
    assert_eq!(first.stdout, parasim(&args("5")).stdout);
    assert_ne!(first.stdout, parasim(&args("6")).stdout);
    let text = String::from_utf8(first.stdout).unwrap();
    assert!(text.starts_with("src,dst,bytes,start_s,finish_s\n"), "{text}");
    assert_eq!(text.matches("src,").count(), 1, "one header row: {text}");
    // The CSV reads back as a traffic file (start_s in seconds, finish_s ignored) and gives
    // every flow the same finish.
    let again = scenario_file("again.csv", &text);
    let replayed = parasim(&["traffic", "--cluster", FAT_TREE, again.to_str().unwrap(), "--csv"]);
    assert!(replayed.status.success(), "{}", String::from_utf8_lossy(&replayed.stderr));
    assert_eq!(String::from_utf8(replayed.stdout).unwrap(), text);
}

#[test]
fn a_pattern_over_the_flow_limit_is_refused_before_it_is_built() {
    // 16,384 GPUs: an all-to-all has 268,419,072 flows.
    let path = scenario_file("big.toml", &crate::quickstart_with("nodes = 8", "nodes = 2048"));
    let started = std::time::Instant::now();
    let output = parasim(&["traffic", "--cluster", path.to_str().unwrap(), "all-to-all"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("268419072 flows") && stderr.contains("uniform-random --flows 16384 "),
        "{stderr}"
    );
    assert!(started.elapsed().as_secs() < 20);
    // Sampling it runs.
    let json =
        traffic(&["--cluster", path.to_str().unwrap(), "uniform-random", "--flows", "4096", "--size", "1M"]);
    assert_eq!(json["flows"], 4096);
}

#[test]
fn a_traffic_file_runs_with_start_times_and_bad_rows_name_the_line() {
    let file = scenario_file("flows.csv", "src,dst,bytes,start\n0,1,16M\n# a comment\n2,1,16M,1.342177 ms\n");
    let json = traffic(&["--cluster", FAT_TREE, file.to_str().unwrap()]);
    // The second flow starts as the first ends: no sharing, twice a lone flow.
    let lone = completion(&traffic(&["--cluster", FAT_TREE, "incast", "1", "--size", "16M"]));
    assert!(close(completion(&json), 2.0 * lone, 0.005), "{json}");
    assert_eq!(json["per_flow"][1]["start_s"].as_f64(), Some(1.342177e-3));
    let bad = scenario_file("bad-flows.csv", "0,1,16M\n0,1024,16M\n");
    let output = parasim(&["traffic", "--cluster", FAT_TREE, bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr.contains("bad-flows.csv: line 2: dst host 1024 does not exist"), "{stderr}");
}

#[test]
fn run_names_its_busiest_links_by_kind_under_flow_and_says_none_under_analytical() {
    let quickstart = "scenarios/quickstart.toml";
    let run = |fidelity: &str| {
        let set = format!("simulation.fidelity={fidelity}");
        let output = parasim(&["run", quickstart, "--set", &set, "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let analytical = run("analytical");
    assert!(analytical["busiest_links"].is_null() && analytical["busiest_link_per_kind"].is_null());
    let flow = run("flow");
    let links = flow["busiest_links"].as_array().unwrap();
    assert_eq!(links.len(), 10);
    let kinds: Vec<&str> = flow["busiest_link_per_kind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["NIC", "NVLink"]);
    for link in links {
        let utilisation = link["utilisation"].as_f64().unwrap();
        assert!(utilisation > 0.0 && utilisation <= 1.0, "{link}");
    }
    // topo --json names the same links, so the two join on the name (and the id).
    let topo = parasim(&["topo", quickstart, "--json"]);
    let topo: serde_json::Value = serde_json::from_slice(&topo.stdout).unwrap();
    let busiest = &links[0];
    let listed = &topo["link_list"][busiest["id"].as_u64().unwrap() as usize];
    assert_eq!(listed["name"], busiest["name"]);
    assert_eq!(listed["capacity_bytes_per_s"], busiest["capacity_bytes_per_s"]);
    let human = parasim(&["run", quickstart, "--set", "simulation.fidelity=flow"]);
    let human = String::from_utf8(human.stdout).unwrap();
    assert!(human.contains("busiest link of each kind"), "{human}");
    let human = String::from_utf8(parasim(&["run", quickstart]).stdout).unwrap();
    assert!(human.contains("per-link utilisation needs the flow network"), "{human}");
}

#[test]
fn run_trace_draws_the_busiest_links_utilisation_as_counter_tracks_and_changes_no_result() {
    let quickstart = "scenarios/quickstart.toml";
    for fidelity in ["flow", "packet-steps", "analytical"] {
        let set = format!("simulation.fidelity={fidelity}");
        let trace = scenario_file(&format!("links-{fidelity}.json"), "");
        let plain = parasim(&["run", quickstart, "--set", &set, "--json"]);
        let traced =
            parasim(&["run", quickstart, "--set", &set, "--json", "--trace", trace.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&traced.stderr);
        assert!(plain.status.success() && traced.status.success(), "{stderr}");
        // Recording the links' loads (a second run of the graph) changes nothing reported.
        assert_eq!(plain.stdout, traced.stdout, "{fidelity}");
        let report: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&fs_err::read(&trace).unwrap()).unwrap();
        let counters: Vec<&serde_json::Value> =
            json["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "C").collect();
        if fidelity == "analytical" {
            assert!(counters.is_empty());
            assert!(stderr.contains("no link counter tracks: analytical routes no flows"), "{stderr}");
            continue;
        }
        assert!(stderr.contains("10 link utilisation counter tracks"), "{stderr}");
        // One track per busiest link, named by its kind and name as `run --json` and
        // `topo --json` name it; its integral over time is the bytes it carried.
        let links = report["busiest_links"].as_array().unwrap();
        assert_eq!(links.len(), 10);
        let mut saturated = false;
        for link in links {
            let name = format!("{} {}", link["kind"].as_str().unwrap(), link["name"].as_str().unwrap());
            let points: Vec<(f64, f64)> = counters
                .iter()
                .filter(|e| e["name"] == name.as_str())
                .map(|e| (e["ts"].as_f64().unwrap(), e["args"]["utilisation"].as_f64().unwrap()))
                .collect();
            assert!(points.len() > 2, "{fidelity}: {name}: {points:?}");
            assert_eq!(points[0], (0.0, 0.0), "{name}");
            assert_eq!(points.last().unwrap().1, 0.0, "{name}: idle at the end");
            assert!(points.windows(2).all(|w| w[0].0 < w[1].0), "{name}: in time order");
            assert!(points.iter().all(|&(_, u)| (0.0..=1.0).contains(&u)), "{name}");
            saturated |= points.iter().any(|&(_, u)| u == 1.0);
            let capacity = link["capacity_bytes_per_s"].as_f64().unwrap();
            let carried: f64 = points.windows(2).map(|w| w[0].1 * capacity * (w[1].0 - w[0].0) * 1e-6).sum();
            let bytes = link["bytes"].as_f64().unwrap();
            assert!((carried / bytes - 1.0).abs() < 1e-6, "{fidelity}: {name}: {carried} of {bytes}");
        }
        assert!(saturated, "{fidelity}: the allreduce fills its NICs at times");
        assert_eq!(
            counters.len(),
            counters.iter().filter(|e| e["pid"] == 64).count(),
            "one process after the ranks"
        );
    }
}

#[test]
fn a_degraded_link_is_reported_at_the_capacity_it_ran_at() {
    let faults = "iterations = 1\n\n[faults]\nlinks = [{ link = \"gpu 8 (node 1.0) -> switch\", bandwidth-factor = 0.5 }]";
    let path = scenario_file("degraded.toml", &crate::quickstart_with("iterations = 1", faults));
    let output = parasim(&["run", path.to_str().unwrap(), "--set", "simulation.fidelity=flow", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // The NIC cable at half its 25 GB/s (both directions) carries what its healthy neighbours
    // carry, so it is the busiest, at twice their utilisation.
    let links = json["busiest_links"].as_array().unwrap();
    assert_eq!(links[0]["name"], "gpu 8 (node 1.0) -> switch");
    assert_eq!(links[1]["name"], "switch -> gpu 8 (node 1.0)");
    assert_eq!(links[0]["capacity_bytes_per_s"].as_f64(), Some(12.5e9));
    assert_eq!(links[2]["capacity_bytes_per_s"].as_f64(), Some(25e9));
    let ratio = links[0]["utilisation"].as_f64().unwrap() / links[2]["utilisation"].as_f64().unwrap();
    assert!((ratio - 2.0).abs() < 0.01, "{ratio}: {links:?}");
}

#[test]
fn traffic_runs_on_the_fabric_with_its_faults_for_a_while() {
    // The quickstart's 64 GPUs, an all-to-all of 1 MiB per pair: healthy, then with GPU 9's NIC
    // down from 0.1 ms for 5 ms. Its flows stall while it is down and finish after it is back;
    // the others are not held (they do not cross it): the median flow is as fast.
    let completion = |name: &str, faults: &str| {
        let text = format!("{}{faults}", fs_err::read_to_string(crate::QUICKSTART).unwrap());
        let path = scenario_file(name, &text);
        let output = parasim(&[
            "traffic",
            "--cluster",
            path.to_str().unwrap(),
            "all-to-all",
            "--size",
            "1M",
            "--json",
        ]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        (json["completion_time_s"].as_f64().unwrap(), json["flow_completion"]["p50_s"].as_f64())
    };
    let (healthy, healthy_p50) = completion("traffic-healthy.toml", "");
    let flap = "\n[faults]\nlinks = [{ link = \"gpu 9 (node 1.1) -> switch\", down = true, at-ms = 0.1, for-ms = 5 }]\n";
    let (flapped, flapped_p50) = completion("traffic-flap.toml", flap);
    println!("healthy {healthy} s (p50 {healthy_p50:?}), flapped {flapped} s (p50 {flapped_p50:?})");
    assert!(flapped > 5.1e-3 && flapped < healthy + 5e-3 + 1e-4, "{healthy} -> {flapped}");
    assert!(flapped_p50 <= healthy_p50, "{healthy_p50:?} -> {flapped_p50:?}");
}
