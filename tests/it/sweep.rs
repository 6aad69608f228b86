//! `parasim sweep`: rows in configuration order whatever the thread count, shards that merge
//! into the unsharded output byte for byte, resume after a cut, and errors that name the key;
//! and the same over a real Slurm job array where one can be started.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{QUICKSTART, parasim, scenario_file};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/sweeps/quickstart-scaling.toml");

pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sweep").join(name);
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(&dir).unwrap();
    dir
}

fn ok(output: Output) -> Output {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// A small sweep (a ResNet-18 on 1-2 servers) with a broken configuration (0 nodes), a
/// skipped ones and ones that do not fit: 3 x 2 x 2 = 12 configurations.
pub(crate) fn small_sweep(dir: &Path) -> PathBuf {
    let text = r#"
[base.cluster]
nodes = 1
device = "a100-sxm4-80gb"
[base.cluster.network]
link-bandwidth = "200 Gb/s"
[base.workload]
model = "resnet18"
batch-per-device = 16
[axes]
"cluster.nodes" = [0, 1, 2]
"workload.batch-per-device" = [16, 200000]
"cluster.network.link-bandwidth" = ["100 Gb/s", "200 Gb/s"]
[derived]
"parallelism.data" = "gpus"
[[filter]]
when = "nodes == 2 and link-bandwidth == '100 Gb/s'"
reason = "no 100 Gb/s fabric for two servers"
"#;
    let path = dir.join("small.toml");
    fs_err::write(&path, text).unwrap();
    path
}

fn read(path: &Path) -> String {
    fs_err::read_to_string(path).unwrap()
}

#[test]
fn rows_are_in_order_whatever_the_thread_count() {
    let dir = scratch("threads");
    let sweep = small_sweep(&dir);
    let one = dir.join("one.csv");
    let two = dir.join("two.csv");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-j", "1", "-o", one.to_str().unwrap()]));
    let output = ok(parasim(&["sweep", sweep.to_str().unwrap(), "-j", "2", "-o", two.to_str().unwrap()]));
    assert_eq!(read(&one), read(&two));
    let eight = dir.join("eight.csv");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-j", "8", "-o", eight.to_str().unwrap()]));
    assert_eq!(read(&one), read(&eight));
    let stdout = ok(parasim(&["sweep", sweep.to_str().unwrap()])).stdout;
    assert_eq!(String::from_utf8(stdout).unwrap(), read(&one));
    let text = read(&one);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 + 12);
    assert!(lines[0].starts_with("# parasim sweep: configurations=12 fingerprint="), "{}", lines[0]);
    assert!(lines[1].starts_with(
        "index,axis.cluster.nodes,axis.workload.batch-per-device,axis.cluster.network.link-bandwidth,axis.parallelism.data,"
    ));
    assert!(lines[1].ends_with(",status,error"));
    let status = |i: usize| {
        let line = lines[2 + i];
        ["ok", "failed", "skipped", "does-not-fit"]
            .into_iter()
            .find(|s| line.contains(&format!(",{s},")))
            .unwrap_or("?")
    };
    // 0 nodes: failed with the scenario's message, and the batch goes on.
    assert_eq!((0..4).map(status).collect::<Vec<_>>(), ["failed"; 4]);
    assert!(lines[2].contains("cluster.nodes"), "{}", lines[2]);
    assert_eq!((4..8).map(status).collect::<Vec<_>>(), ["ok", "ok", "does-not-fit", "does-not-fit"]);
    assert_eq!(status(8), "skipped");
    assert!(lines[2 + 8].ends_with(",skipped,no 100 Gb/s fabric for two servers"), "{}", lines[10]);
    assert_eq!(status(9), "ok");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ran 12 (3 ok, 4 failed, 2 skipped, 3 does-not-fit)"), "{stderr}");
    assert!(
        stderr.contains("p50") && stderr.contains("p99") && stderr.contains("configurations/s"),
        "{stderr}"
    );

    // JSON Lines: the same rows as objects.
    let jsonl = dir.join("rows.jsonl");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", jsonl.to_str().unwrap()]));
    let text = read(&jsonl);
    let objects: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objects[0]["parasim_sweep"]["configurations"], 12);
    assert_eq!(objects[1 + 5]["status"], "ok");
    assert_eq!(objects[1 + 5]["cluster.gpus"], 8);
    assert!(objects[1 + 5]["iteration_time_s"].as_f64().unwrap() > 0.0);
    // The swept value and the metric of the same name are both kept, once each: a failed
    // configuration (0 nodes) reports no metric but keeps the value it was given.
    assert_eq!(objects[1]["axis.cluster.nodes"], 0);
    assert!(objects[1]["cluster.nodes"].is_null());
    assert_eq!(objects[1 + 5]["axis.cluster.nodes"], 1);
    assert_eq!(objects[1 + 5]["cluster.nodes"], 1);
    let columns = objects[0]["parasim_sweep"]["columns"].as_array().unwrap();
    for name in ["axis.cluster.nodes", "cluster.nodes"] {
        assert_eq!(columns.iter().filter(|c| *c == name).count(), 1, "{name}");
        assert_eq!(lines[1].split(',').filter(|c| *c == name).count(), 1, "{name} in the CSV");
    }
    for object in &objects[1..] {
        let keys: Vec<&String> = object.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), columns.len(), "every row holds every column once");
    }
}

/// Flattens `run --json`'s output into dotted keys and their values, lists left out, as the
/// sweep does.
fn flat_keys(value: &serde_json::Value, prefix: &str, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flat_keys(inner, &name, out);
            }
        }
        serde_json::Value::Array(_) => {}
        _ if prefix == "scenario" => {}
        _ => out.push((prefix.to_string(), value.clone())),
    }
}

/// A sweep of out-of-core (offloading) and DASO configurations: the keys only they report
/// (`breakdown.offload_stall_s`, `strategy.offload.*`, `strategy.daso.*`) are columns with their
/// values, every key `run --json` prints for a configuration is a column, and `--columns
/// breakdown.offload_stall_s` keeps that column.
#[test]
fn keys_only_some_configurations_report_are_columns() {
    let dir = scratch("optional-keys");
    let base = r#"
[cluster]
nodes = 2
gpus-per-node = 4
device = "v100-sxm2-16gb"
host-memory = "384 GiB"
[workload]
model = "resnet18"
batch-per-device = 128
precision = "fp16"
[parallelism]
data = 8
[simulation]
iterations = 4
"#;
    fs_err::write(dir.join("base.toml"), base).unwrap();
    let sweep = dir.join("optional.toml");
    fs_err::write(
        &sweep,
        "base = \"base.toml\"\n[axes]\n\"workload.offload\" = [\"none\", \"activations\"]\n\"parallelism.sync\" = [\"allreduce\", \"daso\"]\n",
    )
    .unwrap();
    let out = dir.join("rows.jsonl");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", out.to_str().unwrap()]));
    let text = read(&out);
    let objects: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objects.len(), 1 + 4);
    let columns: Vec<String> =
        serde_json::from_value(objects[0]["parasim_sweep"]["columns"].clone()).unwrap();
    // Configurations: (none, allreduce), (none, daso), (activations, allreduce), (activations, daso).
    for (i, object) in objects[1..].iter().enumerate() {
        assert_eq!(object["status"], "ok", "configuration {i}: {}", object["error"]);
    }
    let daso = &objects[1 + 1];
    assert_eq!(daso["axis.parallelism.sync"], "daso");
    assert!(daso["strategy.daso.global_sync_every"].as_u64().unwrap() > 0, "{daso}");
    assert!(objects[1]["strategy.daso.global_sync_every"].is_null());
    let offload = &objects[1 + 2];
    assert_eq!(offload["axis.workload.offload"], "activations");
    assert!(offload["strategy.offload.to_host_bytes"].as_u64().unwrap() > 0, "{offload}");
    assert!(offload["breakdown.offload_stall_s"].as_f64().unwrap() > 0.0, "{offload}");
    assert!(objects[1]["breakdown.offload_stall_s"].is_null());
    // Every key `run --json` prints for a configuration is a column.
    let run = ok(parasim(&[
        "run",
        dir.join("base.toml").to_str().unwrap(),
        "--json",
        "--set",
        "workload.offload=\"activations\"",
        "--set",
        "parallelism.sync=\"daso\"",
    ]));
    let mut keys = Vec::new();
    flat_keys(&serde_json::from_slice(&run.stdout).unwrap(), "", &mut keys);
    assert!(keys.iter().any(|(key, _)| key == "breakdown.offload_stall_s"));
    for (key, value) in &keys {
        // The busiest-link lists are counted by `run` alone (docs/network.md: counting link bytes
        // is off in sweeps, plan and validate, which keep their speed); they are not columns.
        if key.starts_with("busiest_link") {
            continue;
        }
        assert!(columns.contains(key), "run --json prints {key}, which is no column");
        assert_eq!(&objects[1 + 3][key], value, "{key}: the sweep's row and run --json differ");
    }
    // --columns names any of them.
    let csv = dir.join("stall.csv");
    ok(parasim(&[
        "sweep",
        sweep.to_str().unwrap(),
        "--columns",
        "breakdown.offload_stall_s,strategy.daso",
        "-o",
        csv.to_str().unwrap(),
    ]));
    let text = read(&csv);
    let header = text.lines().nth(1).unwrap();
    assert!(
        header.starts_with(
            "index,axis.workload.offload,axis.parallelism.sync,breakdown.offload_stall_s,strategy.daso."
        ),
        "{header}"
    );
    let output = parasim(&["sweep", sweep.to_str().unwrap(), "--columns", "breakdown.offload_stal"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no metric") && stderr.contains("breakdown.offload_stall_s"), "{stderr}");
}

/// A sweep over a cluster of mixed devices (the 2-stage A100 + H100 pipeline, its stage
/// placement and micro-batch swept) has, per device type, a column for each number of `run
/// --json`'s `devices` entry (`devices.a100-sxm4-80gb.busy`...), holding what `run --json` of
/// that configuration prints; a sweep without node groups has none; a finished file resumes.
#[test]
fn device_types_of_node_groups_are_columns_equal_to_run_json() {
    let dir = scratch("node-groups");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/mixed/pipeline-a100-h100.toml");
    let sweep = dir.join("mixed.toml");
    fs_err::write(
        &sweep,
        format!(
            "base = {:?}\n[axes]\n\"parallelism.stage-placement\" = [\"in-order\", \"by-speed\"]\n\"workload.micro-batch\" = [1, 2]\n",
            scenario.display().to_string()
        ),
    )
    .unwrap();
    let out = dir.join("rows.jsonl");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", out.to_str().unwrap()]));
    let objects: Vec<serde_json::Value> =
        read(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objects.len(), 1 + 4);
    let columns: Vec<String> =
        serde_json::from_value(objects[0]["parasim_sweep"]["columns"].clone()).unwrap();
    let device_columns: Vec<&String> = columns.iter().filter(|c| c.starts_with("devices.")).collect();
    let fields = ["achieved_tflops_per_device", "busy", "gpus", "mfu", "peak_tflops_per_device"];
    let expected: Vec<String> = ["a100-sxm4-80gb", "h100-sxm5-80gb"]
        .iter()
        .flat_map(|name| fields.iter().map(move |field| format!("devices.{name}.{field}")))
        .collect();
    assert_eq!(device_columns, expected.iter().collect::<Vec<_>>());
    for object in &objects[1..] {
        assert_eq!(object["status"], "ok", "{}", object["error"]);
        let placement = object["axis.parallelism.stage-placement"].as_str().unwrap();
        let micro_batch = object["axis.workload.micro-batch"].as_i64().unwrap();
        let run = ok(parasim(&[
            "run",
            scenario.to_str().unwrap(),
            "--json",
            "--set",
            &format!("parallelism.stage-placement={placement}"),
            "--set",
            &format!("workload.micro-batch={micro_batch}"),
        ]));
        let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        let devices = json["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2, "{json}");
        for device in devices {
            // The catalog's names are the report's, lower-cased.
            let name = device["device"].as_str().unwrap().to_ascii_lowercase();
            for field in fields {
                let column = format!("devices.{name}.{field}");
                assert!(!object[&column].is_null(), "{column} is empty: {object}");
                assert_eq!(object[&column], device[field], "{column}: the sweep's row and run --json differ");
            }
        }
        assert_eq!(object["iteration_time_s"], json["iteration_time_s"]);
    }
    // A finished file resumes (its header's device columns are this sweep's), adding nothing.
    let before = read(&out);
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "--resume", "-o", out.to_str().unwrap()]));
    assert_eq!(read(&out), before);
    // Without node groups, no device columns.
    let plain = dir.join("plain.csv");
    ok(parasim(&["sweep", EXAMPLE, "-o", plain.to_str().unwrap()]));
    let header = read(&plain).lines().nth(1).unwrap().to_string();
    assert!(!header.contains("devices."), "{header}");
}

#[test]
fn shards_merge_into_the_unsharded_output_byte_for_byte() {
    let dir = scratch("shards");
    let sweep = small_sweep(&dir);
    let whole = dir.join("whole.csv");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", whole.to_str().unwrap()]));
    let shard = |i: u32, how: &str| {
        let out = dir.join(format!("shard-{i}.csv"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_parasim"));
        command.args(["sweep", sweep.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        match how {
            "flag" => {
                command.args(["--shard", &format!("{i}/3")]);
            }
            "slurm" => {
                command
                    .env("SLURM_ARRAY_TASK_ID", (i + 10).to_string())
                    .env("SLURM_ARRAY_TASK_MIN", "10")
                    .env("SLURM_ARRAY_TASK_MAX", "12");
            }
            _ => {
                command.env("JOB_COMPLETION_INDEX", i.to_string()).env("SWEEP_SHARDS", "3");
            }
        }
        ok(command.output().unwrap());
        out
    };
    for how in ["flag", "slurm", "kubernetes"] {
        let shards: Vec<PathBuf> = (0..3).map(|i| shard(i, how)).collect();
        assert!(read(&shards[1]).lines().next().unwrap().contains("shard=1/3"));
        let merged = dir.join("merged.csv");
        let mut args = vec!["sweep", "merge", merged.to_str().unwrap()];
        args.extend(shards.iter().rev().map(|p| p.to_str().unwrap()));
        ok(parasim(&args));
        assert_eq!(read(&merged), read(&whole), "{how}");
    }
}

#[test]
fn merge_refuses_overlapping_incomplete_and_foreign_shards() {
    let dir = scratch("merge-errors");
    let sweep = small_sweep(&dir);
    let shard = |spec: &str, name: &str| {
        let out = dir.join(name);
        ok(parasim(&["sweep", sweep.to_str().unwrap(), "--shard", spec, "-o", out.to_str().unwrap()]));
        out.to_str().unwrap().to_string()
    };
    let a = shard("0/2", "a.csv");
    let b = shard("1/2", "b.csv");
    let merged = dir.join("m.csv");
    let merge = |inputs: &[&str]| {
        let mut args = vec!["sweep", "merge", merged.to_str().unwrap()];
        args.extend(inputs);
        let output = parasim(&args);
        assert_eq!(output.status.code(), Some(2), "{inputs:?} should be refused");
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    assert!(merge(&[&a, &a]).contains("overlap"));
    assert!(merge(&[&a]).contains("missing"));
    let text = read(Path::new(&b));
    let cut = dir.join("cut.csv");
    fs_err::write(&cut, &text[..text.len() - 40]).unwrap();
    assert!(merge(&[&a, cut.to_str().unwrap()]).contains("partial row"));
    let lines: Vec<&str> = text.lines().collect();
    let short = dir.join("short.csv");
    fs_err::write(&short, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    let error = merge(&[&a, short.to_str().unwrap()]);
    assert!(error.contains("short.csv is incomplete"), "{error}");
    let other = dir.join("other.toml");
    fs_err::write(&other, read(&sweep).replace("[16, 200000]", "[32, 200000]")).unwrap();
    let foreign = dir.join("foreign.csv");
    ok(parasim(&["sweep", other.to_str().unwrap(), "--shard", "1/2", "-o", foreign.to_str().unwrap()]));
    assert!(merge(&[&a, foreign.to_str().unwrap()]).contains("another sweep"));
    // The merged output's name says its format, as `sweep -o`'s does (issue 38: any extension
    // was written): a .txt, or no extension, is refused and nothing is written; a .jsonl for CSV
    // shards is refused as the wrong format.
    for name in ["m.txt", "m", "m.jsonl"] {
        let out = dir.join(name);
        let output = parasim(&["sweep", "merge", out.to_str().unwrap(), &a, &b]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(out.to_str().unwrap()), "{name}: {stderr}");
        let needle = if name == "m.jsonl" { "the shards are CSV" } else { ".csv or .jsonl" };
        assert!(stderr.contains(needle), "{name}: {stderr}");
        assert!(!out.exists(), "{name} was written");
    }
}

#[test]
fn resume_completes_a_cut_output_identically() {
    let dir = scratch("resume");
    let sweep = small_sweep(&dir);
    let whole = dir.join("whole.csv");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", whole.to_str().unwrap()]));
    let text = read(&whole);
    for cut_at in [text.len() / 2, text.find("index").unwrap() + 3, text.len() - 1] {
        let resumed = dir.join("resumed.csv");
        fs_err::write(&resumed, &text[..cut_at]).unwrap();
        let output =
            parasim(&["sweep", sweep.to_str().unwrap(), "--resume", "-o", resumed.to_str().unwrap()]);
        if cut_at < text.find('\n').unwrap() + 40 {
            // A cut inside the header: not a sweep output any more, refused.
            assert_eq!(output.status.code(), Some(2));
            continue;
        }
        ok(output);
        assert_eq!(read(&resumed), text, "cut at byte {cut_at}");
    }
    // Resuming a complete file runs nothing; resuming another sweep's file is refused.
    let output = ok(parasim(&["sweep", sweep.to_str().unwrap(), "--resume", "-o", whole.to_str().unwrap()]));
    assert!(String::from_utf8_lossy(&output.stderr).contains("12 already in the output: ran 0"));
    let output = parasim(&["sweep", EXAMPLE, "--resume", "-o", whole.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not this sweep's"));
}

/// `--resume` keeps only rows it can vouch for (issue 38: a complete but corrupt row and
/// JSON Lines content in a `.csv` were kept): each refusal names the file and the line.
#[test]
fn resume_refuses_corrupt_misformatted_and_foreign_outputs() {
    let dir = scratch("resume-checks");
    let sweep = small_sweep(&dir);
    let sweep = sweep.to_str().unwrap();
    let csv = dir.join("whole.csv");
    let jsonl = dir.join("whole.jsonl");
    ok(parasim(&["sweep", sweep, "-o", csv.to_str().unwrap()]));
    ok(parasim(&["sweep", sweep, "-o", jsonl.to_str().unwrap()]));
    let text = read(&csv);
    let lines: Vec<&str> = text.lines().collect();
    // The first metric: only numbers and swept values (no quoted commas) come before it.
    let column = lines[1].split(',').position(|c| c == "achieved_tflops_per_device").unwrap();
    let row = lines.iter().position(|l| l.ends_with(",ok,")).unwrap();
    let mut fields: Vec<&str> = lines[row].split(',').collect();
    fields[column] = "fast";
    let mut corrupt_lines = lines.clone();
    let corrupt_row = fields.join(",");
    corrupt_lines[row] = &corrupt_row;
    let corrupt = dir.join("corrupt.csv");
    fs_err::write(&corrupt, corrupt_lines.join("\n") + "\n").unwrap();
    let json_in_csv = dir.join("json.csv");
    fs_err::copy(&jsonl, &json_in_csv).unwrap();
    let csv_in_jsonl = dir.join("csv.jsonl");
    fs_err::copy(&csv, &csv_in_jsonl).unwrap();
    let foreign = dir.join("foreign.csv");
    ok(parasim(&["sweep", EXAMPLE, "-o", foreign.to_str().unwrap(), "--columns", "mfu"]));
    let line = format!("line {}", row + 1);
    let cases = [
        (&corrupt, vec![line.as_str(), "column achieved_tflops_per_device holds \"fast\", not a number"]),
        (&json_in_csv, vec!["line 1", "holds JSON Lines, not the CSV its name asks for"]),
        (&csv_in_jsonl, vec!["line 1", "not the JSON Lines its name asks for"]),
        (&foreign, vec!["is not this sweep's", "write to a new file"]),
    ];
    for (path, needles) in cases {
        let before = read(path);
        let output = parasim(&["sweep", sweep, "--resume", "-o", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(stderr.contains(&format!("{}: cannot resume", path.display())), "{stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
        }
        assert_eq!(read(path), before, "a refused resume changed {}", path.display());
    }
}

#[test]
fn bad_sweep_files_name_the_file_and_the_key() {
    for (name, text, needles) in [
        ("unknown-key.toml", "\"cluster.nodez\" = [1]", &["axes.\"cluster.nodez\"", "nodez"][..]),
        ("wrong-type.toml", "\"cluster.nodes\" = [\"two\"]", &["axes.\"cluster.nodes\"", "\"two\""]),
        (
            "bad-expression.toml",
            "[derived]\n\"parallelism.data\" = \"gpus * (\"",
            &["derived.\"parallelism.data\"", "column"],
        ),
    ] {
        let path = scenario_file(name, &format!("base = {QUICKSTART:?}\n[axes]\n{text}\n"));
        let output = parasim(&["sweep", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(name), "{name}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{name}: expected {needle:?} in {stderr}");
        }
        assert!(output.stdout.is_empty());
    }
    let output = parasim(&["sweep", EXAMPLE, "--shard", "4/4"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("numbered 0 to 3"));
}

/// The job script docs/slurm.md gives, for an array of `shards` tasks.
fn slurm_script(binary: &str, sweep: &Path, dir: &Path) -> String {
    format!(
        "#!/bin/bash\n#SBATCH --job-name=parasim-sweep\n#SBATCH --output={dir}/slurm-%A_%a.log\n#SBATCH --cpus-per-task=1\n\
         {binary} sweep {sweep} -j \"${{SLURM_CPUS_PER_TASK:-1}}\" --resume -o {dir}/shard-$SLURM_ARRAY_TASK_ID.csv\n",
        dir = dir.display(),
        sweep = sweep.display(),
    )
}

/// Why a real Slurm cannot be used here, if it cannot.
fn slurm_unavailable() -> Option<String> {
    let has = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !["sbatch", "sinfo", "slurmctld", "munged"].iter().all(|t| has(t)) {
        return Some("Slurm is not installed (Debian: slurm-wlm and munge; ../shared/reference/slurm/local-slurm.sh start installs and starts it as root)".into());
    }
    let idle = || {
        Command::new("sinfo")
            .args(["-h", "-o", "%T"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("idle"))
    };
    if idle() {
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/slurm/local-slurm.sh");
    if !script.exists() {
        return Some(format!("no idle Slurm node and no {} to start one", script.display()));
    }
    match Command::new("bash").arg(&script).arg("start").output() {
        Ok(output) if output.status.success() && idle() => None,
        Ok(output) => {
            Some(format!("local-slurm.sh start failed: {}", String::from_utf8_lossy(&output.stderr).trim()))
        }
        Err(error) => Some(format!("cannot run local-slurm.sh: {error}")),
    }
}

/// Set (to `1`) where a real Slurm must be used: `.ci/run` sets it after
/// `local-slurm.sh start` succeeds, so the Slurm test cannot pass by skipping there.
const REQUIRE_SLURM: &str = "PARASIM_REQUIRE_SLURM";

/// What the Slurm test does when Slurm is unavailable for `reason`: with `required` (see
/// [`REQUIRE_SLURM`]) fail saying so; otherwise the skip's line, written straight to standard
/// output (not through the test harness's capture) so that a CI log shows it.
fn slurm_skip(reason: &str, required: bool) -> Result<String, String> {
    if required {
        Err(format!("{REQUIRE_SLURM}=1 but the Slurm test cannot run: {reason}"))
    } else {
        Ok(format!(
            "a_slurm_job_array_merges_into_the_unsharded_output: skipped: {reason} (set {REQUIRE_SLURM}=1 to make this a failure)\n"
        ))
    }
}

#[test]
fn a_skipped_slurm_test_says_why_and_fails_where_slurm_is_required() {
    let line = slurm_skip("Slurm is not installed", false).unwrap();
    assert!(line.contains("skipped: Slurm is not installed"), "{line}");
    let error = slurm_skip("Slurm is not installed", true).unwrap_err();
    assert!(error.contains("PARASIM_REQUIRE_SLURM=1") && error.contains("not installed"), "{error}");
}

#[test]
fn a_slurm_job_array_merges_into_the_unsharded_output() {
    if let Some(reason) = slurm_unavailable() {
        let required = std::env::var(REQUIRE_SLURM).is_ok_and(|v| v == "1");
        match slurm_skip(&reason, required) {
            Ok(line) => {
                use std::io::Write as _;
                // Straight to the file descriptor: `print!` would be captured and hidden.
                let _ = std::io::stdout().lock().write_all(line.as_bytes());
                return;
            }
            Err(error) => panic!("{error}"),
        }
    }
    let dir = scratch("slurm");
    let whole = dir.join("whole.csv");
    ok(parasim(&["sweep", EXAMPLE, "-o", whole.to_str().unwrap()]));
    let script = dir.join("sweep.sbatch");
    fs_err::write(&script, slurm_script(env!("CARGO_BIN_EXE_parasim"), Path::new(EXAMPLE), &dir)).unwrap();
    let submitted = Command::new("timeout")
        .args(["300", "sbatch", "--wait", "--array=0-2", script.to_str().unwrap()])
        .current_dir(&dir)
        .output()
        .unwrap();
    let logs: String = fs_err::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| read(&p))
        .collect();
    assert!(
        submitted.status.success(),
        "sbatch: {}{}\n{logs}",
        String::from_utf8_lossy(&submitted.stdout),
        String::from_utf8_lossy(&submitted.stderr)
    );
    let merged = dir.join("merged.csv");
    let shards: Vec<String> =
        (0..3).map(|i| dir.join(format!("shard-{i}.csv")).display().to_string()).collect();
    let mut args = vec!["sweep", "merge", merged.to_str().unwrap()];
    args.extend(shards.iter().map(String::as_str));
    ok(parasim(&args));
    assert_eq!(read(&merged), read(&whole));
    assert!(logs.contains("shard 2/3"), "{logs}");
}

/// The fingerprint covers the build, not only the sweep: it differs from the hash of the sweep's
/// contents alone ([`scenario::sweep::Sweep::fingerprint`], which once hashed the crate version,
/// the same through hundreds of commits), and `--version` names the source revision it covers.
/// An output of another build (here: its fingerprint changed) is refused by resume and merge,
/// naming both fingerprints.
#[test]
fn the_fingerprint_covers_the_build_and_a_mismatch_names_both() {
    let dir = scratch("fingerprint");
    let sweep = small_sweep(&dir);
    let whole = dir.join("whole.csv");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", whole.to_str().unwrap()]));
    let text = read(&whole);
    let written = text.split("fingerprint=").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let contents = scenario::sweep::Sweep::load(&sweep).unwrap().fingerprint();
    assert_ne!(written, format!("{contents:016x}"), "the fingerprint is the sweep's contents alone");
    let version = String::from_utf8(ok(parasim(&["--version"])).stdout).unwrap();
    assert!(version.starts_with("parasim ") && version.contains(" ("), "{version}");

    let other = "0123456789abcdef";
    let foreign = dir.join("foreign.csv");
    fs_err::write(&foreign, text.replacen(&written, other, 1)).unwrap();
    let output = parasim(&["sweep", sweep.to_str().unwrap(), "--resume", "-o", foreign.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains(other) && error.contains(&written) && error.contains("build"), "{error}");
    let merged = dir.join("merged.csv");
    let output = parasim(&[
        "sweep",
        "merge",
        merged.to_str().unwrap(),
        whole.to_str().unwrap(),
        foreign.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains(other) && error.contains(&written) && error.contains("build"), "{error}");
}

/// A field with a comma, a quote and a `#` (a filter's reason, in the `error` column) is quoted
/// by the CSV writer and read back whole: by pandas-style readers (a `#` anywhere in the line
/// is inside quotes), by resume, by merge and by `plot`.
#[test]
fn quoted_fields_survive_resume_merge_and_plot() {
    let dir = scratch("quoting");
    let sweep = small_sweep(&dir);
    let reason = r#"no 100 Gb/s fabric, "two" servers #2"#;
    fs_err::write(
        &sweep,
        read(&sweep)
            .replace("reason = \"no 100 Gb/s fabric for two servers\"", &format!("reason = '{reason}'")),
    )
    .unwrap();
    let whole = dir.join("whole.csv");
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "-o", whole.to_str().unwrap()]));
    let text = read(&whole);
    let row = text.lines().nth(2 + 8).unwrap();
    assert!(row.starts_with("\"8\","), "a line with a # has every field quoted: {row}");
    assert!(row.ends_with(r#","skipped","no 100 Gb/s fabric, ""two"" servers #2""#), "{row}");
    let records = scenario::csv_text::records(&text).unwrap();
    assert_eq!(records[1 + 8].1.last().unwrap(), reason);
    assert!(records.iter().all(|(_, r)| r.len() == records[0].1.len()));
    // Resume after a cut in the quoted row, and merge of shards holding it.
    let cut = dir.join("cut.csv");
    let at = text.find(reason.split(',').next().unwrap()).unwrap() + 5;
    fs_err::write(&cut, &text[..at]).unwrap();
    ok(parasim(&["sweep", sweep.to_str().unwrap(), "--resume", "-o", cut.to_str().unwrap()]));
    assert_eq!(read(&cut), text);
    let shards: Vec<String> = (0..2)
        .map(|i| {
            let path = dir.join(format!("shard-{i}.csv"));
            let shard = format!("{i}/2");
            ok(parasim(&["sweep", sweep.to_str().unwrap(), "--shard", &shard, "-o", path.to_str().unwrap()]));
            path.display().to_string()
        })
        .collect();
    let merged = dir.join("merged.csv");
    ok(parasim(&["sweep", "merge", merged.to_str().unwrap(), &shards[0], &shards[1]]));
    assert_eq!(read(&merged), text);
    // plot reads the file (the quoted row is a skipped row, counted).
    let svg = dir.join("bars.svg");
    let output = ok(parasim(&["plot", "bars", whole.to_str().unwrap(), "-o", svg.to_str().unwrap()]));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("skipped"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
