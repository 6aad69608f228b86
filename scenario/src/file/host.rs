//! `cluster.host` and `workload.execution`: the servers' host CPU and how the framework runs the
//! model, which together give the host's measured time to issue one op.
//!
//! The catalog is `data/hosts.toml`, compiled in: each host names its CPU (cited) and the
//! per-op dispatch cost measured on it for each execution mode (`eager`, `compile`, `native`),
//! each with its source. An `eager` figure is one bare op's cost; a training step's host spends
//! more per kernel (module calls, autograd, views), so the eager figure is written in times the
//! catalog's measured [`EagerTraining::factor`]. Before a scenario table is read (after the
//! framework's settings are
//! written in, so a framework may set `workload.execution`), [`apply`] writes the named host's
//! cost for the mode into `compute.dispatch-overhead` where the scenario leaves it out, and
//! `compute.cuda-graphs = true` for `execution = "cuda-graphs"`. Precedence: a
//! `compute.dispatch-overhead` the scenario sets, then the host's measurement, then parasim's
//! built-in default (18.5 us, measured on six profiler traces: docs/compute-model.md). A mode
//! the named host has no measurement for is refused with the modes it has: never a guess.
//!
//! ```
//! let mut table: toml::Table = toml::from_str(scenario::QUICKSTART)?;
//! let _ = scenario::Override::new("cluster.host", "gb200").apply(&mut table);
//! let _ = scenario::Override::new("workload.execution", "compile").apply(&mut table);
//! let used = scenario::host::apply(&mut table).map_err(|(key, message)| format!("{key}: {message}"))?;
//! let used = used.expect("a host is named");
//! assert_eq!(used.dispatch.as_deref(), Some("6.8 us"));
//! // Eager: the bare op's 6.8 us on DGX H100 times the training factor.
//! let mut table: toml::Table = toml::from_str(scenario::QUICKSTART)?;
//! let _ = scenario::Override::new("cluster.device", "h100-sxm5-80gb").apply(&mut table);
//! let _ = scenario::Override::new("cluster.host", "dgx-h100").apply(&mut table);
//! let used = scenario::host::apply(&mut table).map_err(|(key, message)| format!("{key}: {message}"))?;
//! assert_eq!(used.expect("a host is named").dispatch.as_deref(), Some("15.844 us"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::overrides::{InlineValue, Override, get_dotted};

/// The catalog's text (`data/hosts.toml`).
const CATALOG_TOML: &str = include_str!("../../../data/hosts.toml");

/// The scenario key that names the host.
pub const HOST_KEY: &str = "cluster.host";
/// The scenario key that names the execution mode.
pub const EXECUTION_KEY: &str = "workload.execution";
/// The key the host's cost is written to.
const DISPATCH_KEY: &str = "compute.dispatch-overhead";
/// The key of each further kernel's cost, which the host's measurement also writes.
const OP_DISPATCH_KEY: &str = "compute.op-dispatch-overhead";
/// The key `execution = "cuda-graphs"` sets.
const GRAPHS_KEY: &str = "compute.cuda-graphs";
/// The key a host's CPUs are written into.
const HOST_CPU_KEY: &str = "cluster.host-cpu";

/// The execution modes `workload.execution` takes.
pub const MODES: &[&str] = &["eager", "compile", "native", "cuda-graphs"];

/// One host of the catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// The name `cluster.host` takes.
    pub name: String,
    /// What it is: the server and its CPUs.
    pub title: String,
    /// Where the CPU model comes from.
    pub source: String,
    /// The catalog devices the server carries (`cluster.device` must be one of them); empty
    /// for no check.
    #[serde(default)]
    pub devices: Vec<String>,
    /// The server's CPUs as a catalog device (`kind = "cpu"` in data/devices.toml), written
    /// into `cluster.host-cpu` where the scenario leaves it out: what a host optimizer step
    /// runs on.
    #[serde(default)]
    pub cpu: Option<String>,
    /// The measured per-op costs, one per execution mode at most.
    #[serde(rename = "dispatch", default)]
    pub dispatch: Vec<Dispatch>,
}

/// One measured per-op host cost: for which execution mode, how much, and from where.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dispatch {
    /// The execution mode (`eager`, `compile`, `native`).
    pub mode: String,
    /// The cost, as a scenario writes a duration (`"6.8 us"`).
    pub value: String,
    /// The measurement and how the value follows from it.
    pub source: String,
}

/// How much more host time a kernel of an eager training step costs than one bare op
/// (`[eager-training]` of the catalog): measured, never fitted to a validation case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EagerTraining {
    /// The training step's host time per launch over the bare op's time per call.
    pub factor: f64,
    /// The measurements and how the factor follows from them.
    pub source: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    #[serde(rename = "eager-training")]
    eager_training: EagerTraining,
    host: Vec<Host>,
}

/// The parsed catalog (compiled in).
fn catalog_file() -> &'static CatalogFile {
    static CATALOG: OnceLock<CatalogFile> = OnceLock::new();
    CATALOG.get_or_init(|| match toml::from_str::<CatalogFile>(CATALOG_TOML) {
        Ok(file) => file,
        // The catalog is compiled in and parsed by a test: this is a build defect.
        Err(error) => panic!("data/hosts.toml does not parse: {error}"),
    })
}

/// Every host of the built-in catalog, in the catalog's order.
pub fn catalog() -> &'static [Host] {
    &catalog_file().host
}

/// The catalog's eager training factor: an `eager` figure times it is the host's cost per
/// kernel of an eager training step.
pub fn eager_training() -> &'static EagerTraining {
    &catalog_file().eager_training
}

/// The host named `name`, or a message naming the valid names.
pub fn by_name(name: &str) -> Result<&'static Host, String> {
    catalog().iter().find(|host| host.name == name).ok_or_else(|| {
        let names: Vec<String> = catalog().iter().map(|host| format!("{:?}", host.name)).collect();
        format!("unknown host {name:?}; valid: {}", names.join(", "))
    })
}

/// What the host and execution mode decided for one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostUse {
    /// The host's name, if `cluster.host` names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// What the host is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The execution mode (`eager` when the scenario and its framework name none).
    pub execution: String,
    /// The per-op cost written into `compute.dispatch-overhead`, if the host's measurement
    /// applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<String>,
    /// Where that cost comes from, or why no host measurement applies.
    pub source: String,
}

/// The string at `key` in `table`, if any; an error naming what is there otherwise.
fn string_at<'t>(table: &'t toml::Table, key: &str, what: &str) -> Result<Option<&'t str>, (String, String)> {
    match get_dotted(table, key) {
        None => Ok(None),
        Some(value) => value
            .as_str()
            .map(Some)
            .ok_or_else(|| (key.to_string(), format!("is {}; give {what} as a string", InlineValue(value)))),
    }
}

/// Writes the per-op cost of the host `table` names (`cluster.host`) for its execution mode
/// (`workload.execution`, `eager` by default) into `compute.dispatch-overhead` where the table
/// leaves it out, and `compute.cuda-graphs = true` for `cuda-graphs`; `None` if the table names
/// neither key. The error is `(key, message)`: an unknown host or mode, a mode the host has no
/// measurement for, or a contradiction with `compute.cuda-graphs`.
pub fn apply(table: &mut toml::Table) -> Result<Option<HostUse>, (String, String)> {
    let host = string_at(table, HOST_KEY, "a host's name")?.map(str::to_string);
    let execution = string_at(table, EXECUTION_KEY, "an execution mode")?.map(str::to_string);
    if host.is_none() && execution.is_none() {
        return Ok(None);
    }
    let mode = execution.unwrap_or_else(|| "eager".to_string());
    if !MODES.contains(&mode.as_str()) {
        return Err((
            EXECUTION_KEY.into(),
            format!("unknown execution mode {mode:?}; valid: {}", MODES.join(", ")),
        ));
    }
    let host =
        host.map(|name| by_name(&name).map_err(|message| (HOST_KEY.to_string(), message))).transpose()?;
    if let Some(host) = host
        && !host.devices.is_empty()
        && let Some(device) = get_dotted(table, "cluster.device").and_then(toml::Value::as_str)
        && !host.devices.iter().any(|d| d == device)
    {
        return Err((
            HOST_KEY.into(),
            format!(
                "is {:?}, whose servers carry {}, but cluster.device is {device:?}; name the host of that device's servers or none (data/hosts.toml)",
                host.name,
                host.devices.join(", ")
            ),
        ));
    }
    // The server's CPUs, for a host optimizer step, unless the scenario names its own.
    if let Some(cpu) = host.and_then(|h| h.cpu.as_deref())
        && get_dotted(table, HOST_CPU_KEY).is_none()
        && Override::new(HOST_CPU_KEY, cpu).apply(table).is_err()
    {
        return Err(("cluster".into(), "is not a table".into()));
    }
    let mut used = HostUse {
        host: host.map(|h| h.name.clone()),
        title: host.map(|h| h.title.clone()),
        execution: mode.clone(),
        dispatch: None,
        source: String::new(),
    };
    if mode == "cuda-graphs" {
        match get_dotted(table, GRAPHS_KEY).map(toml::Value::as_bool) {
            Some(Some(false)) => {
                return Err((
                    GRAPHS_KEY.into(),
                    "is false, but workload.execution = \"cuda-graphs\" replays the step from a CUDA graph; drop one of the two".into(),
                ));
            }
            Some(_) => {}
            None => {
                let _ = Override::new(GRAPHS_KEY, true).apply(table);
            }
        }
        used.source = "a CUDA graph replays the step: no per-op dispatch (compute.cuda-graphs)".into();
        return Ok(Some(used));
    }
    let Some(host) = host else {
        used.source = format!(
            "no cluster.host named: parasim's built-in {DISPATCH_KEY} (or the scenario's own) applies to {mode} execution"
        );
        return Ok(Some(used));
    };
    let (own_dispatch, own_op) =
        (get_dotted(table, DISPATCH_KEY).is_some(), get_dotted(table, OP_DISPATCH_KEY).is_some());
    if own_dispatch && own_op {
        used.source = format!(
            "the scenario's own {DISPATCH_KEY} and {OP_DISPATCH_KEY} (the host's measurement is not used)"
        );
        return Ok(Some(used));
    }
    let Some(measured) = host.dispatch.iter().find(|d| d.mode == mode) else {
        let modes: Vec<&str> = host.dispatch.iter().map(|d| d.mode.as_str()).collect();
        return Err((
            EXECUTION_KEY.into(),
            format!(
                "is {mode:?}, but host {:?} has no measured per-op cost for it (measured: {}; data/hosts.toml); set {DISPATCH_KEY} yourself",
                host.name,
                if modes.is_empty() { "none".to_string() } else { modes.join(", ") }
            ),
        ));
    };
    let (value, source) = if mode == "eager" {
        // A bare op's figure: a training step's kernel costs the host the factor more.
        let training = eager_training();
        let invalid = |error: String| (HOST_KEY.to_string(), format!("host {:?}: {error}", host.name));
        let bare: sim_core::units::SimDuration = toml::Value::String(measured.value.clone())
            .try_into()
            .map_err(|error: toml::de::Error| invalid(error.to_string()))?;
        let cost = sim_core::units::SimDuration::from_secs_f64(bare.as_secs_f64() * training.factor)
            .map_err(|error| invalid(error.to_string()))?;
        (
            cost.to_string(),
            format!(
                "{}; x {} for a training step's kernel over a bare op ({})",
                measured.source, training.factor, training.source
            ),
        )
    } else {
        (measured.value.clone(), measured.source.clone())
    };
    // Both the pass's first kernel and its further kernels: one measured op each, unless the
    // scenario sets either itself.
    for (key, own) in [(DISPATCH_KEY, own_dispatch), (OP_DISPATCH_KEY, own_op)] {
        if !own && Override::new(key, value.as_str()).apply(table).is_err() {
            return Err(("compute".into(), "is not a table".into()));
        }
    }
    if own_dispatch {
        used.source = format!("the scenario's own {DISPATCH_KEY}; {OP_DISPATCH_KEY} from: {source}");
    } else {
        used.dispatch = Some(value);
        used.source = source;
    }
    Ok(Some(used))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quickstart() -> toml::Table {
        toml::from_str(crate::QUICKSTART).unwrap()
    }

    /// The quickstart on DGX H100's GPUs, with `pairs` set.
    fn with(pairs: &[(&str, &str)]) -> toml::Table {
        let mut table = quickstart();
        Override::new("cluster.device", "h100-sxm5-80gb").apply(&mut table).unwrap();
        for (key, value) in pairs {
            Override::new(*key, *value).apply(&mut table).unwrap();
        }
        table
    }

    #[test]
    fn a_hosts_cpus_are_a_cpu_of_the_catalog_and_fill_the_host_cpu_key_unless_given() {
        let devices = workloads::device::DeviceCatalog::builtin();
        let mut named = 0;
        for host in catalog() {
            if let Some(cpu) = &host.cpu {
                let device = devices.get(cpu).unwrap();
                assert_eq!(device.kind, workloads::device::DeviceKind::Cpu, "{}: {cpu}", host.name);
                named += 1;
            }
        }
        assert!(named >= 1);
        let mut table = with(&[("cluster.host", "dgx-h100")]);
        apply(&mut table).unwrap();
        assert_eq!(get_dotted(&table, HOST_CPU_KEY).and_then(toml::Value::as_str), Some("xeon-8480c-2s"));
        let mut table = with(&[("cluster.host", "dgx-h100"), (HOST_CPU_KEY, "epyc-7742-2s")]);
        apply(&mut table).unwrap();
        assert_eq!(get_dotted(&table, HOST_CPU_KEY).and_then(toml::Value::as_str), Some("epyc-7742-2s"));
    }

    #[test]
    fn every_cost_parses_as_a_duration_names_a_source_and_a_known_mode() {
        for host in catalog() {
            assert!(!host.source.is_empty() && !host.title.is_empty(), "{}", host.name);
            let mut seen = Vec::new();
            for dispatch in &host.dispatch {
                assert!(
                    MODES.contains(&dispatch.mode.as_str()) && dispatch.mode != "cuda-graphs",
                    "{}",
                    host.name
                );
                assert!(!seen.contains(&dispatch.mode), "{}: {} twice", host.name, dispatch.mode);
                seen.push(dispatch.mode.clone());
                let parsed: Result<sim_core::units::SimDuration, _> =
                    toml::Value::String(dispatch.value.clone()).try_into();
                assert!(parsed.is_ok(), "{}: {}", host.name, dispatch.value);
                assert!(!dispatch.source.is_empty());
            }
        }
        let names: Vec<&str> = catalog().iter().map(|h| h.name.as_str()).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique);
    }

    #[test]
    fn the_hosts_measurement_applies_where_the_scenario_leaves_the_cost_out() {
        let mut table = with(&[("cluster.host", "dgx-h100")]);
        let used = apply(&mut table).unwrap().unwrap();
        assert_eq!(used.execution, "eager");
        // The bare op's 6.8 us times the measured training factor.
        let factor = eager_training().factor;
        let expected = sim_core::units::SimDuration::from_secs_f64(6.8e-6 * factor).unwrap().to_string();
        assert_eq!(get_dotted(&table, DISPATCH_KEY).and_then(|v| v.as_str()), Some(expected.as_str()));
        assert!(used.source.contains("training step"), "{}", used.source);
        // The further kernels of a pass cost the host the same measured op.
        assert_eq!(get_dotted(&table, OP_DISPATCH_KEY).and_then(|v| v.as_str()), Some(expected.as_str()));
        // The scenario's own value wins, key by key.
        let mut table = with(&[("cluster.host", "dgx-h100"), ("compute.dispatch-overhead", "40 us")]);
        let used = apply(&mut table).unwrap().unwrap();
        assert_eq!(used.dispatch, None);
        assert_eq!(get_dotted(&table, DISPATCH_KEY).and_then(|v| v.as_str()), Some("40 us"));
        assert_eq!(get_dotted(&table, OP_DISPATCH_KEY).and_then(|v| v.as_str()), Some(expected.as_str()));
        let mut table = with(&[
            ("cluster.host", "dgx-h100"),
            ("compute.dispatch-overhead", "40 us"),
            ("compute.op-dispatch-overhead", "5 us"),
        ]);
        apply(&mut table).unwrap().unwrap();
        assert_eq!(get_dotted(&table, OP_DISPATCH_KEY).and_then(|v| v.as_str()), Some("5 us"));
        // Grace issues an eager op at about twice the x86 hosts' cost (dgxc-benchmarking).
        let mut table = with(&[("cluster.host", "gb200"), ("workload.execution", "native")]);
        assert_eq!(apply(&mut table).unwrap().unwrap().dispatch.as_deref(), Some("3 us"));
    }

    /// The factor is the median, over every training-loop microbenchmark of the H200 runs, of
    /// the step's host time per launch over the same machine's bare matmul (the median of its
    /// eight sizes): recomputed here from the results files, so neither can change alone.
    #[test]
    fn the_eager_training_factor_reproduces_its_measurements() {
        let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/measurements/h200-2026-12-04");
        let mut ratios = Vec::new();
        for run in ["run4", "run5", "run6"] {
            let path = format!("{folder}/{run}-results.jsonl");
            let text = fs_err::read_to_string(&path).unwrap();
            let records: Vec<serde_json::Value> =
                text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
            let of = |section: &'static str| records.iter().filter(move |r| r["section"] == section);
            let mut bare: Vec<f64> =
                of("dispatch_matmul_fp32").map(|r| r["us_per_call"].as_f64().unwrap()).collect();
            assert_eq!(bare.len(), 8, "{path}");
            bare.sort_by(f64::total_cmp);
            let bare = (bare[3] + bare[4]) / 2.0;
            ratios.extend(of("tiny_training_loop").map(|r| r["us_per_kernel"].as_f64().unwrap() / bare));
            ratios.extend(of("host_decomposition").map(|r| r["step_us_per_launch"].as_f64().unwrap() / bare));
        }
        assert_eq!(ratios.len(), 23);
        ratios.sort_by(f64::total_cmp);
        let median = ratios[11];
        assert!((median - eager_training().factor).abs() < 0.005, "median {median}");
    }

    #[test]
    fn the_eager_training_factor_is_measured_above_one_and_names_its_source() {
        let training = eager_training();
        // A training step's kernel cannot cost the host less than the bare op it contains.
        assert!(training.factor >= 1.0 && training.factor < 10.0, "{}", training.factor);
        assert!(training.source.contains("data/measurements/"), "{}", training.source);
        // Only the eager mode's bare-op figure is scaled: a compiled launch is already a
        // training step's (Inductor's launcher), a native one has no framework around it.
        let mut table = with(&[("cluster.host", "gb200"), ("workload.execution", "compile")]);
        assert_eq!(apply(&mut table).unwrap().unwrap().dispatch.as_deref(), Some("6.8 us"));
    }

    #[test]
    fn cuda_graphs_need_no_host_and_contradictions_and_unmeasured_modes_are_refused() {
        let mut table = with(&[("workload.execution", "cuda-graphs")]);
        apply(&mut table).unwrap().unwrap();
        assert_eq!(get_dotted(&table, GRAPHS_KEY).and_then(|v| v.as_bool()), Some(true));
        let mut table = with(&[("workload.execution", "cuda-graphs")]);
        Override::new(GRAPHS_KEY, false).apply(&mut table).unwrap();
        assert_eq!(apply(&mut table).unwrap_err().0, GRAPHS_KEY);
        let mut table = with(&[("cluster.host", "dgx-h100"), ("workload.execution", "compile")]);
        let (key, message) = apply(&mut table).unwrap_err();
        assert_eq!(key, EXECUTION_KEY);
        assert!(message.contains("measured: eager"), "{message}");
        let (key, message) = apply(&mut with(&[("cluster.host", "dgx-z9")])).unwrap_err();
        assert_eq!(key, HOST_KEY);
        assert!(message.contains("\"dgx-h100\""), "{message}");
        let (key, _) = apply(&mut with(&[("workload.execution", "jit")])).unwrap_err();
        assert_eq!(key, EXECUTION_KEY);
        // A host whose servers carry another GPU than the scenario's device.
        let (key, message) =
            apply(&mut with(&[("cluster.host", "dgx-b200"), ("cluster.device", "a100-sxm4-80gb")]))
                .unwrap_err();
        assert_eq!(key, HOST_KEY);
        assert!(message.contains("b200-sxm-180gb"), "{message}");
        // Neither key: nothing decided, nothing written.
        let mut table = quickstart();
        assert_eq!(apply(&mut table).unwrap(), None);
        assert_eq!(table, quickstart());
    }
}
