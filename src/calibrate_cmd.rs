//! `parasim calibrate`: fit the compute model to the kernels of real PyTorch profiler traces
//! and kernel benchmark tables (DeepBench's `*-gemm.csv` and `*-conv.csv`) of one device type,
//! and write the result as a profile a scenario can name.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sim_core::units::SimDuration;
use traces::kineto::operators::{Activity, ActivityKind, OperatorImport, ProfiledOperator};
use workloads::aten::{OperatorCall, Uncosted, operator_kernels};
use workloads::calibrate::{self, PARAMETERS, Sample, class_errors};
use workloads::compute::knobs::{FITTED, KnobValue, fit_position};
use workloads::profile::{CalibrationRecord, ClassError, LaunchRecord, Profile};
use workloads::{ComputeModel, Device, DeviceCatalog, Dtype, deepbench};

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

/// Why an operator was left out of the fit, with how much kernel time it had.
#[derive(Debug, Default)]
struct Left {
    operators: u64,
    kernel_s: f64,
}

/// The operators of the traces as fit samples, and what was left out.
#[derive(Debug, Default)]
struct Collected {
    samples: Vec<Sample>,
    /// The operator name of each sample.
    names: Vec<String>,
    gemm_dtypes: BTreeSet<String>,
    /// (reason, operator name) -> count and time.
    left_out: BTreeMap<(String, String), Left>,
    kernel_s: f64,
    fitted_s: f64,
    /// Whether each sample's kernels shared the GPU with another stream's work for more than
    /// half their time.
    shared: Vec<bool>,
    /// The share of each sample's kernel time beside another stream's copy
    /// (`Activity::copy_ns`): part of its communication share.
    copy: Vec<f64>,
}

/// Runs the calibration and writes the profile; returns the report.
pub fn calibrate(args: &Args) -> anyhow::Result<String> {
    let device = DeviceCatalog::builtin().get(&args.device).context("--device")?;
    let (tables, trace_paths) = split_inputs(&args.traces)?;
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
        let import = traces::kineto::import_operators(&trace_paths)?;
        let trace_device = check_device(&import, device)?;
        (import, trace_device)
    };
    let mut collected = collect(&import);
    if !tables.is_empty() {
        let described = add_tables(&mut collected, &tables, device)?;
        trace_device =
            if trace_device.is_empty() { described } else { format!("{trace_device}; {described}") };
    }
    if collected.samples.is_empty() {
        anyhow::bail!(
            "{}: no operator with kernel time could be costed ({}); calibration needs traces \
             recorded with `torch.profiler.profile(record_shapes=True)`",
            traces::kineto::describe_inputs(&args.traces),
            top_reasons(&collected)
        );
    }
    let default = ComputeModel::default();
    if let Some(name) = &args.check {
        // Kernel benchmarks keep the fastest convolution algorithm: price them that way.
        let winograd = !tables.is_empty();
        let default = ComputeModel { winograd_convolutions: winograd, ..default };
        let report =
            check_profile(name, device, &trace_device, &collected, &default, winograd, args.any_device)?;
        return Ok(report
            + &communication_multiprocessors(&import).unwrap_or_default()
            + &tiny_kernels_beside_communication(&collected.samples, &collected.copy).unwrap_or_default());
    }
    let output =
        args.output.as_ref().context("give -o PROFILE (where to write the profile) or --check PROFILE")?;
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
    let launches = if trace_paths.is_empty() { None } else { launch_record(&trace_paths)? };
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
    let text = profile.to_toml(&header)?;
    fs_err::write(output, &text).with_context(|| format!("writing the profile {}", output.display()))?;
    if args.json {
        return Ok(serde_json::to_string_pretty(&profile)? + "\n");
    }
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

/// The traced GPUs' names, after checking that every file that records its GPU ran on
/// `device` or on a catalog device that computes exactly like it (the same peaks and memory
/// bandwidth: V100-SXM2 16 GB and 32 GB). GPUs are recognized by their memory capacity, within
/// 10%, since traces name them in many ways ("A100-PG509-200" is an A100 SXM4 40 GB).
fn check_device(import: &OperatorImport, device: &Device) -> anyhow::Result<String> {
    let recorded: Vec<(&Path, &traces::model::DeviceInfo)> =
        import.files.iter().filter_map(|f| f.device.as_ref().map(|d| (f.path.as_path(), d))).collect();
    if recorded.is_empty() {
        eprintln!("warning: no trace records its GPU (deviceProperties); trusting --device {}", device.name);
        return Ok(format!("{} (from --device)", device.name));
    }
    let catalog = DeviceCatalog::builtin();
    let near =
        |bytes: f64, candidate: &Device| (bytes / candidate.memory_capacity.as_f64() - 1.0).abs() <= 0.1;
    for (path, traced) in &recorded {
        let bytes = traced.memory_bytes as f64;
        if bytes <= 0.0 {
            continue;
        }
        let matches = catalog.devices().iter().any(|d| near(bytes, d) && d.same_compute(device));
        if !matches {
            let same_size: Vec<&str> =
                catalog.devices().iter().filter(|d| near(bytes, d)).map(|d| d.name.as_str()).collect();
            anyhow::bail!(
                "{} was recorded on a {} with {:.1} GB of memory, which is not --device {} ({:.1} GB) \
                 or a device that computes like it; a profile describes one device type. Catalog \
                 devices of that memory size: {}",
                path.display(),
                traced.name,
                bytes / 1e9,
                device.name,
                device.memory_capacity.as_f64() / 1e9,
                if same_size.is_empty() { "none".to_string() } else { same_size.join(", ") }
            );
        }
    }
    let mut names: Vec<&str> = recorded.iter().map(|(_, d)| d.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Ok(names.join(", "))
}

/// Costs every operator that launched compute kernels and nothing else that the device's
/// roofline does not describe.
fn collect(import: &OperatorImport) -> Collected {
    let mut out = Collected::default();
    for file in &import.files {
        out.kernel_s += file.kernel_ns as f64 * 1e-9;
        for op in &file.operators {
            let has = |kind: ActivityKind| op.activities.iter().any(|a| a.kind == kind);
            let name = import.name(op.name);
            let mut leave = |reason: &str| {
                let entry = out.left_out.entry((reason.to_string(), name.to_string())).or_default();
                entry.operators += 1;
                entry.kernel_s += op.duration_ns(ActivityKind::Kernel) as f64 * 1e-9;
            };
            if has(ActivityKind::Nccl) {
                leave("communication");
                continue;
            }
            if !has(ActivityKind::Kernel) && !has(ActivityKind::Memset) {
                // Only copies: the host link's business, not the device's roofline.
                continue;
            }
            if has(ActivityKind::Memcpy) {
                leave("copies over the host link");
                continue;
            }
            let kernel_ns = op.duration_ns(ActivityKind::Kernel) + op.duration_ns(ActivityKind::Memset);
            if kernel_ns == 0 {
                leave("kernel time rounds to 0 us");
                continue;
            }
            let kernels = op.activities.iter().filter(|a| a.kind != ActivityKind::Memcpy).count();
            let kernel_names: Vec<&str> = op.activities.iter().map(|a| import.name(a.name)).collect();
            let call = OperatorCall { name, dims: &op.dims, types: &op.types, kernel_names: &kernel_names };
            match operator_kernels(&call) {
                Ok(works) => {
                    let mut works = works.into_iter();
                    let Some(work) = works.next() else { continue };
                    if work.class == workloads::OpClass::Gemm {
                        out.gemm_dtypes.insert(work.dtype.name().to_string());
                    }
                    out.fitted_s += op.duration_ns(ActivityKind::Kernel) as f64 * 1e-9;
                    let beside = |share: fn(&Activity) -> u64| -> u64 {
                        op.activities.iter().filter(|a| a.kind != ActivityKind::Memcpy).map(share).sum()
                    };
                    let communication_ns = beside(|a| a.communication_ns);
                    out.samples.push(Sample {
                        work,
                        after: works.collect(),
                        kernels: kernels as u32,
                        measured_s: kernel_ns as f64 * 1e-9,
                        communication: (communication_ns as f64 / kernel_ns as f64).min(1.0),
                        group: shape_key(name, op),
                    });
                    out.names.push(name.to_string());
                    out.shared.push(2 * beside(|a| a.concurrent_ns) > kernel_ns);
                    out.copy.push((beside(|a| a.copy_ns) as f64 / kernel_ns as f64).min(1.0));
                }
                Err(Uncosted::UnknownOperator) => leave("no cost formula"),
                Err(Uncosted::MissingShapes) => leave("shapes or values not recorded"),
                Err(Uncosted::UnsupportedDtype(_)) => leave("unsupported dtype"),
                Err(Uncosted::Malformed(_)) => leave("malformed shapes"),
            }
        }
    }
    out
}

/// The launch intervals of the traces' host threads ([`workloads::dispatch::launch_intervals`]),
/// or `None` if no thread launched twice in a row.
fn launch_record(paths: &[PathBuf]) -> anyhow::Result<Option<LaunchRecord>> {
    use traces::model::CallKind;
    use workloads::dispatch::{HostCall, launch_intervals};
    let mut threads: Vec<Vec<HostCall>> = Vec::new();
    // Each input is its own job (a file, or a directory of one job's ranks).
    let mut ranks = Vec::new();
    for path in paths {
        let job = std::slice::from_ref(path);
        let imported = traces::kineto::import(job)
            .with_context(|| format!("reading host calls of {}", traces::kineto::describe_inputs(job)))?;
        ranks.extend(imported.trace.ranks);
    }
    for rank in &ranks {
        // Calls are sorted by (thread, start).
        let mut current: Option<u32> = None;
        for call in &rank.calls {
            if current != Some(call.thread) {
                threads.push(Vec::new());
                current = Some(call.thread);
            }
            let host = match call.kind {
                CallKind::Launch => HostCall::Launch(call.start_ns),
                CallKind::Synchronize(_) => HostCall::Synchronize,
                CallKind::StreamWaitEvent => continue,
            };
            if let Some(thread) = threads.last_mut() {
                thread.push(host);
            }
        }
    }
    let us = |d: SimDuration| (d.as_secs_f64() * 1e7).round() / 10.0;
    Ok(launch_intervals(&threads).map(|stats| LaunchRecord {
        intervals: stats.intervals,
        p10_us: us(stats.p10),
        p25_us: us(stats.p25),
        median_us: us(stats.median),
        p75_us: us(stats.p75),
    }))
}

/// Kernel benchmark tables (DeepBench's `<family>-<precision>-gemm.csv` and `-conv.csv`,
/// given as files or as directories holding them) apart from traces.
fn split_inputs(paths: &[PathBuf]) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let is_table = |path: &Path| {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("-gemm.csv") || n.ends_with("-conv.csv"))
    };
    let (mut tables, mut traces) = (Vec::new(), Vec::new());
    for path in paths {
        if path.is_dir() {
            let mut inside: Vec<PathBuf> = fs_err::read_dir(path)?
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|p| is_table(p))
                .collect();
            if inside.is_empty() {
                traces.push(path.clone());
            } else {
                inside.sort();
                tables.extend(inside);
            }
        } else if is_table(path) {
            tables.push(path.clone());
        } else {
            traces.push(path.clone());
        }
    }
    Ok((tables, traces))
}

/// Adds the kernels of DeepBench tables measured on `device`'s family (the file name's first
/// word, `v100` for `v100-sxm2-16gb`; a directory's tables of other families are skipped),
/// and describes them for the report.
fn add_tables(collected: &mut Collected, tables: &[PathBuf], device: &Device) -> anyhow::Result<String> {
    let family = device.name.split('-').next().unwrap_or_default();
    let mut used = Vec::new();
    for path in tables {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let Some(stem) = name.strip_suffix("-gemm.csv").or_else(|| name.strip_suffix("-conv.csv")) else {
            continue;
        };
        let Some((table_family, precision)) = stem.split_once('-') else {
            anyhow::bail!("{}: expected a name <device>-<precision>-gemm.csv or -conv.csv", path.display());
        };
        if table_family != family {
            continue;
        }
        let dtype = match precision {
            "fp32" => Dtype::Fp32,
            "fp16" | "fp16-mixed" => Dtype::Fp16,
            other => anyhow::bail!("{}: unknown precision {other:?} (fp32 or fp16-mixed)", path.display()),
        };
        let text = fs_err::read_to_string(path)?;
        let samples = if name.ends_with("-gemm.csv") {
            deepbench::samples(
                device,
                &deepbench::parse_gemms(&text).with_context(|| path.display().to_string())?,
                &[],
                dtype,
            )
        } else {
            deepbench::samples(
                device,
                &[],
                &deepbench::parse_convs(&text).with_context(|| path.display().to_string())?,
                dtype,
            )
        };
        collected.gemm_dtypes.insert(dtype.name().to_string());
        for sample in samples {
            let kind = match sample.work.shape {
                workloads::KernelShape::Conv { direction, .. } => match direction {
                    workloads::ConvDirection::Forward => "convolution forward",
                    workloads::ConvDirection::BackwardData => "convolution backward-data",
                    workloads::ConvDirection::BackwardWeight => "convolution backward-weight",
                },
                _ => "gemm",
            };
            collected.kernel_s += sample.measured_s;
            collected.fitted_s += sample.measured_s;
            collected.names.push(format!("deepbench {precision} {kind}"));
            collected.shared.push(false);
            collected.copy.push(0.0);
            collected.samples.push(sample);
        }
        used.push(name.to_string());
    }
    if used.is_empty() {
        anyhow::bail!(
            "no kernel table of the {family} family among {} (file names start with the device family)",
            tables.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(format!("DeepBench tables {}", used.join(", ")))
}

/// Operators with the same name, shapes and types share a key: FNV-1a over the operator's name, shapes and types as text: stable across Rust versions
/// (the standard library's hasher is not), so the held-out folds, and the errors a profile
/// records, do not change with the toolchain.
fn shape_key(name: &str, op: &ProfiledOperator) -> u64 {
    let text = format!("{name}|{:?}|{:?}", op.dims, op.types);
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// The three biggest reasons operators were left out, for the error message.
fn top_reasons(collected: &Collected) -> String {
    let mut by_reason: BTreeMap<&str, f64> = BTreeMap::new();
    for ((reason, _), left) in &collected.left_out {
        *by_reason.entry(reason).or_default() += left.kernel_s;
    }
    let mut reasons: Vec<(&str, f64)> = by_reason.into_iter().collect();
    reasons.sort_by(|a, b| b.1.total_cmp(&a.1));
    let listed: Vec<String> =
        reasons.iter().take(3).map(|(r, s)| format!("{r}: {:.1} ms of kernels", s * 1e3)).collect();
    if listed.is_empty() { "no operator launched a compute kernel".into() } else { listed.join("; ") }
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
    let mut left: Vec<(&(String, String), &Left)> = collected.left_out.iter().collect();
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
    if let Some(line) = tiny_kernels_beside_communication(&collected.samples, &collected.copy) {
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
    let (mut nccl_ns, mut block_ns, mut share_ns) = (0u64, 0.0, 0.0);
    let mut sms = BTreeSet::new();
    for file in &import.files {
        let multiprocessors = file.device.as_ref().map_or(0, |d| d.multiprocessors);
        let Some(blocks) = file.nccl_blocks().filter(|_| multiprocessors > 0) else { continue };
        nccl_ns += file.nccl_ns;
        block_ns += blocks * file.nccl_ns as f64;
        share_ns += (blocks / f64::from(multiprocessors)).min(1.0) * file.nccl_ns as f64;
        sms.insert(multiprocessors);
    }
    if nccl_ns == 0 {
        return None;
    }
    let (blocks, share) = (block_ns / nccl_ns as f64, share_ns / nccl_ns as f64);
    let sms: Vec<String> = sms.iter().map(u32::to_string).collect();
    let slowdown = if share < 1.0 { format!("{:.3}", 1.0 / (1.0 - share)) } else { "unbounded".into() };
    Some(format!(
        "\nNCCL kernels: {:.1} ms on {blocks:.1} thread blocks of {} multiprocessors (time-weighted; \
         one block to an SM): {} of the SMs, a slowdown of {slowdown} for a compute-bound kernel \
         beside them\n",
        nccl_ns as f64 / 1e6,
        sms.join(" or "),
        percent(share)
    ))
}

/// Traffic up to which a one-kernel element-wise operator counts as tiny in
/// [`tiny_kernels_beside_communication`]: 64 KiB streams in under 0.1 us at any catalog GPU's
/// bandwidth, so such a kernel's measured time is its fixed cost.
const TINY_KERNEL_BYTES: f64 = 65_536.0;

/// The median of `values` (sorted in place; [`workloads::calibrate::median`]); `None` if empty.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    (!values.is_empty()).then(|| workloads::calibrate::median(values))
}

/// The measured fixed cost of a kernel alone, beside NCCL kernels and beside copies: the median
/// time of the tiny one-kernel element-wise operators (at most [`TINY_KERNEL_BYTES`] moved) that
/// ran with no communication on their GPU, of those beside communication for at least 99% of
/// their time with no copy among it (NCCL kernels only), and of those with a copy
/// (`copy[i]`, the share of sample `i`'s time beside a copy, above 0), and the ratios to alone.
/// This is what `communication-launch-slowdown` stands for, measured directly
/// (docs/compute-model.md, "Tiny kernels beside NCCL kernels and beside copies"); `None` unless
/// there are operators alone and beside communication.
fn tiny_kernels_beside_communication(samples: &[Sample], copy: &[f64]) -> Option<String> {
    let (mut alone, mut nccl, mut copies) = (Vec::new(), Vec::new(), Vec::new());
    for (i, s) in samples.iter().enumerate() {
        let tiny = s.work.class == workloads::OpClass::Elementwise
            && s.after.is_empty()
            && s.kernels == 1
            && s.work.bytes <= TINY_KERNEL_BYTES;
        if !tiny {
            continue;
        }
        if s.communication == 0.0 {
            alone.push(s.measured_s);
        } else if s.communication >= 0.99 {
            if copy.get(i).copied().unwrap_or(0.0) > 0.0 { &mut copies } else { &mut nccl }
                .push(s.measured_s);
        }
    }
    let n_alone = alone.len();
    let alone = median(&mut alone)?;
    if nccl.is_empty() && copies.is_empty() {
        return None;
    }
    let beside = |label: &str, times: &mut Vec<f64>| {
        let n = times.len();
        match median(times) {
            Some(t) => format!("{label} {:.1} us ({n}), {:.2} times", t * 1e6, t / alone),
            None => format!("{label}: none"),
        }
    };
    Some(format!(
        "tiny element-wise kernels (one kernel, at most 64 KiB moved: their time is the fixed \
         cost), median: {:.1} us alone ({n_alone}); {}; {}\n",
        alone * 1e6,
        beside("beside NCCL kernels", &mut nccl),
        beside("beside copies", &mut copies)
    ))
}

/// The fitted model's error per operator name, largest measured time first.
fn by_operator(collected: &Collected, predicted: &[f64]) -> String {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, name) in collected.names.iter().enumerate() {
        groups.entry(name).or_default().push(i);
    }
    let samples = &collected.samples;
    let mut rows: Vec<(f64, [String; 6])> = groups
        .into_iter()
        .map(|(name, members)| {
            let subset: Vec<Sample> = members.iter().map(|&i| samples[i].clone()).collect();
            let predictions: Vec<f64> = members.iter().map(|&i| predicted[i]).collect();
            let errors = class_errors(&subset, &predictions);
            let all = errors.last().cloned().unwrap_or_else(|| ClassError {
                class: String::new(),
                samples: 0,
                measured_s: 0.0,
                predicted_s: 0.0,
                median_error: 0.0,
                weighted_error: 0.0,
            });
            (
                all.measured_s,
                [
                    name.to_string(),
                    calibrate::class_name(subset[0].work.class).to_string(),
                    members.len().to_string(),
                    format!("{:.2}", all.measured_s * 1e3),
                    format!("{} / {}", percent(all.median_error), percent(all.weighted_error)),
                    signed_percent(all.total_error()),
                ],
            )
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let rows: Vec<[String; 6]> = rows.into_iter().map(|(_, row)| row).collect();
    format!(
        "\nfitted error per operator (median / weighted by time)\n{}",
        table(&["operator", "class", "count", "measured ms", "error", "total"], &rows, &[2, 3, 4, 5])
    )
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
) -> anyhow::Result<String> {
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
    Ok(out)
}

/// The errors of operators whose kernels ran alone on their GPU and of those that shared it
/// with another stream's kernels or copies for more than half their time (an NCCL kernel
/// beside them, a host copy): the latter's times are not their own, and no parameter of a
/// kernel's model describes them. Empty when no operator shared its GPU.
fn sharing_table(collected: &Collected, default: &[f64], profile: &[f64], label: &str) -> String {
    let shared = |i: usize| collected.shared.get(i).copied().unwrap_or(false);
    if !(0..collected.samples.len()).any(shared) {
        return String::new();
    }
    let mut rows: Vec<[String; 7]> = Vec::new();
    for (sharing, name) in [(false, "alone"), (true, "beside other streams")] {
        let pick: Vec<usize> = (0..collected.samples.len()).filter(|&i| shared(i) == sharing).collect();
        if pick.is_empty() {
            continue;
        }
        let samples: Vec<Sample> = pick.iter().map(|&i| collected.samples[i].clone()).collect();
        let subset = |predictions: &[f64]| -> Vec<f64> { pick.iter().map(|&i| predictions[i]).collect() };
        let (d, p) = (class_errors(&samples, &subset(default)), class_errors(&samples, &subset(profile)));
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

    fn tiny(measured_us: f64, communication: f64, bytes: f64, kernels: u32) -> Sample {
        Sample {
            work: workloads::KernelWork::flat(workloads::OpClass::Elementwise, Dtype::Fp32, 0.0, bytes),
            after: Vec::new(),
            kernels,
            measured_s: measured_us * 1e-6,
            communication,
            group: 0,
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    /// Only tiny one-kernel element-wise operators count: alone (no communication) against
    /// fully beside communication (at least 99% of their time), split by whether a copy ran
    /// meanwhile; the rest are left out.
    #[test]
    fn tiny_kernels_compare_alone_with_beside_nccl_and_copies() {
        let samples = vec![
            tiny(3.0, 0.0, 4.0, 1),
            tiny(4.0, 0.0, 65_536.0, 1),
            tiny(2.0, 0.0, 1024.0, 1),
            tiny(6.0, 1.0, 4.0, 1),
            tiny(9.0, 0.995, 4.0, 1),
            tiny(12.0, 1.0, 4.0, 1),
            // Left out: half beside, too large, two kernels.
            tiny(50.0, 0.5, 4.0, 1),
            tiny(50.0, 0.0, 65_537.0, 1),
            tiny(50.0, 1.0, 4.0, 2),
        ];
        let copy = [0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 1.0];
        let line = tiny_kernels_beside_communication(&samples, &copy).unwrap();
        assert!(
            line.contains(
                "median: 3.0 us alone (3); beside NCCL kernels 7.5 us (2), 2.50 times; \
                 beside copies 12.0 us (1), 4.00 times"
            ),
            "{line}"
        );
        // Without copies the copies' group says so.
        let line = tiny_kernels_beside_communication(&samples[..5], &copy).unwrap();
        assert!(line.ends_with("beside copies: none\n"), "{line}");
        // Without operators beside communication there is nothing to compare.
        assert_eq!(tiny_kernels_beside_communication(&samples[..3], &copy), None);
    }
}
