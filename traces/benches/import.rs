//! Import benchmarks: Kineto JSON import against loading the same trace from a `.pstrace`
//! file, on the real traces in ../shared/data/traces; and the import time and memory of a
//! large synthetic trace.
//!
//! `cargo bench -p traces --bench import` runs both; `PARASIM_BENCH_TRACE_MB` sets the size
//! of the synthetic trace (default 128), `PARASIM_BENCH_REAL=0` skips the real traces.
//! Memory is the growth of the process's peak resident set (Linux `VmHWM`, reset through
//! `/proc/self/clear_refs`) during the import, measured first, before anything else has
//! grown the heap.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use traces::synthetic::SyntheticJob;

fn status_bytes(field: &str) -> Option<u64> {
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let started = Instant::now();
        let value = f();
        best = best.min(started.elapsed());
        last = Some(value);
    }
    (best, last.expect("at least one run"))
}

fn synthetic(megabytes: u64, tmp: &Path) {
    let path = tmp.join("bench-synthetic.json");
    let job = SyntheticJob::sized(megabytes << 20);
    let started = Instant::now();
    {
        let mut file = fs_err::File::create(&path).expect("create the synthetic trace");
        job.write_rank(0, &mut file).expect("write the synthetic trace");
    }
    let size = fs_err::metadata(&path).expect("synthetic trace").len();
    println!(
        "synthetic trace: {:.1} MB ({} steps) written in {:.1} s",
        size as f64 / 1e6,
        job.steps,
        started.elapsed().as_secs_f64()
    );
    let reset = fs_err::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_bytes("VmRSS:");
    let started = Instant::now();
    let imported = traces::kineto::import(std::slice::from_ref(&path)).expect("import the synthetic trace");
    let elapsed = started.elapsed();
    let peak = status_bytes("VmHWM:");
    let ops: usize = imported.trace.ranks.iter().map(|r| r.gpu_ops.len()).sum();
    println!(
        "  import: {:.2} s ({:.0} MB/s), {ops} GPU ops",
        elapsed.as_secs_f64(),
        size as f64 / 1e6 / elapsed.as_secs_f64()
    );
    if let (Some(before), Some(peak)) = (before, peak) {
        let growth = peak.saturating_sub(before);
        println!(
            "  memory: peak RSS grew by {:.1} MB = {:.2}x the file (RSS before {:.1} MB; peak reset: {reset})",
            growth as f64 / 1e6,
            growth as f64 / size as f64,
            before as f64 / 1e6
        );
    }
    drop(imported);
    let _ = fs_err::remove_file(&path);
}

fn real(tmp: &Path) {
    let shared =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/traces/HolisticTraceAnalysis");
    if !shared.is_dir() {
        println!("real traces: {} is missing, skipped", shared.display());
        return;
    }
    println!(
        "\n{:<44} {:>10} {:>12} {:>12} {:>10} {:>8}",
        "trace", "gz size", "JSON import", "binary load", ".pstrace", "speedup"
    );
    for name in [
        "df_index_resolver/df_index_resolver.json.gz",
        "trace_diff/control/control.json.gz",
        "trace_diff/test/test.json.gz",
        "negative_queue_length_values_check/rank0.json.gz",
        "nccl_parser_config/nccl_data.json.gz",
        "trace_filter/sampled_rank-0.json.gz",
    ] {
        let path = shared.join(name);
        let gz = fs_err::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let (json, imported) =
            best_of(3, || traces::kineto::import(std::slice::from_ref(&path)).expect("import"));
        let binary_path = tmp.join("bench.pstrace");
        traces::binary::write(&imported.trace, &binary_path).expect("write .pstrace");
        let size = fs_err::metadata(&binary_path).map(|m| m.len()).unwrap_or(0);
        let (binary, loaded) = best_of(10, || traces::binary::read(&binary_path).expect("read .pstrace"));
        assert_eq!(loaded, imported.trace);
        println!(
            "{:<44} {:>8.2} MB {:>9.1} ms {:>9.2} ms {:>7.2} MB {:>7.0}x",
            name.rsplit('/').next().unwrap_or(name),
            gz as f64 / 1e6,
            json.as_secs_f64() * 1e3,
            binary.as_secs_f64() * 1e3,
            size as f64 / 1e6,
            json.as_secs_f64() / binary.as_secs_f64()
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs benchmarks without it,
    // as a smoke test: skip the minutes of work then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let megabytes = std::env::var("PARASIM_BENCH_TRACE_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
    synthetic(megabytes, &tmp);
    if std::env::var("PARASIM_BENCH_REAL").as_deref() != Ok("0") {
        real(&tmp);
    }
}
