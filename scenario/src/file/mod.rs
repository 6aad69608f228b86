//! Scenario files: the TOML a user writes, read into wire structs (serde, unknown keys
//! rejected) and validated into a [`Scenario`] the simulation uses. Every error names the file
//! and the key, says what was given and what would be valid.

use sim_core::lookup::LookupMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;
use sim_core::fidelity::{Fidelity, NetworkSettings};
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind};
use sim_core::nccl::protocol::ProtocolChoice;
use sim_core::nccl::tuner::GpuGeneration;
use sim_core::units::{Bandwidth, Bytes, SimDuration};
use strategies::{GradientSync, Offload, Parallelism, PipelineSchedule, RankOrder};
use topology::{ClusterSpec, IntraNode, LinkSpec, Topology, TopologyError};
use workloads::fusion::Fusion;
use workloads::groupbn::BatchNormGroup;
use workloads::input::{InputCopy, InputPipeline, Loader};
use workloads::profile::Profile;
use workloads::{
    ComputeModel, Device, DeviceCatalog, Dtype, GradientAccumulation, Model, ModelError, Optimizer,
    OptimizerPasses, Recompute, zoo,
};

mod compute_section;
pub mod framework;
pub mod host;
mod jobs;
mod network;
pub mod node_groups;
mod overrides;
pub mod variability;

use compute_section::ComputeSection;
use framework::FrameworkUse;
use host::HostUse;

pub use jobs::{Job, JobsScenario, Placement, has_jobs, text_has_jobs};
pub use overrides::{InlineValue, Override, OverrideError, apply, dotted_leaves, get_dotted, merge};

/// The example scenario the README runs, compiled in so `parasim run` works anywhere.
pub const QUICKSTART: &str = include_str!("../../../scenarios/quickstart.toml");

/// A scenario file could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario: {message}")]
    Read {
        /// What went wrong, naming the file.
        message: String,
    },
    /// The file is not valid TOML.
    #[error("{file}: {message}")]
    Syntax {
        /// The file.
        file: PathBuf,
        /// The parser's message with line and column.
        message: String,
    },
    /// The TOML does not parse into the scenario format.
    #[error("{file}: key `{key}`: {message}")]
    Format {
        /// The file.
        file: PathBuf,
        /// The key (dotted path) at fault.
        key: String,
        /// What is wrong, with the line and column.
        message: String,
    },
    /// A value parses but is not valid.
    #[error("{file}: key `{key}`: {message}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The key at fault.
        key: String,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// An override does not apply to the scenario's table.
    #[error(transparent)]
    Override(#[from] OverrideError),
    /// The scenario is not valid at a key an override set: the override (`key=value`) and
    /// the scenario's own error, without the file's name (the override is at fault, not the
    /// file).
    #[error("{setting}: {}", source.as_set_by_override())]
    Overridden {
        /// The override, as `key=value`.
        setting: String,
        /// The scenario's error.
        source: Box<ScenarioError>,
    },
}

impl ScenarioError {
    /// The scenario key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ScenarioError::Format { key, .. } | ScenarioError::Invalid { key, .. } => Some(key),
            ScenarioError::Overridden { source, .. } => source.key(),
            ScenarioError::Override(OverrideError::NotATable { key, .. }) => Some(key),
            _ => None,
        }
    }

    /// The error as an override's: a format or value error names its key as the override's
    /// (`key `x` (set by this override): ...`), not the file, which holds no such key.
    fn as_set_by_override(&self) -> String {
        match self {
            ScenarioError::Format { key, message, .. } | ScenarioError::Invalid { key, message, .. } => {
                format!("key `{key}` (set by this override): {message}")
            }
            other => other.to_string(),
        }
    }

    /// The error without the line a table's deserializer ends a format error with (``in
    /// `parallelism.data` ``): the key is named already.
    fn without_path_line(self) -> ScenarioError {
        match self {
            ScenarioError::Format { file, key, message } => {
                let message = match message.rsplit_once('\n') {
                    Some((first, last)) if last.starts_with("in `") => first.trim_end().to_string(),
                    _ => message,
                };
                ScenarioError::Format { file, key, message }
            }
            other => other,
        }
    }

    /// The error, attributed to the last of `overrides` that set its key (or the key inside a
    /// table that the format says is unknown there), if one did.
    pub fn attributed(self, overrides: &[Override]) -> ScenarioError {
        // An unknown key is named with its path (`nothing` of `nothing.here`).
        let unknown_inside = |change: &Override, key: &str| {
            matches!(&self, ScenarioError::Format { message, .. }
                if change.key.strip_prefix(key).is_some_and(|rest| rest.starts_with('.'))
                    && message.contains(&format!("unknown field `{}`", key.rsplit('.').next().unwrap_or(key))))
        };
        let by = self.key().and_then(|key| {
            overrides.iter().rev().find(|change| change.covers(key) || unknown_inside(change, key))
        });
        match by {
            Some(change) => ScenarioError::Overridden { setting: change.to_string(), source: Box::new(self) },
            None => self,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ScenarioSpec {
    cluster: ClusterSection,
    workload: Option<WorkloadSection>,
    #[serde(default)]
    parallelism: ParallelismSection,
    #[serde(default)]
    simulation: SimulationSection,
    #[serde(default)]
    compute: ComputeSection,
    failures: Option<crate::failures::FailuresSection>,
    faults: Option<crate::faults::FaultsSection>,
    #[serde(default)]
    variability: variability::VariabilitySection,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ClusterSection {
    #[serde(default = "one")]
    nodes: u32,
    #[serde(default = "eight")]
    gpus_per_node: u32,
    /// Required unless `node-groups` name the devices.
    device: Option<String>,
    /// `[[cluster.node-groups]]`: servers of different devices in one cluster.
    #[serde(default)]
    node_groups: Vec<node_groups::NodeGroupSection>,
    /// `cluster.host`: its measured dispatch cost is written into `[compute]` before the
    /// table is read ([`host::apply`]); kept here so the format accepts the key.
    #[serde(rename = "host")]
    _host: Option<String>,
    intra_node: Option<IntraNodeSection>,
    host_link: Option<LinkSection>,
    host_memory: Option<Bytes>,
    /// `cluster.host-cpu`: the nodes' CPUs (a `kind = "cpu"` catalog device), for an optimizer
    /// step on the host (`workload.offload = "optimizer"`); a `cluster.host` may name them.
    host_cpu: Option<String>,
    /// `cluster.nvme-bandwidth`: the node's NVMe drives' bandwidth (read and write alike), for
    /// a host optimizer's state on NVMe (`workload.offload-device = "nvme"`).
    nvme_bandwidth: Option<Bandwidth>,
    flops_scale: Option<f64>,
    memory_bandwidth_scale: Option<f64>,
    #[serde(default)]
    network: network::NetworkSection,
}

/// DGX/HGX-style servers hold 8 GPUs.
fn eight() -> u32 {
    8
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct IntraNodeSection {
    #[serde(default = "nvswitch")]
    kind: String,
    bandwidth: Option<Bandwidth>,
    latency: Option<SimDuration>,
}

fn nvswitch() -> String {
    "nvswitch".into()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LinkSection {
    bandwidth: Option<Bandwidth>,
    latency: Option<SimDuration>,
}

/// One 200 Gb/s HDR InfiniBand NIC per GPU, as in a DGX A100.
const DEFAULT_NETWORK_BANDWIDTH: Bandwidth = match Bandwidth::from_bits_per_second(200_000_000_000) {
    Some(bandwidth) => bandwidth,
    None => panic!("non-zero"),
};
/// Per-link latency when none is given (the reference simulators' 1 us).
const DEFAULT_LATENCY: SimDuration = SimDuration::from_us(1);

/// The longest latency a link may have: 1 s, far above any wire, switch or PCIe hop (ns to
/// tens of us); a longer one is a typo of unit.
pub(crate) const MAX_LINK_LATENCY: SimDuration = SimDuration::from_ms(1000);

/// A link latency above [`MAX_LINK_LATENCY`] is refused, naming the value and the bound.
fn check_latency(latency: SimDuration) -> Result<(), String> {
    if latency > MAX_LINK_LATENCY {
        return Err(format!(
            "latency {latency} is above the bound of {MAX_LINK_LATENCY}; links take ns to tens of us (was a unit meant, \"ns\" or \"us\"?)"
        ));
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct WorkloadSection {
    model: String,
    /// `workload.framework`: its settings are written into the table before it is read
    /// ([`framework::apply`]); kept here so the format accepts the key.
    #[serde(rename = "framework")]
    _framework: Option<String>,
    /// `workload.execution`: with `cluster.host`, written into `[compute]` before the table
    /// is read ([`host::apply`]); kept here so the format accepts the key.
    #[serde(rename = "execution")]
    _execution: Option<String>,
    batch_per_device: Option<u64>,
    global_batch: Option<u64>,
    micro_batch: Option<u64>,
    sequence_length: Option<u64>,
    capacity_factor: Option<f64>,
    #[serde(default = "fp16")]
    precision: String,
    #[serde(default = "fp32")]
    gradient_precision: String,
    #[serde(default = "fp32")]
    optimizer_precision: String,
    master_weights: Option<String>,
    #[serde(default)]
    fp8_weights: bool,
    #[serde(default = "sgd_momentum")]
    optimizer: String,
    #[serde(default)]
    recompute: Option<String>,
    passes: Option<String>,
    offload: Option<String>,
    /// `workload.offload-device`: where a host optimizer keeps its state, `"cpu"` (host
    /// memory, the default) or `"nvme"` (ZeRO-Infinity).
    offload_device: Option<String>,
    input: Option<InputSection>,
    lora: Option<LoraSection>,
    muon: Option<MuonSection>,
}

/// `[workload.muon]`: Muon's settings ([`workloads::muon::Muon`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct MuonSection {
    steps: Option<u32>,
    iteration: Option<String>,
    distribution: Option<String>,
}

/// `[workload.lora]`: LoRA fine-tuning ([`workloads::lora`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LoraSection {
    rank: u64,
    targets: Vec<String>,
}

/// `[workload.input]`: the data loader (see [`workloads::input`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct InputSection {
    loader: String,
    rate: Option<f64>,
    #[serde(default = "one")]
    prefetch: u32,
    broadcast_rate: Option<Bandwidth>,
    sample_bytes: Option<Bytes>,
    copy: Option<String>,
}

/// `workload.master-weights` and `workload.fp8-weights`, checked against the dtypes they need.
fn weight_storage(
    workload: &WorkloadSection,
    precision: Dtype,
    optimizer_precision: Dtype,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<workloads::WeightStorage, ScenarioError> {
    use workloads::MasterWeights;
    let master: MasterWeights = match &workload.master_weights {
        Some(name) => name.parse().map_err(|error| invalid("workload.master-weights", error))?,
        None => MasterWeights::default(),
    };
    if master == MasterWeights::Remainders
        && (precision.storage() != Dtype::Bf16 || optimizer_precision != Dtype::Fp32 || workload.fp8_weights)
    {
        return Err(invalid(
            "workload.master-weights",
            format!(
                "is \"remainders\" (the 16 low bits of each fp32 weight beside its bf16 weight), which needs bf16 weights and an fp32 optimizer: workload.precision = \"bf16\" or \"fp8\" (is {:?}), workload.optimizer-precision = \"fp32\" (is {:?}) and no workload.fp8-weights",
                precision.name(),
                optimizer_precision.name()
            ),
        ));
    }
    if workload.fp8_weights && precision != Dtype::Fp8 {
        return Err(invalid(
            "workload.fp8-weights",
            format!(
                "keeps the FP8 layers' weights in FP8 only, which needs workload.precision = \"fp8\" (is {:?})",
                precision.name()
            ),
        ));
    }
    Ok(workloads::WeightStorage { master, fp8: workload.fp8_weights })
}

fn one() -> u32 {
    1
}

fn fp16() -> String {
    "fp16".into()
}
fn fp32() -> String {
    "fp32".into()
}
fn sgd_momentum() -> String {
    "sgd-momentum".into()
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
struct ParallelismSection {
    data: Option<u32>,
    tensor: u32,
    sequence_parallel: bool,
    pipeline: u32,
    virtual_stages: u32,
    schedule: String,
    microbatch_group_size: Option<u32>,
    first_stage_layers: Option<u32>,
    last_stage_layers: Option<u32>,
    /// `parallelism.pad-layers` ([`Parallelism::pad_layers`]).
    pad_layers: bool,
    /// `parallelism.account-for-embedding` ([`Parallelism::account_for_embedding`]).
    account_for_embedding: bool,
    /// `parallelism.account-for-loss` ([`Parallelism::account_for_loss`]).
    account_for_loss: bool,
    /// `parallelism.stage-placement` ([`node_groups::StagePlacement`]).
    stage_placement: Option<String>,
    context: u32,
    expert: u32,
    expert_tensor: Option<u32>,
    moe_dispatcher: String,
    moe_overlap: bool,
    moe_experts: String,
    moe_router_dtype: Option<String>,
    expert_skew: f64,
    zero: u8,
    distributed_optimizer_instances: u32,
    defer_embedding_wgrad: bool,
    wgrad_deferral_limit: Option<u32>,
    context_comm: String,
    hierarchical_context_sizes: Option<Vec<u32>>,
    order: String,
    bucket_size: Bytes,
    first_bucket_size: Bytes,
    allreduce: String,
    filter: u32,
    channel: u32,
    spatial: u32,
    spatial_dims: String,
    spatial_until: Option<String>,
    spatial_halos: String,
    filter_backward: String,
    cnn_transport: String,
    cnn_staging_rate: Option<Bandwidth>,
    sync: String,
    global_sync_every: Option<u32>,
    global_sync: Option<String>,
    global_sync_wait: Option<u32>,
    batch_norm_group: u32,
    zero_implementation: String,
    pipeline_host_sync: String,
    pipeline_scatter_gather: bool,
    gradient_buffers: String,
}

impl Default for ParallelismSection {
    fn default() -> Self {
        ParallelismSection {
            data: None,
            tensor: 1,
            sequence_parallel: false,
            pipeline: 1,
            virtual_stages: 1,
            schedule: "1f1b".into(),
            microbatch_group_size: None,
            first_stage_layers: None,
            last_stage_layers: None,
            pad_layers: false,
            account_for_embedding: false,
            account_for_loss: false,
            stage_placement: None,
            context: 1,
            expert: 1,
            expert_tensor: None,
            moe_dispatcher: "all-to-all".into(),
            moe_overlap: false,
            moe_experts: "grouped".into(),
            moe_router_dtype: None,
            expert_skew: 1.0,
            zero: 0,
            distributed_optimizer_instances: 1,
            defer_embedding_wgrad: false,
            wgrad_deferral_limit: None,
            context_comm: "p2p".into(),
            hierarchical_context_sizes: None,
            order: "tp-cp-dp-pp".into(),
            bucket_size: Bytes(25 << 20),
            first_bucket_size: Bytes(1 << 20),
            allreduce: "auto".into(),
            filter: 1,
            channel: 1,
            spatial: 1,
            spatial_dims: "h".into(),
            spatial_until: None,
            spatial_halos: "every-window".into(),
            filter_backward: "input-allreduce".into(),
            cnn_transport: "device".into(),
            cnn_staging_rate: None,
            sync: "allreduce".into(),
            global_sync_every: None,
            global_sync: None,
            global_sync_wait: None,
            batch_norm_group: 1,
            zero_implementation: "fsdp".into(),
            pipeline_host_sync: "none".into(),
            pipeline_scatter_gather: false,
            gradient_buffers: "copy".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
struct SimulationSection {
    fidelity: String,
    iterations: u32,
    collective_launch: SimDuration,
    chunk_size: Bytes,
    protocol: Option<String>,
    fold_symmetric_ranks: Option<bool>,
    work_budget: Option<u64>,
    seed: u64,
}

impl Default for SimulationSection {
    fn default() -> Self {
        SimulationSection {
            fidelity: "analytical".into(),
            iterations: 1,
            collective_launch: NCCL_BASE_LATENCY,
            chunk_size: Bytes(sim_core::schedule::CHUNK_BYTES),
            protocol: None,
            fold_symmetric_ranks: None,
            work_budget: None,
            seed: 0,
        }
    }
}

/// Fixed cost of launching one collective: NCCL's own tuning model charges a base latency of
/// 8.4 us to ring and tree collectives with the Simple protocol (`baseLat` in
/// `src/graph/tuning.cc`, NCCL 2.12 to 2.18).
const NCCL_BASE_LATENCY: SimDuration = SimDuration::from_ps(8_400_000);

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Where it came from (for messages and reports).
    pub source: String,
    /// The cluster shape.
    pub cluster: ClusterSpec,
    /// The device of every GPU (shared by the scenarios validated with one [`ValidationCache`]).
    pub device: Arc<Device>,
    /// The trained model (shared likewise).
    pub model: Arc<Model>,
    /// Samples per iteration over all data-parallel replicas.
    pub global_batch: u64,
    /// Samples per micro-batch.
    pub micro_batch: u64,
    /// Compute dtype.
    pub precision: Dtype,
    /// Dtype of the all-reduced gradients.
    pub gradient_precision: Dtype,
    /// Dtype of the optimizer's states and its copy of the weights (`workload.optimizer-precision`).
    pub optimizer_precision: Dtype,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// How the weights and the optimizer's copy of them are stored (`workload.master-weights`,
    /// `workload.fp8-weights`).
    pub weights: workloads::WeightStorage,
    /// Activations recomputed in the backward pass.
    pub recompute: Recompute,
    /// Which passes of the step run (`workload.passes`).
    pub passes: strategies::passes::Passes,
    /// How the model is split over the GPUs.
    pub parallelism: Parallelism,
    /// Simulate one of each set of symmetric ranks (tensor ranks, replicas) and replay its
    /// traffic on the others (`simulation.fold-symmetric-ranks`; default: on, except for
    /// plain data parallelism, whose engine counters stay those of every rank).
    pub fold_symmetric_ranks: bool,
    /// Network model and collective settings.
    pub network: NetworkSettings,
    /// Iterations to simulate (with [`Scenario::variability`] on, Monte Carlo iterations, each
    /// with fresh draws).
    pub iterations: u32,
    /// What is drawn afresh in each iteration (`[variability]`); none by default.
    pub variability: sim_core::variability::Variability,
    /// The seed of every draw (`simulation.seed`).
    pub seed: u64,
    /// Roofline parameters (shared likewise).
    pub compute: Arc<ComputeModel>,
    /// Where they came from: "defaults", or the profile (and whether keys override it).
    pub compute_source: String,
    /// Which normalization kernels run fused (`compute.fusion`).
    pub fusion: Fusion,
    /// Group batch norm (`parallelism.batch-norm-group`).
    pub batch_norm_group: BatchNormGroup,
    /// The kernels of the optimizer step around its update rule (`compute.optimizer-passes`).
    pub optimizer_passes: OptimizerPasses,
    /// How micro-batches' weight gradients add up (`compute.gradient-accumulation`).
    pub gradient_accumulation: GradientAccumulation,
    /// Muon's settings (`[workload.muon]`; the defaults unless the optimizer is Muon).
    pub muon: workloads::muon::Muon,
    /// Host memory of one node (`cluster.host-memory`), if given: what out-of-core training
    /// may fill.
    pub host_memory: Option<Bytes>,
    /// One GPU's process's share of the nodes' CPUs (`cluster.host-cpu`), if named: what a host
    /// optimizer step runs on.
    pub host_cpu: Option<Device>,
    /// One GPU's process's share of the node's NVMe bandwidth, where a host optimizer keeps its
    /// state on NVMe (`workload.offload-device = "nvme"`).
    pub nvme: Option<Bandwidth>,
    /// The data loader (`[workload.input]`), if modelled.
    pub input: Option<InputPipeline>,
    /// The training framework (`workload.framework`), if named, and the settings it implied.
    pub framework: Option<FrameworkUse>,
    /// The host (`cluster.host`) and execution mode (`workload.execution`), if either is
    /// named, and the per-op dispatch cost they gave.
    pub host: Option<HostUse>,
    /// Component failures and the job's response (`[failures]`), if modelled: the run reports
    /// goodput.
    pub failures: Option<crate::failures::Failures>,
    /// Links degraded or down (`[faults]`), if any.
    pub faults: Option<crate::faults::Faults>,
    /// Node groups of different devices (`[[cluster.node-groups]]`), if given: each rank
    /// runs its own group's device, and [`Scenario::device`] is the first group's.
    pub node_groups: Option<Arc<node_groups::NodeGroups>>,
}

impl Scenario {
    /// The strategy of this scenario, ready to lower.
    pub fn strategy(&self) -> strategies::Strategy<'_> {
        strategies::Strategy {
            model: &self.model,
            device: &self.device,
            compute: &self.compute,
            precision: self.precision,
            gradient_precision: self.gradient_precision,
            optimizer_precision: self.optimizer_precision,
            optimizer: self.optimizer,
            weights: self.weights,
            recompute: self.recompute,
            passes: self.passes,
            global_batch: self.global_batch,
            micro_batch: self.micro_batch,
            parallelism: self.parallelism,
            iterations: self.iterations,
            fold_symmetric_ranks: self.fold_symmetric_ranks,
            input: self.input.as_ref(),
            layer_tables: None,
            chunk_layers: None,
            host_cpu: self.host_cpu.as_ref(),
            nvme: self.nvme,
            fusion: self.fusion,
            batch_norm_group: self.batch_norm_group,
            optimizer_passes: self.optimizer_passes,
            gradient_accumulation: self.gradient_accumulation,
            muon: self.muon,
        }
    }

    /// Reads and validates the scenario file at `path`.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = fs_err::read_to_string(path)
            .map_err(|error| ScenarioError::Read { message: error.to_string() })?;
        Scenario::parse(&text, path)
    }

    /// Validates scenario `text`; `file` names it in messages.
    pub fn parse(text: &str, file: &Path) -> Result<Scenario, ScenarioError> {
        let spec = read_spec(text, file)?;
        if spec
            .workload
            .as_ref()
            .is_some_and(|workload| workload._framework.is_some() || workload._execution.is_some())
            || spec.cluster._host.is_some()
        {
            // The framework's settings go into the table; its errors were named above.
            let table: toml::Table = toml::from_str(text).map_err(|error| ScenarioError::Syntax {
                file: file.to_path_buf(),
                message: error.to_string(),
            })?;
            return Scenario::from_table(&table, file);
        }
        validate(spec, (None, None), file, &ValidationCache::default())
    }

    /// Reads the scenario file at `path`, applies `overrides` to its table and validates it
    /// ([`Scenario::from_table_with`]); without overrides, [`Scenario::load`].
    pub fn load_with(path: &Path, overrides: &[Override]) -> Result<Scenario, ScenarioError> {
        if overrides.is_empty() {
            return Scenario::load(path);
        }
        let text = fs_err::read_to_string(path)
            .map_err(|error| ScenarioError::Read { message: error.to_string() })?;
        Scenario::parse_with(&text, path, overrides)
    }

    /// Validates scenario `text` with `overrides` applied ([`Scenario::from_table_with`]);
    /// without overrides, [`Scenario::parse`] (whose errors give the line and column).
    pub fn parse_with(text: &str, file: &Path, overrides: &[Override]) -> Result<Scenario, ScenarioError> {
        if overrides.is_empty() {
            return Scenario::parse(text, file);
        }
        let table: toml::Table = toml::from_str(text).map_err(|error| ScenarioError::Syntax {
            file: file.to_path_buf(),
            message: error.to_string(),
        })?;
        Scenario::from_table_with(&table, overrides, file, &ValidationCache::default())
    }

    /// Validates a scenario given as a TOML table (a file changed by [`merge`] or
    /// [`Override`]s); `file` names it in messages and anchors the relative paths in it.
    pub fn from_table(table: &toml::Table, file: &Path) -> Result<Scenario, ScenarioError> {
        Scenario::from_table_cached(table, file, &ValidationCache::default())
    }

    /// [`Scenario::from_table`], taking what validation derives expensively (the cluster,
    /// the model, the compute model) from `cache` when an earlier scenario had the same
    /// inputs.
    pub fn from_table_cached(
        table: &toml::Table,
        file: &Path,
        cache: &ValidationCache,
    ) -> Result<Scenario, ScenarioError> {
        let (table, decided) = with_framework(table.clone(), file)?;
        let spec = match spec_of_valid_table(table.clone()) {
            Some(spec) => spec,
            None => spec_of_owned_table(table, file)?,
        };
        validate(spec, decided, file, cache)
    }

    /// [`Scenario::from_table_cached`] of a table the caller gives up, if it has the scenario
    /// format's keys and types (no copy of it); `None` if not (validate a copy with
    /// [`Scenario::from_table_cached`] for the error naming the key).
    pub(crate) fn from_valid_table(
        table: toml::Table,
        file: &Path,
        cache: &ValidationCache,
    ) -> Option<Result<Scenario, ScenarioError>> {
        let (table, decided) = match with_framework(table, file) {
            Ok(found) => found,
            Err(error) => return Some(Err(error)),
        };
        spec_of_valid_table(table).map(|spec| validate(spec, decided, file, cache))
    }

    /// `table` with `overrides` applied in order, validated (with `cache`): the one way a
    /// scenario is varied. An error at a key an override set names the override
    /// ([`ScenarioError::Overridden`]) around the scenario's own error, which names the key
    /// and what is valid.
    ///
    /// ```
    /// use std::path::Path;
    /// use scenario::{Override, Scenario, ValidationCache};
    /// let table: toml::Table = toml::from_str(scenario::QUICKSTART)?;
    /// let cache = ValidationCache::default();
    /// let file = Path::new("quickstart.toml");
    /// let changes: Vec<Override> = vec!["cluster.nodes=4".parse()?, "parallelism.data=32".parse()?];
    /// let scenario = Scenario::from_table_with(&table, &changes, file, &cache)?;
    /// assert_eq!(scenario.parallelism.data, 32);
    /// let error = Scenario::from_table_with(&table, &["parallelism.dta=32".parse()?], file, &cache)
    ///     .unwrap_err();
    /// assert!(error.to_string().starts_with("parallelism.dta=32: key `parallelism.dta` (set by this override)"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_table_with(
        table: &toml::Table,
        overrides: &[Override],
        file: &Path,
        cache: &ValidationCache,
    ) -> Result<Scenario, ScenarioError> {
        let mut table = table.clone();
        apply(&mut table, overrides)?;
        Scenario::from_table_cached(&table, file, cache)
            .map_err(|error| error.without_path_line().attributed(overrides))
    }

    /// Checks that `table` has the scenario format's keys and value types, without
    /// validating values or reading the files it names: cheap enough to check every value of
    /// a sweep's axes before running any.
    pub fn check_format(table: &toml::Table, file: &Path) -> Result<(), ScenarioError> {
        spec_of_table(table, file).map(|_| ())
    }
}

pub use strategies::{MAX_ITERATIONS, MAX_SIMULATED_ITERATIONS};

/// The most Monte Carlo iterations (`simulation.iterations` with `[variability]`): they are
/// re-timed, not built, so the bound is the time they take (about 4 ms each for 1,024 GPUs of
/// ResNet-50 on 2 cores).
pub const MAX_MONTE_CARLO_ITERATIONS: u32 = 1_000_000;

/// The validated `[cluster]` table: what `parasim topo` needs, and the first part of a
/// scenario.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The cluster shape and network.
    pub spec: ClusterSpec,
    /// The device of every GPU.
    pub device: Device,
    /// The file's `[faults]` (with `simulation.seed`), for commands that build its fabric
    /// from the cluster alone (`parasim traffic`); `None` without the table.
    pub faults: Option<crate::faults::Faults>,
}

impl Cluster {
    /// Reads and validates only the `[cluster]` table of the scenario at `path`; other tables
    /// may be absent (`parasim topo` needs no workload).
    pub fn load(path: &Path) -> Result<Cluster, ScenarioError> {
        let text = fs_err::read_to_string(path)
            .map_err(|error| ScenarioError::Read { message: error.to_string() })?;
        Cluster::parse(&text, path)
    }

    /// Validates the `[cluster]` table of scenario `text`; `file` names it in messages.
    pub fn parse(text: &str, file: &Path) -> Result<Cluster, ScenarioError> {
        if let Ok(mut table) = toml::from_str::<toml::Table>(text)
            && has_jobs(&table)
        {
            // Several jobs on one fabric: the fabric is the [cluster] table.
            jobs::remove_job_keys(&mut table);
            let whole = spec_of_owned_table(table, file)?;
            let (spec, device) = validate_cluster(&whole.cluster, file)?;
            return Ok(Cluster { spec, device, faults: faults_of(&whole, file)? });
        }
        let whole = read_spec(text, file)?;
        let (spec, device) = validate_cluster(&whole.cluster, file)?;
        Ok(Cluster { spec, device, faults: faults_of(&whole, file)? })
    }
}

/// The validated `[faults]` of a scenario, if it has the table.
fn faults_of(spec: &ScenarioSpec, file: &Path) -> Result<Option<crate::faults::Faults>, ScenarioError> {
    let invalid = |key: &str, message: String| invalid(file, key, message);
    spec.faults.as_ref().map(|section| section.validate(spec.simulation.seed, &invalid)).transpose()
}

impl Cluster {
    /// Builds the cluster's fabric with its `[faults]` applied: what `parasim traffic` runs
    /// its flows on. Errors name the file and the key.
    pub fn fabric(&self, file: &Path) -> Result<Topology, ScenarioError> {
        let mut topology =
            Topology::build(&self.spec).map_err(|error| invalid(file, "cluster", error.to_string()))?;
        if let Some(faults) = &self.faults {
            faults.apply(&mut topology).map_err(|error| invalid(file, &error.key, error.message))?;
        }
        Ok(topology)
    }
}

/// What validating a scenario derives expensively, kept for the next scenario with the same
/// inputs: the cluster (its topology is built to check it), the model (parsed from its
/// definition) and the compute model (a profile read and parsed), each keyed by the scenario
/// keys and files that decide it. A search or a sweep that varies a scenario many times
/// validates each variant from its table through one cache; the variants then share one
/// device, model and compute model. Thread-safe; errors are not kept.
#[derive(Debug, Default)]
pub struct ValidationCache {
    /// `[cluster]` as read, and what it validated to (a search sees a few).
    clusters: Mutex<Vec<(ClusterSection, ClusterSpec, Arc<Device>)>>,
    /// (`workload.model`, the directory it is relative to, `workload.sequence-length`).
    models: Mutex<LookupMap<ModelKey, Arc<Model>>>,
    /// (`[compute]` as read, the device, the precision, the scenario file) and the compute
    /// model with its description.
    computes: Mutex<Vec<(ComputeKey, Arc<ComputeModel>, String)>>,
}

/// What decides a scenario's model: `workload.model`, the directory a model file's path is
/// relative to, `workload.sequence-length`.
type ModelKey = (String, PathBuf, Option<u64>);

/// What decides a scenario's compute model.
#[derive(Debug)]
struct ComputeKey {
    section: ComputeSection,
    device: Arc<Device>,
    precision: Dtype,
    file: PathBuf,
}

/// Entries past which a cache list stops growing (a sweep over many clusters or profiles
/// validates the rest afresh rather than scanning a long list).
const CACHE_ENTRIES: usize = 64;

impl ValidationCache {
    fn cluster(
        &self,
        section: &ClusterSection,
        file: &Path,
    ) -> Result<(ClusterSpec, Arc<Device>), ScenarioError> {
        let lock = || self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, spec, device)) = lock().iter().find(|(key, _, _)| key == section) {
            return Ok((spec.clone(), Arc::clone(device)));
        }
        let (spec, device) = validate_cluster(section, file)?;
        let device = Arc::new(device);
        let mut clusters = lock();
        if clusters.len() < CACHE_ENTRIES {
            clusters.push((section.clone(), spec.clone(), Arc::clone(&device)));
        }
        Ok((spec, device))
    }

    fn model(&self, workload: &WorkloadSection, base: &Path) -> Result<Arc<Model>, String> {
        let key = (workload.model.clone(), base.to_path_buf(), workload.sequence_length);
        let lock = || self.models.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(model) = lock().get(&key) {
            return Ok(Arc::clone(model));
        }
        let model = Arc::new(match workload.sequence_length {
            None => load_model(&workload.model, base),
            Some(tokens) => load_model_with_sequence(&workload.model, base, tokens),
        }?);
        let mut models = lock();
        if models.len() < CACHE_ENTRIES {
            models.insert(key, Arc::clone(&model));
        }
        Ok(model)
    }

    fn compute(
        &self,
        section: &ComputeSection,
        device: &Arc<Device>,
        precision: Dtype,
        file: &Path,
    ) -> Result<(Arc<ComputeModel>, String), ScenarioError> {
        let lock = || self.computes.lock().unwrap_or_else(PoisonError::into_inner);
        let found = lock()
            .iter()
            .find(|(key, _, _)| {
                key.precision == precision
                    && (Arc::ptr_eq(&key.device, device) || key.device == *device)
                    && key.section == *section
                    && key.file == file
            })
            .map(|(_, model, source)| (Arc::clone(model), source.clone()));
        if let Some(found) = found {
            return Ok(found);
        }
        let (model, source) = compute_model(section, device, precision, file)?;
        let model = Arc::new(model);
        let mut computes = lock();
        if computes.len() < CACHE_ENTRIES {
            let key = ComputeKey {
                section: section.clone(),
                device: Arc::clone(device),
                precision,
                file: file.to_path_buf(),
            };
            computes.push((key, Arc::clone(&model), source.clone()));
        }
        Ok((model, source))
    }
}

/// A zoo model by name, or a model file by path (relative to `base`, the directory of the file
/// that names it): `model` is read as a path if it is not a zoo name and contains a path
/// separator or ends in `.toml`. The error names the file and what is wrong.
pub fn load_model(model: &str, base: &Path) -> Result<Model, String> {
    match zoo::by_name(model) {
        Ok(found) => Ok(found),
        Err(unknown @ ModelError::UnknownModel { .. }) => {
            if !(model.contains(['/', '\\']) || model.ends_with(".toml")) {
                return Err(unknown.to_string());
            }
            let path = base.join(model);
            let text =
                fs_err::read_to_string(&path).map_err(|error| format!("reading the model file: {error}"))?;
            Model::from_toml_str(&text, &path.display().to_string()).map_err(|error| error.to_string())
        }
        Err(other) => Err(other.to_string()),
    }
}

/// [`load_model`] with the sequence length of a parametric model family set to `tokens`
/// (`workload.sequence-length`).
pub fn load_model_with_sequence(model: &str, base: &Path, tokens: u64) -> Result<Model, String> {
    let (text, origin) = match zoo::source(&model.trim().to_ascii_lowercase()) {
        Some(text) => (text.to_string(), format!("data/models/{}.toml", model.trim().to_ascii_lowercase())),
        None => {
            let path = base.join(model);
            if !(model.contains(['/', '\\']) || model.ends_with(".toml")) {
                return Err(load_model(model, base).err().unwrap_or_default());
            }
            (
                fs_err::read_to_string(&path).map_err(|error| format!("reading the model file: {error}"))?,
                path.display().to_string(),
            )
        }
    };
    let mut table: toml::Table = text.parse().map_err(|error| format!("{origin}: {error}"))?;
    let family = table
        .iter_mut()
        .filter(|(key, _)| key.as_str() != "model")
        .find_map(|(_, value)| value.as_table_mut().filter(|t| t.contains_key("sequence")));
    let Some(family) = family else {
        return Err(format!(
            "is {tokens}, but model {model} has no `sequence` to override (only parametric sequence models such as gpt, bert, llama and mixtral have one; a layer-by-layer model fixes its shapes)"
        ));
    };
    let tokens = i64::try_from(tokens).map_err(|_| format!("{tokens} tokens is too many"))?;
    family.insert("sequence".into(), toml::Value::Integer(tokens));
    Model::from_toml_str(&table.to_string(), &origin).map_err(|error| error.to_string())
}

/// What a scenario's framework and host decided ([`framework::apply`], [`host::apply`]).
type Decided = (Option<FrameworkUse>, Option<HostUse>);

/// `table` with the settings of the framework it names written in where it leaves their keys
/// out ([`framework::apply`]), then its host's measured dispatch cost ([`host::apply`]), and
/// what each decided; the error names `workload.framework` or the host's key at fault.
fn with_framework(mut table: toml::Table, file: &Path) -> Result<(toml::Table, Decided), ScenarioError> {
    let used = framework::apply(&mut table).map_err(|message| invalid(file, framework::KEY, message))?;
    let host = host::apply(&mut table).map_err(|(key, message)| invalid(file, &key, message))?;
    Ok((table, (used, host)))
}

/// The wire form of a scenario given as a table; `file` names it in messages.
fn spec_of_table(table: &toml::Table, file: &Path) -> Result<ScenarioSpec, ScenarioError> {
    spec_of_owned_table(table.clone(), file)
}

/// The wire form of `table` if it has the scenario format's keys and types, read without
/// tracking the key being read (which a search validating thousands of variants notices);
/// `None` if not, when [`spec_of_table`] names the key at fault.
fn spec_of_valid_table(table: toml::Table) -> Option<ScenarioSpec> {
    ScenarioSpec::deserialize(table).ok()
}

/// [`spec_of_table`] of a table the caller gives up.
fn spec_of_owned_table(table: toml::Table, file: &Path) -> Result<ScenarioSpec, ScenarioError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
        let key = error.path().to_string();
        format_error(file, &key, error.into_inner().to_string().trim().to_string())
    })
}

/// The top-level table a deserializer error at path `.` says is missing (`missing field
/// `cluster``), if that is what it says: the key to name instead of `.`.
pub fn missing_top_level_table(path: &str, message: &str) -> Option<String> {
    (path == ".")
        .then(|| message.split("missing field `").nth(1).and_then(|rest| rest.split('`').next()))
        .flatten()
        .map(str::to_string)
}

/// A format error at `key`: a table missing at the top level is named as such, not as the
/// path "." with a TOML excerpt pointing at line 1.
fn format_error(file: &Path, key: &str, message: String) -> ScenarioError {
    for name in ["jobs", "placement"] {
        if (key == "." || key == name) && message.contains(&format!("unknown field `{name}`")) {
            return ScenarioError::Format {
                file: file.to_path_buf(),
                key: name.to_string(),
                message: "several jobs on one fabric ([[jobs]], [placement]) run with `parasim run` (and `parasim topo` shows their fabric); this command takes a scenario of one job".into(),
            };
        }
    }
    match missing_top_level_table(key, &message) {
        Some(table) => ScenarioError::Format {
            file: file.to_path_buf(),
            key: table.clone(),
            message: format!("the scenario has no [{table}] table (see the scenario format in the README)"),
        },
        None => ScenarioError::Format { file: file.to_path_buf(), key: key.to_string(), message },
    }
}

/// The values the scenario format gives the numeric keys a sweep expression may read when a
/// scenario leaves them out (`cluster.nodes` 1, `cluster.gpus-per-node` 8, every parallel
/// degree but `data` 1, ...), as a table of the scenario's shape.
pub fn numeric_defaults() -> toml::Table {
    let parallelism = ParallelismSection::default();
    let simulation = SimulationSection::default();
    let mut table = toml::Table::new();
    let integer = |n: u32| toml::Value::Integer(i64::from(n));
    let entries = [
        ("cluster.nodes", integer(one())),
        ("cluster.gpus-per-node", integer(eight())),
        ("parallelism.tensor", integer(parallelism.tensor)),
        ("parallelism.pipeline", integer(parallelism.pipeline)),
        ("parallelism.virtual-stages", integer(parallelism.virtual_stages)),
        ("parallelism.context", integer(parallelism.context)),
        ("parallelism.expert", integer(parallelism.expert)),
        ("parallelism.zero", integer(u32::from(parallelism.zero))),
        ("simulation.iterations", integer(simulation.iterations)),
    ];
    for (key, value) in entries {
        // The keys are literals with no non-table parts on their paths.
        let _ = Override::new(key, value).apply(&mut table);
    }
    table
}

/// Parses scenario `text` into its wire form; `file` names it in messages.
fn read_spec(text: &str, file: &Path) -> Result<ScenarioSpec, ScenarioError> {
    let deserializer = toml::Deserializer::parse(text)
        .map_err(|error| ScenarioError::Syntax { file: file.to_path_buf(), message: error.to_string() })?;
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let key = error.path().to_string();
        format_error(file, &key, error.into_inner().to_string())
    })
}

fn invalid(file: &Path, key: &str, message: String) -> ScenarioError {
    ScenarioError::Invalid { file: file.to_path_buf(), key: key.into(), message }
}

fn validate_cluster(cluster: &ClusterSection, file: &Path) -> Result<(ClusterSpec, Device), ScenarioError> {
    let invalid = |key: &str, message: String| invalid(file, key, message);
    for (key, value) in [("cluster.nodes", cluster.nodes), ("cluster.gpus-per-node", cluster.gpus_per_node)] {
        if value == 0 {
            return Err(invalid(key, "must be at least 1, got 0".into()));
        }
    }
    let devices = cluster_devices(cluster, file)?;
    let device = devices[0].clone();
    // The links the groups share default to the slowest group's.
    let link_device = node_groups::link_device(&devices).unwrap_or_else(|| device.clone());
    let spec = cluster_spec(cluster, &link_device, file)?;
    Ok((spec, device))
}

/// The device of each node group (`[[cluster.node-groups]]`), or `cluster.device` alone, with
/// the what-if scales applied; errors name the key.
fn cluster_devices(cluster: &ClusterSection, file: &Path) -> Result<Vec<Device>, ScenarioError> {
    let invalid = |key: &str, message: String| invalid(file, key, message);
    let names: Vec<(String, &str)> = match (&cluster.device, cluster.node_groups.is_empty()) {
        (Some(device), true) => vec![("cluster.device".into(), device.as_str())],
        (None, true) => {
            return Err(invalid(
                "cluster.device",
                "is missing: name the GPUs' device from the catalog (data/devices.toml), or give \
                 [[cluster.node-groups]] with a device each"
                    .into(),
            ));
        }
        (Some(_), false) => {
            return Err(invalid(
                "cluster.device",
                "is given together with [[cluster.node-groups]]: give the device of every group \
                 (node-groups' `device`) and remove cluster.device"
                    .into(),
            ));
        }
        (None, false) => cluster
            .node_groups
            .iter()
            .enumerate()
            .map(|(index, group)| (format!("cluster.node-groups[{index}].device"), group.device.as_str()))
            .collect(),
    };
    if !cluster.node_groups.is_empty() {
        let mut total = 0u64;
        for (index, group) in cluster.node_groups.iter().enumerate() {
            if group.nodes == 0 {
                return Err(invalid(
                    &format!("cluster.node-groups[{index}].nodes"),
                    "must be at least 1, got 0".into(),
                ));
            }
            total += u64::from(group.nodes);
        }
        if total != u64::from(cluster.nodes) {
            return Err(invalid(
                "cluster.node-groups",
                format!(
                    "hold {total} nodes ({}), but cluster.nodes is {}: the groups' nodes must add up to cluster.nodes",
                    cluster.node_groups.iter().map(|g| g.nodes.to_string()).collect::<Vec<_>>().join(" + "),
                    cluster.nodes
                ),
            ));
        }
    }
    let devices = names
        .iter()
        .map(|(key, name)| scaled_device(cluster, key, name, file))
        .collect::<Result<Vec<Device>, ScenarioError>>()?;
    node_groups::check_alike(&devices)
        .map_err(|(index, message)| invalid(&format!("cluster.node-groups[{index}].device"), message))?;
    Ok(devices)
}

/// The host CPU one GPU's process gets (`cluster.host-cpu`, a `kind = "cpu"` catalog device):
/// the node's CPUs with their memory bandwidth and peak rates divided by the GPUs per node,
/// whose processes run their host optimizer steps at once; `None` when the key is not given.
fn host_cpu_share(cluster: &ClusterSection, file: &Path) -> Result<Option<Device>, ScenarioError> {
    const KEY: &str = "cluster.host-cpu";
    let Some(name) = &cluster.host_cpu else { return Ok(None) };
    let invalid = |message: String| invalid(file, KEY, message);
    let catalog = DeviceCatalog::builtin();
    let cpus = || {
        catalog
            .names()
            .filter(|n| catalog.get(n).is_ok_and(|d| d.kind == workloads::device::DeviceKind::Cpu))
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut cpu = catalog.get(name).map_err(|error| invalid(format!("{error}; CPUs: {}", cpus())))?.clone();
    if cpu.kind != workloads::device::DeviceKind::Cpu {
        return Err(invalid(format!("is {name:?}, a GPU; name the nodes' CPUs, one of: {}", cpus())));
    }
    let share = f64::from(cluster.gpus_per_node.max(1));
    for rate in cpu.peak.values_mut() {
        *rate =
            rate.scaled(1.0 / share).ok_or_else(|| invalid(format!("{name:?}'s peak rate underflows")))?;
    }
    cpu.memory_bandwidth = cpu
        .memory_bandwidth
        .scaled(1.0 / share)
        .ok_or_else(|| invalid(format!("{name:?}'s memory bandwidth underflows")))?;
    cpu.display_name = format!("{} (1/{} per GPU's process)", cpu.display_name, cluster.gpus_per_node.max(1));
    Ok(Some(cpu))
}

/// One GPU's process's share of `cluster.nvme-bandwidth` where `workload.offload-device` is
/// `"nvme"` (the node's processes read and write their optimizer states at once); `None` for
/// `"cpu"` or no key. Errors name the key.
fn nvme_share(
    cluster: &ClusterSection,
    device: Option<&str>,
    file: &Path,
) -> Result<Option<Bandwidth>, ScenarioError> {
    match device {
        None | Some("cpu") => Ok(None),
        Some("nvme") => {
            let Some(bandwidth) = cluster.nvme_bandwidth else {
                return Err(invalid(
                    file,
                    "cluster.nvme-bandwidth",
                    "is missing: workload.offload-device = \"nvme\" reads and writes the optimizer's state on \
                     the nodes' NVMe drives, so give their bandwidth per node (e.g. nvme-bandwidth = \"25 GB/s\")"
                        .into(),
                ));
            };
            bandwidth.scaled(1.0 / f64::from(cluster.gpus_per_node.max(1))).map(Some).ok_or_else(|| {
                invalid(
                    file,
                    "cluster.nvme-bandwidth",
                    format!("is {bandwidth}: too little to share among the node's GPUs"),
                )
            })
        }
        Some(other) => Err(invalid(
            file,
            "workload.offload-device",
            format!(
                "unknown device {other:?}; valid: \"cpu\" (host memory), \"nvme\" (the nodes' NVMe drives, ZeRO-Infinity)"
            ),
        )),
    }
}

/// Catalog device `name` (given at `key`) with `cluster.flops-scale` and
/// `cluster.memory-bandwidth-scale` applied.
fn scaled_device(
    cluster: &ClusterSection,
    key: &str,
    name: &str,
    file: &Path,
) -> Result<Device, ScenarioError> {
    let device_key = key;
    let invalid = |key: &str, message: String| invalid(file, key, message);
    let mut device =
        DeviceCatalog::builtin().get(name).map_err(|error| invalid(device_key, error.to_string()))?.clone();
    // What-if knobs: the device with faster or slower matrix units or memory.
    for (key, scale) in [
        ("cluster.flops-scale", cluster.flops_scale),
        ("cluster.memory-bandwidth-scale", cluster.memory_bandwidth_scale),
    ] {
        let Some(scale) = scale else { continue };
        if !(scale.is_finite() && scale > 0.0 && scale <= 1000.0) {
            return Err(invalid(
                key,
                format!("is {scale}; give a factor above 0 and at most 1000 (2 doubles the device's rate)"),
            ));
        }
        if key == "cluster.flops-scale" {
            for rate in device.peak.values_mut() {
                *rate = rate
                    .scaled(scale)
                    .ok_or_else(|| invalid(key, format!("{scale} overflows the peak rate")))?;
            }
        } else {
            device.memory_bandwidth = device
                .memory_bandwidth
                .scaled(scale)
                .ok_or_else(|| invalid(key, format!("{scale} gives no memory bandwidth")))?;
        }
        device.display_name = format!("{} ({key} {scale})", device.display_name);
    }
    Ok(device)
}

/// The cluster's shape and links, their defaults from `device`, built once to check it.
fn cluster_spec(
    cluster: &ClusterSection,
    device: &Device,
    file: &Path,
) -> Result<ClusterSpec, ScenarioError> {
    let invalid = |key: &str, message: String| invalid(file, key, message);
    for (key, latency) in [
        ("cluster.intra-node.latency", cluster.intra_node.as_ref().and_then(|section| section.latency)),
        ("cluster.host-link.latency", cluster.host_link.as_ref().and_then(|section| section.latency)),
    ] {
        if let Some(latency) = latency {
            check_latency(latency).map_err(|message| invalid(key, message))?;
        }
    }
    let intra_node = match &cluster.intra_node {
        None => IntraNode::NvSwitch(default_nvlink(device)),
        Some(section) => {
            let default = match section.kind.as_str() {
                "nvswitch" => default_nvlink(device),
                "pcie-switch" => LinkSpec::new(device.pcie_bandwidth, DEFAULT_LATENCY),
                other => {
                    return Err(invalid(
                        "cluster.intra-node.kind",
                        format!("unknown kind {other:?}; valid: \"nvswitch\", \"pcie-switch\""),
                    ));
                }
            };
            let link = LinkSpec::new(
                section.bandwidth.unwrap_or(default.bandwidth),
                section.latency.unwrap_or(default.latency),
            );
            if section.kind == "nvswitch" { IntraNode::NvSwitch(link) } else { IntraNode::PcieSwitch(link) }
        }
    };
    let host_link = LinkSpec::new(
        cluster.host_link.as_ref().and_then(|l| l.bandwidth).unwrap_or(device.pcie_bandwidth),
        cluster.host_link.as_ref().and_then(|l| l.latency).unwrap_or(DEFAULT_LATENCY),
    );
    let network = cluster
        .network
        .to_spec(
            LinkSpec::new(DEFAULT_NETWORK_BANDWIDTH, DEFAULT_LATENCY),
            LinkSpec::new(device.pcie_bandwidth, DEFAULT_LATENCY),
        )
        .map_err(|(key, message)| invalid(&format!("cluster.network.{key}"), message))?;
    let spec = ClusterSpec {
        nodes: cluster.nodes,
        gpus_per_node: cluster.gpus_per_node,
        intra_node,
        network,
        host_memory: Some(host_link),
    };
    // The work budget before the build (issue 38): each GPU adds at least its two directed
    // links to the node's interconnect and two more towards the fabric, so a cluster of
    // millions of GPUs is refused here instead of allocating its graph until memory runs out.
    let gpus = u64::from(cluster.nodes).saturating_mul(u64::from(cluster.gpus_per_node));
    sim_core::budget::check(
        gpus.saturating_mul(4),
        "links",
        || "cluster.nodes".into(),
        || {
            format!(
                "a cluster of {} nodes x {} GPUs (4 directed links per GPU)",
                cluster.nodes, cluster.gpus_per_node
            )
        },
        || "simulate fewer GPUs: fold the data-parallel replicas, or study a slice of the cluster".into(),
    )
    .map_err(|over| invalid("cluster.nodes", over.reason()))?;
    // Build once to check what only the whole shape can show (too many NICs for the fabric,
    // a routing the fabric cannot do); `parasim run` builds it again, in milliseconds.
    Topology::build(&spec).map_err(|error| {
        let key = match &error {
            TopologyError::Invalid { parameter, .. } => format!("cluster.network.{parameter}"),
            TopologyError::UnsupportedRouting { .. } => "cluster.network.routing".into(),
            TopologyError::Zero { what } => format!("cluster.network.{what}"),
            _ => "cluster.network".into(),
        };
        invalid(&key, error.to_string())
    })?;
    Ok(spec)
}

fn validate(
    spec: ScenarioSpec,
    (framework, host): Decided,
    file: &Path,
    cache: &ValidationCache,
) -> Result<Scenario, ScenarioError> {
    let invalid = |key: &str, message: String| invalid(file, key, message);
    let (cluster_spec, device) = cache.cluster(&spec.cluster, file)?;
    let gpus = cluster_spec.nodes.checked_mul(cluster_spec.gpus_per_node).ok_or_else(|| {
        invalid(
            "cluster.nodes",
            format!("{} nodes x {} GPUs overflows", cluster_spec.nodes, cluster_spec.gpus_per_node),
        )
    })?;
    let cluster = &spec.cluster;
    let workload = spec.workload.as_ref().ok_or_else(|| {
        invalid(
            "workload",
            "is missing: a scenario to run needs a [workload] table with at least `model`".into(),
        )
    })?;
    let base = file.parent().unwrap_or(Path::new("."));
    let model = cache.model(workload, base).map_err(|error| {
        invalid(
            if workload.sequence_length.is_some() { "workload.sequence-length" } else { "workload.model" },
            error,
        )
    })?;
    let model = match &workload.lora {
        Some(lora) => {
            let lora = workloads::lora::Lora { rank: lora.rank, targets: lora.targets.clone() };
            Arc::new(
                workloads::lora::apply(&model, &lora)
                    .map_err(|error| invalid(error.key(), error.to_string()))?,
            )
        }
        None => model,
    };
    let precision: Dtype = workload
        .precision
        .parse()
        .map_err(|error: workloads::DeviceError| invalid("workload.precision", error.to_string()))?;
    device.peak(precision).map_err(|error| invalid("workload.precision", error.to_string()))?;
    let gradient_precision: Dtype = workload
        .gradient_precision
        .parse()
        .map_err(|error: workloads::DeviceError| invalid("workload.gradient-precision", error.to_string()))?;
    let optimizer_precision: Dtype = match workload.optimizer_precision.as_str() {
        "fp32" => Dtype::Fp32,
        "bf16" => Dtype::Bf16,
        other => {
            return Err(invalid(
                "workload.optimizer-precision",
                format!(
                    "is {other:?}; valid: \"fp32\" (the optimizer's states and weight copy in fp32, the default) or \"bf16\" (kept in bf16, as Apex's DistributedFusedAdam with dtype = bf16)"
                ),
            ));
        }
    };
    let optimizer: Optimizer =
        workload.optimizer.parse().map_err(|error| invalid("workload.optimizer", error))?;
    let muon = muon_settings(workload, optimizer, &invalid)?;
    let weights = weight_storage(workload, precision, optimizer_precision, &invalid)?;
    let passes: strategies::passes::Passes = match &workload.passes {
        Some(passes) => passes.parse().map_err(|error| invalid("workload.passes", error))?,
        None => strategies::passes::Passes::Training,
    };
    let recompute: Recompute = match &workload.recompute {
        Some(mode) => mode.parse().map_err(|error| invalid("workload.recompute", error))?,
        None => Recompute::None,
    };

    let mut parallelism = parallelism(&spec.parallelism, gpus, cluster, &invalid)?;
    let collnet_needs = match parallelism.data_algorithm {
        CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain
            if !cluster_spec.network.transport.sharp =>
        {
            Some(
                "CollNet reduces in the InfiniBand switches, so set cluster.network.sharp = true (switches with SHARP)",
            )
        }
        CollectiveAlgorithm::CollNetDirect if !matches!(cluster_spec.intra_node, IntraNode::NvSwitch(_)) => {
            Some(
                "CollNet Direct needs an NVSwitch in each server (cluster.intra-node kind \"nvswitch\"); collnet-chain runs on any",
            )
        }
        _ => None,
    };
    if let Some(needs) = collnet_needs {
        return Err(invalid(
            "parallelism.allreduce",
            format!("is {:?}: {needs}, or choose another algorithm", parallelism.data_algorithm.name()),
        ));
    }
    if let Some(name) = &spec.parallelism.spatial_until {
        parallelism.spatial_until = Some(spatial_until(name, &parallelism, &model, &invalid)?);
    }
    parallelism.cnn_staging =
        cnn_staging(&spec.parallelism, &parallelism, cluster_spec.gpus_per_node, &invalid)?;
    if let Some(offload) = &workload.offload {
        parallelism.offload = offload.parse().map_err(|message| invalid("workload.offload", message))?;
    }
    if parallelism.offload != Offload::None && cluster.host_memory.is_none() {
        return Err(invalid(
            "cluster.host-memory",
            format!(
                "is missing: workload.offload = {:?} keeps data in the nodes' host memory, so give its size \
                 per node (e.g. host-memory = \"384 GiB\" for an ABCI node)",
                parallelism.offload.name()
            ),
        ));
    }
    if workload.lora.is_some() {
        // What LoRA is run with here: its frozen weights are in no gradient bucket, shard or
        // offloaded state, which the policies below would have to skip.
        let refused = if parallelism.zero >= 3 {
            Some(("parallelism.zero", format!("is {}", parallelism.zero)))
        } else if parallelism.offload != Offload::None {
            Some(("workload.offload", format!("is {:?}", parallelism.offload.name())))
        } else if parallelism.sync != strategies::GradientSync::AllReduce {
            Some(("parallelism.sync", "is DASO".to_string()))
        } else if parallelism.cnn_degree() > 1 {
            // Their per-layer collectives and copies would run below the first adapter.
            let key = if parallelism.filter > 1 {
                "parallelism.filter"
            } else if parallelism.channel > 1 {
                "parallelism.channel"
            } else {
                "parallelism.spatial"
            };
            Some((key, format!("is {}", parallelism.cnn_degree())))
        } else {
            None
        };
        if let Some((key, what)) = refused {
            return Err(invalid(
                key,
                format!(
                    "{what} with [workload.lora]: LoRA runs with data (ZeRO 0 to 2), tensor, sequence, \
                     context and pipeline parallelism; parasim does not shard or offload frozen weights \
                     (ZeRO-3, FSDP, offload), run DASO with them or split a CNN's layers (filter, channel, \
                     spatial) under them"
                ),
            ));
        }
    }
    if let Some(capacity) = workload.capacity_factor {
        if !(capacity.is_finite() && capacity > 0.0) {
            return Err(invalid(
                "workload.capacity-factor",
                format!(
                    "is {capacity}; give a positive factor (1.25 keeps up to 1.25 x the balanced tokens per expert)"
                ),
            ));
        }
        parallelism.capacity_factor = Some(capacity);
    }
    let (global_batch, micro_batch) = batch(workload, &parallelism, &invalid)?;
    let fidelity: Fidelity =
        spec.simulation.fidelity.parse().map_err(|message| invalid("simulation.fidelity", message))?;
    if spec.simulation.chunk_size.0 == 0 {
        return Err(invalid("simulation.chunk-size", "must be greater than 0".into()));
    }
    if spec.simulation.iterations == 0 {
        return Err(invalid("simulation.iterations", "must be at least 1, got 0".into()));
    }
    let variability =
        variability::validate(&spec.variability, gpus).map_err(|(key, message)| invalid(&key, message))?;
    let monte_carlo = variability.is_active();
    if monte_carlo && spec.simulation.iterations > MAX_MONTE_CARLO_ITERATIONS {
        return Err(invalid(
            "simulation.iterations",
            format!(
                "is {}; at most {MAX_MONTE_CARLO_ITERATIONS} Monte Carlo iterations (each re-times the whole graph)",
                spec.simulation.iterations
            ),
        ));
    }
    if !monte_carlo && spec.simulation.iterations > MAX_SIMULATED_ITERATIONS {
        return Err(invalid(
            "simulation.iterations",
            format!(
                "is {}; at most {MAX_SIMULATED_ITERATIONS}: iterations stream (memory holds a few, time grows with the count) but the report lists every iteration's time, and their mean settles after two or three",
                spec.simulation.iterations
            ),
        ));
    }
    let protocols = protocols(spec.simulation.protocol.as_deref(), &device, &invalid)?;
    let generation = GpuGeneration::of_device(&device.name);
    let input = match &workload.input {
        Some(section) => input_pipeline(section, &invalid)?,
        None => None,
    };
    let (compute, mut compute_source) = cache.compute(&spec.compute, &device, precision, file)?;
    let fusion: Fusion = match &spec.compute.fusion {
        Some(mode) => mode.parse().map_err(|error| invalid("compute.fusion", error))?,
        None => Fusion::None,
    };
    if fusion != Fusion::None {
        compute_source.push_str(&format!(", fusion {fusion}"));
    }
    let optimizer_passes: OptimizerPasses = match &spec.compute.optimizer_passes {
        Some(passes) => passes.parse().map_err(|error| invalid("compute.optimizer-passes", error))?,
        None => OptimizerPasses::Fused,
    };
    if optimizer_passes != OptimizerPasses::Fused {
        compute_source.push_str(&format!(", optimizer passes {optimizer_passes}"));
    }
    let gradient_accumulation: GradientAccumulation = match &spec.compute.gradient_accumulation {
        Some(mode) => mode.parse().map_err(|error| invalid("compute.gradient-accumulation", error))?,
        None => GradientAccumulation::InKernel,
    };
    if gradient_accumulation != GradientAccumulation::InKernel {
        compute_source.push_str(&format!(", gradient accumulation {gradient_accumulation}"));
    }
    let mut device_copy = compute.device_copy(&device);
    let mut generation = generation;
    let node_groups = node_groups_of(
        &spec,
        NodeGroupContext {
            first: (&device, &compute),
            precision,
            gpus_per_node: cluster_spec.gpus_per_node,
            monte_carlo,
        },
        &parallelism,
        file,
        cache,
    )?;
    if let Some(groups) = &node_groups {
        // What the groups share is the least capable group's: the oldest NCCL generation,
        // the slowest device-side copies.
        for group in &groups.groups {
            let theirs = GpuGeneration::of_device(&group.device.name);
            if theirs.index() < generation.index() {
                generation = theirs;
            }
            let copy = group.compute.device_copy(&group.device);
            device_copy = match (device_copy, copy) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    let batch_norm_group =
        batch_norm_group(spec.parallelism.batch_norm_group, &cluster_spec, &model, &parallelism, &invalid)?;

    let failures = match &spec.failures {
        Some(section) => Some(section.validate(gpus, cluster_spec.nodes, spec.simulation.seed, &invalid)?),
        None => None,
    };
    let faults = match &spec.faults {
        Some(section) => Some(section.validate(spec.simulation.seed, &invalid)?),
        None => None,
    };
    if fidelity == Fidelity::Analytical
        && let Some(key) = faults.as_ref().and_then(crate::faults::Faults::needs_time_varying_links)
    {
        return Err(invalid(
            &key,
            "needs simulation.fidelity = \"flow\" or \"packet-steps\": a fault for a while and latency noise change links as the run goes, and the analytical model keeps no link state over time".into(),
        ));
    }
    // Faults break the symmetry of ranks: every rank is simulated unless the scenario says.
    let fold_default = !parallelism.is_data_parallel()
        && faults.as_ref().is_none_or(|f| f.links.is_empty() && f.latency_noise.is_none());
    // Ranks on different devices are not symmetric: every rank is simulated.
    let mixed = node_groups.as_ref().is_some_and(|groups| groups.is_mixed());
    if mixed && spec.simulation.fold_symmetric_ranks == Some(true) {
        return Err(invalid(
            "simulation.fold-symmetric-ranks",
            "is true, but [[cluster.node-groups]] mix devices: ranks on different devices do not do the same work at the same times, so every rank is simulated (remove the key)".into(),
        ));
    }
    let scenario = Scenario {
        source: file.display().to_string(),
        cluster: cluster_spec,
        device,
        model,
        global_batch,
        micro_batch,
        precision,
        gradient_precision,
        optimizer_precision,
        optimizer,
        weights,
        recompute,
        passes,
        // Under variability every rank draws its own times: no two are symmetric.
        fold_symmetric_ranks: !monte_carlo
            && !mixed
            && spec.simulation.fold_symmetric_ranks.unwrap_or(fold_default),
        parallelism,
        network: NetworkSettings {
            work_budget: spec.simulation.work_budget,
            ..NetworkSettings::new(fidelity)
                .with_collective_launch(spec.simulation.collective_launch)
                .with_chunk(spec.simulation.chunk_size)
                .with_protocols(protocols)
                .with_generation(generation)
                .with_device_copy(device_copy)
        },
        iterations: spec.simulation.iterations,
        variability,
        seed: spec.simulation.seed,
        compute,
        compute_source,
        fusion,
        batch_norm_group,
        optimizer_passes,
        gradient_accumulation,
        muon,
        host_memory: cluster.host_memory,
        host_cpu: host_cpu_share(cluster, file)?,
        nvme: nvme_share(cluster, workload.offload_device.as_deref(), file)?,
        input,
        framework,
        host,
        failures,
        faults,
        node_groups,
    };
    scenario.strategy().check().map_err(|error| match error {
        strategies::StrategyError::Invalid { key, message } => invalid(key, message),
        other => invalid("parallelism", other.to_string()),
    })?;
    Ok(scenario)
}

/// Muon's settings from `[workload.muon]` (the defaults where a key is left out); the table
/// is refused with any other optimizer.
fn muon_settings(
    workload: &WorkloadSection,
    optimizer: Optimizer,
    invalid: &impl Fn(&str, String) -> ScenarioError,
) -> Result<workloads::muon::Muon, ScenarioError> {
    let defaults = workloads::muon::Muon::default();
    let Some(section) = &workload.muon else { return Ok(defaults) };
    if optimizer != Optimizer::Muon {
        return Err(invalid(
            "workload.muon",
            format!(
                "sets Muon's Newton-Schulz iterations, but workload.optimizer is {:?}: set optimizer = \"muon\" \
                 or remove [workload.muon]",
                optimizer.name()
            ),
        ));
    }
    let steps = section.steps.unwrap_or(defaults.steps);
    if steps == 0 {
        return Err(invalid(
            "workload.muon.steps",
            "must be at least 1 (Newton-Schulz iterations per update; Muon's default is 5)".into(),
        ));
    }
    let iteration = match &section.iteration {
        Some(name) => name.parse().map_err(|message| invalid("workload.muon.iteration", message))?,
        None => defaults.iteration,
    };
    let distribution = match &section.distribution {
        Some(name) => name.parse().map_err(|message| invalid("workload.muon.distribution", message))?,
        None => defaults.distribution,
    };
    Ok(workloads::muon::Muon { steps, iteration, distribution })
}

/// What [`node_groups_of`] takes from the scenario validated so far.
struct NodeGroupContext<'a> {
    /// The first group's device and compute model (the scenario's own).
    first: (&'a Arc<Device>, &'a Arc<ComputeModel>),
    /// The compute dtype.
    precision: Dtype,
    /// GPUs per server.
    gpus_per_node: u32,
    /// Whether `[variability]` makes the iterations Monte Carlo ones (re-timed, not streamed).
    monte_carlo: bool,
}

/// `[[cluster.node-groups]]` validated with their compute models and
/// `parallelism.stage-placement`; `None` without node groups. Refuses, by key, what a
/// cluster of mixed devices cannot take.
fn node_groups_of(
    spec: &ScenarioSpec,
    context: NodeGroupContext<'_>,
    parallelism: &Parallelism,
    file: &Path,
    cache: &ValidationCache,
) -> Result<Option<Arc<node_groups::NodeGroups>>, ScenarioError> {
    let invalid = |key: &str, message: String| invalid(file, key, message);
    let placement: node_groups::StagePlacement = match &spec.parallelism.stage_placement {
        Some(text) => text.parse().map_err(|message| invalid("parallelism.stage-placement", message))?,
        None => node_groups::StagePlacement::InOrder,
    };
    let cluster = &spec.cluster;
    if cluster.node_groups.is_empty() {
        if placement == node_groups::StagePlacement::BySpeed {
            return Err(invalid(
                "parallelism.stage-placement",
                "is \"by-speed\", but the cluster has one device type: give [[cluster.node-groups]] with their devices, or remove the key".into(),
            ));
        }
        return Ok(None);
    }
    let refuse = |key: &str, why: &str| {
        Err(invalid(key, format!("is set, but [[cluster.node-groups]] are given: {why}")))
    };
    if spec.compute.profile.is_some() {
        return refuse(
            "compute.profile",
            "a calibrated profile describes one device type, and node groups mix them (remove the profile; [compute] keys apply to every group)",
        );
    }
    if cluster._host.is_some() {
        return refuse("cluster.host", "a host is measured with one device's servers (remove the key)");
    }
    if spec.simulation.iterations > strategies::MAX_ITERATIONS && !context.monte_carlo {
        return Err(invalid(
            "simulation.iterations",
            format!(
                "is {}; with [[cluster.node-groups]] at most {} iterations are simulated (a longer run is streamed, one device's graph at a time, which node groups do not do)",
                spec.simulation.iterations,
                strategies::MAX_ITERATIONS
            ),
        ));
    }
    if placement == node_groups::StagePlacement::BySpeed {
        let why = if parallelism.pipeline < 2 {
            Some("there is no pipeline (parallelism.pipeline = 1)")
        } else if parallelism.virtual_stages > 1 {
            Some(
                "by-speed balances one chunk per stage; interleaved stages (virtual-stages > 1) are not balanced",
            )
        } else if parallelism.first_stage_layers.is_some()
            || parallelism.last_stage_layers.is_some()
            || parallelism.pad_layers
            || parallelism.account_for_embedding
            || parallelism.account_for_loss
        {
            Some(
                "first-stage-layers, last-stage-layers, pad-layers, account-for-embedding or account-for-loss \
                 already set the split",
            )
        } else {
            None
        };
        if let Some(why) = why {
            return Err(invalid("parallelism.stage-placement", format!("is \"by-speed\", but {why}")));
        }
    }
    let devices = cluster_devices(cluster, file)?;
    let mixed = devices.iter().any(|device| device.name != devices[0].name);
    if mixed && parallelism.pipeline > 1 && parallelism.schedule == strategies::PipelineSchedule::ZbV {
        // The lowering of each device type must build the same graph but for compute times.
        return Err(invalid(
            "parallelism.schedule",
            "is \"zb-v\", but [[cluster.node-groups]] mix devices: ZB-V orders each stage's work by its kernel times, which differ between the device types, and a mixed cluster runs one order on all of them; give \"1f1b\", \"gpipe\", \"zb-h1\" or \"dualpipe\"".into(),
        ));
    }
    let mut groups = Vec::with_capacity(devices.len());
    let mut first_node = 0;
    for (index, (section, device)) in cluster.node_groups.iter().zip(devices).enumerate() {
        let key = format!("cluster.node-groups[{index}].device");
        // Each group's servers keep their own device's links unless a key sets one rate.
        let intra_node = match &cluster.intra_node {
            None => Some(default_nvlink(&device).bandwidth),
            Some(section) if section.bandwidth.is_none() => Some(if section.kind == "nvswitch" {
                default_nvlink(&device).bandwidth
            } else {
                device.pcie_bandwidth
            }),
            Some(_) => None,
        };
        let host_link = cluster
            .host_link
            .as_ref()
            .and_then(|link| link.bandwidth)
            .is_none()
            .then_some(device.pcie_bandwidth);
        let (device, compute) = if index == 0 {
            (Arc::clone(context.first.0), Arc::clone(context.first.1))
        } else {
            device.peak(context.precision).map_err(|error| {
                invalid(&key, format!("{} cannot run workload.precision: {error}", device.name))
            })?;
            let device = Arc::new(device);
            let (compute, _) = cache.compute(&spec.compute, &device, context.precision, file)?;
            (device, compute)
        };
        groups.push(node_groups::NodeGroup {
            first_node,
            nodes: section.nodes,
            device,
            compute,
            intra_node,
            host_link,
        });
        first_node += section.nodes;
    }
    Ok(Some(Arc::new(node_groups::NodeGroups {
        groups,
        gpus_per_node: context.gpus_per_node,
        stage_placement: placement,
    })))
}

/// `parallelism.batch-norm-group`: how many GPUs of a server share each batch norm's
/// statistics (NVIDIA's `BN_GROUP`), and the cost of one peer exchange on this cluster: NCCL's
/// LL hop latency inside a server for the cluster's NCCL release (`hwLat`, NVLink or PCIe),
/// at the intra-node link's rate ([`workloads::groupbn`]).
fn batch_norm_group(
    size: u32,
    cluster: &ClusterSpec,
    model: &workloads::model::Model,
    parallelism: &Parallelism,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<BatchNormGroup, ScenarioError> {
    let key = "parallelism.batch-norm-group";
    if !workloads::groupbn::VALID_SIZES.contains(&size) {
        return Err(invalid(
            key,
            format!(
                "is {size}; valid: 1 (no group, the default), 2, 4 or 8 GPUs of one server sharing each batch norm's statistics (NVIDIA's group batch norm supports these)"
            ),
        ));
    }
    if size == 1 {
        return Ok(BatchNormGroup::NONE);
    }
    if !model.layers.iter().any(|layer| layer.kind == workloads::layer::LayerKind::BatchNorm) {
        return Err(invalid(
            key,
            format!(
                "is {size}, but model {:?} has no batch norm: remove the key (or set it to 1)",
                model.name
            ),
        ));
    }
    if cluster.gpus_per_node % size != 0 {
        return Err(invalid(
            key,
            format!(
                "is {size}, which does not divide cluster.gpus-per-node = {}: a group's GPUs exchange through peer memory, so they must share a server",
                cluster.gpus_per_node
            ),
        ));
    }
    if !parallelism.is_data_parallel() {
        return Err(invalid(
            key,
            format!(
                "is {size}; group batch norm is modelled for plain data parallelism only (no tensor, pipeline, context, expert, ZeRO or CNN split), where a group is {size} consecutive data-parallel ranks of one server"
            ),
        ));
    }
    let (hop, link) = match cluster.intra_node {
        IntraNode::NvSwitch(link) | IntraNode::NvLinkMesh(link) => {
            (sim_core::nccl::protocol::Hop::NvLink, link)
        }
        IntraNode::PcieSwitch(link) => (sim_core::nccl::protocol::Hop::Pci, link),
    };
    let table = sim_core::nccl::tables::NcclTable::of(cluster.network.transport.nccl_version);
    let latency_us = table.hop_latency_us(
        sim_core::nccl::protocol::Family::Ring,
        sim_core::nccl::protocol::Protocol::Ll,
        hop,
        false,
    );
    let latency =
        SimDuration::from_secs_f64(latency_us * 1e-6).map_err(|error| invalid(key, error.to_string()))?;
    Ok(BatchNormGroup::new(size, latency, link.bandwidth))
}

/// `simulation.protocol`: NCCL's protocols, chosen per collective by its tuner (`auto`, the
/// default on devices whose jobs use NCCL), one protocol for all, or `off` (collectives on the
/// links alone: the default for RCCL and MPI, whose tuning parasim does not model).
fn protocols(
    given: Option<&str>,
    device: &Device,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<ProtocolChoice, ScenarioError> {
    let key = "simulation.protocol";
    let choice = given
        .map(|given| {
            given
                .parse::<ProtocolChoice>()
                .map_err(|_| invalid(key, format!("is {given:?}; valid: auto, LL, LL128, Simple, off")))
        })
        .transpose()?;
    device.collectives.protocols(choice).map_err(|message| {
        invalid(
            key,
            format!("is {:?}, but {} {message} (or remove the key)", given.unwrap_or_default(), device.name),
        )
    })
}

/// `parallelism.spatial-until`: the index of the named layer, which must be one spatial
/// parallelism can split.
/// `parallelism.cnn-transport` and `parallelism.cnn-staging-rate`: the host staging of the CNN
/// group's MPI messages, for a group of `parallelism.cnn_degree()` contiguous ranks on nodes of
/// `gpus_per_node`.
fn cnn_staging(
    section: &ParallelismSection,
    parallelism: &Parallelism,
    gpus_per_node: u32,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<Option<strategies::HostStaging>, ScenarioError> {
    use strategies::CnnTransport;
    let transport: CnnTransport =
        section.cnn_transport.parse().map_err(|message| invalid("parallelism.cnn-transport", message))?;
    let degree = parallelism.cnn_degree();
    match (transport, section.cnn_staging_rate) {
        (CnnTransport::Device, None) => Ok(None),
        (CnnTransport::Device, Some(_)) => Err(invalid(
            "parallelism.cnn-staging-rate",
            "applies to parallelism.cnn-transport = \"mpi\" or \"mpi-managed\" only (or remove the key)"
                .into(),
        )),
        (_, _) if degree <= 1 => Err(invalid(
            "parallelism.cnn-transport",
            format!(
                "is {:?}: it carries the collectives of filter, channel or spatial parallelism, so set one of \
                 them above 1 (or remove the key)",
                transport.name()
            ),
        )),
        (_, None) => Err(invalid(
            "parallelism.cnn-staging-rate",
            format!(
                "is missing: parallelism.cnn-transport = {:?} stages MPI messages through host memory, so give \
                 the round trip's rate (e.g. cnn-staging-rate = \"1.4 GB/s\")",
                transport.name()
            ),
        )),
        (_, Some(rate)) if rate.bytes_per_second() < 1e6 => Err(invalid(
            "parallelism.cnn-staging-rate",
            format!("is {rate}: give at least 1 MB/s (a host round trip of GPU buffers)"),
        )),
        (_, Some(rate)) => Ok(strategies::HostStaging::new(transport, rate, degree, gpus_per_node)),
    }
}

fn spatial_until(
    name: &str,
    parallelism: &Parallelism,
    model: &Model,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<u32, ScenarioError> {
    let key = "parallelism.spatial-until";
    if parallelism.spatial <= 1 {
        return Err(invalid(
            key,
            "applies to spatial parallelism only: set parallelism.spatial above 1 (or remove the key)".into(),
        ));
    }
    let end = strategies::cnn::automatic_spatial_end(model);
    let splittable: Vec<&str> = model.layers[..end].iter().map(|layer| layer.name.as_str()).collect();
    let valid = match (splittable.first(), splittable.last()) {
        (Some(first), Some(last)) => format!("a layer from {first} to {last}"),
        _ => "none: the model starts with a non-spatial layer".into(),
    };
    match model.layers.iter().position(|layer| layer.name == name) {
        Some(index) if index < end => Ok(index as u32),
        Some(_) => Err(invalid(
            key,
            format!(
                "{name:?} is past the layers spatial parallelism can split in {}; valid: {valid}",
                model.name
            ),
        )),
        None => Err(invalid(key, format!("{name:?} is no layer of {}; valid: {valid}", model.name))),
    }
}

/// The validated `[workload.input]` table; `None` for `loader = "none"` without a copy.
fn input_pipeline(
    section: &InputSection,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<Option<InputPipeline>, ScenarioError> {
    let loader: Loader =
        section.loader.parse().map_err(|message| invalid("workload.input.loader", message))?;
    let copy: InputCopy = match &section.copy {
        Some(copy) => copy.parse().map_err(|message| invalid("workload.input.copy", message))?,
        None => InputCopy::None,
    };
    if loader == Loader::None {
        if copy == InputCopy::None {
            return Ok(None);
        }
        // Only the copy is modelled: the loader's keys (which a case may inherit from its
        // family) are not used.
        let input = InputPipeline {
            loader,
            rate: f64::INFINITY,
            prefetch: 1,
            broadcast_rate: None,
            sample_bytes: section.sample_bytes,
            copy,
        };
        input.validate().map_err(|(key, message)| invalid(&format!("workload.input.{key}"), message))?;
        return Ok(Some(input));
    }
    let Some(rate) = section.rate else {
        return Err(invalid(
            "workload.input.rate",
            format!(
                "is missing: loader = {:?} needs the samples per second one loader decodes and augments (e.g. rate = 345)",
                loader.name()
            ),
        ));
    };
    let input = InputPipeline {
        loader,
        rate,
        prefetch: section.prefetch,
        broadcast_rate: section.broadcast_rate,
        sample_bytes: section.sample_bytes,
        copy,
    };
    input.validate().map_err(|(key, message)| invalid(&format!("workload.input.{key}"), message))?;
    Ok(Some(input))
}

/// The validated `[parallelism]` table on `gpus` GPUs.
fn parallelism(
    section: &ParallelismSection,
    gpus: u32,
    cluster: &ClusterSection,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<Parallelism, ScenarioError> {
    for (key, value) in [
        ("parallelism.tensor", section.tensor),
        ("parallelism.pipeline", section.pipeline),
        ("parallelism.virtual-stages", section.virtual_stages),
        ("parallelism.context", section.context),
        ("parallelism.expert", section.expert),
        ("parallelism.expert-tensor", section.expert_tensor.unwrap_or(1)),
        ("parallelism.filter", section.filter),
        ("parallelism.channel", section.channel),
        ("parallelism.spatial", section.spatial),
    ] {
        if value == 0 {
            return Err(invalid(key, "must be at least 1, got 0".into()));
        }
    }
    let spatial_dims: strategies::SpatialDims =
        section.spatial_dims.parse().map_err(|message| invalid("parallelism.spatial-dims", message))?;
    let spatial_halos: strategies::SpatialHalos =
        section.spatial_halos.parse().map_err(|message| invalid("parallelism.spatial-halos", message))?;
    if spatial_halos != strategies::SpatialHalos::EveryWindow && section.spatial < 2 {
        return Err(invalid(
            "parallelism.spatial-halos",
            format!(
                "is {:?}, but there is no spatial split (parallelism.spatial = {}): set spatial to 2 or more, or leave spatial-halos out",
                section.spatial_halos, section.spatial
            ),
        ));
    }
    if spatial_halos == strategies::SpatialHalos::PaddedPooling && spatial_dims != strategies::SpatialDims::H
    {
        return Err(invalid(
            "parallelism.spatial-halos",
            format!(
                "\"padded-pooling\" grows row stripes (chainermnx's pooling_halo_exchange), but \
                 spatial-dims is {:?}: use spatial-dims = \"h\" or another spatial-halos",
                section.spatial_dims
            ),
        ));
    }
    let filter_backward: strategies::FilterBackward =
        section.filter_backward.parse().map_err(|message| invalid("parallelism.filter-backward", message))?;
    if filter_backward != strategies::FilterBackward::InputAllreduce && section.filter < 2 {
        return Err(invalid(
            "parallelism.filter-backward",
            format!(
                "is {:?}, but there is no filter split (parallelism.filter = {}): set filter to 2 or more, or leave filter-backward out",
                section.filter_backward, section.filter
            ),
        ));
    }
    let cnn = u64::from(section.filter) * u64::from(section.channel) * u64::from(section.spatial);
    let model_parallel =
        u64::from(section.tensor) * u64::from(section.pipeline) * u64::from(section.context) * cnn;
    let shape = format!("{} nodes x {} GPUs", cluster.nodes, cluster.gpus_per_node);
    // The model-parallel degrees in use (above 1), named and multiplied, for the messages:
    // "tensor x pipeline = 8 x 16".
    let degrees: Vec<(&str, u32)> = [
        ("tensor", section.tensor),
        ("pipeline", section.pipeline),
        ("context", section.context),
        ("filter", section.filter),
        ("channel", section.channel),
        ("spatial", section.spatial),
    ]
    .into_iter()
    .filter(|&(_, degree)| degree > 1)
    .collect();
    let product = |leading: Option<u32>| {
        let names: Vec<&str> =
            leading.map(|_| "data").into_iter().chain(degrees.iter().map(|d| d.0)).collect();
        let values: Vec<String> =
            leading.into_iter().chain(degrees.iter().map(|d| d.1)).map(|v| v.to_string()).collect();
        let named = format!("{} = {}", names.join(" x "), values.join(" x "));
        // A product of several is worth its total; one degree is its own.
        if names.len() > 1 {
            format!("{named} = {}", u64::from(leading.unwrap_or(1)) * model_parallel)
        } else {
            named
        }
    };
    let data = match section.data {
        Some(0) => return Err(invalid("parallelism.data", "must be at least 1, got 0".into())),
        Some(data) => data,
        None => {
            if u64::from(gpus) % model_parallel != 0 {
                let key = degrees
                    .first()
                    .map_or("parallelism.tensor".to_string(), |d| format!("parallelism.{}", d.0));
                return Err(invalid(
                    &key,
                    format!(
                        "{} does not divide the cluster's {gpus} GPUs ({shape}), so no data-parallel degree uses them all",
                        product(None)
                    ),
                ));
            }
            (u64::from(gpus) / model_parallel) as u32
        }
    };
    if u64::from(data) * model_parallel != u64::from(gpus) {
        let shown = product(Some(data));
        return Err(invalid(
            "parallelism.data",
            format!(
                "{shown}, but the cluster has {gpus} GPUs ({shape}); the product of the degrees must use every GPU (leave `data` out to derive it)"
            ),
        ));
    }
    if section.zero > 3 {
        return Err(invalid(
            "parallelism.zero",
            format!(
                "is {}; valid: 0 (none), 1 (optimizer state, Megatron's distributed optimizer), 2 (+ gradients), 3 (+ parameters: FSDP full shard)",
                section.zero
            ),
        ));
    }
    if section.bucket_size.0 == 0 || section.first_bucket_size.0 == 0 {
        return Err(invalid("parallelism.bucket-size", "bucket sizes must be greater than 0".into()));
    }
    if !(section.expert_skew.is_finite() && section.expert_skew >= 1.0) {
        return Err(invalid(
            "parallelism.expert-skew",
            format!(
                "is {}; give the busiest expert's tokens relative to balanced routing, at least 1 (1 = balanced)",
                section.expert_skew
            ),
        ));
    }
    let schedule: PipelineSchedule =
        section.schedule.parse().map_err(|message| invalid("parallelism.schedule", message))?;
    let zero_implementation: strategies::ZeroImplementation = section
        .zero_implementation
        .parse()
        .map_err(|message| invalid("parallelism.zero-implementation", message))?;
    let pipeline_host_sync: strategies::PipelineHostSync = section
        .pipeline_host_sync
        .parse()
        .map_err(|message| invalid("parallelism.pipeline-host-sync", message))?;
    let gradient_buffers: strategies::GradientBuffers = section
        .gradient_buffers
        .parse()
        .map_err(|message| invalid("parallelism.gradient-buffers", message))?;
    let order: RankOrder = section.order.parse().map_err(|message| invalid("parallelism.order", message))?;
    let moe_dispatcher: strategies::MoeDispatcher =
        section.moe_dispatcher.parse().map_err(|message| invalid("parallelism.moe-dispatcher", message))?;
    let moe_experts: strategies::experts::MoeExperts =
        section.moe_experts.parse().map_err(|message| invalid("parallelism.moe-experts", message))?;
    // Megatron-Core's moe_router_dtype choices (transformer_config.py: None, fp32, fp64).
    let moe_router_dtype = match section.moe_router_dtype.as_deref() {
        None => None,
        Some("fp32") => Some(workloads::device::Dtype::Fp32),
        Some("fp64") => Some(workloads::device::Dtype::Fp64),
        Some(other) => {
            return Err(invalid(
                "parallelism.moe-router-dtype",
                format!(
                    "unknown router dtype {other:?}; valid: \"fp32\", \"fp64\" (Megatron-Core's \
                     --moe-router-dtype; leave it out for the compute dtype)"
                ),
            ));
        }
    };
    let allreduce: CollectiveAlgorithm = section
        .allreduce
        .parse()
        .ok()
        .filter(|algorithm: &CollectiveAlgorithm| algorithm.supports(CollectiveKind::AllReduce))
        .ok_or_else(|| {
            let valid: Vec<&str> = CollectiveAlgorithm::ALL
                .iter()
                .filter(|a| a.supports(CollectiveKind::AllReduce))
                .map(|a| a.name())
                .collect();
            invalid(
                "parallelism.allreduce",
                format!("unknown allreduce algorithm {:?}; valid: {}", section.allreduce, valid.join(", ")),
            )
        })?;
    Ok(Parallelism {
        data,
        tensor: section.tensor,
        sequence_parallel: section.sequence_parallel,
        pipeline: section.pipeline,
        virtual_stages: section.virtual_stages,
        schedule,
        microbatch_group: section.microbatch_group_size,
        first_stage_layers: section.first_stage_layers,
        last_stage_layers: section.last_stage_layers,
        pad_layers: section.pad_layers,
        account_for_embedding: section.account_for_embedding,
        account_for_loss: section.account_for_loss,
        context: section.context,
        expert: section.expert,
        expert_tensor: section.expert_tensor,
        moe_dispatcher,
        moe_overlap: section.moe_overlap,
        moe_node: cluster.gpus_per_node,
        moe_experts,
        moe_router_dtype,
        zero: section.zero,
        distributed_optimizer_instances: section.distributed_optimizer_instances,
        context_comm: context_comm(section, invalid)?,
        defer_embedding_wgrad: match (section.defer_embedding_wgrad, section.wgrad_deferral_limit) {
            (true, limit) => Some(limit.unwrap_or(0)),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(invalid(
                    "parallelism.wgrad-deferral-limit",
                    "applies only with parallelism.defer-embedding-wgrad = true".into(),
                ));
            }
        },
        expert_skew: section.expert_skew,
        capacity_factor: None,
        order,
        bucket_cap: section.bucket_size,
        first_bucket_cap: section.first_bucket_size,
        data_algorithm: allreduce,
        filter: section.filter,
        channel: section.channel,
        spatial: section.spatial,
        spatial_dims,
        spatial_until: None,
        spatial_halos,
        filter_backward,
        cnn_staging: None,
        sync: gradient_sync(section, cluster, invalid)?,
        offload: strategies::Offload::None,
        zero_implementation,
        pipeline_host_sync,
        pipeline_scatter_gather: section.pipeline_scatter_gather,
        gradient_buffers,
    })
}

/// `parallelism.context-comm` and `parallelism.hierarchical-context-sizes`.
fn context_comm(
    section: &ParallelismSection,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<strategies::ContextComm, ScenarioError> {
    let sizes = &section.hierarchical_context_sizes;
    match (section.context_comm.as_str(), sizes.as_deref()) {
        ("p2p", None) => Ok(strategies::ContextComm::P2p),
        ("a2a", None) => Ok(strategies::ContextComm::A2a),
        ("a2a+p2p", Some(&[a2a, p2p])) => {
            if a2a * p2p != section.context {
                return Err(invalid(
                    "parallelism.hierarchical-context-sizes",
                    format!("is [{a2a}, {p2p}], whose product must be parallelism.context = {}", section.context),
                ));
            }
            Ok(strategies::ContextComm::A2aP2p { a2a })
        }
        ("a2a+p2p", _) => Err(invalid(
            "parallelism.hierarchical-context-sizes",
            "a2a+p2p needs the two levels' sizes, [all-to-all, ring] (Megatron-Core's --hierarchical-context-parallel-sizes), e.g. [2, 2] for context = 4".into(),
        )),
        ("p2p" | "a2a", Some(_)) => Err(invalid(
            "parallelism.hierarchical-context-sizes",
            format!("applies only with context-comm = \"a2a+p2p\" (is {:?})", section.context_comm),
        )),
        (other, _) => Err(invalid(
            "parallelism.context-comm",
            format!(
                "is {other:?}; valid: \"p2p\" (a ring of key/value chunks, the default), \"a2a\" (all-to-all of heads for sequence, DeepSpeed-Ulysses) or \"a2a+p2p\" (both, with hierarchical-context-sizes)"
            ),
        )),
    }
}

/// `parallelism.sync` and DASO's keys.
fn gradient_sync(
    section: &ParallelismSection,
    cluster: &ClusterSection,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<GradientSync, ScenarioError> {
    match section.sync.as_str() {
        "allreduce" => {
            for (key, given) in [
                ("parallelism.global-sync-every", section.global_sync_every.is_some()),
                ("parallelism.global-sync", section.global_sync.is_some()),
                ("parallelism.global-sync-wait", section.global_sync_wait.is_some()),
            ] {
                if given {
                    return Err(invalid(
                        key,
                        "applies to DASO only: set parallelism.sync = \"daso\" (or remove the key)".into(),
                    ));
                }
            }
            Ok(GradientSync::AllReduce)
        }
        "daso" => {
            let every = section.global_sync_every.unwrap_or(DASO_GLOBAL_SKIP);
            if every == 0 {
                return Err(invalid(
                    "parallelism.global-sync-every",
                    format!(
                        "must be at least 1, got 0: the iterations between two global synchronisations \
                         (1 = every iteration; DASO's default {DASO_GLOBAL_SKIP})"
                    ),
                ));
            }
            let blocking = match section.global_sync.as_deref().unwrap_or("non-blocking") {
                "blocking" => true,
                "non-blocking" => false,
                other => {
                    return Err(invalid(
                        "parallelism.global-sync",
                        format!(
                            "unknown mode {other:?}; valid: \"blocking\" (every rank waits for the global \
                             allreduce), \"non-blocking\" (it overlaps the next iterations)"
                        ),
                    ));
                }
            };
            // DASO sets batches_to_wait to global_skip / local_skip_factor (4), at least 1.
            let wait = section.global_sync_wait.unwrap_or((every / 4).max(1));
            if blocking && section.global_sync_wait.is_some() {
                return Err(invalid(
                    "parallelism.global-sync-wait",
                    "applies to global-sync = \"non-blocking\" only (a blocking sync is received at once)"
                        .into(),
                ));
            }
            if !blocking && !(1..=every).contains(&wait) {
                return Err(invalid(
                    "parallelism.global-sync-wait",
                    format!(
                        "is {wait}; the iterations between sending a global sync and receiving it must be \
                         1..={every} (at most global-sync-every = {every})"
                    ),
                ));
            }
            Ok(GradientSync::Daso { every, blocking, wait, node: cluster.gpus_per_node })
        }
        other => Err(invalid(
            "parallelism.sync",
            format!(
                "unknown synchronisation {other:?}; valid: \"allreduce\" (every replica every iteration), \
                 \"daso\" (node-local every iteration, global every global-sync-every iterations)"
            ),
        )),
    }
}

/// DASO's global skip after its warm-up (`heat.optim.DASO.epoch_loss_logic`: 4).
const DASO_GLOBAL_SKIP: u32 = 4;

/// Samples per iteration and per micro-batch from `[workload]`: `global-batch` (with
/// `micro-batch`), or `batch-per-device` for pure data parallelism (32 if neither is given).
fn batch(
    workload: &WorkloadSection,
    parallelism: &Parallelism,
    invalid: &dyn Fn(&str, String) -> ScenarioError,
) -> Result<(u64, u64), ScenarioError> {
    let data = u64::from(parallelism.data);
    for (key, value) in [
        ("workload.batch-per-device", workload.batch_per_device),
        ("workload.global-batch", workload.global_batch),
        ("workload.micro-batch", workload.micro_batch),
    ] {
        if value == Some(0) {
            return Err(invalid(key, "must be at least 1, got 0".into()));
        }
    }
    match (workload.batch_per_device, workload.global_batch) {
        (Some(_), Some(_)) => Err(invalid(
            "workload.batch-per-device",
            "and `global-batch` are both given: give `global-batch` (and `micro-batch`), or `batch-per-device`              for pure data parallelism"
                .into(),
        )),
        (Some(_), None)
            if !(parallelism.tensor == 1
                && parallelism.pipeline == 1
                && parallelism.context == 1
                && parallelism.cnn_degree() == 1) =>
        {
            Err(invalid(
                "workload.batch-per-device",
                "is for pure data parallelism; with tensor, pipeline, context, filter, channel or spatial parallelism give `global-batch` (samples per iteration over all replicas) and `micro-batch`"
                    .into(),
            ))
        }
        (per_device, None) => {
            let per_device = per_device.unwrap_or(32);
            let micro = workload.micro_batch.unwrap_or(per_device);
            if per_device % micro != 0 {
                return Err(invalid(
                    "workload.micro-batch",
                    format!("is {micro}, which does not divide batch-per-device = {per_device}"),
                ));
            }
            let global = per_device.checked_mul(data).ok_or_else(|| {
                invalid("workload.batch-per-device", format!("{per_device} x {data} replicas overflows"))
            })?;
            Ok((global, micro))
        }
        (None, Some(global)) => {
            // One micro-batch per replica without a pipeline; 1 sample per micro-batch with one.
            let micro = workload.micro_batch.unwrap_or(if parallelism.pipeline > 1 { 1 } else { global / data.max(1) }).max(1);
            Ok((global, micro))
        }
    }
}

/// The compute model of `[compute]`: the named profile's (or the defaults), with the keys the
/// scenario sets on top; and a description of where it came from.
fn compute_model(
    section: &ComputeSection,
    device: &Device,
    precision: Dtype,
    file: &Path,
) -> Result<(ComputeModel, String), ScenarioError> {
    let (mut model, mut source) = match &section.profile {
        None => (ComputeModel::default(), "defaults (docs/compute-model.md)".to_string()),
        Some(name) => {
            let (profile, label) = load_profile(name, file)?;
            if !DeviceCatalog::builtin().same_type(&profile.device, device) {
                return Err(invalid(
                    file,
                    "compute.profile",
                    format!(
                        "{label} was calibrated on {}, but cluster.device is {}: a profile describes \
                         one device type (built-in profiles: {})",
                        profile.device,
                        device.name,
                        Profile::builtin_names().join(", ")
                    ),
                ));
            }
            let mut source = format!("profile {label}");
            // GEMM efficiency is a fraction of the dtype's peak; measured in one dtype, it is
            // an extrapolation in another. Say so.
            if let Some(record) = &profile.calibration
                && !record.gemm_dtypes.is_empty()
                && !record.gemm_dtypes.iter().any(|d| d == precision.name())
            {
                source.push_str(&format!(
                    " (GEMMs calibrated in {}, extrapolated to {precision})",
                    record.gemm_dtypes.join(", ")
                ));
            }
            (profile.compute, source)
        }
    };
    for (knob, value) in &section.knobs {
        knob.set(&mut model, *value);
    }
    if !section.knobs.is_empty() {
        source.push_str(&format!(", {} key(s) set in [compute]", section.knobs.len()));
    }
    model.validate().map_err(|error| invalid(file, "compute", error.to_string()))?;
    Ok((model, source))
}

/// Whether a profile name is a file path (it ends in `.toml` or has a directory) rather than
/// a shipped profile's device name.
fn is_profile_path(name: &str) -> bool {
    name.ends_with(".toml") || name.contains('/') || name.contains('\\')
}

/// A profile named by `compute.profile`: a file (relative to the scenario's directory) if the
/// value looks like a path, else a built-in profile by device name.
fn load_profile(name: &str, file: &Path) -> Result<(Profile, String), ScenarioError> {
    read_profile(name, file.parent().unwrap_or(Path::new(".")))
        .map_err(|error| invalid(file, "compute.profile", error))
}

/// A profile by name: a file relative to `directory` if the name looks like a path, else a
/// built-in profile by device name; with a label for reports, or a message naming what failed.
pub fn read_profile(name: &str, directory: &Path) -> Result<(Profile, String), String> {
    if !is_profile_path(name) {
        let profile = Profile::builtin(name).map_err(|error| error.to_string())?;
        return Ok((profile, format!("{name} (built-in)")));
    }
    let path = directory.join(name);
    let text = fs_err::read_to_string(&path).map_err(|error| error.to_string())?;
    let profile = Profile::from_toml_str(&text).map_err(|error| format!("{}: {error}", path.display()))?;
    Ok((profile, path.display().to_string()))
}

/// NVSwitch default: half the datasheet's NVLink (or Infinity Fabric) total (it adds both
/// directions).
fn default_nvlink(device: &Device) -> LinkSpec {
    let per_direction = device
        .gpu_link_bandwidth()
        .and_then(|total| Bandwidth::from_bits_per_second(total.bits_per_second() / 2))
        .unwrap_or(device.pcie_bandwidth);
    LinkSpec::new(per_direction, DEFAULT_LATENCY)
}
