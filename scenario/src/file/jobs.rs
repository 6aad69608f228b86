//! Several jobs on one fabric (`[[jobs]]`, `[placement]`): the scenario's `[cluster]` is the
//! whole fabric, and each job trains its own model with its own strategy on some of its nodes,
//! from its own start time. Each job is a scenario of its own, built from the file's table
//! (every top-level table but `[[jobs]]` and `[placement]`, with the job's own `workload`,
//! `parallelism` and `compute` tables in place of the top-level ones, and `cluster.nodes` set
//! to the job's nodes) and validated by the one scenario validation, so every key means what
//! it means in a one-job scenario; an error at a key of the job's own table names the job
//! (`jobs[1].workload.model`). `[faults]` belong to the fabric, not to any job.
//! [`crate::jobs::simulate`] runs them together.

use super::overrides::get_dotted;
use std::path::Path;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use sim_core::fidelity::Fidelity;
use sim_core::units::SimDuration;
use topology::{ClusterSpec, FabricSpec, HostId, Topology};

use super::{ClusterSection, Override, Scenario, ScenarioError, ValidationCache, apply, invalid};

/// The top-level keys of a scenario with several jobs that are not part of each job's scenario.
const JOB_KEYS: [&str; 2] = ["jobs", "placement"];

/// The tables a job may give in place of the top-level ones.
const JOB_TABLES: [&str; 3] = ["workload", "parallelism", "compute"];

/// The latest a job may start: one day of simulated time (a longer offset is a unit typo, and
/// the clock holds 213 days).
const MAX_START: SimDuration = SimDuration::from_ms(86_400_000);

/// Whether the scenario `table` holds several jobs (`[[jobs]]`): then it is read with
/// [`JobsScenario`], not [`Scenario`].
pub fn has_jobs(table: &toml::Table) -> bool {
    table.contains_key("jobs")
}

/// Whether scenario `text` holds `[[jobs]]`; false for text that is not TOML (its error comes
/// from the one-job reading).
pub fn text_has_jobs(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|table| has_jobs(&table))
}

/// `table` without the keys of several jobs (`[[jobs]]`, `[placement]`): the fabric and the
/// tables every job inherits.
pub(crate) fn remove_job_keys(table: &mut toml::Table) {
    for key in JOB_KEYS {
        table.remove(key);
    }
}

/// How jobs without an explicit `node-list` are given nodes (`placement.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Consecutive free nodes, job after job in file order (the default).
    Packed,
    /// Free nodes dealt round-robin to the jobs still short of nodes: each job spread over
    /// the whole fabric.
    Spread,
    /// Free nodes shuffled (ChaCha8 seeded by `placement.seed`, default `simulation.seed`), then
    /// dealt consecutively.
    Random,
    /// Each job inside as few top-level switch groups as it can (fat-tree pods below the top
    /// level, dragonfly groups): the job fits in one if some group has enough free nodes (the
    /// fullest such group, best fit), else it takes the groups with most free nodes first.
    Pods,
}

impl Placement {
    /// Every policy, in the order messages list them.
    pub const ALL: [Placement; 4] =
        [Placement::Packed, Placement::Spread, Placement::Random, Placement::Pods];

    /// The name scenario files use.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Packed => "packed",
            Placement::Spread => "spread",
            Placement::Random => "random",
            Placement::Pods => "pods",
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(name: &str) -> Result<Placement, String> {
        Placement::ALL.into_iter().find(|policy| policy.name() == name).ok_or_else(|| {
            let valid: Vec<String> = Placement::ALL.iter().map(|p| format!("{:?}", p.name())).collect();
            format!("unknown placement policy {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// One job of a scenario with several jobs, validated and placed.
#[derive(Debug, Clone)]
pub struct Job {
    /// `jobs[i].name`.
    pub name: String,
    /// The cluster's nodes it runs on, in rank order: its rank `r` is GPU
    /// `nodes[r / gpus_per_node] * gpus_per_node + r % gpus_per_node` of the fabric.
    pub nodes: Vec<u32>,
    /// When it starts (`jobs[i].start`).
    pub start: SimDuration,
    /// The job as a scenario of its own (on `nodes.len()` nodes, every rank simulated).
    pub scenario: Scenario,
}

impl Job {
    /// The fabric GPU that plays each of the job's ranks.
    pub fn gpus(&self, gpus_per_node: u32) -> Vec<u32> {
        self.nodes
            .iter()
            .flat_map(|&node| (0..gpus_per_node).map(move |gpu| node * gpus_per_node + gpu))
            .collect()
    }
}

/// A validated scenario with several jobs on one fabric.
#[derive(Debug, Clone)]
pub struct JobsScenario {
    /// Where it came from.
    pub source: String,
    /// The whole fabric (`[cluster]` with all its nodes).
    pub cluster: ClusterSpec,
    /// How jobs without a `node-list` were placed.
    pub placement: Placement,
    /// The seed of the `random` placement.
    pub placement_seed: u64,
    /// Links of the fabric degraded or down (`[faults]`), if any: every run, shared and
    /// alone, is on the fabric with them.
    pub faults: Option<crate::faults::Faults>,
    /// The jobs, in file order.
    pub jobs: Vec<Job>,
    /// What is drawn afresh for every iteration of every job (`[variability]`, over the
    /// fabric's GPUs); none by default. Each job's iterations are then re-timed from the shared
    /// run ([`crate::jobs::simulate`]).
    pub variability: sim_core::variability::Variability,
    /// `simulation.seed`: the draws' seed.
    pub seed: u64,
    /// Component failures over the fabric and the jobs' response (`[failures]`), if any: each
    /// job's goodput counts the failures of the GPUs, nodes and cables it runs on.
    pub failures: Option<crate::failures::Failures>,
}

/// `[[jobs]]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct JobSpec {
    name: String,
    nodes: Option<u32>,
    start: Option<SimDuration>,
    node_list: Option<Vec<u32>>,
    workload: Option<toml::Table>,
    parallelism: Option<toml::Table>,
    compute: Option<toml::Table>,
}

/// `[placement]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
struct PlacementSpec {
    policy: Option<String>,
    seed: Option<u64>,
}

impl JobsScenario {
    /// Reads the scenario file at `path`, applies `overrides` to its table (`simulation.fidelity`
    /// and the other top-level keys, for every job) and validates it.
    pub fn load_with(path: &Path, overrides: &[Override]) -> Result<JobsScenario, ScenarioError> {
        let text = fs_err::read_to_string(path)
            .map_err(|error| ScenarioError::Read { message: error.to_string() })?;
        let table: toml::Table = toml::from_str(&text).map_err(|error| ScenarioError::Syntax {
            file: path.to_path_buf(),
            message: error.to_string(),
        })?;
        JobsScenario::from_table_with(&table, overrides, path)
    }

    /// Validates a scenario with `[[jobs]]` given as a table, with `overrides` applied; `file`
    /// names it in messages and anchors relative paths.
    pub fn from_table_with(
        table: &toml::Table,
        overrides: &[Override],
        file: &Path,
    ) -> Result<JobsScenario, ScenarioError> {
        let mut table = table.clone();
        apply(&mut table, overrides)?;
        JobsScenario::from_table(&table, file).map_err(|error| error.attributed(overrides))
    }

    /// Validates a scenario with `[[jobs]]` given as a table; `file` names it in messages.
    pub fn from_table(table: &toml::Table, file: &Path) -> Result<JobsScenario, ScenarioError> {
        let invalid = |key: &str, message: String| invalid(file, key, message);
        let format = |key: &str, message: String| ScenarioError::Format {
            file: file.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let entries = match table.get("jobs") {
            Some(toml::Value::Array(entries)) => entries,
            Some(other) => {
                return Err(format(
                    "jobs",
                    format!("is a {}; write each job as a [[jobs]] table", other.type_str()),
                ));
            }
            None => {
                return Err(invalid(
                    "jobs",
                    "is missing: a scenario with several jobs lists them as [[jobs]] tables".into(),
                ));
            }
        };
        if entries.is_empty() {
            return Err(invalid("jobs", "is empty: give at least one [[jobs]] table".into()));
        }
        if get_dotted(table, "cluster.node-groups").is_some() {
            return Err(invalid(
                "cluster.node-groups",
                "node groups of different devices are not combined with [[jobs]] yet (each job is validated as a scenario on its own nodes): run each job alone on its node groups".into(),
            ));
        }
        let placement_spec: PlacementSpec = match table.get("placement") {
            None => PlacementSpec::default(),
            Some(value) => serde_path_to_error::deserialize(value.clone()).map_err(|error| {
                let path = error.path().to_string();
                let key = if path == "." { "placement".to_string() } else { format!("placement.{path}") };
                format(&key, error.into_inner().to_string().trim().to_string())
            })?,
        };
        let placement: Placement = match &placement_spec.policy {
            Some(name) => name.parse().map_err(|message| invalid("placement.policy", message))?,
            None => Placement::Packed,
        };

        // The fabric: the top-level [cluster], all its nodes.
        let mut base = table.clone();
        remove_job_keys(&mut base);
        let cluster_value = base.get("cluster").cloned().ok_or_else(|| {
            format(
                "cluster",
                "the scenario has no [cluster] table (see the scenario format in the README)".into(),
            )
        })?;
        let section: ClusterSection = serde_path_to_error::deserialize(cluster_value).map_err(|error| {
            let path = error.path().to_string();
            let key = if path == "." { "cluster".to_string() } else { format!("cluster.{path}") };
            format(&key, error.into_inner().to_string().trim().to_string())
        })?;
        let (cluster, _) = super::validate_cluster(&section, file)?;
        let simulation = base.get("simulation").and_then(toml::Value::as_table);
        let seed = simulation.and_then(|s| s.get("seed")).and_then(toml::Value::as_integer).unwrap_or(0);
        let placement_seed = placement_spec.seed.unwrap_or(seed.max(0) as u64);
        // `[faults]` hit the fabric's links (names and kinds as `parasim topo` lists the whole
        // fabric's), in the shared run and in each run alone; no job sees them on its own.
        let faults = match base.remove("faults") {
            None => None,
            Some(value) => {
                let section: crate::faults::FaultsSection =
                    serde_path_to_error::deserialize(value).map_err(|error| {
                        let path = error.path().to_string();
                        let key = if path == "." { "faults".to_string() } else { format!("faults.{path}") };
                        format(&key, error.into_inner().to_string().trim().to_string())
                    })?;
                Some(section.validate(seed.max(0) as u64, &invalid)?)
            }
        };

        // `[variability]` draws for the fabric's GPUs (named slow ranks are fabric GPUs), in
        // the shared run's re-timing; no job sees it on its own.
        let variability = match base.remove("variability") {
            None => sim_core::variability::Variability::default(),
            Some(value) => {
                let section: super::variability::VariabilitySection = serde_path_to_error::deserialize(value)
                    .map_err(|error| {
                        let path = error.path().to_string();
                        let key = if path == "." {
                            "variability".to_string()
                        } else {
                            format!("variability.{path}")
                        };
                        format(&key, error.into_inner().to_string().trim().to_string())
                    })?;
                let gpus = cluster.nodes * cluster.gpus_per_node;
                super::variability::validate(&section, gpus)
                    .map_err(|(key, message)| invalid(&key, message))?
            }
        };

        // `[failures]` strike the fabric's components (GPUs and nodes by fabric number, links by
        // name); each job's goodput counts those it runs on ([`crate::jobs::simulate`]).
        let failures = match base.remove("failures") {
            None => None,
            Some(value) => {
                let section: crate::failures::FailuresSection = serde_path_to_error::deserialize(value)
                    .map_err(|error| {
                        let path = error.path().to_string();
                        let key =
                            if path == "." { "failures".to_string() } else { format!("failures.{path}") };
                        format(&key, error.into_inner().to_string().trim().to_string())
                    })?;
                let gpus = cluster.nodes * cluster.gpus_per_node;
                Some(section.validate(gpus, cluster.nodes, seed.max(0) as u64, &invalid)?)
            }
        };

        // Each job's own keys.
        let mut specs = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let spec: JobSpec = serde_path_to_error::deserialize(entry.clone()).map_err(|error| {
                let path = error.path().to_string();
                let key =
                    if path == "." { format!("jobs[{index}]") } else { format!("jobs[{index}].{path}") };
                format(&key, error.into_inner().to_string().trim().to_string())
            })?;
            let key = |name: &str| format!("jobs[{index}].{name}");
            if spec.name.trim().is_empty() {
                return Err(invalid(&key("name"), "is empty; give each job a name for the report".into()));
            }
            if let Some(other) = specs.iter().position(|earlier: &JobSpec| earlier.name == spec.name) {
                return Err(invalid(
                    &key("name"),
                    format!("{:?} is also the name of jobs[{other}]; give each job its own", spec.name),
                ));
            }
            if spec.nodes == Some(0) {
                return Err(invalid(&key("nodes"), "must be at least 1, got 0".into()));
            }
            if let Some(list) = &spec.node_list {
                if list.is_empty() {
                    return Err(invalid(
                        &key("node-list"),
                        "is empty; list the nodes the job runs on".into(),
                    ));
                }
                if let Some(&node) = list.iter().find(|&&node| node >= cluster.nodes) {
                    return Err(invalid(
                        &key("node-list"),
                        format!(
                            "names node {node}, but the cluster has nodes 0 to {} (cluster.nodes = {})",
                            cluster.nodes - 1,
                            cluster.nodes
                        ),
                    ));
                }
                let mut sorted = list.clone();
                sorted.sort_unstable();
                if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
                    return Err(invalid(&key("node-list"), format!("names node {} twice", pair[0])));
                }
                if let Some(nodes) = spec.nodes
                    && nodes as usize != list.len()
                {
                    return Err(invalid(
                        &key("nodes"),
                        format!(
                            "is {nodes}, but node-list names {} nodes; give one or make them agree",
                            list.len()
                        ),
                    ));
                }
            } else if spec.nodes.is_none() {
                return Err(invalid(
                    &key("nodes"),
                    "is missing: give the number of nodes the job uses, or its node-list".into(),
                ));
            }
            if let Some(start) = spec.start
                && start > MAX_START
            {
                return Err(invalid(&key("start"), format!("is {start}; at most {MAX_START} (one day)")));
            }
            specs.push(spec);
        }
        // Explicit node lists must not overlap; then the nodes asked for must fit.
        let mut owner: Vec<Option<usize>> = vec![None; cluster.nodes as usize];
        for (index, spec) in specs.iter().enumerate() {
            for &node in spec.node_list.iter().flatten() {
                if let Some(other) = owner[node as usize].replace(index) {
                    return Err(invalid(
                        &format!("jobs[{index}].node-list"),
                        format!(
                            "names node {node}, which jobs[{other}] ({:?}) has too; jobs do not share nodes",
                            specs[other].name
                        ),
                    ));
                }
            }
        }
        let wanted: u64 = specs
            .iter()
            .map(|spec| {
                spec.node_list.as_ref().map_or(u64::from(spec.nodes.unwrap_or(0)), |l| l.len() as u64)
            })
            .sum();
        if wanted > u64::from(cluster.nodes) {
            return Err(invalid(
                "jobs",
                format!(
                    "the jobs ask for {wanted} nodes in all, but the cluster has {} (cluster.nodes); jobs do not share nodes",
                    cluster.nodes
                ),
            ));
        }
        let node_lists = place(&specs, &owner, placement, placement_seed, &cluster)
            .map_err(|message| invalid("placement.policy", message))?;

        // Each job as a scenario of its own.
        let cache = ValidationCache::default();
        let mut jobs = Vec::with_capacity(specs.len());
        for (index, (spec, nodes)) in specs.into_iter().zip(node_lists).enumerate() {
            let mut job_table = base.clone();
            let mut own = Vec::new();
            for (name, value) in
                JOB_TABLES.into_iter().zip([&spec.workload, &spec.parallelism, &spec.compute])
            {
                if let Some(value) = value {
                    job_table.insert(name.to_string(), toml::Value::Table(value.clone()));
                    own.push(name);
                }
            }
            let job_overrides = [
                Override::new("cluster.nodes", i64::from(nodes.len() as u32)),
                Override::new("simulation.fold-symmetric-ranks", false),
            ];
            apply(&mut job_table, &job_overrides)?;
            let scenario = Scenario::from_table_cached(&job_table, file, &cache)
                .map_err(|error| job_error(error, index, &spec.name, &own))?;
            if scenario.network.fidelity == Fidelity::Analytical {
                return Err(invalid(
                    "simulation.fidelity",
                    "is \"analytical\", whose collectives never share a link, so jobs on one fabric would not slow each other down: give \"flow\" or \"packet-steps\"".into(),
                ));
            }
            if scenario.iterations > crate::MAX_ITERATIONS {
                return Err(invalid(
                    "simulation.iterations",
                    format!(
                        "is {}; jobs on one fabric run at most {} iterations (their graphs are held whole, not streamed)",
                        scenario.iterations,
                        crate::MAX_ITERATIONS
                    ),
                ));
            }
            jobs.push(Job {
                name: spec.name,
                nodes,
                start: spec.start.unwrap_or(SimDuration::ZERO),
                scenario,
            });
        }
        Ok(JobsScenario {
            source: file.display().to_string(),
            cluster,
            placement,
            placement_seed,
            faults,
            variability,
            seed: seed.max(0) as u64,
            failures,
            jobs,
        })
    }
}

/// A job's scenario error, naming the job: a key of a table the job gave itself becomes
/// `jobs[i].key`; any other key keeps its name and the message says which job it was in.
fn job_error(error: ScenarioError, index: usize, name: &str, own: &[&str]) -> ScenarioError {
    let rename = |key: String, message: String| {
        let first = key.split('.').next().unwrap_or_default();
        if key == "cluster.nodes" {
            (format!("jobs[{index}].nodes"), message)
        } else if own.contains(&first) {
            (format!("jobs[{index}].{key}"), message)
        } else {
            (key, format!("in job {name:?} (jobs[{index}]): {message}"))
        }
    };
    match error {
        ScenarioError::Invalid { file, key, message } => {
            let (key, message) = rename(key, message);
            ScenarioError::Invalid { file, key, message }
        }
        ScenarioError::Format { file, key, message } => {
            let (key, message) = rename(key, message);
            ScenarioError::Format { file, key, message }
        }
        other => other,
    }
}

/// The top-level switch group (fat-tree pod, dragonfly group) of each node, by the fabric
/// terminal of its first GPU; every node in group 0 on a fabric without such groups.
fn pods_of(cluster: &ClusterSpec) -> Result<Vec<u32>, String> {
    let per_pod: u64 = match &cluster.network.fabric {
        FabricSpec::FatTree(tree) if tree.levels > 1 => {
            tree.down.iter().take(tree.levels as usize - 1).map(|&d| u64::from(d)).product()
        }
        FabricSpec::Dragonfly(spec) => u64::from(spec.routers_per_group) * u64::from(spec.hosts_per_router),
        FabricSpec::CascadeDragonfly(spec) => {
            u64::from(spec.chassis_per_group)
                * u64::from(spec.routers_per_chassis)
                * u64::from(spec.hosts_per_router)
        }
        _ => return Ok(vec![0; cluster.nodes as usize]),
    };
    let topology = Topology::build(cluster).map_err(|error| error.to_string())?;
    (0..cluster.nodes)
        .map(|node| {
            let terminal = topology
                .nic_of(HostId(node * cluster.gpus_per_node))
                .map_err(|error| error.to_string())?
                .unwrap_or(0);
            Ok((u64::from(terminal) / per_pod.max(1)) as u32)
        })
        .collect()
}

/// Each job's nodes: its explicit `node-list`, or nodes the `policy` gives it from those no
/// list names (`owner`: which job's list holds each node).
fn place(
    specs: &[JobSpec],
    owner: &[Option<usize>],
    policy: Placement,
    seed: u64,
    cluster: &ClusterSpec,
) -> Result<Vec<Vec<u32>>, String> {
    let mut free: Vec<u32> = (0..cluster.nodes).filter(|&node| owner[node as usize].is_none()).collect();
    let mut lists: Vec<Vec<u32>> =
        specs.iter().map(|spec| spec.node_list.clone().unwrap_or_default()).collect();
    let wanted: Vec<usize> = specs
        .iter()
        .map(|spec| if spec.node_list.is_some() { 0 } else { spec.nodes.unwrap_or(0) as usize })
        .collect();
    match policy {
        Placement::Packed | Placement::Random => {
            if policy == Placement::Random {
                free.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
            }
            let mut next = free.into_iter();
            for (list, &count) in lists.iter_mut().zip(&wanted) {
                list.extend(next.by_ref().take(count));
            }
        }
        Placement::Spread => {
            let mut next = free.into_iter();
            let mut short: Vec<usize> = (0..specs.len()).filter(|&job| wanted[job] > 0).collect();
            while !short.is_empty() {
                short.retain(|&job| {
                    if let Some(node) = next.next() {
                        lists[job].push(node);
                    }
                    lists[job].len() < wanted[job]
                });
            }
        }
        Placement::Pods => {
            let pods = pods_of(cluster)?;
            let pod_count = pods.iter().copied().max().map_or(0, |max| max as usize + 1);
            let mut by_pod: Vec<Vec<u32>> = vec![Vec::new(); pod_count];
            for node in free {
                by_pod[pods[node as usize] as usize].push(node);
            }
            for (list, &count) in lists.iter_mut().zip(&wanted) {
                if count == 0 {
                    continue;
                }
                // Best fit: the fullest pod that still holds the whole job (lowest index on ties).
                let fit = (0..pod_count)
                    .filter(|&pod| by_pod[pod].len() >= count)
                    .min_by_key(|&pod| (by_pod[pod].len(), pod));
                match fit {
                    Some(pod) => list.extend(by_pod[pod].drain(..count)),
                    None => {
                        let mut order: Vec<usize> = (0..pod_count).collect();
                        order.sort_by_key(|&pod| (std::cmp::Reverse(by_pod[pod].len()), pod));
                        for pod in order {
                            let take = (count - list.len()).min(by_pod[pod].len());
                            list.extend(by_pod[pod].drain(..take));
                            if list.len() == count {
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(lists)
}
