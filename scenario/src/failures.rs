//! Failures and goodput (`[failures]`): component failures at given times or drawn from
//! per-component MTBFs, the job's response (checkpoint-restart, or a hot spare that shortens
//! the restart), and what is left of a wall-clock budget for training.
//!
//! The job alternates work and checkpoint writes: after every `T` of work (the checkpoint
//! interval, a whole number of simulated iterations) it writes a checkpoint for `C`. A failure
//! loses the work since the last completed checkpoint (and a checkpoint being written), then the
//! job re-initialises for `R` (`restart-minutes`, or `swap-minutes` with a hot spare) before it
//! works again; a failure during the restart starts it again. Goodput is useful training time
//! (work that is kept) over wall time. To first order in `T/M`, `C/T` and `R/M` (job MTBF `M`)
//! that is `1 - C/T - T/(2M) - R/M`, maximised at Young's interval `sqrt(2 C M)` (J. W. Young,
//! "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974; J. T.
//! Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future
//! Generation Computer Systems 22(3), 2006, eq. 37 for the higher-order estimate).
//!
//! Drawn failures: each GPU, node and network cable fails with exponential inter-arrival times
//! of mean its MTBF, independently and renewed on replacement. The superposition of `N` such
//! Poisson processes is a Poisson process of rate `N / MTBF` whose failing component is uniform
//! among the `N`, so the draws are made per kind at that rate (the same process, at a cost that
//! grows with the failures, not the components). The draws use ChaCha8 seeded by
//! `simulation.seed` (one stream per replica), so the same seed gives the same output.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};
use sim_core::units::{Bandwidth, Bytes};

/// `[failures]` as written (see [`FailuresSection::validate`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct FailuresSection {
    #[serde(default)]
    events: Vec<FailureEventSection>,
    gpu_mtbf_hours: Option<f64>,
    node_mtbf_hours: Option<f64>,
    link_mtbf_hours: Option<f64>,
    response: Option<String>,
    checkpoint_bandwidth: Option<Bandwidth>,
    checkpoint_interval: Option<u64>,
    checkpoint_interval_minutes: Option<f64>,
    restart_minutes: Option<f64>,
    swap_minutes: Option<f64>,
    hours: Option<f64>,
}

/// One `[[failures.events]]` entry as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FailureEventSection {
    at_hours: f64,
    kind: String,
    rank: Option<u32>,
    node: Option<u32>,
    link: Option<String>,
}

/// The wall-clock budget when neither `failures.hours` nor `run --hours` gives one: a day.
pub const DEFAULT_HOURS: f64 = 24.0;

/// The longest wall-clock budget: ten years, far beyond any training run (a typo of unit).
const MAX_HOURS: f64 = 87_660.0;

/// A wall-clock budget of `hours`, if valid: positive and at most ten years.
pub fn check_hours(hours: f64) -> Result<f64, String> {
    if !(hours.is_finite() && hours > 0.0) {
        return Err(format!("is {hours}; give a positive number of hours"));
    }
    if hours > MAX_HOURS {
        return Err(format!(
            "is {hours}; at most {MAX_HOURS} (ten years): the wall-clock budget is in hours"
        ));
    }
    Ok(hours)
}

/// What fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComponentKind {
    /// A GPU (by rank).
    Gpu,
    /// A server (by node index).
    Node,
    /// A network cable (by the name of one of its links in `parasim topo --json`).
    Link,
}

impl ComponentKind {
    /// The name the scenario and the report use.
    pub fn name(self) -> &'static str {
        match self {
            ComponentKind::Gpu => "gpu",
            ComponentKind::Node => "node",
            ComponentKind::Link => "link",
        }
    }
}

/// A failure the scenario names (`[[failures.events]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct FailureEvent {
    /// Wall-clock hours from the start of the job.
    pub at_hours: f64,
    /// What fails.
    pub kind: ComponentKind,
    /// Which one: the rank, the node, or the link's name.
    pub component: String,
}

/// What the job does when a component fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Response {
    /// Stop, re-initialise (`restart-minutes`: rescheduling, process start, loading the last
    /// checkpoint) and redo the work since the last checkpoint.
    CheckpointRestart {
        /// Re-initialisation time, in hours.
        restart_hours: f64,
    },
    /// A hot spare takes the failed component's place (`swap-minutes`, in place of a full
    /// restart); the job still rolls back to its last checkpoint.
    HotSpare {
        /// Swap time, in hours.
        swap_hours: f64,
    },
}

impl Response {
    /// `checkpoint-restart` or `hot-spare`.
    pub fn name(self) -> &'static str {
        match self {
            Response::CheckpointRestart { .. } => "checkpoint-restart",
            Response::HotSpare { .. } => "hot-spare",
        }
    }

    /// The time from a failure until the job works again, in hours.
    pub fn recovery_hours(self) -> f64 {
        match self {
            Response::CheckpointRestart { restart_hours } => restart_hours,
            Response::HotSpare { swap_hours } => swap_hours,
        }
    }
}

/// How often the job checkpoints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CheckpointInterval {
    /// Every this many iterations (`checkpoint-interval`).
    Iterations(u64),
    /// Every this many minutes of work, rounded to whole iterations
    /// (`checkpoint-interval-minutes`).
    Minutes(f64),
}

/// Validated `[failures]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Failures {
    /// Failures at given times.
    pub events: Vec<FailureEvent>,
    /// Mean time between failures of one GPU, in hours.
    pub gpu_mtbf_hours: Option<f64>,
    /// Mean time between failures of one server, in hours.
    pub node_mtbf_hours: Option<f64>,
    /// Mean time between failures of one network cable, in hours.
    pub link_mtbf_hours: Option<f64>,
    /// The job's response.
    pub response: Response,
    /// Aggregate write bandwidth of the job to checkpoint storage.
    pub checkpoint_bandwidth: Bandwidth,
    /// How often the job checkpoints.
    pub checkpoint_interval: CheckpointInterval,
    /// The wall-clock budget, in hours (`failures.hours`, `run --hours`).
    pub hours: f64,
    /// `simulation.seed`.
    pub seed: u64,
}

impl FailuresSection {
    /// Validates the section; `gpus` and `nodes` bound the ranks and nodes events name,
    /// `invalid` makes an error at a key. Link names are checked against the topology when the
    /// scenario is simulated ([`Failures::check_links`]).
    pub(crate) fn validate<E>(
        &self,
        gpus: u32,
        nodes: u32,
        seed: u64,
        invalid: &dyn Fn(&str, String) -> E,
    ) -> Result<Failures, E> {
        let positive = |key: &str, value: Option<f64>| -> Result<Option<f64>, E> {
            match value {
                Some(v) if !(v.is_finite() && v > 0.0) => {
                    Err(invalid(key, format!("is {v}; give a positive number of hours or minutes")))
                }
                other => Ok(other),
            }
        };
        let gpu_mtbf_hours = positive("failures.gpu-mtbf-hours", self.gpu_mtbf_hours)?;
        let node_mtbf_hours = positive("failures.node-mtbf-hours", self.node_mtbf_hours)?;
        let link_mtbf_hours = positive("failures.link-mtbf-hours", self.link_mtbf_hours)?;
        let hours = match self.hours {
            Some(hours) => check_hours(hours).map_err(|message| invalid("failures.hours", message))?,
            None => DEFAULT_HOURS,
        };
        let non_negative = |key: &str, value: Option<f64>| -> Result<f64, E> {
            match value {
                Some(v) if !(v.is_finite() && v >= 0.0) => {
                    Err(invalid(key, format!("is {v}; give a non-negative number of minutes")))
                }
                Some(v) => Ok(v / 60.0),
                None => Ok(0.0),
            }
        };
        let response = match self.response.as_deref().unwrap_or("checkpoint-restart") {
            "checkpoint-restart" => {
                if self.swap_minutes.is_some() {
                    return Err(invalid(
                        "failures.swap-minutes",
                        "applies to response = \"hot-spare\"; checkpoint-restart takes restart-minutes"
                            .into(),
                    ));
                }
                Response::CheckpointRestart {
                    restart_hours: non_negative("failures.restart-minutes", self.restart_minutes)?,
                }
            }
            "hot-spare" => {
                if self.restart_minutes.is_some() {
                    return Err(invalid(
                        "failures.restart-minutes",
                        "applies to response = \"checkpoint-restart\"; a hot spare takes swap-minutes".into(),
                    ));
                }
                Response::HotSpare { swap_hours: non_negative("failures.swap-minutes", self.swap_minutes)? }
            }
            other => {
                return Err(invalid(
                    "failures.response",
                    format!("is \"{other}\"; valid: \"checkpoint-restart\", \"hot-spare\""),
                ));
            }
        };
        let checkpoint_bandwidth = self.checkpoint_bandwidth.ok_or_else(|| {
            invalid(
                "failures.checkpoint-bandwidth",
                "is missing: the job's aggregate write bandwidth to checkpoint storage, e.g. \"100 GB/s\""
                    .into(),
            )
        })?;
        let checkpoint_interval = match (self.checkpoint_interval, self.checkpoint_interval_minutes) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "failures.checkpoint-interval-minutes",
                    "and failures.checkpoint-interval are both given; give one".into(),
                ));
            }
            (Some(0), None) => {
                return Err(invalid(
                    "failures.checkpoint-interval",
                    "must be at least 1 iteration, got 0".into(),
                ));
            }
            (Some(iterations), None) => CheckpointInterval::Iterations(iterations),
            (None, Some(minutes)) => {
                if !(minutes.is_finite() && minutes > 0.0) {
                    return Err(invalid(
                        "failures.checkpoint-interval-minutes",
                        format!("is {minutes}; give a positive number of minutes"),
                    ));
                }
                CheckpointInterval::Minutes(minutes)
            }
            (None, None) => {
                return Err(invalid(
                    "failures.checkpoint-interval",
                    "is missing: give checkpoint-interval (iterations) or checkpoint-interval-minutes".into(),
                ));
            }
        };
        let mut events = Vec::with_capacity(self.events.len());
        for (index, event) in self.events.iter().enumerate() {
            let key = |field: &str| format!("failures.events[{index}].{field}");
            if !(event.at_hours.is_finite() && event.at_hours >= 0.0) {
                return Err(invalid(
                    &key("at-hours"),
                    format!("is {}; give hours from the start, at least 0", event.at_hours),
                ));
            }
            let (kind, component) = match event.kind.as_str() {
                "gpu" => {
                    let rank = event.rank.ok_or_else(|| {
                        invalid(&key("rank"), "is missing: a gpu failure names its rank".into())
                    })?;
                    if rank >= gpus {
                        return Err(invalid(
                            &key("rank"),
                            format!("is {rank}; the cluster's ranks are 0 to {}", gpus - 1),
                        ));
                    }
                    (ComponentKind::Gpu, rank.to_string())
                }
                "node" => {
                    let node = event.node.ok_or_else(|| {
                        invalid(&key("node"), "is missing: a node failure names its node".into())
                    })?;
                    if node >= nodes {
                        return Err(invalid(
                            &key("node"),
                            format!("is {node}; the cluster's nodes are 0 to {}", nodes - 1),
                        ));
                    }
                    (ComponentKind::Node, node.to_string())
                }
                "link" => {
                    let link = event.link.clone().ok_or_else(|| {
                        invalid(&key("link"), "is missing: a link failure names its link as `parasim topo --json` lists it (link_list)".into())
                    })?;
                    (ComponentKind::Link, link)
                }
                other => {
                    return Err(invalid(
                        &key("kind"),
                        format!("is \"{other}\"; valid: \"gpu\", \"node\", \"link\""),
                    ));
                }
            };
            let named = [
                ("rank", event.rank.is_some(), "gpu"),
                ("node", event.node.is_some(), "node"),
                ("link", event.link.is_some(), "link"),
            ];
            if let Some((field, _, for_kind)) =
                named.iter().find(|(_, given, for_kind)| *given && *for_kind != kind.name())
            {
                return Err(invalid(
                    &key(field),
                    format!("names a {for_kind}, but this event's kind is \"{}\"", kind.name()),
                ));
            }
            events.push(FailureEvent { at_hours: event.at_hours, kind, component });
        }
        if events.is_empty()
            && gpu_mtbf_hours.is_none()
            && node_mtbf_hours.is_none()
            && link_mtbf_hours.is_none()
        {
            return Err(invalid(
                "failures",
                "names no failures: give events = [{ at-hours = ..., kind = \"gpu\", rank = ... }] or gpu-mtbf-hours, node-mtbf-hours, link-mtbf-hours".into(),
            ));
        }
        Ok(Failures {
            events,
            gpu_mtbf_hours,
            node_mtbf_hours,
            link_mtbf_hours,
            response,
            checkpoint_bandwidth,
            checkpoint_interval,
            hours,
            seed,
        })
    }
}

/// How many components of each kind can fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Components {
    /// GPUs.
    pub gpus: u64,
    /// Servers.
    pub nodes: u64,
    /// Network cables (a cable's two directed links fail together).
    pub cables: u64,
}

/// One failure in time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Failure {
    at_hours: f64,
    kind: ComponentKind,
}

/// Where the wall-clock time of one horizon went, in hours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TimeSpent {
    /// Work that is kept.
    pub useful: f64,
    /// Writing checkpoints (including writes a failure interrupted).
    pub checkpoint: f64,
    /// Work redone: done since the last completed checkpoint when a failure struck.
    pub lost_work: f64,
    /// Re-initialising (or swapping in a spare) after failures.
    pub restart: f64,
    /// Failures that struck during the horizon.
    pub failures: u64,
}

impl TimeSpent {
    fn add(&mut self, other: &TimeSpent) {
        self.useful += other.useful;
        self.checkpoint += other.checkpoint;
        self.lost_work += other.lost_work;
        self.restart += other.restart;
        self.failures += other.failures;
    }
}

/// The job's timeline over `horizon` hours with checkpoints every `interval` hours of work,
/// checkpoint writes of `checkpoint` hours and recoveries of `recovery` hours, struck by the
/// failures at `failures` (hours, sorted).
pub fn play(horizon: f64, interval: f64, checkpoint: f64, recovery: f64, failures: &[f64]) -> TimeSpent {
    let mut spent = TimeSpent::default();
    let mut t = 0.0;
    let mut next = failures.iter().copied().peekable();
    // Work done since the last completed checkpoint.
    let mut uncommitted = 0.0;
    loop {
        let failure = next.peek().copied().unwrap_or(f64::INFINITY);
        // Whole cycles of work and write that end before the next failure and the end, at once.
        if uncommitted == 0.0 {
            let cycles = ((failure.min(horizon) - t) / (interval + checkpoint)).floor();
            if cycles >= 1.0 {
                spent.useful += cycles * interval;
                spent.checkpoint += cycles * checkpoint;
                t += cycles * (interval + checkpoint);
            }
        }
        // Work until the next checkpoint, the end, or a failure.
        let end = (t + interval - uncommitted).min(horizon).min(failure);
        uncommitted += end - t;
        t = end;
        let mut failed = t >= failure;
        if !failed && t >= horizon {
            spent.useful += uncommitted;
            return spent;
        }
        if !failed {
            // Write the checkpoint.
            let end = (t + checkpoint).min(horizon).min(failure);
            spent.checkpoint += end - t;
            t = end;
            failed = t >= failure;
            if !failed {
                // Written (or the horizon ended while writing: the work so far still counts, as
                // the job goes on after the budget).
                spent.useful += uncommitted;
                uncommitted = 0.0;
                if t >= horizon {
                    return spent;
                }
                continue;
            }
        }
        // A failure: the work since the last checkpoint is lost; recover, again after each
        // failure that strikes during the recovery.
        spent.lost_work += uncommitted;
        uncommitted = 0.0;
        loop {
            next.next();
            spent.failures += 1;
            let failure = next.peek().copied().unwrap_or(f64::INFINITY);
            let end = (t + recovery).min(horizon).min(failure);
            spent.restart += end - t;
            t = end;
            if t >= horizon {
                return spent;
            }
            if t < failure {
                break;
            }
        }
    }
}

/// Expected goodput to first order, `1 - C/T - T/(2M) - R/M`, for checkpoint interval `T`,
/// write time `C`, recovery `R` and job MTBF `M` (all in hours).
pub fn first_order_goodput(interval: f64, checkpoint: f64, recovery: f64, mtbf: f64) -> f64 {
    1.0 - checkpoint / interval - interval / (2.0 * mtbf) - recovery / mtbf
}

/// Young's optimum checkpoint interval `sqrt(2 C M)` (hours).
pub fn young_interval(checkpoint: f64, mtbf: f64) -> f64 {
    (2.0 * checkpoint * mtbf).sqrt()
}

/// Daly's higher-order optimum (2006, eq. 37): `sqrt(2 C M) (1 + sqrt(C/(2M))/3 + C/(18 M)) - C`
/// for `C < 2M`, else `M` (hours).
pub fn daly_interval(checkpoint: f64, mtbf: f64) -> f64 {
    if checkpoint >= 2.0 * mtbf {
        return mtbf;
    }
    let ratio = checkpoint / (2.0 * mtbf);
    young_interval(checkpoint, mtbf) * (1.0 + ratio.sqrt() / 3.0 + ratio / 9.0) - checkpoint
}

/// The failure process of a job: fixed events plus Poisson draws per component kind.
#[derive(Debug, Clone)]
pub struct FailureProcess {
    /// Fixed failures (hours, kind), sorted by time.
    fixed: Vec<Failure>,
    /// Rate of drawn failures per kind (failures per hour over all components of the kind).
    rates: Vec<(ComponentKind, f64)>,
    seed: u64,
    horizon: f64,
}

impl FailureProcess {
    /// The process of `failures` on a cluster of `components`.
    pub fn new(failures: &Failures, components: Components) -> FailureProcess {
        let mut fixed: Vec<Failure> = failures
            .events
            .iter()
            .filter(|event| event.at_hours < failures.hours)
            .map(|event| Failure { at_hours: event.at_hours, kind: event.kind })
            .collect();
        fixed.sort_by(|a, b| a.at_hours.total_cmp(&b.at_hours).then(a.kind.cmp(&b.kind)));
        let mut rates = Vec::new();
        for (kind, mtbf, count) in [
            (ComponentKind::Gpu, failures.gpu_mtbf_hours, components.gpus),
            (ComponentKind::Node, failures.node_mtbf_hours, components.nodes),
            (ComponentKind::Link, failures.link_mtbf_hours, components.cables),
        ] {
            if let Some(mtbf) = mtbf
                && count > 0
            {
                rates.push((kind, count as f64 / mtbf));
            }
        }
        FailureProcess { fixed, rates, seed: failures.seed, horizon: failures.hours }
    }

    /// The job's mean time between drawn failures (hours): `1 / sum of rates`; `None` without
    /// drawn failures.
    pub fn job_mtbf(&self) -> Option<f64> {
        let rate: f64 = self.rates.iter().map(|(_, rate)| rate).sum();
        (rate > 0.0).then(|| 1.0 / rate)
    }

    /// Failures per hour the process expects (drawn ones, plus the fixed events spread over
    /// the horizon).
    fn expected_per_hour(&self) -> f64 {
        self.rates.iter().map(|(_, rate)| rate).sum::<f64>() + self.fixed.len() as f64 / self.horizon
    }

    /// The failures of replica `replica` (replica 0 is the run's own), sorted by time.
    fn draw(&self, replica: u64) -> Vec<Failure> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(replica);
        let mut all = self.fixed.clone();
        for &(kind, rate) in &self.rates {
            // A rate is positive and finite (a positive MTBF and at least one component).
            let Ok(gap) = Exp::new(rate) else { continue };
            let mut t = 0.0;
            loop {
                t += gap.sample(&mut rng);
                if t >= self.horizon {
                    break;
                }
                all.push(Failure { at_hours: t, kind });
            }
        }
        all.sort_by(|a, b| a.at_hours.total_cmp(&b.at_hours).then(a.kind.cmp(&b.kind)));
        all
    }
}

/// Replicas of the horizon the interval search averages over: enough for about
/// [`SEARCH_FAILURES`] failures in all, at least [`MIN_REPLICAS`], at most [`MAX_REPLICAS`].
const SEARCH_FAILURES: f64 = 4000.0;
const MIN_REPLICAS: u64 = 16;
const MAX_REPLICAS: u64 = 4096;

/// The interval search's grid: whole iterations, each about this factor above the last.
const GRID_RATIO: f64 = 1.04;

/// One checkpoint interval's expected outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct IntervalGoodput {
    /// Iterations between checkpoints.
    pub iterations: u64,
    /// Hours of work between checkpoints.
    pub hours: f64,
    /// Mean goodput over the replicas.
    pub goodput: f64,
}

/// The goodput report: `run`'s `goodput` block.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GoodputSummary {
    /// Wall-clock budget, hours.
    pub hours: f64,
    /// `checkpoint-restart` or `hot-spare`.
    pub response: &'static str,
    /// `simulation.seed`.
    pub seed: u64,
    /// Simulated time of one iteration, seconds.
    pub step_time_s: f64,
    /// Bytes of one checkpoint: weights and optimizer state of the whole model.
    pub checkpoint_bytes: u64,
    /// Time to write one checkpoint, seconds.
    pub checkpoint_write_s: f64,
    /// Recovery after a failure (restart or swap), seconds.
    pub recovery_s: f64,
    /// Iterations between checkpoints, as configured.
    pub checkpoint_interval_iterations: u64,
    /// Components that can fail.
    pub components: Components,
    /// Mean time between drawn failures of the whole job, hours (omitted without MTBFs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_mtbf_hours: Option<f64>,
    /// Failures of this run's draw, by kind.
    pub failures: FailureCounts,
    /// Useful training time over wall time, for this run's draw of failures.
    pub fraction: f64,
    /// Iterations completed and kept, for this run's draw.
    pub useful_iterations: u64,
    /// Hours of useful training, this run's draw.
    pub useful_hours: f64,
    /// Hours writing checkpoints, this run's draw.
    pub lost_hours_checkpoint: f64,
    /// Hours of work lost to failures, this run's draw.
    pub lost_hours_lost_work: f64,
    /// Hours restarting (or swapping spares), this run's draw.
    pub lost_hours_restart: f64,
    /// Replicas of the horizon (independent draws) behind the expected figures.
    pub replicas: u64,
    /// Mean goodput over the replicas at the configured interval.
    pub expected_fraction: f64,
    /// The interval with the highest mean goodput over the replicas (the search's grid:
    /// whole iterations, 4% apart).
    pub best_interval: IntervalGoodput,
    /// Young's `sqrt(2 C M)` in iterations of work (omitted without MTBFs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub young_interval_iterations: Option<f64>,
    /// The first-order goodput `1 - C/T - T/(2M) - R/M` at the configured interval (omitted
    /// without MTBFs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_order_goodput: Option<f64>,
    /// Mean goodput at each interval of the search's grid.
    pub curve: Vec<IntervalGoodput>,
}

/// Failures that struck during a horizon, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FailureCounts {
    /// GPUs.
    pub gpu: u64,
    /// Servers.
    pub node: u64,
    /// Network cables.
    pub link: u64,
}

/// A checkpoint write at `bandwidth` of `bytes`, in hours.
pub fn checkpoint_hours(bytes: Bytes, bandwidth: Bandwidth) -> f64 {
    bytes.0 as f64 / bandwidth.bytes_per_second() / 3600.0
}

/// The first failure event naming a link `topology` does not have, as (its key, the message):
/// `failures.events[i].link`, with an example of a valid name.
pub(crate) fn unknown_link(failures: &Failures, topology: &topology::Topology) -> Option<(String, String)> {
    use topology::LinkId;
    let links = topology.link_count() as u32;
    failures.events.iter().enumerate().find_map(|(index, event)| {
        (event.kind == ComponentKind::Link
            && !(0..links).any(|id| topology.link_name(LinkId(id)) == event.component))
        .then(|| {
            (
                format!("failures.events[{index}].link"),
                format!(
                    "is \"{}\"; no link of this cluster has that name: `parasim topo --json` lists them (link_list), e.g. \"{}\"",
                    event.component,
                    topology.link_name(LinkId(0))
                ),
            )
        })
    })
}

/// The goodput of `failures` for a job whose iteration takes `step_seconds`, whose
/// checkpoint holds `checkpoint_bytes`, on a cluster of `components`.
pub fn goodput(
    failures: &Failures,
    step_seconds: f64,
    checkpoint_bytes: Bytes,
    components: Components,
) -> GoodputSummary {
    let step = step_seconds / 3600.0;
    let horizon = failures.hours;
    let checkpoint = checkpoint_hours(checkpoint_bytes, failures.checkpoint_bandwidth);
    let recovery = failures.response.recovery_hours();
    let configured = match failures.checkpoint_interval {
        CheckpointInterval::Iterations(n) => n,
        CheckpointInterval::Minutes(minutes) => ((minutes / 60.0 / step).round() as u64).max(1),
    };
    let process = FailureProcess::new(failures, components);
    let run = process.draw(0);
    let times: Vec<f64> = run.iter().map(|f| f.at_hours).collect();
    let spent = play(horizon, configured as f64 * step, checkpoint, recovery, &times);
    let struck = &run[..(spent.failures as usize).min(run.len())];
    let count = |kind: ComponentKind| struck.iter().filter(|f| f.kind == kind).count() as u64;
    let by_kind = FailureCounts {
        gpu: count(ComponentKind::Gpu),
        node: count(ComponentKind::Node),
        link: count(ComponentKind::Link),
    };
    // The search: the same replicas (common random numbers) for every interval.
    let expected = process.expected_per_hour() * horizon;
    let replicas = if process.rates.is_empty() {
        1
    } else {
        ((SEARCH_FAILURES / expected.max(1e-9)).ceil() as u64).clamp(MIN_REPLICAS, MAX_REPLICAS)
    };
    let draws: Vec<Vec<f64>> =
        (0..replicas).map(|replica| process.draw(replica).iter().map(|f| f.at_hours).collect()).collect();
    let mean_goodput = |iterations: u64| {
        let mut total = TimeSpent::default();
        for draw in &draws {
            total.add(&play(horizon, iterations as f64 * step, checkpoint, recovery, draw));
        }
        total.useful / (horizon * replicas as f64)
    };
    // The grid: from a twentieth of a write (shorter intervals spend most of the time writing)
    // to the horizon, or ten job MTBFs (longer ones lose most of the work), in whole iterations.
    let mtbf = process.job_mtbf();
    let longest = mtbf.map_or(horizon, |m| horizon.min(10.0 * m));
    let max_iterations = ((longest / step).ceil() as u64).max(1);
    let mut grid = Vec::new();
    let mut k = ((checkpoint / 20.0 / step).floor() as u64).clamp(1, max_iterations);
    while k < max_iterations {
        grid.push(k);
        k = ((k as f64 * GRID_RATIO).ceil() as u64).max(k + 1);
    }
    grid.push(max_iterations);
    if !grid.contains(&configured) {
        grid.push(configured);
        grid.sort_unstable();
    }
    let curve: Vec<IntervalGoodput> = grid
        .iter()
        .map(|&iterations| IntervalGoodput {
            iterations,
            hours: iterations as f64 * step,
            goodput: mean_goodput(iterations),
        })
        .collect();
    let best = curve
        .iter()
        .copied()
        .fold(None::<IntervalGoodput>, |best, point| match best {
            Some(b) if b.goodput >= point.goodput => Some(b),
            _ => Some(point),
        })
        .unwrap_or(IntervalGoodput { iterations: configured, hours: configured as f64 * step, goodput: 0.0 });
    let expected_goodput = curve.iter().find(|p| p.iterations == configured).map_or(0.0, |p| p.goodput);
    GoodputSummary {
        hours: horizon,
        response: failures.response.name(),
        seed: failures.seed,
        step_time_s: step_seconds,
        checkpoint_bytes: checkpoint_bytes.0,
        checkpoint_write_s: checkpoint * 3600.0,
        recovery_s: recovery * 3600.0,
        checkpoint_interval_iterations: configured,
        components,
        job_mtbf_hours: mtbf,
        failures: by_kind,
        fraction: spent.useful / horizon,
        useful_iterations: (spent.useful / step + 1e-9).floor() as u64,
        useful_hours: spent.useful,
        lost_hours_checkpoint: spent.checkpoint,
        lost_hours_lost_work: spent.lost_work,
        lost_hours_restart: spent.restart,
        replicas,
        expected_fraction: expected_goodput,
        best_interval: best,
        young_interval_iterations: mtbf.map(|m| young_interval(checkpoint, m) / step),
        first_order_goodput: mtbf
            .map(|m| first_order_goodput(configured as f64 * step, checkpoint, recovery, m)),
        curve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failures(mtbf: f64, hours: f64, seed: u64, interval: u64) -> Failures {
        Failures {
            events: Vec::new(),
            gpu_mtbf_hours: Some(mtbf),
            node_mtbf_hours: None,
            link_mtbf_hours: None,
            response: Response::CheckpointRestart { restart_hours: 0.25 },
            checkpoint_bandwidth: Bandwidth::from_bytes_per_second(1_000_000_000).expect("positive"),
            checkpoint_interval: CheckpointInterval::Iterations(interval),
            hours,
            seed,
        }
    }

    const ONE_GPU: Components = Components { gpus: 1, nodes: 0, cables: 0 };

    #[test]
    fn without_failures_only_checkpoints_cost() {
        // 10 h, work 1 h then a 0.1 h write: 9 full cycles (9.9 h) and 0.1 h of work.
        let spent = play(10.0, 1.0, 0.1, 0.5, &[]);
        assert!((spent.checkpoint - 0.9).abs() < 1e-9, "{spent:?}");
        assert!((spent.useful - 9.1).abs() < 1e-9, "{spent:?}");
        assert_eq!(spent.failures, 0);
    }

    #[test]
    fn a_failure_loses_the_work_since_the_last_checkpoint() {
        // Checkpoint written at 1.1 h; failure at 1.6 h loses 0.5 h; restart until 2.1 h.
        let spent = play(3.0, 1.0, 0.1, 0.5, &[1.6]);
        assert!((spent.lost_work - 0.5).abs() < 1e-9, "{spent:?}");
        assert!((spent.restart - 0.5).abs() < 1e-9, "{spent:?}");
        // After the restart: work 2.1 -> 3.0 (0.9 h, uncommitted but kept at the end).
        assert!((spent.useful - 1.9).abs() < 1e-9, "{spent:?}");
        let total = spent.useful + spent.checkpoint + spent.lost_work + spent.restart;
        assert!((total - 3.0).abs() < 1e-9, "the causes add up to the wall time: {spent:?}");
    }

    #[test]
    fn a_failure_during_a_write_loses_the_work_it_was_saving_and_restarts_again_when_struck() {
        // Write 1.0 -> 1.1 is struck at 1.05; restart 1.05 -> 1.55 is struck at 1.3 and starts
        // again until 1.8.
        let spent = play(2.0, 1.0, 0.1, 0.5, &[1.05, 1.3]);
        assert!((spent.lost_work - 1.0).abs() < 1e-9, "{spent:?}");
        assert!((spent.checkpoint - 0.05).abs() < 1e-9, "{spent:?}");
        assert!((spent.restart - 0.75).abs() < 1e-9, "{spent:?}");
        assert_eq!(spent.failures, 2);
    }

    #[test]
    fn wall_time_is_always_accounted_for() {
        let f = failures(5.0, 500.0, 7, 100);
        let process = FailureProcess::new(&f, Components { gpus: 4, nodes: 0, cables: 0 });
        for replica in 0..8 {
            let draw: Vec<f64> = process.draw(replica).iter().map(|x| x.at_hours).collect();
            for interval in [0.01, 0.3, 2.0, 50.0] {
                let s = play(500.0, interval, 0.05, 0.2, &draw);
                let total = s.useful + s.checkpoint + s.lost_work + s.restart;
                assert!((total - 500.0).abs() < 1e-6, "{s:?}");
                assert_eq!(s.failures as usize, draw.len(), "every failure in the horizon strikes");
            }
        }
    }

    #[test]
    fn drawn_failures_arrive_at_the_rate_of_the_components() {
        // 64 GPUs of 1,000 h MTBF over 100,000 h: 6,400 failures expected, sd 80.
        let f = failures(1000.0, 100_000.0, 3, 10);
        let process = FailureProcess::new(&f, Components { gpus: 64, nodes: 0, cables: 0 });
        let count = process.draw(0).len() as f64;
        assert!((count - 6400.0).abs() < 4.0 * 80.0, "{count}");
    }

    #[test]
    fn expected_goodput_matches_the_first_order_closed_form_within_sampling_error() {
        // M = 1,000 h, C = 0.01 h (36 s), R = 0.5 h, T = Young's sqrt(2 C M) = 4.47 h: the
        // neglected terms are of order (T/M)^2 ~ 2e-5, well under the sampling error.
        let (mtbf, checkpoint, recovery, horizon) = (1000.0, 0.01, 0.5, 400_000.0);
        let interval = young_interval(checkpoint, mtbf);
        let f = failures(mtbf, horizon, 11, 1);
        let draw: Vec<f64> = FailureProcess::new(&f, ONE_GPU).draw(0).iter().map(|x| x.at_hours).collect();
        let spent = play(horizon, interval, checkpoint, recovery, &draw);
        let simulated = spent.useful / horizon;
        let closed = first_order_goodput(interval, checkpoint, recovery, mtbf);
        // Per failure: R + lost work ~ uniform on (0, T); the count is Poisson.
        let n = horizon / mtbf;
        let per_failure_sd = ((recovery + interval / 2.0).powi(2) + interval * interval / 12.0).sqrt();
        let sd = n.sqrt() * per_failure_sd / horizon;
        assert!(
            (simulated - closed).abs() < 4.0 * sd,
            "simulated {simulated}, closed form {closed}, sd {sd}"
        );
        // And the test can fail: the losses are many times the tolerance.
        assert!(1.0 - closed > 5.0 * 4.0 * sd, "losses {} against a tolerance of {}", 1.0 - closed, 4.0 * sd);
    }

    #[test]
    fn the_search_finds_young_and_dalys_optimum_interval() {
        // C = 0.1 h, job MTBF M = 50 h: Young's sqrt(2 C M) = 3.16 h, Daly's higher-order
        // estimate 3.10 h. Steps of 36 s (0.01 h) make the grid fine enough.
        let (mtbf, step_seconds) = (50.0, 36.0);
        let mut f = failures(mtbf, 200_000.0, 5, 100);
        // 0.1 h at 1 GB/s: 360 GB.
        let bytes = Bytes(360_000_000_000);
        f.response = Response::CheckpointRestart { restart_hours: 0.0 };
        let summary = goodput(&f, step_seconds, bytes, ONE_GPU);
        let checkpoint = summary.checkpoint_write_s / 3600.0;
        assert!((checkpoint - 0.1).abs() < 1e-9);
        let found = summary.best_interval.hours;
        let young = young_interval(checkpoint, mtbf);
        let daly = daly_interval(checkpoint, mtbf);
        println!("found {found:.3} h, Young {young:.3} h, Daly {daly:.3} h");
        assert!((found - young).abs() / young < 0.10, "found {found} h, Young {young} h");
        assert!((found - daly).abs() / daly < 0.06, "found {found} h, Daly {daly} h");
        // The optimum beats intervals a factor 3 away on either side.
        let at = |hours: f64| {
            summary
                .curve
                .iter()
                .min_by(|a, b| (a.hours - hours).abs().total_cmp(&(b.hours - hours).abs()))
                .map(|p| p.goodput)
                .unwrap_or(0.0)
        };
        assert!(summary.best_interval.goodput > at(young * 3.0) + 0.01);
        assert!(summary.best_interval.goodput > at(young / 3.0) + 0.01);
    }

    #[test]
    fn the_same_seed_gives_the_same_report_and_another_seed_another_draw() {
        let f = failures(20.0, 200.0, 42, 50);
        let components = Components { gpus: 8, nodes: 0, cables: 0 };
        let a = goodput(&f, 10.0, Bytes(1 << 30), components);
        let b = goodput(&f, 10.0, Bytes(1 << 30), components);
        assert_eq!(a, b);
        let c = goodput(&Failures { seed: 43, ..f }, 10.0, Bytes(1 << 30), components);
        assert_ne!(a.useful_hours, c.useful_hours, "another seed draws other failures");
    }

    #[test]
    fn fixed_events_strike_at_their_times() {
        let mut f = failures(1.0, 10.0, 0, 360);
        f.gpu_mtbf_hours = None;
        f.events = vec![FailureEvent { at_hours: 3.5, kind: ComponentKind::Gpu, component: "12".into() }];
        // Steps of 10 s, checkpoints every hour of work (360 iterations), 1 GB at 1 GB/s.
        let s = goodput(&f, 10.0, Bytes(1_000_000_000), ONE_GPU);
        assert_eq!(s.failures, FailureCounts { gpu: 1, node: 0, link: 0 });
        let c = 1.0 / 3600.0;
        // Checkpoints end at 1+c, 2+2c, 3+3c; the failure at 3.5 loses 0.5 - 3c of work.
        assert!((s.lost_hours_lost_work - (0.5 - 3.0 * c)).abs() < 1e-9, "{s:?}");
        assert!((s.lost_hours_restart - 0.25).abs() < 1e-9);
        assert_eq!(s.replicas, 1);
    }
}
