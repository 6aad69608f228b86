//! `parasim collective`: nccl-tests-style output, comparison with measured output, errors.

use std::path::PathBuf;

use crate::parasim;

const H100: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/nccl-2x8-h100.toml");
const MEASURED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/validation/nccl-allreduce-2x8-h100.txt");
const AZURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/azure-nd-a100-v4.toml");

/// `all_reduce_perf_N.log` of the Azure ND A100 v4 runs in `../shared/data/nccl-tests`, which
/// must exist (CI has it beside the checkout; the logs are read from there, never copied).
fn azure_log(ranks: u32) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/nccl-tests/echo-azure-a100");
    assert!(
        root.is_dir(),
        "the measured nccl-tests logs are missing: expected the shared data folder at {} (beside the \
         checkout; see PROVENANCE.md there)",
        root.display()
    );
    let path = root.join(format!("all_reduce_perf_{ranks}.log"));
    assert!(path.is_file(), "missing {}", path.display());
    path
}

/// Runs `parasim collective allreduce` on `cluster` against `measured` and returns (sizes
/// compared, accuracy in percent) from its summary line.
fn accuracy(cluster: &str, measured: &str, extra: &[&str]) -> (u32, f64) {
    let mut args = vec!["collective", "allreduce", "--cluster", cluster, "-b", "8", "-e", "16G", "-f", "2"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--compare", measured]);
    let output = parasim(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    let line = text.lines().find(|l| l.contains("# compared with")).unwrap_or_else(|| panic!("{text}"));
    let sizes = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    let accuracy = line.rsplit(' ').next().unwrap().trim_end_matches('%').parse().unwrap();
    (sizes, accuracy)
}

/// The data rows of an nccl-tests-style table: (size, time us, busbw).
fn rows(text: &str) -> Vec<(u64, f64, f64)> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(5)?.parse().ok()?, f.get(7)?.parse().ok()?))
        })
        .collect()
}

#[test]
fn prints_nccl_tests_columns_for_every_size() {
    let output = parasim(&[
        "collective",
        "all_reduce",
        "--cluster",
        H100,
        "-b",
        "8",
        "-e",
        "1G",
        "-f",
        "4",
        "--fidelity",
        "analytical",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("size")
            && text.contains("algbw")
            && text.contains("busbw")
            && text.contains("Avg bus bandwidth")
    );
    let rows = rows(&text);
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..14).map(|i| 8u64 << (2 * i)).collect::<Vec<_>>()
    );
    // Time grows with size; bus bandwidth rises towards the tree's bound: each NIC carries an
    // eighth of the buffer each way at NCCL's 0.92 tree share, 2 x 15/16 x 0.92 x 8 x 25 GB/s
    // = 345 GB/s (measured: 263.7 at 512 MiB, the last size here, 339 at 8 GiB).
    assert!(rows.windows(2).all(|w| w[1].1 >= w[0].1));
    let busbw = rows.last().unwrap().2;
    assert!((busbw - 263.7).abs() < 0.1 * 263.7, "busbw at 512 MiB: {busbw}");
}

#[test]
fn compares_with_measured_nccl_tests_output() {
    let output = parasim(&[
        "collective",
        "allreduce",
        "--cluster",
        H100,
        "-b",
        "8",
        "-e",
        "8G",
        "-f",
        "2",
        "--fidelity",
        "analytical",
        "--compare",
        MEASURED,
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("measured") && text.contains("compared with 15 measured sizes"), "{text}");
}

#[test]
fn bad_arguments_are_errors() {
    for (args, needle) in [
        (vec!["collective", "gossip"], "unknown collective"),
        (vec!["collective", "allreduce", "--algorithm", "pairwise"], "cannot perform allreduce"),
        (vec!["collective", "allreduce", "--ranks", "999"], "--ranks 999"),
        (vec!["collective", "allreduce", "-b", "lots"], "size \"lots\""),
        (vec!["collective", "allreduce", "--fidelity", "exact"], "unknown fidelity"),
        (vec!["collective", "allreduce", "--protocol", "fast"], "unknown protocol \"fast\""),
        (
            vec!["collective", "allreduce", "--algorithm", "nvls", "-e", "8"],
            "NVLS needs an NVSwitch and Hopper",
        ),
    ] {
        let output = parasim(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn reads_nccl_tests_logs_without_the_root_column_under_mpi() {
    // The Azure logs have the older layout (no `root` column) and MPI's `[1,0]<stdout>:`
    // prefix; the run's 16 ranks come from the log's header.
    let log = azure_log(16);
    let (sizes, accuracy) = accuracy(AZURE, log.to_str().unwrap(), &[]);
    assert_eq!(sizes, 25);
    assert!(accuracy.is_finite() && accuracy > 0.0, "{accuracy}");
}

/// `ll-host-rate` reaches the collectives from a scenario: on the Azure servers a 4 KiB
/// tree/LL allreduce over 8 servers (one channel, one 4 KiB chunk, 6 network hops) takes
/// 6 x 4 KiB at 2 GB/s = 12.288 us longer with the key than without it.
#[test]
fn the_ll_host_rate_key_times_each_network_hop_of_an_ll_chunk() {
    let with = fs_err::read_to_string(AZURE).unwrap();
    assert!(with.contains("ll-host-rate = \"2 GB/s\""), "the Azure scenario lost its ll-host-rate");
    let without = with.replace("ll-host-rate = \"2 GB/s\"", "");
    let time = |name: &str, text: &str| -> f64 {
        let row = first_row(name, text, &["--ranks", "64", "-b", "4K", "-e", "4K"]);
        assert!(row.ends_with("tree/LL"), "{row}");
        row.split_whitespace().nth(5).unwrap().parse().unwrap()
    };
    let difference = time("ll-with.toml", &with) - time("ll-without.toml", &without);
    assert!((difference - 12.288).abs() < 0.11, "{difference}");
}

/// The first result row of `parasim collective allreduce --cluster SCENARIO ARGS` (the
/// scenario written to `name`).
fn first_row(name: &str, scenario: &str, args: &[&str]) -> String {
    let path = crate::scenario_file(name, scenario);
    let mut all = vec!["collective", "allreduce", "--cluster", path.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = parasim(&all);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    text.lines().find(|l| !l.starts_with('#')).unwrap().to_string()
}

/// Bus bandwidth (GB/s) of the 8 GiB row of `parasim collective allreduce` on `scenario`.
fn plateau(name: &str, scenario: &str, extra: &[&str]) -> (f64, String) {
    let mut args = vec!["-b", "8G", "-e", "8G"];
    args.extend_from_slice(extra);
    let row = first_row(name, scenario, &args);
    let busbw = row.split_whitespace().nth(7).unwrap().parse().unwrap();
    (busbw, row)
}

const DGX_A100: &str = r#"
[cluster]
nodes = 2
gpus-per-node = 8
device = "a100-sxm4-80gb"
intra-node = { kind = "nvswitch", bandwidth = "240 GB/s", latency = "0.3 us" }
[cluster.network]
topology = "switch"
link-bandwidth = "200 Gb/s"
link-latency = "1 us"
"#;

/// The single-server and two-server anchors of published-measurements.md section 10, each
/// within 10%: NVIDIA's 192 GB/s on DGX A100 (8 x 200 Gb/s, nccl #1576), 232.5 GB/s inside
/// one A100 server and 86-91 GB/s on two HGX A100 with 4 NICs (nccl-tests #100, #175),
/// ~480 GB/s NVLS and ~370 GB/s ring inside one H100 server (nccl-tests #212).
#[test]
fn published_bus_bandwidth_anchors_within_ten_percent() {
    let within = |simulated: f64, measured: f64, row: &str| {
        assert!((simulated - measured).abs() / measured <= 0.10, "{simulated} vs {measured}: {row}");
    };
    let (busbw, row) = plateau("dgx-a100.toml", DGX_A100, &[]);
    within(busbw, 192.0, &row);
    assert!(row.contains("ring/Simple"), "{row}");
    let (busbw, row) = plateau("dgx-a100-one.toml", DGX_A100, &["--ranks", "8"]);
    within(busbw, 232.5, &row);
    let four_nics = DGX_A100.replace("link-latency = \"1 us\"", "link-latency = \"1 us\"\nnics-per-node = 4");
    let (busbw, row) = plateau("hgx-a100-4nic.toml", &four_nics, &[]);
    within(busbw, 91.0, &row);
    let h100 = "[cluster]\nnodes = 1\ngpus-per-node = 8\ndevice = \"h100-sxm5-80gb\"\n\
                intra-node = { kind = \"nvswitch\", bandwidth = \"370 GB/s\", latency = \"0.3 us\" }\n";
    let (busbw, row) = plateau("h100-one.toml", h100, &[]);
    within(busbw, 480.0, &row);
    assert!(row.contains("nvls/Simple"), "{row}");
    let (busbw, row) = plateau("h100-one-ring.toml", h100, &["--algorithm", "ring"]);
    within(busbw, 370.0, &row);
}

#[test]
fn transport_keys_are_checked() {
    for (text, needle) in [
        ("transport = \"carrier-pigeon\"", "unknown transport \"carrier-pigeon\""),
        ("efficiency = 1.5", "cluster.network.efficiency"),
        ("efficiency = 0", "not a fraction"),
        ("nccl-algorithms = [\"tree\", \"butterfly\"]", "unknown algorithm \"butterfly\""),
        ("nccl-algorithms = []", "cluster.network.nccl-algorithms`: is empty"),
        ("nccl-protocols = [\"LL256\"]", "unknown protocol \"LL256\""),
        ("nccl-buffsize = \"1001 B\"", "multiple of 8 bytes"),
    ] {
        let scenario =
            DGX_A100.replace("link-latency = \"1 us\"", &format!("link-latency = \"1 us\"\n{text}"));
        let path = crate::scenario_file("bad-transport.toml", &scenario);
        let output = parasim(&["collective", "allreduce", "--cluster", path.to_str().unwrap(), "-e", "8"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(needle), "{text}: {stderr}");
    }
    // A TCP-based transport's message overhead shows in the small-message floor.
    let tcp =
        DGX_A100.replace("link-latency = \"1 us\"", "link-latency = \"1 us\"\ntransport = \"tcp-direct\"");
    let floor = |scenario: &str, name: &str| {
        let path = crate::scenario_file(name, scenario);
        let output =
            parasim(&["collective", "allreduce", "--cluster", path.to_str().unwrap(), "-b", "8", "-e", "8"]);
        let text = String::from_utf8(output.stdout).unwrap();
        let row = text.lines().find(|l| !l.starts_with('#')).unwrap().to_string();
        row.split_whitespace().nth(5).unwrap().parse::<f64>().unwrap()
    };
    let (ib, tcp) = (floor(DGX_A100, "ib.toml"), floor(&tcp, "tcp.toml"));
    assert!(tcp >= ib + 2.0 * 15.0 - 1e-6, "infiniband {ib} us, tcp-direct {tcp} us");
}

/// GCP's A3-Mega configuration in `scenarios/nccl-2x8-h100.toml`: NCCL_ALGO/NVLS off and its
/// tuner plugin leave tree, NCCL_PROTO Simple, NCCL_BUFFSIZE 8 MiB. The table shows what ran;
/// its 16 MiB allreduce has one 1 MiB chunk per channel, so it takes the tree's 16 hops at a
/// channel's rate each (~0.8 ms), and from there every further chunk adds only its network
/// share: the measured curve's step from 8 MiB to 16 MiB and its flat 16 MiB to 32 MiB.
#[test]
fn gcps_tcpxo_configuration_runs_tree_simple_in_one_mib_chunks() {
    let output = parasim(&[
        "collective",
        "allreduce",
        "--cluster",
        H100,
        "-b",
        "8M",
        "-e",
        "32M",
        "-f",
        "2",
        "--fidelity",
        "analytical",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.lines().filter(|l| !l.starts_with('#')).all(|l| l.ends_with("tree/Simple")), "{text}");
    let rows = rows(&text);
    let (eight, sixteen, thirty_two) = (rows[0].1, rows[1].1, rows[2].1);
    // Measured: 571.9, 977.6 and 1059.9 us.
    assert!(sixteen - eight > 300.0 && thirty_two - sixteen < 200.0, "{text}");
    // Without the settings (NCCL's defaults), NVLS-tree runs from 16 MiB.
    let defaults = fs_err::read_to_string(H100)
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with("nccl-"))
        .collect::<Vec<_>>()
        .join("\n");
    let path = crate::scenario_file("h100-nccl-defaults.toml", &defaults);
    let output =
        parasim(&["collective", "allreduce", "--cluster", path.to_str().unwrap(), "-b", "16M", "-e", "16M"]);
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("nvls-tree/Simple"), "{text}");
}

#[test]
fn a_scenario_asking_for_collnet_gets_what_it_needs_named() {
    // CollNet Direct on servers without an NVSwitch (SHARP switches present): refused before
    // the run, naming the key and the algorithm that would run there.
    let scenario = crate::quickstart_with(
        "first-bucket-size = \"1 MiB\"",
        "first-bucket-size = \"1 MiB\"\nallreduce = \"collnet-direct\"",
    )
    .replace(
        "kind = \"nvswitch\", bandwidth = \"300 GB/s\"",
        "kind = \"pcie-switch\", bandwidth = \"32 GB/s\"",
    )
    .replace("link-latency = \"1 us\"", "link-latency = \"1 us\"\nsharp = true");
    let path = crate::scenario_file("collnet-direct-pcie.toml", &scenario);
    let output = parasim(&["run", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("parallelism.allreduce") && stderr.contains("collnet-chain runs on any"),
        "{stderr}"
    );
    // With an NVSwitch the same scenario runs.
    let nvswitch = scenario.replace(
        "kind = \"pcie-switch\", bandwidth = \"32 GB/s\"",
        "kind = \"nvswitch\", bandwidth = \"300 GB/s\"",
    );
    let path = crate::scenario_file("collnet-direct-nvswitch.toml", &nvswitch);
    let output = parasim(&["run", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Two runs print the same bytes: the wall time (which differs every run) goes to standard
/// error, not into the report.
#[test]
fn the_report_is_the_same_every_run() {
    let args = ["collective", "allreduce", "--cluster", H100, "-b", "8", "-e", "1M", "-f", "4"];
    let (first, second) = (parasim(&args), parasim(&args));
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(String::from_utf8_lossy(&first.stdout), String::from_utf8_lossy(&second.stdout));
    assert!(!String::from_utf8_lossy(&first.stdout).contains("wall time"));
    assert!(String::from_utf8_lossy(&first.stderr).contains("of wall time"));
}

/// `--plot` goes through the `plot` crate: a `.png` is a PNG (it used to be SVG text), a `.svg`
/// an SVG with both curves, and another extension is refused naming the formats.
#[test]
fn the_plot_is_png_or_svg_by_its_extension() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("collective-plot");
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(&dir).unwrap();
    let plot = |name: &str| {
        let path = dir.join(name);
        let output = parasim(&[
            "collective",
            "allreduce",
            "--cluster",
            H100,
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "4",
            "--compare",
            MEASURED,
            "--plot",
            path.to_str().unwrap(),
        ]);
        (output, path)
    };
    let (output, png) = plot("bw.png");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(fs_err::read(&png).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let (output, svg) = plot("bw.svg");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let svg = fs_err::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("simulated") && svg.contains("measured"));
    assert!(svg.contains("bus bandwidth"), "the y axis is named");
    let (output, jpg) = plot("bw.jpg");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains(".svg or .png"));
    assert!(!jpg.exists());
}
