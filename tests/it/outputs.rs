//! Safe outputs (issue 38): one writer per sweep output, refused with the holder named; every
//! other output written through a temporary name, so a process stopped mid-write (here by the
//! file-size limit, as a full disk would stop it) leaves nothing under the final name; and no
//! command writes an output file any other way.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{QUICKSTART, parasim};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("outputs").join(name);
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(&dir).unwrap();
    dir
}

/// A sweep of 100,000 small configurations: one thread takes tens of seconds, long enough to
/// be the first writer while the others try.
fn long_sweep(dir: &Path) -> PathBuf {
    let path = dir.join("long.toml");
    fs_err::write(
        &path,
        "[base.cluster]\nnodes = 1\ndevice = \"a100-sxm4-80gb\"\n[base.workload]\nmodel = \"resnet18\"\nbatch-per-device = 16\n\
         [axes]\n\"workload.batch-per-device\" = { from = 1, to = 100000, step = 1 }\n[derived]\n\"parallelism.data\" = \"gpus\"\n",
    )
    .unwrap();
    path
}

/// Kills the first writer when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two writers on one sweep output: the second (a fresh sweep, a `--resume` as a Slurm requeue
/// would start, a `sweep merge` onto it) is refused with exit 2, naming the output and the
/// first writer's pid; once the first is gone the output is free again.
#[test]
fn a_second_writer_of_a_sweep_output_is_refused() {
    let dir = scratch("lock");
    let sweep = long_sweep(&dir);
    let out = dir.join("out.csv");
    let (sweep_arg, out_arg) = (sweep.to_str().unwrap(), out.to_str().unwrap());
    let first = Running(
        Command::new(env!("CARGO_BIN_EXE_parasim"))
            .args(["sweep", sweep_arg, "-o", out_arg, "-j", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let lock = dir.join("out.csv.lock");
    let started = Instant::now();
    while !fs_err::read_to_string(&lock).is_ok_and(|t| t.ends_with('\n')) {
        assert!(started.elapsed() < Duration::from_secs(30), "the first sweep never took the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = format!("pid {}", first.0.id());
    let shard = dir.join("shard.csv");
    for args in [
        vec!["sweep", sweep_arg, "-o", out_arg],
        vec!["sweep", sweep_arg, "-o", out_arg, "--resume"],
        vec!["sweep", "merge", out_arg, shard.to_str().unwrap()],
    ] {
        let output = parasim(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("{}: in use", out.display())), "{args:?}: {stderr}");
        assert!(stderr.contains(&pid) && stderr.contains("out.csv.lock"), "{args:?}: {stderr}");
    }
    drop(first);
    // The first writer was killed: its lock went with it, and its rows resume.
    let resumed = parasim(&["sweep", sweep_arg, "-o", out_arg, "--resume", "--count"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let small = dir.join("small.toml");
    fs_err::write(&small, fs_err::read_to_string(&sweep).unwrap().replace("to = 100000", "to = 3")).unwrap();
    let fresh = parasim(&["sweep", small.to_str().unwrap(), "-o", out_arg]);
    assert!(fresh.status.success(), "{}", String::from_utf8_lossy(&fresh.stderr));
    assert!(!lock.exists(), "a finished sweep leaves its lock file");
}

/// Every output file, its command stopped by a 4 KiB file-size limit (SIGXFSZ) in the middle
/// of writing it: nothing is left under the final name (before, a truncated file was).
#[test]
fn an_output_cut_short_leaves_nothing_under_its_name() {
    let dir = scratch("cut");
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/traces/HolisticTraceAnalysis/trace_diff/control/control.json.gz");
    assert!(trace.is_file(), "missing the shared trace {}", trace.display());
    let csv = dir.join("points.csv");
    fs_err::write(&csv, (0..2000).fold("x,y\n".to_string(), |t, i| t + &format!("{i},{}\n", i * i))).unwrap();
    let merged_shard = dir.join("whole.csv");
    let long = long_sweep(&dir);
    let small = dir.join("small.toml");
    fs_err::write(&small, fs_err::read_to_string(&long).unwrap().replace("to = 100000", "to = 200")).unwrap();
    let made = parasim(&["sweep", small.to_str().unwrap(), "-o", merged_shard.to_str().unwrap()]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let (q, t) = (QUICKSTART, trace.to_str().unwrap());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["run".into(), q.into(), "--trace".into(), "out.json".into()], "out.json"),
        (vec!["run".into(), q.into(), "--csv".into(), "out.csv".into()], "out.csv"),
        (vec!["topo".into(), q.into(), "--dot".into(), "out.dot".into()], "out.dot"),
        (vec!["man".into(), "-o".into(), "parasim.1".into()], "parasim.1"),
        (vec!["trace".into(), "convert".into(), t.into(), "out.pstrace".into()], "out.pstrace"),
        (
            vec!["replay".into(), t.into(), "--quiet".into(), "--trace".into(), "replay.json".into()],
            "replay.json",
        ),
        (
            vec![
                "collective".into(),
                "allreduce".into(),
                "-e".into(),
                "8G".into(),
                "--plot".into(),
                "c.svg".into(),
            ],
            "c.svg",
        ),
        (
            ["plot", "line", csv.to_str().unwrap(), "--x", "x", "--y", "y", "-o", "plot.png"]
                .map(String::from)
                .to_vec(),
            "plot.png",
        ),
        (
            vec!["sweep".into(), "merge".into(), "merged.csv".into(), merged_shard.to_str().unwrap().into()],
            "merged.csv",
        ),
    ];
    for (args, name) in cases {
        let command = format!("ulimit -f 4 && exec {} {}", env!("CARGO_BIN_EXE_parasim"), args.join(" "));
        let output = Command::new("sh").arg("-c").arg(&command).current_dir(&dir).output().unwrap();
        assert!(!output.status.success(), "{command}: the output fits in 4 KiB, the test proves nothing");
        assert!(!dir.join(name).exists(), "{command}: left a cut {name}");
    }
}

/// No command opens an output file but through `traces::atomic` (or, for the sweep rows that
/// are appended as they finish, under the output's lock): a grep of the binary's sources.
#[test]
fn outputs_are_written_only_through_the_atomic_helper() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // The sweep appends rows under its lock; the embedded suite, the benchmark guard's
    // generated inputs and the fuzz targets' cluster files are scratch in a temporary
    // directory (the guard's baseline goes through the helper); the lock file is the lock.
    let allowed = ["sweep_cmd.rs", "embedded.rs", "lock.rs", "bench_guard.rs", "fuzz.rs"];
    let mut found = Vec::new();
    for entry in fs_err::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if allowed.contains(&name.as_str()) {
            continue;
        }
        let text = fs_err::read_to_string(&path).unwrap();
        for (number, line) in text.lines().enumerate() {
            if ["File::create", "fs_err::write", "std::fs::write", "OpenOptions", "generate_to("]
                .iter()
                .any(|needle| line.contains(needle))
            {
                found.push(format!("src/{name}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "outputs written around traces::atomic:\n{}", found.join("\n"));
}
