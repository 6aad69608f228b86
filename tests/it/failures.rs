//! `[failures]` and `[faults]` end to end: the goodput block of `run`, `--hours`, determinism,
//! and faults that slow a job, are routed around, or cut ranks off (docs/failures.md).

use crate::{parasim, quickstart_with, scenario_file};

const FAILURES: &str = "[failures]\ngpu-mtbf-hours = 2000\nnode-mtbf-hours = 20000\nrestart-minutes = 10\n\
checkpoint-bandwidth = \"10 GB/s\"\ncheckpoint-interval = 2000\n";

fn with_failures(name: &str, extra: &str) -> std::path::PathBuf {
    let text = quickstart_with("iterations = 1", &format!("iterations = 1\nseed = 3\n\n{FAILURES}{extra}"));
    scenario_file(name, &text)
}

#[test]
fn run_reports_goodput_the_same_for_the_same_seed() {
    let path = with_failures("failures-goodput.toml", "");
    let first = parasim(&["run", path.to_str().unwrap(), "--json", "--hours", "48"]);
    let second = parasim(&["run", path.to_str().unwrap(), "--json", "--hours", "48"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(first.stdout, second.stdout, "same seed, same output");
    let json: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    let goodput = &json["goodput"];
    assert_eq!(goodput["hours"], 48.0);
    let fraction = goodput["fraction"].as_f64().unwrap();
    assert!(fraction > 0.0 && fraction < 1.0, "{goodput}");
    // The hours add up to the budget.
    let parts: f64 = ["useful_hours", "lost_hours_checkpoint", "lost_hours_lost_work", "lost_hours_restart"]
        .iter()
        .map(|key| goodput[key].as_f64().unwrap())
        .sum();
    assert!((parts - 48.0).abs() < 1e-6, "{goodput}");
    // 25.6 M parameters, fp16 weights + fp32 master + momentum: 10 bytes each.
    assert_eq!(goodput["checkpoint_bytes"], 25_557_032u64 * 10);
    let text = parasim(&["run", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("goodput ") && text.contains("best        every"), "{text}");
    // Without [failures] nothing changes: no goodput block.
    let plain = parasim(&["run", crate::QUICKSTART, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(json.get("goodput").is_none());
}

#[test]
fn hours_without_failures_and_bad_failure_keys_are_refused() {
    let output = parasim(&["run", crate::QUICKSTART, "--hours", "5"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no [failures] table"));
    let bad = with_failures("failures-bad.toml", "events = [{ at-hours = 1, kind = \"gpu\", rank = 64 }]\n");
    let output = parasim(&["run", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("failures.events[0].rank") && stderr.contains("0 to 63"), "{stderr}");
}

#[test]
fn a_degraded_nic_slows_the_job_and_a_cut_off_rank_is_an_error() {
    let healthy = parasim(&["run", crate::QUICKSTART, "--json"]);
    let healthy: serde_json::Value = serde_json::from_slice(&healthy.stdout).unwrap();
    let degraded = scenario_file(
        "faults-degraded.toml",
        &format!(
            "{}\n[faults]\nlinks = [{{ link = \"gpu 5 (node 0.5) -> switch\", bandwidth-factor = 0.25 }}]\n",
            fs_err::read_to_string(crate::QUICKSTART).unwrap()
        ),
    );
    let output = parasim(&["run", degraded.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let slow: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let (before, after) =
        (healthy["iteration_time_s"].as_f64().unwrap(), slow["iteration_time_s"].as_f64().unwrap());
    assert!(after > before, "a NIC at a quarter of its rate slows the allreduce: {before} -> {after}");
    let cut = scenario_file(
        "faults-cut.toml",
        &format!(
            "{}\n[faults]\nlinks = [{{ link = \"gpu 5 (node 0.5) -> switch\", down = true }}]\n",
            fs_err::read_to_string(crate::QUICKSTART).unwrap()
        ),
    );
    let output = parasim(&["run", cut.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("faults.links[0]") && stderr.contains("ranks 5;"), "{stderr}");
}

/// The quickstart job under `flow` for `iterations` iterations, with `faults` as its
/// `[faults]` table; the `run --json` output.
fn flow_with_faults(name: &str, iterations: u32, faults: &str) -> serde_json::Value {
    let text = quickstart_with("fidelity = \"analytical\"", "fidelity = \"flow\"")
        .replace("iterations = 1", &format!("iterations = {iterations}"));
    let text = if faults.is_empty() { text } else { format!("{text}\n[faults]\n{faults}\n") };
    let path = scenario_file(name, &text);
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn iteration(json: &serde_json::Value) -> f64 {
    json["iteration_time_s"].as_f64().unwrap()
}

#[test]
fn a_nic_that_flaps_during_the_last_allreduce_delays_the_step_by_its_time_down() {
    const NIC: &str = "gpu 9 (node 1.1) -> switch";
    let healthy = flow_with_faults("flap-none.toml", 1, "");
    let step = iteration(&healthy);
    // Down from 1 ms before the end of the healthy step: the last gradient allreduce is in
    // flight (the step ends with it) and stalls until the NIC is back.
    let at_ms = (step - 1e-3) * 1e3;
    let flap = |length_ms: f64| {
        let faults =
            format!("links = [{{ link = \"{NIC}\", down = true, at-ms = {at_ms}, for-ms = {length_ms} }}]");
        flow_with_faults(&format!("flap-{length_ms}.toml"), 1, &faults)
    };
    let (five, ten) = (flap(5.0), flap(10.0));
    println!("healthy {step} s, down 5 ms {} s, down 10 ms {} s", iteration(&five), iteration(&ten));
    assert!(iteration(&five) > step + 3e-3, "the stalled allreduce ends after the NIC is back");
    // Past the window the same transfers run at the same rates: 5 ms more down, 5 ms later.
    assert!((iteration(&ten) - iteration(&five) - 5e-3).abs() < 1e-9);
    let line = five["link_conditions"][0].as_str().unwrap();
    assert!(line.starts_with(&format!("\"{NIC}\" (both ways) down for 5 ms from {:.3}", at_ms)), "{line}");
    // A window after the step ends changes nothing but the report's line.
    let late = flow_with_faults(
        "flap-late.toml",
        1,
        &format!("links = [{{ link = \"{NIC}\", down = true, at-ms = {}, for-ms = 5 }}]", step * 1e3 + 1.0),
    );
    assert_eq!(iteration(&late), step);
    // A flap every flapped step: each of three iterations starts when the last one ended, so
    // each meets the window at the same point of its own step and takes as long as the first.
    let period_ms = iteration(&five) * 1e3;
    let every = flow_with_faults(
        "flap-every.toml",
        3,
        &format!(
            "links = [{{ link = \"{NIC}\", down = true, at-ms = {at_ms}, for-ms = 5, every-ms = {period_ms} }}]"
        ),
    );
    let times: Vec<f64> =
        every["iteration_times_s"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
    assert_eq!(times.len(), 3);
    for time in &times {
        assert!((time - iteration(&five)).abs() < 1e-9, "{times:?} against {}", iteration(&five));
    }
}

#[test]
fn latency_noise_slows_the_job_the_same_way_for_the_same_seed() {
    let noise = "latency-noise = { distribution = \"lognormal\", mean-us = 20, cv = 1.0, kind = \"NIC\" }";
    let healthy = iteration(&flow_with_faults("noise-none.toml", 1, ""));
    let first = flow_with_faults("noise-a.toml", 1, noise);
    let again = flow_with_faults("noise-b.toml", 1, noise);
    assert!(iteration(&first) > healthy, "{healthy} -> {}", iteration(&first));
    assert_eq!(first["iteration_time_s"], again["iteration_time_s"]);
    assert_eq!(first["breakdown"], again["breakdown"]);
    let text = quickstart_with("fidelity = \"analytical\"", "fidelity = \"flow\"")
        .replace("iterations = 1", "iterations = 1\nseed = 5");
    let path = scenario_file("noise-seed.toml", &format!("{text}\n[faults]\n{noise}\n"));
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    let other: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_ne!(other["iteration_time_s"], first["iteration_time_s"], "another seed, other draws");
}
