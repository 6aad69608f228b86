//! `parasim compare` on the real 8-rank DLRM trace of `facebookresearch/param` (read from
//! ../shared, never copied) and `scenarios/dlrm-8xv100.toml`.

use std::path::{Path, PathBuf};
use std::process::Output;

use super::{parasim, scenario_file};

const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/dlrm-8xv100.toml");

/// The 8 rank files of param's `dlrm_kineto.tar.gz`, unpacked once into a scratch folder.
fn dlrm_directory() -> PathBuf {
    static UNPACKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    UNPACKED
        .get_or_init(|| {
            let archive = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../shared/data/traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz");
            assert!(
                archive.is_file(),
                "the real DLRM trace is missing: expected {} (the shared data folder beside the \
                 checkout; its PROVENANCE.md lists the files). These tests read it from there.",
                archive.display()
            );
            let target = scratch("compare-dlrm");
            let _ = std::fs::remove_dir_all(&target);
            fs_err::create_dir_all(&target).unwrap();
            let file = fs_err::File::open(&archive).unwrap();
            tar::Archive::new(flate2::read::GzDecoder::new(file)).unpack(&target).unwrap();
            let directory = target.join("dlrm_kineto");
            assert!(directory.is_dir(), "the archive has a dlrm_kineto/ folder");
            directory
        })
        .clone()
}

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

fn compare(trace: &Path, scenario: &str, json: bool) -> Output {
    let mut args = vec!["compare", trace.to_str().unwrap(), scenario];
    if json {
        args.push("--json");
    }
    parasim(&args)
}

fn compare_json(trace: &Path) -> serde_json::Value {
    let output = compare(trace, SCENARIO, true);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Asserts that `rows` are sorted by |difference|, largest first, and returns their names.
fn sorted_names(rows: &serde_json::Value) -> Vec<String> {
    let rows = rows.as_array().unwrap();
    let differences: Vec<f64> = rows.iter().map(|r| r["difference_s"].as_f64().unwrap().abs()).collect();
    assert!(differences.windows(2).all(|w| w[0] >= w[1]), "not sorted by |difference|: {differences:?}");
    for row in rows {
        let (m, s) = (row["measured_s"].as_f64().unwrap(), row["simulated_s"].as_f64().unwrap());
        assert!((row["difference_s"].as_f64().unwrap() - (s - m)).abs() < 1e-15);
    }
    rows.iter().map(|r| r["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn the_rows_exist_and_are_sorted_by_absolute_difference() {
    let json = compare_json(&dlrm_directory());
    assert_eq!(json["trace"]["world_size"], 8);
    assert_eq!(json["trace"]["steps"], serde_json::json!([10]));
    assert_eq!(json["scenario"]["gpus"], 8);
    let kernels = sorted_names(&json["kernels"]);
    for class in ["gemm", "elementwise", "embedding", "optimizer"] {
        assert!(kernels.iter().any(|k| k == class), "no {class} row in {kernels:?}");
    }
    let collectives = sorted_names(&json["collectives"]);
    for kind in ["all-to-all", "allreduce"] {
        assert!(collectives.iter().any(|k| k == kind), "no {kind} row in {collectives:?}");
    }
    // The trace's NCCL work per rank per iteration (PROVENANCE.md: 5 all-to-alls, 3 allreduces).
    let row =
        |name: &str| json["collectives"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap();
    assert_eq!(row("all-to-all")["measured_count"], 5.0);
    assert_eq!(row("allreduce")["measured_count"], 3.0);
    // parasim's DLRM is data parallel: no all-to-all is simulated (the scenario says why).
    assert_eq!(row("all-to-all")["simulated_count"], 0.0);
    assert!(row("all-to-all")["simulated_s"].as_f64().unwrap() == 0.0);

    let output = compare(&dlrm_directory(), SCENARIO, false);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in
        ["iteration", "GPU kernels", "NCCL", "measured", "simulated", "difference", "error", "all-to-all"]
    {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

/// The measured iteration is `parasim replay`'s, for the same traces, and so are the measured
/// NCCL times (the trace holds one step per rank, so per iteration is the whole trace).
#[test]
fn the_measured_side_is_what_replay_reports() {
    let directory = dlrm_directory();
    let compared = compare_json(&directory);
    let output = parasim(&["replay", directory.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let replay: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let comparison = &replay["comparison"];
    let measured = match &comparison["steady_mean_s"] {
        serde_json::Value::Null => comparison["mean_s"][0].as_f64().unwrap(),
        steady => steady[0].as_f64().unwrap(),
    };
    assert_eq!(compared["iteration"]["measured_s"].as_f64().unwrap(), measured);
    assert!((measured - 16.008e-3).abs() < 1e-6, "{measured}");
    for kind in comparison["collectives"].as_array().unwrap() {
        let name = kind["kind"].as_str().unwrap();
        let row = compared["collectives"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap();
        let (ours, theirs) = (row["measured_s"].as_f64().unwrap(), kind["measured_s"].as_f64().unwrap());
        assert!((ours - theirs).abs() <= 1e-12 * theirs, "{name}: {ours} vs replay's {theirs}");
        assert_eq!(row["measured_count"], kind["count_per_rank"], "{name}");
    }
}

/// `replay`'s progress names its counts: with standard error not a terminal (captured here),
/// plain lines, one a period (shortened by PARASIM_PROGRESS_PERIOD_MS), say how many MB of the
/// traces are read of their total, how many of the 8 rank files, and how many events so far;
/// the report is the same without them.
#[test]
fn replay_progress_lines_count_the_bytes_files_and_events_read() {
    let directory = dlrm_directory();
    let replay = |period: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_parasim"));
        command.args(["replay", directory.to_str().unwrap(), "--json"]);
        if let Some(period) = period {
            command.env("PARASIM_PROGRESS_PERIOD_MS", period);
        }
        command.output().unwrap()
    };
    let with = replay(Some("1"));
    let stderr = String::from_utf8_lossy(&with.stderr);
    assert!(with.status.success(), "{stderr}");
    let reading: Vec<&str> = stderr.lines().filter(|l| l.starts_with("replay: reading ")).collect();
    assert!(!reading.is_empty(), "no reading line:\n{stderr}");
    let total_mb = fs_err::read_dir(&directory)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .sum::<u64>()
        .div_ceil(1_000_000)
        .max(1);
    for line in &reading {
        // replay: reading 3/12 MB, 0.4 s elapsed[, ETA 1.0 s] (2/8 files, 51234 events)
        let counts = line.strip_prefix("replay: reading ").unwrap();
        let (read, rest) = counts.split_once('/').unwrap();
        let (total, rest) = rest.split_once(" MB, ").unwrap_or_else(|| panic!("{line}"));
        assert!(read.parse::<u64>().unwrap() <= total_mb, "{line}");
        assert_eq!(total.parse::<u64>().unwrap(), total_mb, "{line}");
        let note = rest.rsplit_once(" (").map(|(_, note)| note).unwrap_or_else(|| panic!("{line}"));
        let (files, events) = note.split_once(" files, ").unwrap_or_else(|| panic!("{line}"));
        let (files_read, files) = files.split_once('/').unwrap();
        assert!(files_read.parse::<u64>().unwrap() <= 8 && files == "8", "{line}");
        assert!(events.strip_suffix(" events)").unwrap().parse::<u64>().is_ok(), "{line}");
    }
    // Later lines name the later stages' counts, if the run lasted into them.
    for line in stderr.lines().filter(|l| l.starts_with("replay: simulating")) {
        assert!(line.contains(" ops on 8 ranks)"), "{line}");
    }
    let without = replay(None);
    assert_eq!(with.stdout, without.stdout);
    assert!(!String::from_utf8_lossy(&without.stderr).contains("replay: reading"));
}

#[test]
fn json_is_deterministic() {
    let first = compare(&dlrm_directory(), SCENARIO, true);
    let second = compare(&dlrm_directory(), SCENARIO, true);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(first.stdout, second.stdout);
}

/// Exit code 2, no panic, nothing on stdout, and stderr holds every needle.
fn assert_fails(output: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.stdout.is_empty());
    for needle in needles {
        assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
    }
}

#[test]
fn missing_and_empty_trace_directories_are_named() {
    let missing = scratch("compare-no-such-trace");
    assert_fails(&compare(&missing, SCENARIO, false), &["compare-no-such-trace"]);
    let empty = scratch("compare-empty-trace");
    fs_err::create_dir_all(&empty).unwrap();
    assert_fails(&compare(&empty, SCENARIO, false), &["compare-empty-trace", "no *.json"]);
}

#[test]
fn a_scenario_of_another_gpu_count_is_refused_naming_both() {
    let text = fs_err::read_to_string(SCENARIO).unwrap();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/models/dlrm-param-trace.toml");
    let four = text
        .replace("gpus-per-node = 8", "gpus-per-node = 4")
        .replace("data = 8", "data = 4")
        .replace("\"models/dlrm-param-trace.toml\"", &format!("{model:?}"));
    let path = scenario_file("dlrm-4-gpus.toml", &four);
    let output = compare(&dlrm_directory(), path.to_str().unwrap(), false);
    assert_fails(&output, &["dlrm-4-gpus.toml", "4 GPUs", "dlrm_kineto", "world size 8"]);
}

#[test]
fn a_trace_without_profiler_steps_is_refused_naming_the_file() {
    let target = scratch("compare-no-steps");
    let _ = std::fs::remove_dir_all(&target);
    fs_err::create_dir_all(&target).unwrap();
    let mut entries: Vec<PathBuf> =
        fs_err::read_dir(dlrm_directory()).unwrap().map(|entry| entry.unwrap().path()).collect();
    entries.sort();
    for path in &entries {
        let mut json: serde_json::Value = serde_json::from_slice(&fs_err::read(path).unwrap()).unwrap();
        json["traceEvents"]
            .as_array_mut()
            .unwrap()
            .retain(|event| !event["name"].as_str().is_some_and(|name| name.starts_with("ProfilerStep#")));
        fs_err::write(target.join(path.file_name().unwrap()), serde_json::to_vec(&json).unwrap()).unwrap();
    }
    let output = compare(&target, SCENARIO, false);
    assert_fails(&output, &["worker0_step_12", "no ProfilerStep#N markers", "8 of 8"]);
}

/// The output docs/traces.md shows is what the command prints today.
#[test]
fn the_documented_output_is_current() {
    let docs = include_str!("../../docs/traces.md");
    let command = "$ parasim compare /tmp/dlrm_kineto scenarios/dlrm-8xv100.toml\n";
    let start =
        docs.find(command).expect("docs/traces.md shows `parasim compare` on the DLRM trace") + command.len();
    let shown = &docs[start..start + docs[start..].find("```").unwrap()];
    let directory = dlrm_directory();
    let output = parasim(&["compare", directory.to_str().unwrap(), "scenarios/dlrm-8xv100.toml"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed =
        String::from_utf8(output.stdout).unwrap().replace(directory.to_str().unwrap(), "/tmp/dlrm_kineto");
    assert_eq!(printed, shown, "update the block in docs/traces.md");
}
