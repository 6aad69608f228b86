//! `parasim calibrate` on the real traces in ../shared (read from there, never copied), and
//! scenarios that name the profiles it writes.

use std::path::PathBuf;
use std::process::Output;

use workloads::profile::{ClassError, Profile};

use super::{QUICKSTART, parasim, quickstart_with, scenario_file};

/// A file under `../shared/data/traces`, which must exist (CI has it).
fn shared_trace(relative: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/traces");
    assert!(
        root.is_dir(),
        "the real traces are missing: expected the shared data folder at {} (beside the checkout; \
         its PROVENANCE.md lists the files). These tests read them from there and never copy them.",
        root.display()
    );
    let path = root.join(relative);
    assert!(path.is_file(), "missing shared trace {} (see PROVENANCE.md there)", path.display());
    path
}

/// The 8 rank files of param's `dlrm_kineto.tar.gz` (V100-SXM2-32GB), unpacked once.
fn dlrm_directory() -> PathBuf {
    static UNPACKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    UNPACKED
        .get_or_init(|| {
            let archive = shared_trace("param/et_replay/tests/inputs/dlrm_kineto.tar.gz");
            let target = scratch("calibrate-dlrm");
            let _ = std::fs::remove_dir_all(&target);
            fs_err::create_dir_all(&target).unwrap();
            let file = fs_err::File::open(&archive).unwrap();
            tar::Archive::new(flate2::read::GzDecoder::new(file)).unpack(&target).unwrap();
            target.join("dlrm_kineto")
        })
        .clone()
}

/// `parasim calibrate TRACES... --device DEVICE REST...`.
fn calibrate(traces: &[&PathBuf], device: &str, rest: &[&str]) -> Output {
    let mut args = vec!["calibrate"];
    args.extend(traces.iter().map(|t| t.to_str().unwrap()));
    args.extend(["--device", device]);
    args.extend(rest);
    parasim(&args)
}

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

fn class<'a>(list: &'a [ClassError], name: &str) -> &'a ClassError {
    list.iter().find(|e| e.class == name).unwrap_or_else(|| panic!("no {name} row in {list:?}"))
}

/// Each shipped profile is what `parasim calibrate` writes for its trace today (the files in
/// data/profiles cannot go stale or be edited by hand), and it predicts the kernels better
/// than the defaults do.
#[test]
fn the_shipped_profiles_are_reproduced_from_their_traces_and_beat_the_defaults() {
    let v100 = [
        shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz"),
        // Same silicon as the 16 GB card (same peaks and bandwidth): one device type.
        dlrm_directory(),
    ];
    let a100 = [shared_trace("HolisticTraceAnalysis/trace_diff/control/control.json.gz")];
    let a100_80 = [shared_trace("HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz")];
    // The communication slowdowns the traces fit (docs/compute-model.md, "Results") move the
    // other parameters so that DeepBench's V100 fp32 products fall 2.1 points below the
    // defaults, past issue 12's transfer rule, and the A100's memory efficiency to the edge of
    // its range (which nccl-tests' one-rank copy reads): the shipped A100 profile holds them
    // off.
    // Every shipped profile holds `l2-hit-fraction` at 0 (off), as before it existed: fitted,
    // it moves the A100's memory efficiency, which the suite reads (docs/compute-model.md,
    // "Results").
    // It holds `unaligned-memory-efficiency` at 1 too, as it priced before the key: fitted
    // (0.639), the profile's memory efficiency rises from 0.884 to 0.911, which takes the
    // one-rank copy of `nccl-tests/azure-a100-1` from 92.6% to 91.8%, and its GEMM ceiling
    // falls from 0.820 to 0.719 (docs/compute-model.md, "Results").
    let a100_held: &[&str] = &[
        "--hold",
        "unaligned-memory-efficiency=1",
        "--hold",
        "communication-memory-slowdown=1",
        "--hold",
        "communication-compute-slowdown=1",
        "--hold",
        "communication-launch-slowdown=1",
        "--hold",
        "l2-hit-fraction=0",
    ];
    // The A100 80 GB trace (TorchRec) decides only the element-wise memory curve and the
    // per-kernel cost: its 25 products are too few for the GEMM curve, and its reductions are
    // integer sums over a few rows, starved of parallelism, that would make every layer norm of
    // a transformer 16 times too slow. Those parameters stay at their defaults, held.
    let held_80: Vec<&str> = [
        "gemm-efficiency=0.8",
        "unaligned-gemm-efficiency=1",
        "unaligned-memory-efficiency=1",
        "gemm-ramp-exponent=1",
        "gemm-half-time=3us",
        "vector-gemm-efficiency=0.9",
        "reduction-memory-efficiency=0.8",
        "reduction-half-time=10us",
        "memory-half-time=1us",
        "communication-memory-slowdown=1",
        "communication-compute-slowdown=1",
        "communication-launch-slowdown=1",
        "reduction-overhead=0 s",
        "l2-hit-fraction=0",
    ]
    .iter()
    .flat_map(|value| ["--hold", value])
    .collect();
    // The V100 profile is the fit from before row-wise normalisations had their class, kept:
    // re-fitted with them (and the slowdowns held), its memory efficiency falls from 0.777 to
    // 0.764 and ResNet-50's one-V100 step from 93.0% to 92.4% against the defaults' 94.8%,
    // past the transfer rule (docs/compute-model.md, "Results"). Every parameter is held at
    // that fit's value; the report's errors are the kept profile's under today's pricing.
    let v100_held: Vec<String> = [
        "gemm-efficiency=0.8",
        // DLRM's fp32 products stop short of saturation, so the V100 traces cannot decide the
        // vector units' ceiling: its default, measured on DeepBench's largest products.
        "vector-gemm-efficiency=0.9",
        "unaligned-gemm-efficiency=0.9658",
        // Before the key existed: unaligned products streamed at the aligned rate.
        "unaligned-memory-efficiency=1",
        "gemm-ramp-exponent=0.7037",
        "gemm-half-time=15.317 us",
        "memory-efficiency=0.7766",
        "reduction-memory-efficiency=0.05",
        "memory-half-time=1 ns",
        "vector-efficiency=0.5",
        "launch-overhead=4.098 us",
        "gemm-tile-half-intensity=6.0",
        "gemm-wave-overhead=2 us",
        "conv-efficiency=0.999",
        "conv-backward-weight-efficiency=0.999",
        "conv-backward-data-efficiency=0.999",
        "reduction-half-time=11.771 us",
        "communication-memory-slowdown=1",
        "communication-compute-slowdown=1",
        "communication-launch-slowdown=1",
        "reduction-overhead=0 s",
        "l2-hit-fraction=0",
    ]
    .iter()
    .flat_map(|pair| ["--hold".to_string(), pair.to_string()])
    .collect();
    let v100_held: Vec<&str> = v100_held.iter().map(String::as_str).collect();
    for (traces, device, dtype, hold) in [
        (&a100[..], "a100-sxm4-40gb", "tf32", a100_held),
        (&a100_80[..], "a100-sxm4-80gb", "tf32", &held_80[..]),
        (&v100[..], "v100-sxm2-16gb", "fp32", &v100_held[..]),
    ] {
        let output = scratch(&format!("{device}.toml"));
        let traces: Vec<&PathBuf> = traces.iter().collect();
        let mut rest = vec!["-o", output.to_str().unwrap(), "--by-operator"];
        rest.extend(hold);
        let run = calibrate(&traces, device, &rest);
        let report = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        for needle in ["gemm-efficiency", "held-out shapes", "aten::mm", "left out of the fit"] {
            assert!(report.contains(needle), "{needle:?} missing from:\n{report}");
        }
        let written = Profile::from_toml_str(&fs_err::read_to_string(&output).unwrap()).unwrap();
        let shipped = Profile::builtin(device).unwrap();
        assert_eq!(
            written.compute, shipped.compute,
            "data/profiles/{device}.toml is stale: re-run calibrate"
        );
        assert_eq!(written.calibration, shipped.calibration);

        let record = written.calibration.unwrap();
        assert!(record.gemm_dtypes.iter().any(|d| d == dtype), "{:?}", record.gemm_dtypes);
        assert!(record.operators > 1000, "{}", record.operators);
        let (fitted, default) = (class(&record.fit, "all"), class(&record.default_model, "all"));
        assert!(fitted.median_error < default.median_error, "{fitted:?} vs {default:?}");
        assert!(
            fitted.total_error().abs() < default.total_error().abs().max(0.08),
            "{fitted:?} vs {default:?}"
        );
        // Shapes the fit never saw are predicted about as well as the fitted ones.
        let held_out = class(&record.held_out, "all");
        assert!(held_out.weighted_error < 1.25 * fitted.weighted_error, "{held_out:?} vs {fitted:?}");
    }
}

#[test]
fn a_trace_of_another_gpu_is_refused_by_name() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/control/control.json.gz");
    let output = scratch("wrong-device.toml");
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &["-o", output.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(error.contains("A100-PG509-200") && error.contains("v100-sxm2-16gb"), "{error}");
    assert!(!output.exists(), "nothing is written on error");

    let other = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let run = calibrate(&[&trace, &other], "a100-sxm4-40gb", &["-o", output.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(
        error.contains("test.json.gz")
            && error.contains("V100-SXM2-16GB")
            && error.contains("a100-sxm4-40gb"),
        "{error}"
    );
}

#[test]
fn a_trace_without_shapes_says_how_to_record_them() {
    let trace = shared_trace("HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz");
    let output = scratch("no-shapes.toml");
    let run = calibrate(&[&trace], "v100-sxm2-32gb", &["-o", output.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(error.contains("record_shapes=True") && error.contains("df_index_resolver"), "{error}");
}

#[test]
fn a_scenario_names_a_profile_by_device_or_by_file() {
    let a100_40 = quickstart_with("device = \"a100-sxm4-80gb\"", "device = \"a100-sxm4-40gb\"");
    let defaults = scenario_file("profile-none.toml", &a100_40);
    let builtin = scenario_file(
        "profile-builtin.toml",
        &format!("{a100_40}\n[compute]\nprofile = \"a100-sxm4-40gb\"\n"),
    );
    let json = |path: &PathBuf| {
        let run = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        serde_json::from_slice::<serde_json::Value>(&run.stdout).unwrap()
    };
    let (plain, calibrated) = (json(&defaults), json(&builtin));
    assert!(plain["model"]["compute_model"].as_str().unwrap().starts_with("defaults"));
    let source = calibrated["model"]["compute_model"].as_str().unwrap();
    assert!(
        source.contains("a100-sxm4-40gb (built-in)") && source.contains("extrapolated to fp16"),
        "{source}"
    );
    assert_ne!(plain["iteration_time_s"], calibrated["iteration_time_s"]);

    // A file next to the scenario, with one key overridden.
    let profile =
        fs_err::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/profiles/a100-sxm4-40gb.toml"))
            .unwrap();
    fs_err::write(scratch("my-a100.toml"), profile).unwrap();
    let by_file = scenario_file(
        "profile-file.toml",
        &format!("{a100_40}\n[compute]\nprofile = \"my-a100.toml\"\nlaunch-overhead = \"1 us\"\n"),
    );
    let source = json(&by_file)["model"]["compute_model"].as_str().unwrap().to_string();
    assert!(source.contains("my-a100.toml") && source.contains("1 key(s) set"), "{source}");

    // The V100 32 GB computes like the 16 GB card: the shipped V100 profile serves it.
    let v100_32 = scenario_file(
        "profile-v100-32.toml",
        &format!(
            "{}\n[compute]\nprofile = \"v100-sxm2-32gb\"\n",
            quickstart_with("device = \"a100-sxm4-80gb\"", "device = \"v100-sxm2-32gb\"")
        ),
    );
    let source = json(&v100_32)["model"]["compute_model"].as_str().unwrap().to_string();
    assert!(source.contains("v100-sxm2-32gb (built-in)"), "{source}");
}

#[test]
fn a_profile_of_another_device_or_a_broken_one_is_an_error_naming_the_key() {
    // The quickstart runs on 80 GB A100s.
    refused(
        "profile-wrong-device.toml",
        "profile = \"v100-sxm2-16gb\"",
        &["compute.profile", "calibrated on v100-sxm2-16gb"],
    );

    fs_err::write(
        scratch("broken-profile.toml"),
        "device = \"a100-sxm4-80gb\"\n[compute]\ngemm-efficiency = 1.5\n",
    )
    .unwrap();
    refused(
        "profile-broken.toml",
        "profile = \"broken-profile.toml\"",
        &["broken-profile.toml", "gemm-efficiency"],
    );

    // A slowdown below 1, in a profile or in the scenario's own [compute] table.
    fs_err::write(
        scratch("fast-profile.toml"),
        "device = \"a100-sxm4-80gb\"\n[compute]\ncommunication-launch-slowdown = 0.5\n",
    )
    .unwrap();
    refused(
        "profile-fast.toml",
        "profile = \"fast-profile.toml\"",
        &["fast-profile.toml", "communication-launch-slowdown", "at least 1"],
    );
    refused("slowdown-key.toml", "communication-memory-slowdown = 0.9", &["communication-memory-slowdown"]);

    let unknown = scenario_file(
        "profile-unknown.toml",
        &format!("{}\n[compute]\nprofile = \"tpu-v9\"\n", fs_err::read_to_string(QUICKSTART).unwrap()),
    );
    let run = parasim(&["run", unknown.to_str().unwrap()]);
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(error.contains("tpu-v9") && error.contains("v100-sxm2-16gb"), "{error}");
}

/// `--check` prices another trace with an existing profile: the A100 40 GB profile (a DLRM
/// trace) against a TorchRec trace measured on an 80 GB A100, which it never saw.
#[test]
fn check_measures_a_profile_on_traces_it_was_not_fitted_to() {
    let trace = shared_trace("HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz");
    let run = calibrate(&[&trace], "a100-sxm4-80gb", &["--check", "a100-sxm4-40gb", "--any-device"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = String::from_utf8_lossy(&run.stdout);
    let all = report.lines().find(|l| l.starts_with("all ")).unwrap_or_else(|| panic!("{report}"));
    // class, operators, measured ms, default "m% / w%", profile "m% / w%", totals.
    let weighted: Vec<f64> = all
        .split('/')
        .skip(1)
        .take(2)
        .map(|part| part.split_whitespace().next().unwrap().trim_end_matches('%').parse().unwrap())
        .collect();
    assert!(weighted[1] < weighted[0], "the profile should beat the defaults on the unseen trace: {all}");
}

/// The report gives the multiprocessors the traces' NCCL kernels held (their recorded grids, one
/// block to an SM) and the slowdown that share alone gives a compute-bound kernel beside them:
/// 2 of the V100's 80 SMs, 1/(1 - 2/80) = 1.026.
#[test]
fn the_report_gives_the_multiprocessors_nccl_held() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &["--check", "v100-sxm2-16gb"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = String::from_utf8_lossy(&run.stdout);
    let line = report.lines().find(|l| l.starts_with("NCCL kernels:")).unwrap_or_else(|| panic!("{report}"));
    assert!(
        line.contains("251.3 ms on 2.0 thread blocks of 80 multiprocessors")
            && line.contains("2.5% of the SMs, a slowdown of 1.026"),
        "{line}"
    );
}

/// The report gives the fixed cost of a kernel measured directly: the median time of tiny
/// one-kernel element-wise operators alone, beside NCCL kernels only and beside copies (HTA's
/// V100 trace: 4, 6 and 18 us; docs/compute-model.md, "Tiny kernels beside NCCL kernels and
/// beside copies").
#[test]
fn the_report_gives_tiny_kernels_alone_beside_nccl_and_beside_copies() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &["--check", "v100-sxm2-16gb"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = String::from_utf8_lossy(&run.stdout);
    let line = report
        .lines()
        .find(|l| l.starts_with("tiny element-wise kernels"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        line.contains(
            "median: 4.0 us alone (821); beside NCCL kernels 6.0 us (383), 1.50 times; beside copies \
             18.0 us (45), 4.50 times"
        ),
        "{line}"
    );
}

/// `--check` refuses a profile of another device type, as a scenario does.
#[test]
fn check_refuses_a_profile_of_another_device() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &["--check", "a100-sxm4-40gb"]);
    assert_eq!(run.status.code(), Some(2));
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(error.contains("calibrated on a100-sxm4-40gb") && error.contains("v100-sxm2-16gb"), "{error}");
}

/// `--hold KEY=VALUE` keeps a parameter out of the fit, exactly at its value, and the profile
/// records it.
#[test]
fn held_parameters_stay_exactly_where_they_were_put() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let output = scratch("held.toml");
    let run = calibrate(
        &[&trace],
        "v100-sxm2-16gb",
        &["-o", output.to_str().unwrap(), "--hold", "gemm-ramp-exponent=1", "--hold", "launch-overhead=2 us"],
    );
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let profile = Profile::from_toml_str(&fs_err::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(profile.compute.gemm_ramp_exponent, 1.0);
    assert_eq!(profile.compute.launch_overhead.to_string(), "2 us");
    let held = profile.calibration.unwrap().held;
    assert_eq!(held.keys().collect::<Vec<_>>(), ["gemm-ramp-exponent", "launch-overhead"]);
    assert!(String::from_utf8_lossy(&run.stdout).contains("held"));

    let run =
        calibrate(&[&trace], "v100-sxm2-16gb", &["-o", output.to_str().unwrap(), "--hold", "gemm-ramp=1"]);
    assert_eq!(run.status.code(), Some(2));
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(error.contains("gemm-ramp") && error.contains("gemm-ramp-exponent"), "{error}");
}

/// The shipped P100 profile is what `parasim calibrate` writes for DeepBench's P100 fp32 tables
/// (kernel benchmark tables are inputs like traces), and it predicts them better than the
/// defaults, on shapes it never saw too. A directory of tables contributes the device family's.
#[test]
fn the_p100_profile_is_reproduced_from_deepbench() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kernels/deepbench");
    let tables = [root.join("p100-fp32-gemm.csv"), root.join("p100-fp32-conv.csv")];
    for table in &tables {
        assert!(table.is_file(), "missing DeepBench table {} (see PROVENANCE.md there)", table.display());
    }
    let output = scratch("p100-pcie-16gb.toml");
    let run =
        calibrate(&tables.iter().collect::<Vec<_>>(), "p100-pcie-16gb", &["-o", output.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(report.contains("DeepBench tables p100-fp32-gemm.csv, p100-fp32-conv.csv"), "{report}");
    // Errors per shape regime: products by shape, convolutions by direction.
    for regime in ["error per shape regime", "gemm thin", "gemm large", "conv backward-weight"] {
        assert!(report.contains(regime), "{regime:?} missing from:\n{report}");
    }
    let written = Profile::from_toml_str(&fs_err::read_to_string(&output).unwrap()).unwrap();
    let shipped = Profile::builtin("p100-pcie-16gb").unwrap();
    assert_eq!(
        written.compute, shipped.compute,
        "data/profiles/p100-pcie-16gb.toml is stale: re-run calibrate"
    );
    assert_eq!(written.calibration, shipped.calibration);
    let record = written.calibration.unwrap();
    let (fitted, default, held_out) =
        (class(&record.fit, "all"), class(&record.default_model, "all"), class(&record.held_out, "all"));
    assert!(fitted.weighted_error < 0.5 * default.weighted_error, "{fitted:?} vs {default:?}");
    assert!(held_out.weighted_error < 0.5 * default.weighted_error, "{held_out:?} vs {default:?}");

    // The whole directory: only the P100 tables are read for a P100 (fp32 and fp16).
    let run = calibrate(&[&root], "p100-pcie-16gb", &["-o", scratch("p100-all.toml").to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(report.contains("p100-fp16-mixed-conv.csv") && !report.contains("v100"), "{report}");
    // A family without tables is refused by name.
    let run =
        calibrate(&[&tables[0]], "a100-sxm4-40gb", &["-o", scratch("a100-none.toml").to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("a100 family"));
}

/// The default `dispatch-overhead` is the median, over the six real traces with host calls, of
/// each trace's lower quartile of launch intervals (the statistic `parasim calibrate` writes
/// into a profile). `cargo test -p parasim --test it dispatch -- --nocapture` prints them.
#[test]
fn the_default_dispatch_overhead_is_measured_on_the_real_traces() {
    use validation::calibration::host_threads;
    use workloads::dispatch::launch_intervals;
    let inputs = [
        shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz"),
        shared_trace("HolisticTraceAnalysis/trace_diff/control/control.json.gz"),
        shared_trace("HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"),
        shared_trace("HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"),
        shared_trace("HolisticTraceAnalysis/nccl_parser_config/nccl_data.json.gz"),
        dlrm_directory(),
    ];
    let mut quartiles = Vec::new();
    for input in &inputs {
        let imported = traces::kineto::import(std::slice::from_ref(input)).unwrap();
        let stats = launch_intervals(&host_threads(&imported.trace.ranks)).unwrap();
        println!(
            "{}: {} intervals, 10% {} 25% {} median {} 75% {}",
            input.file_name().unwrap().to_string_lossy(),
            stats.intervals,
            stats.p10,
            stats.p25,
            stats.median,
            stats.p75
        );
        quartiles.push(stats.p25);
    }
    quartiles.sort();
    let median = (quartiles[2].as_ps() + quartiles[3].as_ps()) / 2;
    let default = workloads::ComputeModel::default().dispatch_overhead;
    println!(
        "median of the lower quartiles: {} (default {default})",
        sim_core::units::SimDuration::from_ps(median)
    );
    assert!((default.as_ps() as f64 / median as f64 - 1.0).abs() < 0.05, "{default} vs {median} ps");
}

/// Every compute key a scenario may set, the shape and host keys included, parses and counts;
/// a misspelt one is refused by name.
#[test]
fn a_scenario_sets_the_shape_and_host_keys() {
    let keys = "[compute]\nvector-gemm-efficiency = 0.95\ngemm-tile-half-intensity = 4.0\n\
                gemm-wave-overhead = \"1 us\"\nconv-efficiency = 0.9\nconv-backward-data-efficiency = 0.9\n\
                conv-backward-weight-efficiency = 0.8\nreduction-half-time = \"5 us\"\n\
                reduction-overhead = \"2 us\"\nl2-hit-fraction = 0.2\nunaligned-memory-efficiency = 0.7\n\
                winograd-convolutions = true\ndispatch-overhead = \"5 us\"\ncuda-graphs = true\n\
                k-major-thin-gemm-efficiency = 0.8\n";
    let scenario = scenario_file(
        "compute-keys.toml",
        &format!("{}\n{keys}", fs_err::read_to_string(QUICKSTART).unwrap()),
    );
    let run = parasim(&["run", scenario.to_str().unwrap(), "--json"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let source = json["model"]["compute_model"].as_str().unwrap();
    assert!(source.contains("14 key(s) set"), "{source}");

    // A reduction's combine is a duration: a number without a unit names the file and the key.
    refused("compute-unitless-overhead.toml", "reduction-overhead = 3", &["reduction-overhead"]);
    refused("compute-negative-overhead.toml", "reduction-overhead = \"-1 us\"", &["reduction-overhead"]);
    // The L2's share of streaming traffic is a fraction: above 1 names the file, the key and
    // the valid range.
    // The unaligned products' memory factor is an efficiency: 0 names the file, the key and
    // the valid range.
    refused(
        "compute-unaligned-memory-zero.toml",
        "unaligned-memory-efficiency = 0",
        &["unaligned-memory-efficiency", "greater than 0 and at most 1"],
    );
    refused(
        "compute-l2-over-one.toml",
        "l2-hit-fraction = 1.5",
        &["l2-hit-fraction", "at least 0 and at most 1"],
    );

    // The layout's rate is an efficiency: 0 names the key and the valid range.
    refused(
        "compute-layout-zero.toml",
        "k-major-thin-gemm-efficiency = 0",
        &["k-major-thin-gemm-efficiency"],
    );

    let wrong = scenario_file(
        "compute-wrong-key.toml",
        &format!("{}\n[compute]\ncuda-graph = true\n", fs_err::read_to_string(QUICKSTART).unwrap()),
    );
    let run = parasim(&["run", wrong.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("cuda-graph"));
}

/// Runs the quickstart with `keys` added under `[compute]` (written to `file`) and checks it is
/// refused with exit code 2 and a message naming the file and every one of `needles`.
fn refused(file: &str, keys: &str, needles: &[&str]) {
    let text = format!("{}\n[compute]\n{keys}\n", fs_err::read_to_string(QUICKSTART).unwrap());
    let run = parasim(&["run", scenario_file(file, &text).to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    let error = String::from_utf8_lossy(&run.stderr);
    assert!(error.contains(file) && needles.iter().all(|n| error.contains(n)), "{error}");
}

/// `calibrate --json` prints the profile without `-o` (it used to demand `-o`), and with `-o`
/// writes the same profile as TOML.
#[test]
fn calibrate_json_prints_the_profile_without_an_output_file() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &["--json"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let profile: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(profile["device"], "v100-sxm2-16gb", "{profile}");
    assert!(profile["calibration"]["operators"].as_u64().unwrap() > 0, "{profile}");
    // Neither -o nor --json nor --check: refused, naming the ways out.
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &[]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("--output"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// `calibrate --check --json` prints the check as JSON (it used to print the text report).
#[test]
fn calibrate_check_json_prints_json() {
    let trace = shared_trace("HolisticTraceAnalysis/trace_diff/test/test.json.gz");
    let run = calibrate(&[&trace], "v100-sxm2-16gb", &["--check", "v100-sxm2-16gb", "--json"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let check: serde_json::Value = serde_json::from_slice(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&run.stdout)));
    assert_eq!(check["profile"], "v100-sxm2-16gb");
    assert_eq!(check["device"], "v100-sxm2-16gb");
    let all = check["classes"].as_array().unwrap().iter().find(|row| row["group"] == "all").unwrap();
    assert!(all["profile"]["median-error"].as_f64().unwrap() >= 0.0, "{all}");
    assert!(!check["regimes"].as_array().unwrap().is_empty());
}

/// A Kineto trace of `iterations` repetitions of one small training step, each with its own
/// times and correlation ids: an `aten::mm` of shaped arguments and an `aten::add`, each
/// launching one kernel, and a stream synchronization. No two iterations overlap.
fn repeated_step_trace(iterations: u64) -> String {
    let mut events = Vec::with_capacity(iterations as usize * 7);
    for i in 0..iterations {
        let (t, c) = (i * 1_000, 2 * i + 1);
        let noise = i % 7;
        events.push(format!(
            r#"{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": {t}, "dur": 40,
               "args": {{"Input Dims": [[512, 1024], [1024, 256]], "Input type": ["float", "float"]}}}}"#
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
               "ts": {}, "dur": 5, "args": {{"correlation": {c}}}}}"#,
            t + 10
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
               "ts": {}, "dur": {}, "args": {{"correlation": {c}, "stream": 7, "device": 0}}}}"#,
            t + 100,
            60 + noise
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": {}, "dur": 40,
               "args": {{"Input Dims": [[512, 256], [512, 256], []], "Input type": ["float", "float", "Scalar"]}}}}"#,
            t + 50
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
               "ts": {}, "dur": 5, "args": {{"correlation": {}}}}}"#,
            t + 60,
            c + 1
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "pid": 0, "tid": 7,
               "ts": {}, "dur": {}, "args": {{"correlation": {}, "stream": 7, "device": 0}}}}"#,
            t + 200,
            5 + noise,
            c + 1
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
               "ts": {}, "dur": 300, "args": {{}}}}"#,
            t + 100
        ));
    }
    format!(
        "{{\"distributedInfo\": {{\"rank\": 0, \"world_size\": 1}},\n\"traceEvents\": [\n{}\n]}}\n",
        events.join(",\n")
    )
}

/// `calibrate` is near-linear in trace size (issue 38: it took over 10 minutes on a 1 GB trace):
/// a trace of twice the iterations takes less than three times as long to fit and report
/// (quadratic work would take four). Small sizes keep it fast; the scale measurement (1 and
/// 2 GB) is a command in docs/compute-model.md, "Large traces". It times wall clock, so it is
/// run by hand (`cargo test --release --test it calibrate_time -- --ignored`); in CI the
/// benchmark guard's `calibrate-trace` case (CPU time per trace size against its baseline,
/// docs/benchmarks.md) catches the same slowdown.
#[test]
#[ignore = "a wall-clock ratio: run by hand; CI's bench guard covers calibrate"]
fn calibrate_time_grows_linearly_with_the_trace() {
    let time = |iterations: u64| {
        let trace = scratch(&format!("calibrate-linear-{iterations}.json"));
        fs_err::write(&trace, repeated_step_trace(iterations)).unwrap();
        let profile = scratch(&format!("calibrate-linear-{iterations}.toml"));
        let args = ["-o", profile.to_str().unwrap()];
        // The best of two runs: the machine's other load only ever adds time.
        let best = (0..2)
            .map(|_| {
                let start = std::time::Instant::now();
                let run = calibrate(&[&trace], "a100-sxm4-80gb", &args);
                assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
                start.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        let written = Profile::from_toml_str(&fs_err::read_to_string(&profile).unwrap()).unwrap();
        assert_eq!(written.calibration.unwrap().operators as u64, 2 * iterations);
        best
    };
    let (small, large) = (time(3_000), time(6_000));
    println!("3000 iterations: {small:.3} s; 6000: {large:.3} s ({:.2}x)", large / small);
    assert!(large < 3.0 * small, "twice the trace took {:.2} times as long", large / small);
}
