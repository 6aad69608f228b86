//! `parasim collective`: nccl-tests-style output, comparison with measured output, errors.

use crate::parasim;

const H100: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/nccl-2x8-h100.toml");
const MEASURED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/validation/nccl-allreduce-2x8-h100.txt");

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
    // Time grows with size; bus bandwidth rises to a plateau below 8 NICs x 25 GB/s.
    assert!(rows.windows(2).all(|w| w[1].1 >= w[0].1));
    let plateau = rows.last().unwrap().2;
    assert!(plateau > 190.0 && plateau <= 200.0, "busbw at 512 MiB: {plateau}");
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
    ] {
        let output = parasim(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
