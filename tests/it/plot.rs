//! `parasim plot`: every kind draws a valid SVG with its series and axis labels from a real
//! sweep or validation CSV; PNG output is a PNG of the requested size; rows without results
//! are left out and counted; `validate --plot` draws the same scatter.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::parasim;

const SCALING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/sweeps/quickstart-scaling.toml");
const TP_PP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/sweeps/megatron-1.7b-tp-pp.toml");

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plot").join(name);
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(&dir).unwrap();
    dir
}

fn ok(output: Output) -> Output {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// Runs a sweep into `dir/name.csv`.
fn sweep(sweep: &str, dir: &Path, name: &str) -> PathBuf {
    let csv = dir.join(format!("{name}.csv"));
    ok(parasim(&["sweep", sweep, "-o", csv.to_str().unwrap()]));
    csv
}

/// Runs `parasim plot` and returns the SVG it wrote and its stderr.
fn plot_svg(args: &[&str], out: &Path) -> (String, String) {
    let mut all: Vec<&str> = vec!["plot"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", out.to_str().unwrap()]);
    let output = ok(parasim(&all));
    let svg = fs_err::read_to_string(out).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "not an SVG document: {svg:.200}");
    (svg, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn assert_contains(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} is not in the picture");
    }
}

#[test]
fn line_bars_and_heatmap_of_a_sweep() {
    let dir = scratch("sweep");
    let scaling = sweep(SCALING, &dir, "scaling");
    let csv = scaling.to_str().unwrap();
    let (svg, _) = plot_svg(
        &[
            "line",
            csv,
            "--x",
            "cluster.gpus",
            "--y",
            "samples_per_second",
            "--series",
            "axis.cluster.network.link-bandwidth",
            "--logx=2",
            "--title",
            "ResNet-50 scaling",
        ],
        &dir.join("line.svg"),
    );
    assert_contains(
        &svg,
        &["100 Gb/s", "200 Gb/s", "throughput (samples/s)", "cluster GPUs", "ResNet-50 scaling"],
    );
    // Powers of two on the log2 axis.
    for tick in ["8", "16", "32", "64"] {
        assert!(svg.lines().any(|line| line.trim() == tick), "no x tick {tick}");
    }
    // Two series of four points: eight dots.
    assert_eq!(svg.matches("<circle").count(), 8 + 2, "points plus the legend's markers");

    let (svg, _) = plot_svg(
        &[
            "heatmap",
            csv,
            "--x",
            "axis.cluster.nodes",
            "--y",
            "axis.cluster.network.link-bandwidth",
            "--z",
            "iteration_time_s",
        ],
        &dir.join("heatmap.svg"),
    );
    assert_contains(
        &svg,
        &["cluster nodes", "cluster network link bandwidth", "iteration time (ms)", "28.53"],
    );

    let tp_pp = sweep(TP_PP, &dir, "tp-pp");
    let (svg, stderr) = plot_svg(&["bars", tp_pp.to_str().unwrap()], &dir.join("bars.svg"));
    assert_contains(
        &svg,
        &[
            "compute",
            "exposed tensor communication",
            "pipeline bubble",
            "time per iteration (s)",
            "tensor 2, pipeline 4, data 4",
        ],
    );
    // The configuration whose data degree is not an integer failed: counted, not drawn.
    assert!(stderr.contains("1 row(s) left out (1 failed)"), "{stderr}");
    assert!(!svg.contains("tensor 8, pipeline 8"), "a failed row was drawn");
    let (svg, _) = plot_svg(
        &["bars", tp_pp.to_str().unwrap(), "--fraction", "--x", "axis.parallelism.pipeline"],
        &dir.join("shares.svg"),
    );
    assert_contains(&svg, &["share of the iteration (%)", "pipeline 8"]);
}

#[test]
fn accuracy_scatter_of_validate_csv_and_validate_plot() {
    let dir = scratch("accuracy");
    let output = ok(parasim(&["validate", "--suite", "nccl-tests", "--csv", "--points"]));
    let csv = dir.join("validate.csv");
    fs_err::write(&csv, &output.stdout).unwrap();
    let (svg, _) = plot_svg(&["accuracy", csv.to_str().unwrap()], &dir.join("accuracy.svg"));
    assert_contains(
        &svg,
        &["nccl-tests, s (", "within ±10%", "simulated = measured", "measured (s)", "simulated (s)"],
    );
    // Families in different units get a panel each: no axis mixes s with ms or fractions
    // (issue 35). Two units, two panels, each axis named with its unit.
    let mixed = dir.join("mixed.csv");
    fs_err::write(
        &mixed,
        "id,family,unit,measured,simulated,accuracy,status\n\
         a,nccl-tests,s,0.002,0.0021,0.95,ok\n\
         b,memory,fraction,0.5,0.45,0.9,ok\n\
         c,steps,ms,120,118,0.98,ok\n",
    )
    .unwrap();
    let (svg, _) = plot_svg(&["accuracy", mixed.to_str().unwrap()], &dir.join("mixed.svg"));
    assert_contains(&svg, &["measured (s)", "measured (fraction)", "measured (ms)", "simulated (ms)"]);
    assert!(!svg.contains("each family"), "one axis for every unit");

    let png = dir.join("validate.png");
    ok(parasim(&["validate", "--suite", "nccl-tests", "--plot", png.to_str().unwrap()]));
    assert_png(&png, 1100, 760);
    let svg = dir.join("validate.svg");
    ok(parasim(&["validate", "--suite", "nccl-tests", "--plot", svg.to_str().unwrap()]));
    assert_contains(
        &fs_err::read_to_string(&svg).unwrap(),
        &["parasim validate: simulated against measured", "nccl-tests"],
    );
}

fn assert_png(path: &Path, width: u32, height: u32) {
    let bytes = fs_err::read(path).unwrap();
    assert_eq!(bytes[..8], [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'], "no PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), width);
    assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), height);
    assert_eq!(&bytes[bytes.len() - 8..bytes.len() - 4], b"IEND");
}

#[test]
fn png_has_the_requested_size() {
    let dir = scratch("png");
    let csv = dir.join("small.csv");
    fs_err::write(
        &csv,
        "index,cluster.gpus,mfu,status,error\n0,8,0.4,ok,\n1,16,0.38,ok,\n2,32,,does-not-fit,too big\n",
    )
    .unwrap();
    let png = dir.join("small.png");
    let output = ok(parasim(&[
        "plot",
        "line",
        csv.to_str().unwrap(),
        "--x",
        "cluster.gpus",
        "--y",
        "mfu",
        "--width",
        "640",
        "--height",
        "400",
        "-o",
        png.to_str().unwrap(),
    ]));
    assert_png(&png, 640, 400);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("1 row(s) left out (1 does-not-fit)"), "{stderr}");
}

#[test]
fn bad_plots_are_refused_with_what_is_valid() {
    let dir = scratch("errors");
    let csv = dir.join("t.csv");
    fs_err::write(&csv, "index,cluster.gpus,mfu,status,error\n0,8,0.4,ok,\n1,0,0.38,ok,\n").unwrap();
    let csv = csv.to_str().unwrap();
    let out = dir.join("x.svg");
    let out = out.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["plot", "line", csv, "--x", "gpus", "--y", "mfu", "-o", out],
            &["t.csv", "no column `gpus`", "cluster.gpus, mfu"],
        ),
        (
            &["plot", "line", csv, "--x", "cluster.gpus", "--y", "status", "-o", out],
            &["line 2", "column `status`", "\"ok\" is not a number"],
        ),
        (
            &["plot", "line", csv, "--x", "cluster.gpus", "--y", "mfu", "--logx", "-o", out],
            &["line 3", "cluster.gpus", "logarithmic"],
        ),
        (
            &["plot", "line", csv, "--x", "cluster.gpus", "--y", "mfu", "-o", "x.jpg"],
            &["x.jpg", ".svg or .png"],
        ),
        (&["plot", "bars", csv, "-o", out], &["no column `breakdown.compute_s`", "parasim sweep"]),
        (&["plot", "accuracy", csv, "-o", out], &["no column `measured`", "validate --csv"]),
        (
            &["plot", "line", csv, "--x", "cluster.gpus", "--y", "mfu", "--logx=3", "-o", out],
            &["write 2 or 10"],
        ),
    ];
    for (args, needles) in cases {
        let output = parasim(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        for needle in *needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr}");
        }
    }
    assert!(!Path::new("x.jpg").exists());
}

/// Values whose span overflows a double (issue 38: `1e308` and `-1e308` drew a "NaN" tick and
/// exited 0) are refused, naming the file, line, column and value; nothing is written.
#[test]
fn values_too_large_to_scale_are_refused() {
    let dir = scratch("huge");
    let csv = dir.join("huge.csv");
    fs_err::write(&csv, "x,y\n1,1e308\n2,-1e308\n").unwrap();
    let out = dir.join("huge.svg");
    let output = parasim(&[
        "plot",
        "line",
        csv.to_str().unwrap(),
        "--x",
        "x",
        "--y",
        "y",
        "-o",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for needle in ["huge.csv", "line 2", "column `y`", "1e308", "-1e300 to 1e300"] {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    assert!(!out.exists(), "huge.svg was written");
    // The largest values allowed draw with finite ticks.
    fs_err::write(&csv, "x,y\n1,1e300\n2,-1e300\n").unwrap();
    let (svg, _) = plot_svg(&["line", csv.to_str().unwrap(), "--x", "x", "--y", "y"], &out);
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg:.2000}");
}

/// Grouping rows into series scanned every series per row (quadratic: 64,000 series of 8
/// points took 68.7 s, 4,000 took 0.13 s); eight times the series now take about eight times
/// as long. The bound of 30 is far from the quadratic ratio of 64 and above. The chart crates
/// build optimised in the test profile (Cargo.toml). In the debug test build 4,000 -> 32,000
/// series still took 4.6 s -> 242 s (a ratio of 53): a superlinear path is left at that size
/// (issue 38), so the test checks 500 -> 4,000.
#[test]
fn line_charts_are_near_linear_in_series() {
    let dir = scratch("many-series");
    let wall = |series: u32| {
        let csv = dir.join(format!("series-{series}.csv"));
        let mut text = String::from("status,x,y,s\n");
        for s in 0..series {
            for x in 1..=8 {
                text.push_str(&format!("ok,{x},{},{s}\n", x * s + 1));
            }
        }
        fs_err::write(&csv, text).unwrap();
        let started = std::time::Instant::now();
        let out = dir.join(format!("series-{series}.svg"));
        ok(parasim(&[
            "plot",
            "line",
            csv.to_str().unwrap(),
            "--x",
            "x",
            "--y",
            "y",
            "--series",
            "s",
            "-o",
            out.to_str().unwrap(),
        ]));
        started.elapsed().as_secs_f64()
    };
    let small = wall(4_000);
    let large = wall(32_000);
    assert!(large < 30.0 * small, "4,000 series in {small} s, 32,000 in {large} s");
}

/// `plot distribution` of two real Monte Carlo runs (the quickstart with 5% kernel noise, and
/// with 20%): one line per run, named by its file since both are one scenario, each with its
/// p50 and p99 as the run reported them; `plot goodput` of a real `--hours` run; a run without
/// the numbers a kind needs is refused by name.
#[test]
fn distribution_and_goodput_of_real_runs() {
    let dir = scratch("runs");
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quickstart.toml");
    let base = fs_err::read_to_string(quickstart).unwrap();
    let mut runs = Vec::new();
    for (name, cv) in [("calm", "0.05"), ("noisy", "0.2")] {
        let scenario = dir.join("noise.toml");
        let text =
            format!("{base}\n[variability]\nop-noise = {{ distribution = \"lognormal\", cv = {cv} }}\n");
        fs_err::write(&scenario, text).unwrap();
        let out =
            ok(parasim(&["run", scenario.to_str().unwrap(), "--iterations", "40", "--seed", "3", "--json"]));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let path = dir.join(format!("{name}.json"));
        fs_err::write(&path, &out.stdout).unwrap();
        runs.push((path, json));
    }
    let (svg, stderr) = plot_svg(
        &["distribution", runs[0].0.to_str().unwrap(), runs[1].0.to_str().unwrap()],
        &dir.join("d.svg"),
    );
    assert!(stderr.contains("(2 run(s), 80 iterations, 40 bins)"), "{stderr}");
    for (path, json) in &runs {
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let p50 = json["distribution"]["p50_s"].as_f64().unwrap() * 1e3;
        let p99 = json["distribution"]["p99_s"].as_f64().unwrap() * 1e3;
        assert_contains(&svg, &[&format!("{stem}: p50 {p50:.2} ms, p99 {p99:.2} ms")]);
    }
    assert_contains(&svg, &["iteration time (ms)", "share of iterations (%)"]);

    let failures = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/llama3-405b-16k-failures.toml");
    let out = ok(parasim(&["run", failures, "--hours", "24", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let goodput = dir.join("goodput.json");
    fs_err::write(&goodput, &out.stdout).unwrap();
    let (svg, stderr) = plot_svg(&["goodput", goodput.to_str().unwrap()], &dir.join("g.svg"));
    let best = &json["goodput"]["best_interval"];
    let expected = format!(
        "best every {} iterations, goodput {:.2}%",
        best["iterations"],
        100.0 * best["goodput"].as_f64().unwrap()
    );
    assert!(stderr.contains(&expected), "{stderr} lacks {expected}");
    assert_contains(&svg, &["checkpoint interval (h)", "goodput (%)", "Young"]);

    // Each kind refuses the other's file, naming it and the command that writes what it needs.
    let out =
        parasim(&["plot", "goodput", runs[0].0.to_str().unwrap(), "-o", dir.join("x.svg").to_str().unwrap()]);
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && error.contains("calm.json: no `goodput`") && error.contains("--hours"),
        "{error}"
    );
    let out = parasim(&[
        "plot",
        "distribution",
        goodput.to_str().unwrap(),
        "-o",
        dir.join("x.svg").to_str().unwrap(),
    ]);
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && error.contains("goodput.json") && error.contains("--iterations"),
        "{error}"
    );
}

/// `plot roofline` of a real `run --csv`: the quickstart's ResNet-50 on A100s. Every kernel
/// lies on or under both roofs (its FLOPs over its time at most the peak, and at most the
/// bandwidth times its FLOPs per byte), and the chart names the A100's roofs and the passes.
#[test]
fn roofline_of_a_run_csv() {
    let dir = scratch("roofline");
    let layers = dir.join("layers.csv");
    ok(parasim(&["run", crate::QUICKSTART, "--csv", layers.to_str().unwrap()]));
    let text = fs_err::read_to_string(&layers).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let (flops, bytes, time) = (at("flops"), at("bytes"), at("kernel_time_s"));
    let (peak, bandwidth) = (at("peak_flops_per_s"), at("memory_bandwidth_bytes_per_s"));
    let mut kernels = 0;
    for line in lines {
        // The columns read here come before any quoted name, or are counted from the end.
        let cells: Vec<&str> = line.split(',').collect();
        let from_end = |column: usize| cells[cells.len() - (header.len() - column)].parse::<f64>().unwrap();
        let (f, b, t) =
            (cells[flops].parse::<f64>().unwrap(), from_end(bytes), cells[time].parse::<f64>().unwrap());
        let (p, w) = (from_end(peak), from_end(bandwidth));
        assert_eq!((p, w), (312e12, 2.039e12), "{line}");
        assert!(b > 0.0 && t > 0.0, "a kernel without bytes or time: {line}");
        if f > 0.0 {
            kernels += 1;
            let achieved = f / t;
            assert!(achieved <= p.min(w * f / b) * (1.0 + 1e-9), "above the roof: {line}");
        }
    }
    let out = dir.join("roofline.svg");
    let (svg, stderr) =
        plot_svg(&["roofline", layers.to_str().unwrap(), "--title", "ResNet-50 on A100"], &out);
    assert_contains(
        &svg,
        &[
            "ResNet-50 on A100",
            "arithmetic intensity (FLOP/byte)",
            "achieved (TFLOP/s)",
            "peak 312 TFLOP/s",
            "memory 2.039 TB/s",
            "ridge 153 FLOP/byte",
            "forward (",
            "backward-data (",
            "backward-weight (",
            "optimizer (1)",
        ],
    );
    assert!(stderr.contains(&format!("({kernels} kernels in 4 groups; ")), "{stderr}");
    // --peak and --bandwidth replace the CSV's roofs; --colour-by kind names layer kinds.
    let (svg, stderr) = plot_svg(
        &[
            "roofline",
            layers.to_str().unwrap(),
            "--peak",
            "125 TFLOP/s",
            "--bandwidth",
            "900 GB/s",
            "--colour-by",
            "kind",
        ],
        &out,
    );
    assert_contains(&svg, &["peak 125 TFLOP/s", "memory 900 GB/s", "conv2d (", "batchnorm ("]);
    assert!(stderr.contains("at 138.9 FLOP/byte"), "{stderr}");
}

/// `plot roofline` refuses what it cannot draw, naming the file, line and column, or the flag.
#[test]
fn bad_rooflines_are_refused_with_what_is_valid() {
    let dir = scratch("roofline-errors");
    let old = dir.join("old.csv");
    fs_err::write(&old, "stage,pass,flops,kernel_time_s\n0,forward,1e9,0.001\n").unwrap();
    let negative = dir.join("negative.csv");
    fs_err::write(
        &negative,
        "pass,flops,bytes,kernel_time_s,peak_flops_per_s,memory_bandwidth_bytes_per_s\n\
         forward,1e9,1e6,0.001,312e12,2.039e12\nforward,1e9,-5,0.001,312e12,2.039e12\n",
    )
    .unwrap();
    let no_roofs = dir.join("no-roofs.csv");
    fs_err::write(&no_roofs, "pass,flops,bytes,kernel_time_s\nforward,1e9,1e6,0.001\n").unwrap();
    let (old, negative, no_roofs) =
        (old.to_str().unwrap(), negative.to_str().unwrap(), no_roofs.to_str().unwrap());
    let out = dir.join("x.svg");
    let out = out.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["plot", "roofline", old, "-o", out],
            &["old.csv", "no column `bytes`", "parasim run SCENARIO --csv"],
        ),
        (
            &["plot", "roofline", negative, "-o", out],
            &["negative.csv: line 3: column `bytes` is -5", "0 or more"],
        ),
        (&["plot", "roofline", no_roofs, "-o", out], &["no column `peak_flops_per_s`", "or give --peak"]),
        (&["plot", "roofline", no_roofs, "--peak", "312 TFLOP/s", "-o", out], &["or give --bandwidth"]),
        (&["plot", "roofline", negative, "--peak", "fast", "-o", out], &["--peak", "fast"]),
        (&["plot", "roofline", negative, "--bandwidth", "0 GB/s", "-o", out], &["--bandwidth"]),
    ];
    for (args, needles) in cases {
        let output = parasim(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        for needle in *needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr}");
        }
    }
    assert!(!Path::new(out).exists());
}
