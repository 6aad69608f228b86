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
