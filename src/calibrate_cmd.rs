//! `parasim calibrate`: fit the compute model to the kernels of real PyTorch profiler traces
//! and kernel benchmark tables (DeepBench's `*-gemm.csv` and `*-conv.csv`) of one device type,
//! and write the result as a profile a scenario can name.

use crate::output::stderr;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use sim_core::units::SimDuration;
use traces::kineto::operators::OperatorImport;
use validation::calibration::{self as join, Collected};
use workloads::calibrate::{self, PARAMETERS, class_errors};
use workloads::compute::knobs::{FITTED, KnobValue, fit_position};
use workloads::profile::{CalibrationRecord, ClassError, Profile};
use workloads::{ComputeModel, Device, DeviceCatalog};

use crate::models::table;

/// Folds of the held-out check.
const FOLDS: u64 = 5;

/// A parameter decided by fewer operators than this is reported as kept near its default.
const MIN_SUPPORT: usize = 10;

/// What `parasim calibrate` was asked to do.
#[derive(Debug)]
pub struct Args {
    /// Kineto traces (files or directories).
    pub traces: Vec<PathBuf>,
    /// Catalog name of the traced device.
    pub device: String,
    /// Where the profile goes (required unless `check`).
    pub output: Option<PathBuf>,
    /// Instead of fitting, measure how well this profile (a file or a built-in name) predicts
    /// the traces' kernels.
    pub check: Option<String>,
    /// Let `check` price with a profile of another device type.
    pub any_device: bool,
    /// Print the profile as JSON instead of the report.
    pub json: bool,
    /// Add the fit's error per operator name to the report.
    pub by_operator: bool,
    /// `KEY=VALUE` pairs: parameters held at these values instead of fitted.
    pub hold: Vec<String>,
}

/// Runs the calibration and writes the profile; returns the report.
pub fn calibrate(args: &Args) -> anyhow::Result<String> {
    let device = DeviceCatalog::builtin().get(&args.device).context("--device")?;
    // The fit takes minutes on large traces: a profile that cannot be written is refused first.
    if let Some(output) = &args.output {
        traces::atomic::check_folder(output).context("-o")?;
    }
    let (tables, trace_paths) = join::split_inputs(&args.traces)?;
    let mut host_threads = Vec::new();
    let mut replay_error: Option<anyhow::Error> = None;
    let (import, mut trace_device) = if trace_paths.is_empty() {
        let empty =
            OperatorImport { names: Vec::new(), files: Vec::new(), warnings: traces::Warnings::new() };
        (empty, String::new())
    } else {
        if let Some(binary) = trace_paths.iter().find(|p| p.extension().is_some_and(|e| e == "pstrace")) {
            anyhow::bail!(
                "{}: calibrate reads Kineto JSON traces recorded with record_shapes=True; a .pstrace keeps no operator shapes: give the JSON files",
                binary.display()
            );
        }
        // One parse per file gives the operators and each input's host threads (for the
        // launch intervals); an input the replay import refuses is an error only where the
        // intervals are needed, after the fit.
        let import =
            traces::kineto::import_operators_and_jobs(&trace_paths, |input, imported| match imported {
                Ok(imported) => host_threads.extend(join::host_threads(&imported.trace.ranks)),
                Err(error) => {
                    if replay_error.is_none() {
                        // As `describe_inputs` names one input.
                        replay_error = Some(
                            anyhow::Error::new(error)
                                .context(format!("reading host calls of {}", input.display())),
                        );
                    }
                }
            })?;
        let trace_device = match join::traced_devices(&import, device)? {
            Some(names) => names,
            None => {
                stderr!(
                    "warning: no trace records its GPU (deviceProperties); trusting --device {}",
                    device.name
                );
                format!("{} (from --device)", device.name)
            }
        };
        (import, trace_device)
    };
    let mut collected = join::collect(&import);
    if !tables.is_empty() {
        let described = join::add_tables(&mut collected, &tables, device)?;
        trace_device =
            if trace_device.is_empty() { described } else { format!("{trace_device}; {described}") };
    }
    if collected.samples.is_empty() {
        anyhow::bail!(
            "{}: no operator with kernel time could be costed ({}); calibration needs traces \
             recorded with `torch.profiler.profile(record_shapes=True)`",
            traces::kineto::describe_inputs(&args.traces),
            collected.top_reasons()
        );
    }
    let default = ComputeModel::default();
    if let Some(name) = &args.check {
        // Kernel benchmarks keep the fastest convolution algorithm: price them that way.
        let winograd = !tables.is_empty();
        let default = ComputeModel { winograd_convolutions: winograd, ..default };
        let check =
            check_profile(name, device, &trace_device, &collected, &default, winograd, args.any_device)?;
        if args.json {
            return Ok(serde_json::to_string_pretty(&check)? + "\n");
        }
        return Ok(check.text()
            + &communication_multiprocessors(&import).unwrap_or_default()
            + &tiny_kernels_beside_communication(&collected).unwrap_or_default());
    }
    // With --json the profile goes to standard output, so -o is optional there.
    let output = match (&args.output, args.json) {
        (Some(output), _) => Some(output),
        (None, true) => None,
        (None, false) => anyhow::bail!(
            "give -o PROFILE (where to write the profile), --json (print it), or --check PROFILE"
        ),
    };
    let (mut start, held) = held_start(&args.hold)?;
    // Kernel benchmarks time every convolution algorithm and keep the fastest (Winograd too);
    // they are priced that way. The profile leaves the choice to the scenario.
    start.winograd_convolutions = !tables.is_empty();
    let hold: Vec<&str> = held.keys().map(String::as_str).collect();
    let fit = calibrate::fit_staged(device, &collected.samples, &start, &hold)?;
    let samples = &collected.samples;
    let predicted = calibrate::predictions(&fit.model, device, samples)?;
    let fitted = class_errors(samples, &predicted);
    let before = class_errors(samples, &calibrate::predictions(&default, device, samples)?);
    let held_out =
        class_errors(samples, &calibrate::cross_validate(device, samples, &start, &hold, &fit.model, FOLDS)?);
    let support: BTreeMap<String, usize> =
        PARAMETERS.iter().zip(fit.support).map(|(name, count)| (name.to_string(), count)).collect();
    let launches = match replay_error {
        _ if trace_paths.is_empty() => None,
        Some(error) => return Err(error),
        None => join::launch_record_of_threads(&host_threads),
    };
    let mut compute = ComputeModel { winograd_convolutions: false, ..fit.model.clone() };
    if let Some(record) = &launches {
        compute.dispatch_overhead = SimDuration::from_ns((record.p25_us * 1e3).round() as u64);
    }
    let profile = Profile {
        device: device.name.clone(),
        compute,
        calibration: Some(CalibrationRecord {
            traces: import
                .files
                .iter()
                .map(|f| f.path.as_path())
                .chain(tables.iter().map(PathBuf::as_path))
                .map(|path| {
                    path.file_name().map_or(path.display().to_string(), |n| n.to_string_lossy().into())
                })
                .collect(),
            trace_device: trace_device.clone(),
            operators: samples.len(),
            gemm_dtypes: collected.gemm_dtypes.iter().cloned().collect(),
            support,
            held,
            fit: fitted,
            held_out,
            default_model: before,
            launch_intervals: launches,
        }),
    };
    let header = vec![
        format!(
            "Compute profile of {} ({}), written by `parasim calibrate`.",
            device.name, device.display_name
        ),
        format!(
            "Fitted to {} operators ({:.1}% of the traces' compute-kernel time) measured on {trace_device}.",
            samples.len(),
            100.0 * collected.fitted_s / collected.kernel_s
        ),
        "Use it from a scenario: [compute] profile = \"<this file>\" (or the device name for a built-in)."
            .into(),
        "Errors are |predicted/measured - 1| per operator: median, and weighted by time.".into(),
    ];
    if let Some(output) = output {
        let text = profile.to_toml(&header)?;
        traces::atomic::write(output, &text)
            .with_context(|| format!("writing the profile {}", output.display()))?;
    }
    let Some(output) = output.filter(|_| !args.json) else {
        return Ok(serde_json::to_string_pretty(&profile)? + "\n");
    };
    let mut text = report(output, &profile, &collected, &fit, &default, &import);
    let before_predictions = calibrate::predictions(&default, device, samples)?;
    text.push_str(&regime_table(
        &calibrate::regime_errors(device, samples, &before_predictions),
        &calibrate::regime_errors(device, samples, &predicted),
        "fitted",
    ));
    text.push_str(&sharing_table(&collected, &before_predictions, &predicted, "fitted"));
    if args.by_operator {
        text.push_str(&by_operator(&collected, &predicted));
    }
    Ok(text)
}

/// The defaults with the `--hold KEY=VALUE` pairs set, and those pairs by key. A value is read
/// as a number if it is one (`gemm-ramp-exponent=1`), else as a quantity (`launch-overhead=2us`).
fn held_start(pairs: &[String]) -> anyhow::Result<(ComputeModel, BTreeMap<String, String>)> {
    let mut table = toml::Table::try_from(ComputeModel::default()).context("the default compute model")?;
    let mut held = BTreeMap::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            anyhow::bail!(
                "--hold {pair:?}: expected KEY=VALUE, e.g. gemm-ramp-exponent=1 or launch-overhead=\"2 us\""
            );
        };
        let (key, value) = (key.trim(), value.trim().trim_matches('"'));
        if !PARAMETERS.contains(&key) {
            anyhow::bail!(
                "--hold {pair:?}: no parameter `{key}`; the parameters are {}",
                PARAMETERS.join(", ")
            );
        }
        let parsed = match value.parse::<f64>() {
            Ok(number) => toml::Value::Float(number),
            Err(_) => toml::Value::String(value.to_string()),
        };
        table.insert(key.to_string(), parsed);
        held.insert(key.to_string(), value.to_string());
    }
    let start: ComputeModel = table.try_into().with_context(|| format!("--hold {}", pairs.join(" ")))?;
    start.validate().with_context(|| format!("--hold {}", pairs.join(" ")))?;
    Ok((start, held))
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn signed_percent(x: f64) -> String {
    format!("{:+.1}%", 100.0 * x)
}

/// The human report: coverage, parameters, errors per class, what was left out.
fn report(
    output: &Path,
    profile: &Profile,
    collected: &Collected,
    fit: &calibrate::Fit,
    default: &ComputeModel,
    import: &OperatorImport,
) -> String {
    let mut out = String::new();
    let Some(record) = &profile.calibration else { return out };
    let _ = writeln!(
        out,
        "calibrated {} on {} ({} trace files)",
        profile.device,
        record.trace_device,
        import.files.len()
    );
    let _ = writeln!(
        out,
        "fitted {} operators: {:.1} ms of {:.1} ms compute-kernel time ({})\n",
        record.operators,
        collected.fitted_s * 1e3,
        collected.kernel_s * 1e3,
        percent(collected.fitted_s / collected.kernel_s)
    );
    let values = |m: &ComputeModel| {
        FITTED.map(|knob| match knob.get(m) {
            KnobValue::Number(number) => format!("{number:.3}"),
            KnobValue::Duration(duration) => duration.to_string(),
            KnobValue::Switch(switch) => switch.to_string(),
        })
    };
    let rows: Vec<[String; 4]> = PARAMETERS
        .iter()
        .zip(values(default))
        .zip(values(&profile.compute))
        .zip(fit.support)
        .map(|(((name, before), after), support)| {
            let decided = if record.held.contains_key(*name) {
                "held".to_string()
            } else if support < MIN_SUPPORT {
                format!("{support} (too few: kept near default)")
            } else {
                support.to_string()
            };
            [name.to_string(), before, after, decided]
        })
        .collect();
    out.push_str(&table(&["parameter", "default", "fitted", "operators deciding it"], &rows, &[1, 2]));
    // The efficiencies whose fitted value at an edge says the roofline misfits their kernels.
    for name in [
        "gemm-efficiency",
        "vector-gemm-efficiency",
        "unaligned-gemm-efficiency",
        "unaligned-memory-efficiency",
        "memory-efficiency",
        "reduction-memory-efficiency",
    ] {
        let j = fit_position(name);
        let KnobValue::Number(value) = FITTED[j].get(&profile.compute) else { continue };
        let decided = fit.support[j] >= MIN_SUPPORT;
        // A factor of 1 (no penalty for unaligned products) is a legitimate answer.
        let upper = if name.starts_with("unaligned-") || name.starts_with("conv-") { 1.0 } else { 0.99 };
        if decided && !(0.1..=upper).contains(&value) {
            let _ = writeln!(
                out,
                "warning: {name} = {value:.3} is at the edge of (0, 1]: the roofline does not describe \
                 these kernels well (see --by-operator); use this profile with care"
            );
        }
    }
    let _ = writeln!(
        out,
        "\nerror per operation class (|predicted/measured - 1|: median / weighted by time; total = sum predicted / sum measured - 1)"
    );
    let find = |list: &[ClassError], class: &str| list.iter().find(|e| e.class == class).cloned();
    let mut rows: Vec<[String; 8]> = Vec::new();
    for now in &record.fit {
        let (Some(before), Some(held)) =
            (find(&record.default_model, &now.class), find(&record.held_out, &now.class))
        else {
            continue;
        };
        rows.push([
            now.class.clone(),
            now.samples.to_string(),
            format!("{:.2}", now.measured_s * 1e3),
            error_cell(&before),
            error_cell(now),
            error_cell(&held),
            signed_percent(before.total_error()),
            signed_percent(now.total_error()),
        ]);
    }
    out.push_str(&table(
        &[
            "class",
            "operators",
            "measured ms",
            "default",
            "fitted",
            "held-out shapes",
            "default total",
            "fitted total",
        ],
        &rows,
        &[1, 2, 3, 4, 5, 6, 7],
    ));
    let mut left: Vec<(&(String, String), &join::LeftOut)> = collected.left_out.iter().collect();
    left.sort_by(|a, b| b.1.kernel_s.total_cmp(&a.1.kernel_s));
    if !left.is_empty() {
        let _ = writeln!(out, "\nleft out of the fit (largest kernel time first):");
        let rows: Vec<[String; 4]> = left
            .iter()
            .take(10)
            .map(|((reason, name), l)| {
                [short(name), reason.clone(), l.operators.to_string(), format!("{:.2}", l.kernel_s * 1e3)]
            })
            .collect();
        out.push_str(&table(&["operator", "why", "count", "kernel ms"], &rows, &[2, 3]));
        if left.len() > 10 {
            let rest: f64 = left[10..].iter().map(|(_, l)| l.kernel_s).sum();
            let _ = writeln!(out, "... and {} more operator kinds, {:.2} ms", left.len() - 10, rest * 1e3);
        }
    }
    if let Some(launches) = &record.launch_intervals {
        let _ = writeln!(
            out,
            "\nhost dispatch: {} intervals between kernel launches of one host thread: 10% {} us, \
             25% {} us, median {} us, 75% {} us; dispatch-overhead = the lower quartile",
            launches.intervals, launches.p10_us, launches.p25_us, launches.median_us, launches.p75_us
        );
    }
    if let Some(line) = communication_multiprocessors(import) {
        out.push_str(&line);
    }
    if let Some(line) = tiny_kernels_beside_communication(collected) {
        out.push_str(&line);
    }
    if !import.warnings.is_empty() {
        let _ = writeln!(out, "\nimport warnings:\n{}", import.warnings);
    }
    let _ = writeln!(
        out,
        "\nGEMMs were measured in {}; wrote {}",
        record.gemm_dtypes.join(", "),
        output.display()
    );
    out
}

/// The multiprocessors the traces' NCCL kernels held, from their recorded launch grids
/// ([`traces::kineto::operators::OperatorFile::nccl_blocks`]: one block to an SM) and the traces' `numSms`,
/// averaged over the kernels' time; and the slowdown `1 / (1 - share)` this share alone gives a
/// compute-bound kernel beside them, to set against the fitted `communication-compute-slowdown`
/// (docs/compute-model.md, "Beside NCCL"). `None` without NCCL kernels with a grid on a GPU of
/// known size.
fn communication_multiprocessors(import: &OperatorImport) -> Option<String> {
    let share = join::nccl_share(import)?;
    let sms: Vec<String> = share.multiprocessors.iter().map(u32::to_string).collect();
    let slowdown = share.slowdown().map_or_else(|| "unbounded".into(), |s| format!("{s:.3}"));
    Some(format!(
        "\nNCCL kernels: {:.1} ms on {:.1} thread blocks of {} multiprocessors (time-weighted; \
         one block to an SM): {} of the SMs, a slowdown of {slowdown} for a compute-bound kernel \
         beside them\n",
        share.nccl_s * 1e3,
        share.blocks,
        sms.join(" or "),
        percent(share.share)
    ))
}

/// The measured fixed cost of a kernel alone, beside NCCL kernels and beside copies
/// ([`join::tiny_kernels`]), and the ratios to alone; `None` unless there are operators alone
/// and beside communication.
fn tiny_kernels_beside_communication(collected: &Collected) -> Option<String> {
    let tiny = join::tiny_kernels(&collected.samples, &collected.copy)?;
    let (alone, n_alone) = tiny.alone;
    let beside = |label: &str, group: Option<join::Median>| match group {
        Some((t, n)) => format!("{label} {:.1} us ({n}), {:.2} times", t * 1e6, t / alone),
        None => format!("{label}: none"),
    };
    Some(format!(
        "tiny element-wise kernels (one kernel, at most 64 KiB moved: their time is the fixed \
         cost), median: {:.1} us alone ({n_alone}); {}; {}\n",
        alone * 1e6,
        beside("beside NCCL kernels", tiny.nccl),
        beside("beside copies", tiny.copies)
    ))
}

/// The fitted model's error per operator name, largest measured time first.
fn by_operator(collected: &Collected, predicted: &[f64]) -> String {
    let rows: Vec<[String; 6]> = collected
        .errors_by_operator(predicted)
        .into_iter()
        .map(|(name, members, all)| {
            [
                name,
                calibrate::class_name(collected.samples[members[0]].work.class).to_string(),
                members.len().to_string(),
                format!("{:.2}", all.measured_s * 1e3),
                format!("{} / {}", percent(all.median_error), percent(all.weighted_error)),
                signed_percent(all.total_error()),
            ]
        })
        .collect();
    format!(
        "\nfitted error per operator (median / weighted by time)\n{}",
        table(&["operator", "class", "count", "measured ms", "error", "total"], &rows, &[2, 3, 4, 5])
    )
}

/// What `calibrate --check` found: the errors of a profile and of the defaults, per operation
/// class, per shape regime and by GPU sharing (`--check --json` prints it).
#[derive(Debug, Serialize)]
struct Check {
    /// The profile checked, as named.
    profile: String,
    /// The device it was calibrated on.
    calibrated_on: String,
    /// The device the kernels are priced as (`--device`).
    device: String,
    /// The GPU the traces name.
    trace_device: String,
    /// Operators compared.
    operators: usize,
    /// Per operation class.
    classes: Vec<CheckRow>,
    /// Per shape regime.
    regimes: Vec<CheckRow>,
    /// Operators alone on their GPU, and beside other streams' work.
    sharing: Vec<CheckRow>,
    /// The text report's tables.
    #[serde(skip)]
    text: String,
}

/// One group's errors under the defaults and under the profile.
#[derive(Debug, Serialize)]
struct CheckRow {
    /// The group's name.
    group: String,
    /// The defaults' errors.
    default: ClassError,
    /// The profile's errors.
    profile: ClassError,
}

impl Check {
    /// The text report.
    fn text(self) -> String {
        self.text
    }
}

fn check_rows(default: &[ClassError], profile: &[ClassError], prefix: &str) -> Vec<CheckRow> {
    default
        .iter()
        .zip(profile)
        .map(|(d, p)| CheckRow {
            group: format!("{prefix}{}", p.class),
            default: d.clone(),
            profile: p.clone(),
        })
        .collect()
}

/// `--check`: the errors of an existing profile on these traces' kernels, next to the
/// defaults'. The profile may come from another device (that is what the check is for).
fn check_profile(
    name: &str,
    device: &Device,
    trace_device: &str,
    collected: &Collected,
    default: &ComputeModel,
    winograd: bool,
    any_device: bool,
) -> anyhow::Result<Check> {
    let (mut profile, _) =
        scenario::read_profile(name, Path::new("")).map_err(anyhow::Error::msg).context("--check")?;
    // As in a scenario: a profile describes one device type (or one with the same compute).
    let same_type = workloads::DeviceCatalog::builtin().same_type(&profile.device, device);
    if !same_type && !any_device {
        anyhow::bail!(
            "--check {name}: the profile was calibrated on {}, but --device is {}: a profile describes one device type (built-in profiles: {}); add --any-device to measure how it transfers",
            profile.device,
            device.name,
            workloads::profile::Profile::builtin_names().join(", ")
        );
    }
    profile.compute.winograd_convolutions |= winograd;
    let samples = &collected.samples;
    let default_predictions = calibrate::predictions(default, device, samples)?;
    let profile_predictions = calibrate::predictions(&profile.compute, device, samples)?;
    let with_profile = class_errors(samples, &profile_predictions);
    let with_defaults = class_errors(samples, &default_predictions);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "checked profile {name} (calibrated on {}) against {} operators measured on {trace_device}, priced as {}",
        profile.device,
        samples.len(),
        device.name
    );
    let _ = writeln!(out, "error per operation class (|predicted/measured - 1|: median / weighted by time)");
    let rows: Vec<[String; 7]> =
        with_profile.iter().zip(&with_defaults).map(|(p, d)| error_row(p.class.clone(), d, p)).collect();
    out.push_str(&table(
        &["class", "operators", "measured ms", "default", "profile", "default total", "profile total"],
        &rows,
        &[1, 2, 3, 4, 5, 6],
    ));
    out.push_str(&regime_table(
        &calibrate::regime_errors(device, samples, &default_predictions),
        &calibrate::regime_errors(device, samples, &profile_predictions),
        "profile",
    ));
    out.push_str(&sharing_table(collected, &default_predictions, &profile_predictions, "profile"));
    let default_regimes = calibrate::regime_errors(device, samples, &default_predictions);
    let profile_regimes = calibrate::regime_errors(device, samples, &profile_predictions);
    let mut sharing = Vec::new();
    for (shared, d, p) in collected.errors_by_sharing(&default_predictions, &profile_predictions) {
        let prefix = if shared { "beside other streams: " } else { "alone: " };
        sharing.extend(check_rows(&d, &p, prefix));
    }
    Ok(Check {
        profile: name.to_string(),
        calibrated_on: profile.device.clone(),
        device: device.name.clone(),
        trace_device: trace_device.to_string(),
        operators: samples.len(),
        classes: check_rows(&with_defaults, &with_profile, ""),
        regimes: check_rows(&default_regimes, &profile_regimes, ""),
        sharing,
        text: out,
    })
}

/// The errors of operators whose kernels ran alone on their GPU and of those that shared it
/// with another stream's kernels or copies for more than half their time (an NCCL kernel
/// beside them, a host copy): the latter's times are not their own, and no parameter of a
/// kernel's model describes them. Empty when no operator shared its GPU.
fn sharing_table(collected: &Collected, default: &[f64], profile: &[f64], label: &str) -> String {
    let groups = collected.errors_by_sharing(default, profile);
    if groups.is_empty() {
        return String::new();
    }
    let mut rows: Vec<[String; 7]> = Vec::new();
    for (sharing, d, p) in groups {
        let name = if sharing { "beside other streams" } else { "alone" };
        rows.extend(d.iter().zip(&p).map(|(d, p)| error_row(format!("{name}: {}", p.class), d, p)));
    }
    let total = format!("{label} total");
    format!(
        "\nerror of operators that ran alone on their GPU and of those beside another stream's work for most of their time\n{}",
        table(
            &["operators", "count", "measured ms", "default", label, "default total", &total],
            &rows,
            &[1, 2, 3, 4, 5, 6]
        )
    )
}

/// A class's "median / weighted" error cell.
fn error_cell(error: &ClassError) -> String {
    format!("{} / {}", percent(error.median_error), percent(error.weighted_error))
}

/// One row of a default-against-profile error table: the label, the samples, the measured time,
/// median / weighted error of each, and each one's total error.
fn error_row(label: String, default: &ClassError, profile: &ClassError) -> [String; 7] {
    [
        label,
        profile.samples.to_string(),
        format!("{:.2}", profile.measured_s * 1e3),
        error_cell(default),
        error_cell(profile),
        signed_percent(default.total_error()),
        signed_percent(profile.total_error()),
    ]
}

/// The errors per shape regime ([`calibrate::regime_errors`]) of the defaults and of a profile.
fn regime_table(default: &[ClassError], profile: &[ClassError], label: &str) -> String {
    let rows: Vec<[String; 7]> =
        default.iter().zip(profile).map(|(d, p)| error_row(p.class.clone(), d, p)).collect();
    let total = format!("{label} total");
    format!(
        "\nerror per shape regime (median / weighted by time)\n{}",
        table(
            &["regime", "kernels", "measured ms", "default", label, "default total", &total],
            &rows,
            &[1, 2, 3, 4, 5, 6]
        )
    )
}

/// A name cut to 60 characters for tables (C++ template names run to hundreds).
fn short(name: &str) -> String {
    if name.chars().count() <= 60 {
        return name.to_string();
    }
    let head: String = name.chars().take(57).collect();
    format!("{head}...")
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::calibrate::Sample;

    fn tiny(measured_us: f64, communication: f64) -> Sample {
        Sample {
            work: workloads::KernelWork::flat(
                workloads::OpClass::Elementwise,
                workloads::Dtype::Fp32,
                0.0,
                4.0,
            ),
            after: Vec::new(),
            kernels: 1,
            measured_s: measured_us * 1e-6,
            communication,
            group: 0,
        }
    }

    /// The tiny kernels' line: medians alone, beside NCCL kernels and beside copies, and the
    /// ratios to alone ([`join::tiny_kernels`] decides the groups).
    #[test]
    fn the_tiny_kernels_line_gives_each_group_and_its_ratio_to_alone() {
        let collected = Collected {
            samples: vec![tiny(3.0, 0.0), tiny(6.0, 1.0), tiny(9.0, 1.0), tiny(12.0, 1.0)],
            copy: vec![0.0, 0.0, 0.0, 0.5],
            ..Collected::default()
        };
        let line = tiny_kernels_beside_communication(&collected).unwrap();
        assert!(
            line.contains(
                "median: 3.0 us alone (1); beside NCCL kernels 7.5 us (2), 2.50 times; \
                 beside copies 12.0 us (1), 4.00 times"
            ),
            "{line}"
        );
        let collected = Collected { copy: vec![0.0; 4], ..collected };
        assert!(tiny_kernels_beside_communication(&collected).unwrap().ends_with("beside copies: none\n"));
    }
}
