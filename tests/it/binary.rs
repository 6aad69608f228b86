//! The binary on its own: copied out of the checkout, `parasim validate` runs the suite embedded
//! in it; shell completions and the man page name every subcommand.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::parasim;

/// A copy of the built binary in a folder of its own, and an empty working directory apart
/// from it (no data/validation, no checkout above it that the binary could find).
fn copied_binary(name: &str) -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("copied-binary-{name}"));
    let _ = fs_err::remove_dir_all(&root);
    let (bin, work) = (root.join("bin"), root.join("work"));
    fs_err::create_dir_all(&bin).unwrap();
    fs_err::create_dir_all(&work).unwrap();
    let binary = bin.join("parasim");
    fs_err::copy(env!("CARGO_BIN_EXE_parasim"), &binary).unwrap();
    (binary, work)
}

/// Runs `binary` with `args` in `dir`, without the shared data folder's variable.
///
/// A freshly copied executable can fail to start with "Text file busy" (ETXTBSY) while another
/// test thread forks: the child holds the copy's write descriptor between its fork and its
/// exec. That is the test harness's race, not parasim's, so the start is retried briefly.
fn run_in(binary: &Path, dir: &Path, args: &[&str]) -> Output {
    const TEXT_FILE_BUSY: i32 = 26;
    let mut attempts = 0;
    loop {
        let result =
            Command::new(binary).args(args).current_dir(dir).env_remove("PARASIM_SHARED_DATA").output();
        match result {
            Err(error) if error.raw_os_error() == Some(TEXT_FILE_BUSY) && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other.expect("the copied binary runs"),
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_copied_binary_validates_with_its_embedded_suite() {
    let (binary, work) = copied_binary("validate");
    let listed = run_in(&binary, &work, &["validate", "--list"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let suite = concat!(env!("CARGO_MANIFEST_DIR"), "/data/validation");
    let checkout = parasim(&["validate", "--list", "--suite-dir", suite]);
    assert!(checkout.status.success(), "{}", text(&checkout.stderr));
    assert_eq!(text(&listed.stdout), text(&checkout.stdout), "the embedded suite is the checkout's");
    assert!(text(&listed.stdout).contains("korthikanti-table4/baseline"));

    // Model files (../models/...) and the bounds, all embedded.
    let checked = run_in(&binary, &work, &["validate", "--suite", "korthikanti-table4", "--check-bounds"]);
    let stdout = text(&checked.stdout);
    assert!(checked.status.success(), "{stdout}{}", text(&checked.stderr));
    assert!(
        stdout.contains(
            "bounds: every recorded floor holds (data/validation/bounds.toml, embedded in the binary)"
        ),
        "{stdout}"
    );
    // A scenario file (../../scenarios/...) and the suite's own nccl-tests log.
    let nccl = run_in(&binary, &work, &["validate", "--case", "nccl-tests/h100-2x8", "--check-bounds"]);
    assert!(nccl.status.success(), "{}{}", text(&nccl.stdout), text(&nccl.stderr));
    assert!(text(&nccl.stdout).contains("h100-2x8"));
    // Nothing is left in the working directory.
    assert_eq!(fs_err::read_dir(&work).unwrap().count(), 0);
}

#[test]
fn the_embedded_suite_refuses_to_write_the_checkout() {
    let (binary, work) = copied_binary("refuse");
    for flags in [
        &["--update-bounds"][..],
        &["--write-doc", "validation.md"][..],
        &["--write-summary", "README.md"][..],
    ] {
        let mut args = vec!["validate", "--suite", "korthikanti-table4"];
        args.extend_from_slice(flags);
        let output = run_in(&binary, &work, &args);
        assert_eq!(output.status.code(), Some(2), "{flags:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(flags[0]) && stderr.contains("embedded"), "{stderr}");
        assert!(stderr.contains("run it in the parasim checkout, or pass --suite-dir DIR"), "{stderr}");
    }
}

/// The subcommands `parasim --help` lists (less `help`).
fn subcommands() -> Vec<String> {
    let help = parasim(&["--help"]);
    let help = text(&help.stdout);
    let commands: Vec<String> = help
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect();
    assert!(commands.len() > 10 && commands.iter().any(|c| c == "completions"), "{commands:?}");
    commands
}

#[test]
fn completions_name_every_subcommand() {
    let commands = subcommands();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = parasim(&["completions", shell]);
        assert!(output.status.success(), "{shell}: {}", text(&output.stderr));
        let script = text(&output.stdout);
        for command in &commands {
            assert!(script.contains(command.as_str()), "the {shell} script lacks {command}");
        }
    }
    let output = parasim(&["completions", "tcsh"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn the_man_page_names_every_subcommand() {
    let output = parasim(&["man"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let page = text(&output.stdout);
    assert!(page.contains(".TH parasim 1"), "{page}");
    let commands = subcommands();
    for command in &commands {
        assert!(page.contains(&format!("parasim\\-{command}(1)")), "the man page lacks {command}");
    }
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parasim.1");
    let written = parasim(&["man", "-o", file.to_str().unwrap()]);
    assert!(written.status.success(), "{}", text(&written.stderr));
    assert!(written.stdout.is_empty());
    assert_eq!(fs_err::read_to_string(&file).unwrap(), page);

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("man-pages");
    let _ = fs_err::remove_dir_all(&dir);
    let pages = parasim(&["man", "--dir", dir.to_str().unwrap()]);
    assert!(pages.status.success(), "{}", text(&pages.stderr));
    assert_eq!(fs_err::read_to_string(dir.join("parasim.1")).unwrap(), page);
    for command in &commands {
        let sub = fs_err::read_to_string(dir.join(format!("parasim-{command}.1"))).unwrap();
        assert!(sub.contains(&format!(".TH parasim-{command} 1")), "{sub}");
    }
    let validate = fs_err::read_to_string(dir.join("parasim-validate.1")).unwrap();
    assert!(validate.contains("suite\\-dir"), "{validate}");
}

/// Every file a suite family names (other than `shared:` ones) lies in `data/` or
/// `scenarios/`, the folders build.rs embeds: a case naming another file would run in the
/// checkout and fail from a copied binary.
#[test]
fn the_suite_names_only_embedded_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let suite = root.join("data/validation");
    let mut named = 0;
    for entry in fs_err::read_dir(&suite).unwrap() {
        let file = entry.unwrap().path();
        if file.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        for line in fs_err::read_to_string(&file).unwrap().lines() {
            let Some((key, value)) = line.split_once(" = \"") else { continue };
            let key = key.trim();
            let value = value.split('"').next().unwrap();
            let is_path =
                value.contains('/') || [".toml", ".txt", ".csv", ".json"].iter().any(|e| value.ends_with(e));
            if !["scenario-file", "model", "log", "table", "profile"].contains(&key)
                || !is_path
                || value.starts_with("shared:")
            {
                continue;
            }
            // Resolve `..` lexically against the family's folder, relative to the checkout.
            let mut parts: Vec<&str> = vec!["data", "validation"];
            for part in value.split('/') {
                match part {
                    ".." => assert!(parts.pop().is_some(), "{}: {value} leaves the checkout", file.display()),
                    "." | "" => {}
                    part => parts.push(part),
                }
            }
            assert!(
                matches!(parts.first(), Some(&"data" | &"scenarios")),
                "{}: {key} = {value:?} is outside data/ and scenarios/, which the binary embeds",
                file.display()
            );
            assert!(root.join(parts.join("/")).is_file(), "{}: {value} is missing", file.display());
            named += 1;
        }
    }
    assert!(named > 50, "only {named} files named: the scan lost its keys");
}
