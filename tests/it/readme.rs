//! Output shown in the README is the binary's: each block marked `<!-- snapshot: parasim ARGS
//! ... -->` (optionally starting with the command line) must equal what `parasim ARGS` prints,
//! except the `engine` line (wall times).

use crate::parasim;

/// The blocks of README.md marked as snapshots: (arguments, expected lines).
fn snapshots() -> Vec<(Vec<String>, Vec<String>)> {
    let readme = include_str!("../../README.md");
    let mut found = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("<!-- snapshot: parasim ") else { continue };
        let arguments: Vec<String> = rest
            .split(" (")
            .next()
            .unwrap_or(rest)
            .trim_end_matches(" -->")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(lines.next(), Some("```"), "a snapshot marker must be followed by a code block");
        let mut block: Vec<String> = lines.by_ref().take_while(|l| *l != "```").map(String::from).collect();
        if block.first().is_some_and(|l| l.starts_with("$ parasim")) {
            block.remove(0); // the command, shown as typed
        }
        found.push((arguments, block));
    }
    found
}

#[test]
fn readme_output_is_what_the_binary_prints() {
    let snapshots = snapshots();
    assert!(!snapshots.is_empty(), "README.md has no snapshot markers");
    for (arguments, expected) in snapshots {
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        let output = parasim(&arguments);
        assert!(output.status.success(), "{arguments:?}: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8_lossy(&output.stdout);
        let keep = |line: &&str| !line.starts_with("engine ");
        let actual: Vec<&str> = text.lines().filter(keep).collect();
        let expected: Vec<&str> = expected.iter().map(String::as_str).filter(keep).collect();
        assert_eq!(
            actual,
            expected,
            "README.md's output of `parasim {}` drifted from the binary",
            arguments.join(" ")
        );
    }
}
