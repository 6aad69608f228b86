//! `parasim bench --guard`: a case slower than its baseline allows fails the guard with exit
//! status 1 and a message naming it; within the tolerance it passes. The baselines here are
//! written as if the case had once run a million times faster (a millionfold slowdown now) or
//! slower, so the verdict does not depend on this machine's speed.

use crate::parasim;

/// A baseline file with one case, `seconds` of CPU per `size` at a reference of 1 s.
fn baseline(case: &str, seconds: f64) -> std::path::PathBuf {
    let mut text = String::new();
    for profile in ["release", "debug"] {
        text.push_str(&format!(
            "[{profile}]\nmachine = \"test\"\nmeasured = \"2026-12-02\"\nrevision = \"test\"\n\
             [{profile}.cases.{case}]\nsize = 1000\nseconds = {seconds:e}\nwall_seconds = {seconds:e}\nreference_seconds = 1.0\n"
        ));
    }
    crate::scenario_file(&format!("bench-baseline-{seconds:e}.toml"), &text)
}

#[test]
fn the_guard_fails_naming_a_case_slower_than_its_baseline() {
    let case = "plot-series";
    let guard = |baseline: &std::path::Path| {
        parasim(&[
            "bench",
            "--guard",
            "--case",
            case,
            "--repeats",
            "1",
            "--baseline",
            baseline.to_str().unwrap(),
        ])
    };
    let output = guard(&baseline(case, 1e-6));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("bench guard: slower than the baseline allows: {case} (")), "{stderr}");
    assert!(stderr.contains("SLOWER"), "{stderr}");

    let output = guard(&baseline(case, 1e6));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.lines().any(|l| l.starts_with(case) && l.trim_end().ends_with("ok")), "{stdout}");
}

/// An unknown case and a tolerance that cannot be met are refused, naming what is valid.
#[test]
fn the_guard_refuses_bad_arguments() {
    for (args, needles) in [
        (vec!["bench", "--guard", "--case", "nope"], vec!["--case \"nope\"", "lowering-deep"]),
        (vec!["bench", "--guard", "--tolerance", "0.5"], vec!["--tolerance 0.5", "greater than 1"]),
    ] {
        let output = parasim(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr}");
        }
    }
}
