//! Fuzzing of command-line input (docs/fuzzing.md) with the workspace's one mutation engine
//! (the `fuzzing` crate): argument lists of `parasim collective` and `parasim plan` (with a
//! mutated cluster file), written one argument per line and mutated as text, are parsed by the
//! real command line (clap) and checked by the command's own validation. A clean outcome is
//! a refusal by clap, an error that names a flag, a value given or the file at fault, or (for
//! `collective`) a finished benchmark; the same for `traffic`, `topo`, `inspect` and `models`; never a panic, a hang or a runaway allocation.
//! `cargo test --bin parasim fuzz::` runs 128 cases of each; `FUZZ_SECONDS=N` runs each for N
//! seconds.

use std::path::{Path, PathBuf};

use clap::Parser;
use fuzzing::{Campaign, names_one_of};

use crate::{Cli, Command};

/// The arguments of a mutant: one per line, `{root}` for the checkout.
fn arguments(text: &str, root: &Path) -> Vec<String> {
    let root = root.display().to_string();
    std::iter::once("parasim".to_string())
        .chain(text.lines().map(|line| line.replace("{root}", &root)))
        .collect()
}

/// The names an error may give to be clean: every flag given, every value given of three
/// characters or more (a path, a name such as the collective's kind, a size with its unit;
/// errors about a value quote it) and `extra` (flags with defaults, the file).
fn names<'a>(arguments: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut names: Vec<&str> = arguments[1..]
        .iter()
        .map(|a| a.trim())
        .filter(|a| (a.starts_with('-') && a.len() > 1) || a.chars().count() >= 3)
        .collect();
    names.extend(extra);
    names
}

/// The flags of `collective`: an error about a default value names its flag.
const COLLECTIVE_FLAGS: [&str; 13] = [
    "-b",
    "-e",
    "-f",
    "-g",
    "-d",
    "--ranks",
    "--algorithm",
    "--fidelity",
    "--launch",
    "--chunk",
    "--protocol",
    "--host-launch",
    "--cluster",
];

/// `parasim collective`: every flag, the size and type grammar, the cluster, algorithm,
/// protocol and fidelity names; small sizes on the quickstart's 64 GPUs, so a valid mutant
/// runs in milliseconds and a slow one is a finding.
#[test]
fn collective_arguments() {
    let root = fuzzing::root();
    let compare = "/../shared/data/nccl-tests/echo-azure-a100/all_reduce_perf_2.log";
    let seeds: Vec<String> = [
        "collective\nallreduce\n--ranks\n8\n-b\n8\n-e\n1M\n-f\n4".to_string(),
        "collective\nall_gather\n--cluster\n{root}/scenarios/nccl-2x8-h100.toml\n--fidelity\nanalytical\n-b\n1K\n-e\n16M\n-f\n16".into(),
        "collective\nalltoall\n--ranks\n16\n--algorithm\nauto\n--protocol\nLL128\n-d\nhalf\n--chunk\n512 KiB\n--launch\n5 us\n--host-launch\n2 us\n-g\n2\n-e\n4M\n--json".into(),
        "collective\nbroadcast\n--ranks\n4\n--fidelity\npacket-steps\n-b\n1K\n-e\n64K\n-f\n8".into(),
        "collective\nreduce_scatter\n--ranks\n8\n--algorithm\nring\n--protocol\nSimple\n-d\nint8\n-b\n64\n-e\n256K".into(),
        format!("collective\nallreduce\n--cluster\n{{root}}/scenarios/azure-nd-a100-v4.toml\n--compare\n{{root}}{compare}\n-e\n1M"),
    ]
    .into();
    Campaign::from_env("collective_arguments").with_default_cases(16).run(
        fuzzing::mutated_text(seeds),
        |text| {
            let arguments = arguments(&text, &root);
            // --plot writes a file where the mutant says: the one output this target leaves out.
            if arguments.iter().any(|a| a.contains("--plot")) {
                return Ok(());
            }
            let Ok(cli) = Cli::try_parse_from(&arguments) else { return Ok(()) };
            if !matches!(cli.command, Command::Collective { .. }) {
                return Ok(());
            }
            // A tenth of a second of the flow model's work in release (a second or two in this
            // debug build, under load): a longer valid benchmark gives up with an error that
            // names the collective, well inside the watchdog's 10 s.
            let budget = Some(scenario::plan::FLOW_WORK_PER_SECOND / 10);
            if let Err(error) = crate::collective_with(cli.command, budget) {
                let message = crate::message(&error);
                names_one_of(&message, &names(&arguments, &COLLECTIVE_FLAGS))?;
            }
            Ok(())
        },
    );
}

/// The flags of `plan` that have defaults.
const PLAN_FLAGS: [&str; 6] =
    ["--cluster", "--top", "--memory-headroom", "--final-time-limit", "--final-max", "--objective"];

/// `parasim plan`: its flags (model, GPU counts, batch, sequence, precision, budgets, price,
/// headroom, `--set`) and the cluster file, both mutated, checked as `plan` checks them before
/// its search starts (`plan_cmd::prepare`).
#[test]
fn plan_inputs() {
    let root = fuzzing::root();
    let dir = std::env::temp_dir().join(format!("parasim-fuzz-plan-{}", std::process::id()));
    fs_err::create_dir_all(&dir).expect("a scratch folder for the cluster files");
    let cluster: PathBuf = dir.join("cluster.toml");
    let argument_seeds: Vec<String> = [
        "plan\n--cluster\nCLUSTER\n--model\ngpt3-175b\n--gpus\n64,128\n--global-batch\n1536\n--tokens\n300e9",
        "plan\n--cluster\nCLUSTER\n--model\nresnet50\n--samples\n115.2e6\n--objective\ncost\n--gpu-hour-price\n2.5\n--top\n3",
        "plan\n--cluster\nCLUSTER\n--model\n{root}/data/models/llama3-8b.toml\n--seq\n8192\n--precision\nbf16\n--set\nparallelism.tensor=8\n--set\nworkload.recompute=full",
        "plan\n--cluster\nCLUSTER\n--memory-headroom\n0.2\n--final-time-limit\n0\n--final-max\n4\n--objective\nthroughput\n--json",
    ]
    .map(String::from)
    .into();
    let cluster_seeds: Vec<String> =
        ["quickstart.toml", "gpt3-175b-1024.toml", "superpod-h100-1024.toml", "nccl-2x8-h100.toml"]
            .iter()
            .filter_map(|name| fs_err::read_to_string(root.join("scenarios").join(name)).ok())
            .collect();
    let strategy =
        (fuzzing::mutated_text(argument_seeds), fuzzing::mutated_text(cluster_seeds), proptest::bool::ANY);
    Campaign::from_env("plan_inputs").with_default_cases(16).run(
        strategy,
        |(text, cluster_text, mutate_arguments)| {
            // Half the cases keep valid flags, so the cluster file's mutations reach the search.
            let text = if mutate_arguments { text } else { "plan\n--cluster\nCLUSTER".to_string() };
            let text = text.replace("CLUSTER", &cluster.display().to_string());
            fs_err::write(&cluster, &cluster_text).expect("writing the cluster file");
            let arguments = arguments(&text, &root);
            let Ok(cli) = Cli::try_parse_from(&arguments) else { return Ok(()) };
            let Command::Plan(args) = cli.command else { return Ok(()) };
            if let Err(error) = crate::plan_cmd::prepare(&args) {
                let message = crate::message(&error);
                let mut extra = PLAN_FLAGS.to_vec();
                extra.extend(["cluster.toml", "--set"]);
                names_one_of(&message, &names(&arguments, &extra))?;
            }
            Ok(())
        },
    );
    let _ = fs_err::remove_dir_all(&dir);
}

/// The flags of `traffic`, `topo` and `inspect` that have defaults, and the names of their
/// positional arguments (an error about one names it: `unknown pattern "st"`).
const DESCRIBE_FLAGS: [&str; 8] =
    ["--size", "--seed", "--max-flows", "--batch", "--cluster", "pattern", "model", "scenario"];

/// Flows the target lets a traffic matrix run (`--max-flows` capped): a larger valid matrix
/// takes seconds in this debug build, which the watchdog would take for a hang.
const FUZZ_MAX_FLOWS: u64 = 4096;

/// `parasim traffic`, `topo`, `inspect` and `models`: the pattern grammar (names, arguments,
/// a file of flows), sizes, seeds and flow counts, scenario files given as clusters, model
/// names and model files, checked by the commands themselves (`--dot` left out: it writes a
/// file). A clean outcome is a report, a clap refusal or an error that names a flag, a value
/// given or the file at fault.
#[test]
fn traffic_topo_inspect_arguments() {
    let root = fuzzing::root();
    let seeds: Vec<String> = [
        "traffic\n--cluster\n{root}/scenarios/quickstart.toml\nshift\n1\n--size\n16M",
        "traffic\n--cluster\n{root}/scenarios/fat-tree-k16.toml\nuniform-random\n--flows\n64\n--seed\n3\n--json",
        "traffic\n--cluster\n{root}/scenarios/quickstart.toml\nincast\n4\n--size\n1 MiB\n--csv",
        "traffic\n--cluster\n{root}/scenarios/nccl-2x8-h100.toml\nbisection\n--max-flows\n100",
        "traffic\n--cluster\n{root}/scenarios/quickstart.toml\npermutation\n--seed\n18446744073709551615",
        "topo\n{root}/scenarios/quickstart.toml\n--json",
        "topo\n{root}/scenarios/superpod-1024.toml",
        "inspect\nresnet50\n--batch\n32",
        "inspect\n{root}/data/models/llama3-8b.toml\n--json",
        "models\n--json",
    ]
    .map(String::from)
    .into();
    Campaign::from_env("traffic_topo_inspect_arguments").with_default_cases(32).run(
        fuzzing::mutated_text(seeds),
        |text| {
            let arguments = arguments(&text, &root);
            let Ok(cli) = Cli::try_parse_from(&arguments) else { return Ok(()) };
            let outcome = match cli.command {
                command @ Command::Traffic { .. } => crate::traffic(command, Some(FUZZ_MAX_FLOWS)),
                Command::Topo { scenario, dot: None, json } => crate::topo::describe(&scenario, None, json),
                Command::Inspect { model, batch, json } => crate::models::inspect(&model, batch, json),
                Command::Models { json } => crate::models::list(json),
                _ => return Ok(()),
            };
            match outcome {
                Ok(report) => proptest::prop_assert!(!report.is_empty(), "an empty report for {arguments:?}"),
                Err(error) => {
                    let message = crate::message(&error);
                    names_one_of(&message, &names(&arguments, &DESCRIBE_FLAGS))?;
                }
            }
            Ok(())
        },
    );
}
