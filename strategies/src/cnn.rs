//! The CNN strategies of ParaDL (Kahira et al., HPDC'21): filter, channel and spatial
//! parallelism inside a model-parallel group of contiguous ranks, optionally combined with data
//! parallelism across groups.
//!
//! - **Filter** (output channels split over `p` ranks) on every convolution and fully connected
//!   layer: each rank computes `K / p` output channels; an allgather of the layer's output after
//!   its forward (the next layers run on the gathered, replicated activation: batch norm,
//!   activations, pooling and residual adds are replicated, as ParaDL's `filter_*.lc` mark only
//!   the split layers); in the backward, an allreduce of the input gradient (each rank's partial
//!   gradient from its `K / p` output channels), or, as ParaDL's code runs it
//!   ([`FilterBackward::OutputAlltoall`]), an alltoall of the output gradient before the layer's
//!   backward kernels. Weights sharded; gradients synchronised over `data` only.
//! - **Channel** (input channels split): each rank holds the weights of `C / p` input channels
//!   and computes a partial sum of every output channel; an allreduce of the output after the
//!   forward; in the backward the rank's input gradient covers its `C / p` channels only, and
//!   the replicated layers in front of the next split layer need all of them: an allgather of
//!   the input gradient. Weights sharded.
//! - **Spatial**: activations split along H (ParaDL's row stripes), H and W, or D, H and W, up to
//!   the first layer that is not spatial (global or adaptive pooling, flatten, fully connected);
//!   every convolution or pooling whose window crosses a tile boundary first exchanges halos
//!   with its neighbours (point-to-point, one dimension after the other so corners travel with
//!   the second dimension), and sends the halo's gradient back after its backward-data kernel;
//!   an allgather of the activation before the first replicated layer; weights replicated and
//!   gradients allreduced over the spatial x data ranks.
//!
//! A degree that does not divide a layer's channels or extent splits it unevenly (NumPy's
//! `array_split`, as ParaDL's code does: its channel runs use 3 ranks on 64-channel
//! convolutions); every rank is given the busiest rank's share, which sets the step time.

use sim_core::graph::CollectiveKind;
use sim_core::units::Bytes;

use super::shard::{Comm, GroupKind, LocalLayer, Role, ShardError};
use workloads::device::Dtype;
use workloads::layer::{Layer, LayerKind, Padding, Shape};
use workloads::model::Model;

/// Which spatial dimensions the spatial strategy splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpatialDims {
    /// Rows only (ParaDL's row stripes); for 3-D volumes the H axis (ParaDL's axis -2).
    #[default]
    H,
    /// Rows and columns: a 2-D grid of tiles.
    Hw,
    /// Depth, rows and columns of 3-D volumes: a 3-D grid of blocks.
    Dhw,
}

impl SpatialDims {
    /// Every value.
    pub const ALL: [SpatialDims; 3] = [SpatialDims::H, SpatialDims::Hw, SpatialDims::Dhw];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            SpatialDims::H => "h",
            SpatialDims::Hw => "hw",
            SpatialDims::Dhw => "dhw",
        }
    }

    /// Number of split dimensions.
    pub const fn count(self) -> usize {
        match self {
            SpatialDims::H => 1,
            SpatialDims::Hw => 2,
            SpatialDims::Dhw => 3,
        }
    }
}

impl std::str::FromStr for SpatialDims {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        SpatialDims::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| {
            format!("unknown spatial dimensions {name:?}; valid: \"h\" (row stripes), \"hw\", \"dhw\" (3-D volumes)")
        })
    }
}

/// How the per-layer collectives and halo exchanges of a CNN group travel
/// (`parallelism.cnn-transport`).
///
/// ParaDL runs them as ChainerMN's function-level collectives (`chainermn.functions.allgather`,
/// chainermnx's `allreduce` and halo `send`/`recv`), which call mpi4py on raw device pointers
/// (`MpiCommunicatorBase.allgather` / `alltoall` / `allreduce` / `send` / `recv`, Chainer
/// v7.0.0), so a CUDA-aware MPI moves them; only the gradient allreduce goes through NCCL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CnnTransport {
    /// GPU to GPU (NCCL, or CUDA IPC inside a node): the network model prices it alone.
    #[default]
    Device,
    /// CUDA-aware Open MPI with device buffers: `MPI_Allreduce` goes through host buffers
    /// (`coll/cuda`), the other messages only when the group spans nodes.
    Mpi,
    /// CUDA-aware Open MPI with CUDA managed memory (CuPy's `malloc_managed`): every message
    /// goes through host buffers (Open MPI flags managed memory `CONVERTOR_CUDA_UNIFIED`).
    MpiManaged,
}

impl CnnTransport {
    /// Every value.
    pub const ALL: [CnnTransport; 3] = [CnnTransport::Device, CnnTransport::Mpi, CnnTransport::MpiManaged];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            CnnTransport::Device => "device",
            CnnTransport::Mpi => "mpi",
            CnnTransport::MpiManaged => "mpi-managed",
        }
    }
}

impl std::str::FromStr for CnnTransport {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        CnnTransport::ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
            format!(
                "unknown CNN transport {name:?}; valid: \"device\" (NCCL or CUDA IPC), \"mpi\" (CUDA-aware \
                 MPI, device buffers), \"mpi-managed\" (CUDA-aware MPI, managed memory)"
            )
        })
    }
}

/// The collective of a filter split's backward (`parallelism.filter-backward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilterBackward {
    /// An allreduce of each split layer's input gradient after its backward-data kernel (each
    /// rank's part comes from its `K / p` output channels); none on the first layer.
    #[default]
    InputAllreduce,
    /// ChainerMN's `AllGather` function (Chainer v7.0.0,
    /// `chainermn/functions/collective_communication.py`), which ParaDL's filter links call
    /// (chainermnx `FilterParallelConvolution2D` / `FilterParallelFC`, development `6cb392a`;
    /// paraDL `experiments.old/filter/models/filter_parallel_convolution.py`, `f8fc9b57`): its
    /// backward is `comm.alltoall` of the output gradient's `p` channel blocks, then
    /// `stack(...).sum(0)`, a reduce-scatter of the replicated layers' partial gradients, before
    /// the layer's backward kernels, on every split layer (the first too: its weights need it).
    OutputAlltoall,
}

impl FilterBackward {
    /// Every value.
    pub const ALL: [FilterBackward; 2] = [FilterBackward::InputAllreduce, FilterBackward::OutputAlltoall];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            FilterBackward::InputAllreduce => "input-allreduce",
            FilterBackward::OutputAlltoall => "output-alltoall",
        }
    }
}

impl std::str::FromStr for FilterBackward {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        FilterBackward::ALL.into_iter().find(|b| b.name() == name).ok_or_else(|| {
            format!(
                "unknown filter backward {name:?}; valid: \"input-allreduce\" (an allreduce of each split \
                 layer's input gradient), \"output-alltoall\" (ChainerMN's allgather backward: an alltoall of \
                 its output gradient)"
            )
        })
    }
}

/// Which layers of a spatial split exchange halos (`parallelism.spatial-halos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpatialHalos {
    /// Every convolution and pooling whose window crosses a tile edge exchanges its input's
    /// halo before its forward and sends the halo's gradient back after its backward: exact
    /// tiled convolution.
    #[default]
    EveryWindow,
    /// Only the first layer with a halo exchanges one in its forward; every convolution whose
    /// window crosses a tile edge sends its output gradient's halo in its backward, and pooling
    /// exchanges none. This is what ParaDL's spatial ResNet-50 runs (`spatial/models/resnet50.py`
    /// and `hybrid/models/resnet50.py`, master `cc23ef09`): the stem's `halo_exchange(k_size=7)`
    /// is the only forward exchange, its bottlenecks call `halo_exchange(k_size=1)`, a halo of
    /// zero rows that returns its input (chainermnx `functions/halo_exchange.py`, development
    /// `6cb392a`), its max pooling is plain `F.max_pooling_2d`, and chainermnx's
    /// `Convolution2D` link exchanges the output gradient's halo in its backward whenever its
    /// kernel is larger than 1 (`functions/convolution_2d.py`).
    StemAndGradients,
    /// Every window exchanges its halo as with `EveryWindow`, and every pooling also receives
    /// `k / 2` rows (integer division) on each side of its tile, whatever its stride, in the
    /// forward only, and pools them all: the tiles grow at each pooling, and so does the map the
    /// replicated layers receive. This is what chainermnx's `pooling_halo_exchange` does
    /// (`functions/pooling_halo_exchange.py`, development `6cb392a`: `halo_size = k_size // 2`,
    /// zero rows padded at the first and last tile, the neighbours' rows concatenated elsewhere;
    /// its backward only slices), called before every pooling of ParaDL's spatial VGG-16
    /// (`spatial/models/vgg.py`, master `cc23ef09`; its AlexNet mixes padded and plain layers,
    /// which this pattern does not express), whose Chainer `max_pooling_2d` rounds up (`cover_all=True`, the model's `ceil_mode`). A 56-row
    /// stripe of VGG-16 ends at 4 rows instead of 1.75, so the gathered map is 512 x 16 x 7 and
    /// Chainer's lazily sized `fc6 = L.Linear(None, 4096)` takes 57,344 inputs. The layers after
    /// the gather are rebuilt in order on that map (a chain, as the plain CNNs it serves).
    /// Row stripes only (`spatial-dims = "h"`), as chainermnx's exchanges are.
    PaddedPooling,
}

impl SpatialHalos {
    /// Every value.
    pub const ALL: [SpatialHalos; 3] =
        [SpatialHalos::EveryWindow, SpatialHalos::StemAndGradients, SpatialHalos::PaddedPooling];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            SpatialHalos::EveryWindow => "every-window",
            SpatialHalos::StemAndGradients => "stem-and-gradients",
            SpatialHalos::PaddedPooling => "padded-pooling",
        }
    }
}

impl std::str::FromStr for SpatialHalos {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        SpatialHalos::ALL.into_iter().find(|h| h.name() == name).ok_or_else(|| {
            format!(
                "unknown spatial halo pattern {name:?}; valid: \"every-window\" (every crossing window, \
                 forward and backward), \"stem-and-gradients\" (the first layer's forward halo, then \
                 only convolutions' gradient halos, as ParaDL's ResNet-50), \"padded-pooling\" (every \
                 crossing window, and k / 2 rows padded around every pooling's tile, which grows, as \
                 ParaDL's VGG-16)"
            )
        })
    }
}

/// The host staging of a CNN group's MPI messages: which of them go through host memory, and
/// at what rate. Each staged message is a blocking round trip (copy to the host, MPI over host
/// memory, copy back; ChainerMN synchronises the stream before each call), priced as the
/// bytes the rank stages over `rate` on top of the collective's network time, before the next
/// kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostStaging {
    /// Bytes per second through the host round trip.
    pub rate: sim_core::units::Bandwidth,
    /// Every message is staged (managed memory, or a group spanning nodes); otherwise only
    /// `MPI_Allreduce`, which Open MPI's `coll/cuda` always runs on host copies.
    pub every_message: bool,
}

impl HostStaging {
    /// The staging of `transport` at `rate` for a group of `degree` ranks on nodes of
    /// `gpus_per_node`; `None` for [`CnnTransport::Device`].
    pub fn new(
        transport: CnnTransport,
        rate: sim_core::units::Bandwidth,
        degree: u32,
        gpus_per_node: u32,
    ) -> Option<Self> {
        match transport {
            CnnTransport::Device => None,
            CnnTransport::Mpi => Some(HostStaging { rate, every_message: degree > gpus_per_node }),
            CnnTransport::MpiManaged => Some(HostStaging { rate, every_message: true }),
        }
    }

    /// Bytes a rank stages for `comm` (a filter, channel or spatial collective over `degree`
    /// ranks; zero for other groups):
    /// - the channel forward allreduce (`MPI_Allreduce`): three times the buffer, always, as
    ///   Open MPI's `coll/cuda` copies the send and the receive buffer to the host and the
    ///   result back (`ompi/mca/coll/cuda/coll_cuda_allreduce.c`);
    /// - an allgather, or the filter backward (ChainerMN's `alltoall`, the allgather's
    ///   backward): the `(p - 1) / p` of the buffer the rank receives, when every message is
    ///   staged.
    pub fn collective_bytes(self, comm: &Comm, degree: u64) -> Bytes {
        let cnn = matches!(comm.group, GroupKind::Filter | GroupKind::Channel | GroupKind::Spatial);
        if !cnn || degree < 2 {
            return Bytes(0);
        }
        if comm.group == GroupKind::Channel && comm.kind == CollectiveKind::AllReduce {
            return Bytes(comm.bytes.0 * 3);
        }
        if self.every_message { Bytes(comm.bytes.0 / degree * (degree - 1)) } else { Bytes(0) }
    }

    /// Whether Open MPI pipelines the staging of `comm` with its transfer: the point-to-point
    /// protocol of `pml/ob1` copies a GPU buffer to the host (or back) fragment by fragment while
    /// earlier fragments travel (`mca_pml_ob1_send_request_start_cuda` starts a rendezvous
    /// without data, then `opal_convertor` packs each fragment with `cuMemcpyAsync`;
    /// `ompi/mca/pml/ob1/pml_ob1_cuda.c`, `opal/mca/common/cuda/common_cuda.c`, v2.1.6), so the
    /// collective takes the longer of its network time and its staging, not their sum. Not
    /// `MPI_Allreduce` through `coll/cuda`: it copies whole buffers to the host, reduces, then
    /// copies back (`coll_cuda_allreduce.c`), one after the other.
    pub fn pipelined(self, comm: &Comm) -> bool {
        !(comm.group == GroupKind::Channel && comm.kind == CollectiveKind::AllReduce)
    }

    /// Bytes a rank stages for the halo rows it receives (`received`): all of them when every
    /// message is staged, none otherwise (neighbours inside a node over CUDA IPC).
    pub fn halo_bytes(self, received: Bytes) -> Bytes {
        if self.every_message { received } else { Bytes(0) }
    }
}

/// The CNN strategy inside a model-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CnnSplit {
    /// None: the group is one rank.
    #[default]
    None,
    /// Output channels split over `degree` ranks.
    Filter {
        /// Ranks of the group.
        degree: u32,
        /// The backward's collective (`parallelism.filter-backward`).
        backward: FilterBackward,
    },
    /// Input channels split over this many ranks.
    Channel(u32),
    /// Activations split over this many ranks along `dims`.
    Spatial {
        /// Ranks of the group.
        degree: u32,
        /// Split dimensions.
        dims: SpatialDims,
        /// The last layer computed on tiles (`parallelism.spatial-until`, an index into the
        /// model's layers); `None`: every layer up to the first non-spatial one.
        until: Option<u32>,
        /// Which layers exchange halos (`parallelism.spatial-halos`).
        halos: SpatialHalos,
    },
}

impl CnnSplit {
    /// Ranks of the model-parallel group.
    pub fn degree(self) -> u32 {
        match self {
            CnnSplit::None => 1,
            CnnSplit::Filter { degree: p, .. }
            | CnnSplit::Channel(p)
            | CnnSplit::Spatial { degree: p, .. } => p,
        }
    }

    /// The scenario key (under `parallelism`) of the strategy.
    pub fn key(self) -> &'static str {
        match self {
            CnnSplit::None => "data",
            CnnSplit::Filter { .. } => "filter",
            CnnSplit::Channel(_) => "channel",
            CnnSplit::Spatial { .. } => "spatial",
        }
    }
}

/// One dimension of a halo exchange: the bytes a rank receives from its lower neighbour (the
/// rows just before its tile) and from its upper neighbour (the rows just after), for one
/// micro-batch. Every rank of the grid exchanges the same sizes (tiles are the busiest rank's);
/// ranks on the grid's border skip the missing neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaloDim {
    /// Index of the dimension in the rank grid ([`spatial_grid`]).
    pub grid_axis: usize,
    /// Bytes received from the lower neighbour (sent by every rank to its upper neighbour).
    pub from_lower: Bytes,
    /// Bytes received from the upper neighbour (sent by every rank to its lower neighbour).
    pub from_upper: Bytes,
}

/// The halo exchange before a convolution or pooling layer, dimension after dimension.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Halo {
    /// The exchanged dimensions, in order.
    pub dims: Vec<HaloDim>,
    /// Whether the input's halo is exchanged before the forward kernel.
    pub forward: bool,
    /// Whether the halo's gradient is sent back after the backward-data kernel.
    pub backward: bool,
}

/// The rank grid of `degree` ranks over `dims`: one factor per split dimension (outermost
/// first), as even as possible, the larger factors outermost.
pub fn spatial_grid(degree: u32, dims: SpatialDims) -> Vec<u32> {
    let divisors = |n: u32| (1..=n).filter(move |d| n % d == 0);
    match dims.count() {
        1 => vec![degree],
        2 => {
            let inner = divisors(degree).filter(|d| d * d <= degree).max().unwrap_or(1);
            vec![degree / inner, inner]
        }
        _ => {
            let mut best = vec![degree, 1, 1];
            for a in divisors(degree) {
                for b in divisors(degree / a) {
                    let c = degree / a / b;
                    let mut grid = vec![a, b, c];
                    grid.sort_unstable_by(|x, y| y.cmp(x));
                    if grid[0] - grid[2] < best[0] - best[2] {
                        best = grid;
                    }
                }
            }
            best
        }
    }
}

/// The grid coordinates of group rank `index` (last dimension fastest).
pub fn grid_coordinates(index: u32, grid: &[u32]) -> Vec<u32> {
    let mut rest = index;
    let mut coordinates = vec![0; grid.len()];
    for (slot, size) in coordinates.iter_mut().zip(grid).rev() {
        *slot = rest % size;
        rest /= size;
    }
    coordinates
}

/// The group rank at grid `coordinates`.
pub fn grid_index(coordinates: &[u32], grid: &[u32]) -> u32 {
    coordinates.iter().zip(grid).fold(0, |index, (c, size)| index * size + c)
}

fn invalid(key: &'static str, message: String) -> ShardError {
    ShardError::Invalid { key, message }
}

fn is_conv(kind: &LayerKind) -> bool {
    matches!(kind, LayerKind::Conv { .. })
}

/// The index of the first layer the spatial split does not reach: the layer after `until` if
/// given (ParaDL's CosmoFlow gathers after its second convolution block), else the first
/// non-spatial layer (global or adaptive pooling, flatten, fully connected, or a non-spatial
/// tensor). Its input is allgathered.
pub fn spatial_region_end(model: &Model, until: Option<u32>) -> usize {
    let automatic = automatic_spatial_end(model);
    until.map_or(automatic, |last| automatic.min(last as usize + 1))
}

/// The first layer no spatial split can reach (see [`spatial_region_end`]).
pub fn automatic_spatial_end(model: &Model) -> usize {
    model
        .layers
        .iter()
        .position(|layer| {
            layer.input.0.len() < 2
                || matches!(
                    layer.kind,
                    LayerKind::GlobalAvgPool
                        | LayerKind::GlobalMaxPool
                        | LayerKind::AdaptiveAvgPool { .. }
                        | LayerKind::Flatten
                        | LayerKind::Linear { .. }
                        | LayerKind::TiedLinear { .. }
                        | LayerKind::Matmul { .. }
                )
        })
        .unwrap_or(model.layers.len())
}

/// The shape axes `dims` splits in a `[C, (D,) H, W]` shape of `rank` dimensions.
fn split_axes(rank: usize, dims: SpatialDims) -> Vec<usize> {
    match dims {
        SpatialDims::H => vec![rank - 2],
        SpatialDims::Hw => vec![rank - 2, rank - 1],
        SpatialDims::Dhw => vec![rank - 3, rank - 2, rank - 1],
    }
}

/// Dimensions of a sample (channels included) that `dims` needs (`parasim plan` tries the
/// dimensions a model's samples have).
pub fn needed_rank(dims: SpatialDims) -> usize {
    if dims == SpatialDims::Dhw { 4 } else { 3 }
}

/// The output channels (filter) or input channels (channel) a split layer divides, if it is
/// split.
fn split_channels(layer: &Layer, filter: bool) -> Option<u64> {
    match &layer.kind {
        LayerKind::Conv { out_channels, .. } => {
            Some(if filter { *out_channels } else { layer.input.0.first().copied().unwrap_or(1) })
        }
        LayerKind::Linear { out_features, .. } => {
            Some(if filter { *out_features } else { layer.input.0.last().copied().unwrap_or(1) })
        }
        _ => None,
    }
}

/// Checks that `split` can split `model`, with messages that say what would be valid.
pub fn check(model: &Model, split: CnnSplit) -> Result<(), ShardError> {
    let degree = split.degree();
    if split == CnnSplit::None || degree == 1 {
        return Ok(());
    }
    let key = split.key();
    if !model.layers.iter().any(|l| is_conv(&l.kind)) {
        return Err(invalid(
            key,
            format!(
                "is {degree}, but model {} has no convolution: {key} parallelism splits CNNs; use 1 \
                 (tensor or context parallelism split transformers)",
                model.name
            ),
        ));
    }
    match split {
        CnnSplit::None => Ok(()),
        CnnSplit::Filter { .. } | CnnSplit::Channel(_) => {
            let filter = matches!(split, CnnSplit::Filter { .. });
            let what = if filter { "output channels" } else { "input channels" };
            let mut fewest: Option<(u64, &str)> = None;
            for layer in &model.layers {
                if let LayerKind::Conv { groups, .. } = layer.kind
                    && groups > 1
                {
                    return Err(invalid(
                        key,
                        format!(
                            "is {degree}, but layer {} is a grouped convolution ({groups} groups), which \
                             {key} parallelism does not split; use 1",
                            layer.name
                        ),
                    ));
                }
                if let Some(channels) = split_channels(layer, filter)
                    && fewest.is_none_or(|(n, _)| channels < n)
                {
                    fewest = Some((channels, &layer.name));
                }
            }
            let (channels, name) = fewest.unwrap_or((1, ""));
            if u64::from(degree) > channels {
                return Err(invalid(
                    key,
                    format!(
                        "is {degree}, but layer {name} has {channels} {what}: every rank needs at least one; \
                         valid: 1 to {channels} (divisors of every split layer's {what} split evenly: {})",
                        common_divisors(model, filter)
                    ),
                ));
            }
            Ok(())
        }
        CnnSplit::Spatial { degree, dims, until, .. } => {
            let end = spatial_region_end(model, until);
            if end == 0 {
                return Err(invalid(
                    key,
                    format!("is {degree}, but model {} starts with a non-spatial layer; use 1", model.name),
                ));
            }
            let grid = spatial_grid(degree, dims);
            let names = ["depth", "height", "width"];
            for layer in &model.layers[..end] {
                for shape in [&layer.input, &layer.output] {
                    let rank = shape.0.len();
                    if rank < needed_rank(dims) {
                        return Err(invalid(
                            "spatial-dims",
                            format!(
                                "is {:?}, which splits {} dimensions, but layer {} has {}-D samples ({:?}); \
                                 valid for this model: {}",
                                dims.name(),
                                dims.count(),
                                layer.name,
                                rank.saturating_sub(1),
                                shape.0,
                                if rank >= 4 { "\"h\", \"hw\", \"dhw\"" } else { "\"h\", \"hw\"" }
                            ),
                        ));
                    }
                    for (axis, &parts) in split_axes(rank, dims).into_iter().zip(&grid) {
                        let extent = shape.0[axis];
                        if u64::from(parts) > extent {
                            let name = names[names.len() - (rank - axis)];
                            return Err(invalid(
                                key,
                                format!(
                                    "is {degree} ({parts} parts along the {name}), but layer {} has {extent} \
                                     positions along the {name} (shape {:?}), the smallest before the \
                                     non-spatial layers: a part needs at least one; use at most {extent} \
                                     parts along it",
                                    layer.name, shape.0
                                ),
                            ));
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

/// `"1, 2, 4"`: the degrees that divide every split layer's channels.
fn common_divisors(model: &Model, filter: bool) -> String {
    let channels: Vec<u64> = model.layers.iter().filter_map(|l| split_channels(l, filter)).collect();
    let smallest = channels.iter().copied().min().unwrap_or(1);
    let list: Vec<String> = (1..=smallest.min(1024))
        .filter(|d| channels.iter().all(|c| c % d == 0))
        .map(|d| d.to_string())
        .collect();
    list.join(", ")
}

/// The padding before the window along kernel axis `j`.
fn padding_before(padding: &Padding, j: usize, window: u64, stride: u64) -> u64 {
    match padding {
        Padding::Symmetric(values) => values.get(j).or(values.first()).copied().unwrap_or(0),
        Padding::Same => window.saturating_sub(stride) / 2,
    }
}

/// Rows of the neighbours' tiles a windowed layer reads along kernel axis `j`, before and after
/// its own tile, when each rank computes `stride x` as many input rows as output rows (tiles
/// aligned with the stride): `padding` rows before, `window - stride - padding` after (ParaDL's
/// `(K - 1) / 2` each side for odd kernels of stride 1).
fn halo_rows(kind: &LayerKind, j: usize) -> Option<(u64, u64)> {
    let (kernel, stride, before) = match kind {
        LayerKind::Conv { kernel, stride, padding, dilation, .. } => {
            let k = kernel.get(j).copied().unwrap_or(1);
            let d = dilation.get(j).copied().unwrap_or(1);
            let window = d * (k - 1) + 1;
            let s = stride.get(j).copied().unwrap_or(1);
            (window, s, padding_before(padding, j, window, s))
        }
        LayerKind::MaxPool { kernel, stride, padding, .. }
        | LayerKind::AvgPool { kernel, stride, padding, .. } => {
            let k = kernel.get(j).copied().unwrap_or(1);
            let s = stride.get(j).copied().unwrap_or(k);
            (k, s, padding.get(j).copied().unwrap_or(0))
        }
        _ => return None,
    };
    let before = before.min(kernel.saturating_sub(1));
    Some((before, kernel.saturating_sub(stride + before)))
}

/// The rows chainermnx's `pooling_halo_exchange(k_size = k)` adds on each side of a pooling
/// layer's tile along kernel axis `j`: `k / 2` (`halo_size = k_size // 2`,
/// `functions/pooling_halo_exchange.py`, development `6cb392a`); 0 for any other layer.
fn pooling_pad(kind: &LayerKind, j: usize) -> u64 {
    match kind {
        LayerKind::MaxPool { kernel, .. } | LayerKind::AvgPool { kernel, .. } => {
            kernel.get(j).copied().unwrap_or(1) / 2
        }
        _ => 0,
    }
}

/// The halo exchange of `layer` (whole-model shapes) split over `grid` along `dims`, for
/// `micro_batch` samples of `width` bytes; `None` if its window never crosses a tile boundary.
pub fn halo(layer: &Layer, grid: &[u32], dims: SpatialDims, micro_batch: u64, width: u64) -> Option<Halo> {
    let shape = &layer.input.0;
    let rank = shape.len();
    let axes = split_axes(rank, dims);
    let tile = |axis: usize, parts: u32| shape[axis].div_ceil(u64::from(parts));
    let mut widened: Vec<u64> = shape.clone();
    for (&axis, &parts) in axes.iter().zip(grid) {
        widened[axis] = tile(axis, parts);
    }
    let mut result = Halo { dims: Vec::new(), forward: true, backward: true };
    for (position, (&axis, &parts)) in axes.iter().zip(grid).enumerate() {
        let (before, after) = halo_rows(&layer.kind, axis - 1)?;
        if parts > 1 && before + after > 0 {
            // The slab: the halo rows across the other axes (earlier split axes already widened
            // by their halos, so corners come along).
            let across: u64 =
                widened.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &e)| e).product();
            let slab = |rows: u64| Bytes(rows * across * micro_batch * width);
            result.dims.push(HaloDim {
                grid_axis: position,
                from_lower: slab(before),
                from_upper: slab(after),
            });
        }
        widened[axis] += before + after;
    }
    (!result.dims.is_empty()).then_some(result)
}

/// Every layer of `model` as one rank of the group runs it for `micro_batch` samples.
pub fn local_layers(
    model: &Model,
    split: CnnSplit,
    micro_batch: u64,
    precision: Dtype,
) -> Result<Vec<LocalLayer>, ShardError> {
    check(model, split)?;
    let width = precision.bytes();
    let bytes = |shape: &Shape| Bytes(shape.elements() * micro_batch * width);
    let p = u64::from(split.degree());
    let comm = |group, kind, bytes, what| Comm { group, kind, bytes, what };
    let region = match split {
        CnnSplit::Spatial { until, .. } => spatial_region_end(model, until),
        _ => 0,
    };
    let mut result = Vec::with_capacity(model.layers.len());
    // `stem-and-gradients`: whether a forward halo has been exchanged yet (only the first).
    let mut forward_halo_seen = false;
    // `padded-pooling`: the grown tile rows of each whole-model row count, and the input of the
    // next layer after the gather.
    let mut grown: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let mut chain: Option<Shape> = None;
    for (index, layer) in model.layers.iter().enumerate() {
        let mut entry = LocalLayer::new(index, Role::Replicated, layer.clone());
        // A rebuilt layer keeps its model layer's training state (frozen under LoRA).
        let rebuild = |kind: LayerKind, input: Shape| {
            let mut local = Layer::new(layer.name.clone(), kind, input)
                .map_err(|source| ShardError::Layer { layer: layer.name.clone(), source })?;
            local.train_as(layer.cost.training);
            Ok(local)
        };
        use CollectiveKind::{AllGather, AllReduce};
        match split {
            CnnSplit::None => {}
            CnnSplit::Filter { backward, .. } => {
                // The output channels (or features) split: the same layer with `K / p` of them.
                let mut kind = layer.kind.clone();
                let split = match &mut kind {
                    LayerKind::Conv { out_channels: outputs, .. }
                    | LayerKind::Linear { out_features: outputs, .. } => {
                        *outputs = outputs.div_ceil(p);
                        true
                    }
                    _ => false,
                };
                if split {
                    entry.layer = rebuild(kind, layer.input.clone())?;
                    entry.role = Role::FilterSplit;
                    match backward {
                        FilterBackward::InputAllreduce => around_split(
                            &mut entry,
                            layer,
                            &bytes,
                            GroupKind::Filter,
                            (AllGather, "filter allgather"),
                            (AllReduce, "filter allreduce input gradient"),
                        ),
                        FilterBackward::OutputAlltoall => {
                            // Each rank ends with the whole gradient of its own `K / p`
                            // channels, all its kernels need ([`FilterBackward`]).
                            let output = bytes(&layer.output);
                            entry.after_forward.push(comm(
                                GroupKind::Filter,
                                AllGather,
                                output,
                                "filter allgather",
                            ));
                            entry.before_backward.push(comm(
                                GroupKind::Filter,
                                CollectiveKind::AllToAll,
                                output,
                                "filter alltoall output gradient",
                            ));
                        }
                    }
                }
            }
            CnnSplit::Channel(_) => {
                let channel_axis = match layer.kind {
                    LayerKind::Conv { .. } => Some(0),
                    LayerKind::Linear { .. } => Some(layer.input.0.len().saturating_sub(1)),
                    _ => None,
                };
                if let Some(axis) = channel_axis {
                    let mut input = layer.input.clone();
                    input.0[axis] = input.0[axis].div_ceil(p);
                    entry.layer = rebuild(layer.kind.clone(), input)?;
                    entry.role = Role::ChannelSplit;
                    around_split(
                        &mut entry,
                        layer,
                        &bytes,
                        GroupKind::Channel,
                        (AllReduce, "channel allreduce"),
                        (AllGather, "channel allgather input gradient"),
                    );
                }
            }
            CnnSplit::Spatial {
                degree, dims: SpatialDims::H, halos: SpatialHalos::PaddedPooling, ..
            } => {
                // The rows' axis of a [C, H, W] map; the flat inputs of the layers after the
                // gather have none, and take their input from the chain instead.
                let axis = layer.input.0.len().saturating_sub(2);
                let tile = |whole: u64| grown.get(&whole).copied().unwrap_or_else(|| whole.div_ceil(p));
                if index < region {
                    let mut input = layer.input.clone();
                    input.0[axis] = tile(layer.input.0[axis]);
                    let pad = axis.checked_sub(1).map_or(0, |j| pooling_pad(&layer.kind, j));
                    if pad > 0 {
                        let across: u64 =
                            input.0.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &e)| e).product();
                        let slab = Bytes(pad * across * micro_batch * width);
                        input.0[axis] += 2 * pad;
                        entry.halo = Some(Halo {
                            dims: vec![HaloDim { grid_axis: 0, from_lower: slab, from_upper: slab }],
                            forward: true,
                            backward: false,
                        });
                    } else {
                        entry.halo = halo(layer, &[degree], SpatialDims::H, micro_batch, width);
                    }
                    entry.layer = rebuild(layer.kind.clone(), input)?;
                    entry.role = Role::SpatialSplit;
                    if layer.output.0.len() == layer.input.0.len() {
                        grown.insert(layer.output.0[axis], entry.layer.output.0[axis]);
                    }
                } else {
                    let input = match chain.take() {
                        Some(input) => input,
                        None => {
                            // The gather point: every tile's grown rows, side by side.
                            let mut gathered = layer.input.clone();
                            gathered.0[axis] = tile(layer.input.0[axis]) * p;
                            entry.before_forward.push(comm(
                                GroupKind::Spatial,
                                AllGather,
                                bytes(&gathered),
                                "spatial allgather",
                            ));
                            gathered
                        }
                    };
                    entry.layer = rebuild(layer.kind.clone(), input)?;
                    chain = Some(entry.layer.output.clone());
                }
            }
            CnnSplit::Spatial { degree, dims, halos, .. } => {
                let grid = spatial_grid(degree, dims);
                if index < region {
                    let mut input = layer.input.clone();
                    for (axis, &parts) in split_axes(input.0.len(), dims).into_iter().zip(&grid) {
                        input.0[axis] = input.0[axis].div_ceil(u64::from(parts));
                    }
                    entry.layer = rebuild(layer.kind.clone(), input)?;
                    entry.role = Role::SpatialSplit;
                    entry.halo = halo(layer, &grid, dims, micro_batch, width).and_then(|mut exchange| {
                        if halos == SpatialHalos::StemAndGradients {
                            exchange.forward = !forward_halo_seen;
                            exchange.backward = matches!(layer.kind, LayerKind::Conv { .. });
                            forward_halo_seen = true;
                        }
                        (exchange.forward || exchange.backward).then_some(exchange)
                    });
                } else if index == region {
                    entry.before_forward.push(comm(
                        GroupKind::Spatial,
                        AllGather,
                        bytes(&layer.input),
                        "spatial allgather",
                    ));
                }
            }
        }
        result.push(entry);
    }
    Ok(result)
}

/// The collectives around a filter- or channel-split layer: `forward` on the whole `layer`'s
/// output after the forward kernel, `backward` on its input gradient after the backward-data
/// kernel (none for the first layer, whose input needs no gradient). `bytes` sizes a shape
/// for the micro-batch.
fn around_split(
    entry: &mut LocalLayer,
    layer: &Layer,
    bytes: &dyn Fn(&Shape) -> Bytes,
    group: GroupKind,
    forward: (CollectiveKind, &'static str),
    backward: (CollectiveKind, &'static str),
) {
    let (kind, what) = forward;
    entry.after_forward.push(Comm { group, kind, bytes: bytes(&layer.output), what });
    if entry.index > 0 {
        let (kind, what) = backward;
        entry.after_backward_data.push(Comm { group, kind, bytes: bytes(&layer.input), what });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::zoo;

    fn conv3x3(channels: u64, height: u64, width: u64) -> Layer {
        let kind = LayerKind::Conv {
            out_channels: channels,
            kernel: vec![3, 3],
            stride: vec![1, 1],
            padding: Padding::Symmetric(vec![1, 1]),
            dilation: vec![1, 1],
            groups: 1,
            bias: false,
        };
        Layer::new("conv", kind, Shape(vec![channels, height, width])).unwrap()
    }

    #[test]
    fn halo_of_a_3x3_stride_1_convolution_is_one_row_each_side() {
        // ParaDL: (K - 1) / 2 rows of C x W per neighbour and sample.
        let (c, h, w, b, width) = (64u64, 56u64, 56u64, 8u64, 4u64);
        let layer = conv3x3(c, h, w);
        let rows = halo(&layer, &[2], SpatialDims::H, b, width).unwrap();
        let kernel = 3u64;
        let row = Bytes((kernel - 1) / 2 * c * w * b * width);
        assert_eq!(rows.dims, vec![HaloDim { grid_axis: 0, from_lower: row, from_upper: row }]);
        // 2 x 2 tiles of (H/2) x (W/2): rows of W/2 first, then columns of H/2 + 2 (the rows
        // just received, so the corner comes along).
        let tiles = halo(&layer, &spatial_grid(4, SpatialDims::Hw), SpatialDims::Hw, b, width).unwrap();
        let rows_bytes = Bytes(c * (w / 2) * b * width);
        let columns_bytes = Bytes(c * (h / 2 + 2) * b * width);
        assert_eq!(
            tiles.dims,
            vec![
                HaloDim { grid_axis: 0, from_lower: rows_bytes, from_upper: rows_bytes },
                HaloDim { grid_axis: 1, from_lower: columns_bytes, from_upper: columns_bytes },
            ]
        );
    }

    #[test]
    fn strided_windows_aligned_with_their_stride_need_less_halo() {
        let resnet = zoo::by_name("resnet50").unwrap();
        let layer = |name: &str| resnet.layers.iter().find(|l| l.name == name).unwrap();
        // 7x7 stride 2 padding 3: 3 rows from below, 2 from above.
        let stem = halo(layer("conv1"), &[4], SpatialDims::H, 1, 4).unwrap();
        assert_eq!(stem.dims[0].from_lower, Bytes(3 * 3 * 224 * 4));
        assert_eq!(stem.dims[0].from_upper, Bytes(2 * 3 * 224 * 4));
        // 1x1 convolutions never exchange.
        assert!(halo(layer("layer1.0.conv1"), &[4], SpatialDims::H, 1, 4).is_none());
        let vgg = zoo::by_name("vgg16").unwrap();
        // 2x2 stride-2 pooling on even tiles: none.
        assert!(halo(&vgg.layers[4], &[4], SpatialDims::H, 1, 4).is_none());
    }

    /// ParaDL's ResNet-50 pattern: the stem's forward halo only; every 3x3 and the stem send
    /// their gradient's halo back; the max pooling exchanges nothing. With every window, the
    /// pooling and each 3x3 convolution exchange both ways too.
    #[test]
    fn stem_and_gradients_keeps_the_stems_forward_halo_and_the_convolutions_gradients() {
        let resnet = zoo::by_name("resnet50").unwrap();
        let split = |halos| CnnSplit::Spatial { degree: 4, dims: SpatialDims::H, until: None, halos };
        let exchanges = |halos| -> Vec<(String, bool, bool)> {
            local_layers(&resnet, split(halos), 8, Dtype::Fp32)
                .unwrap()
                .iter()
                .filter_map(|l| {
                    l.halo.as_ref().map(|h| (resnet.layers[l.index].name.clone(), h.forward, h.backward))
                })
                .collect()
        };
        let every = exchanges(SpatialHalos::EveryWindow);
        let paradl = exchanges(SpatialHalos::StemAndGradients);
        assert!(every.iter().all(|&(_, forward, backward)| forward && backward), "{every:?}");
        // The stem, the max pooling and the 16 bottlenecks' 3x3 convolutions cross tile edges.
        assert_eq!(every.len(), 18, "{every:?}");
        assert_eq!(every[1].0, "maxpool");
        assert_eq!(paradl[0], ("conv1".to_string(), true, true));
        assert_eq!(paradl.len(), 17, "{paradl:?}");
        assert!(
            paradl
                .iter()
                .skip(1)
                .all(|(name, forward, backward)| !forward && *backward && name.ends_with("conv2"))
        );
    }

    /// ParaDL's VGG-16 (Chainer's rounded-up pooling, no adaptive pooling) on ParaDL's four row
    /// stripes with chainermnx's padded pooling halos.
    fn paradl_vgg16(halos: SpatialHalos, micro_batch: u64) -> (Model, Vec<LocalLayer>) {
        let text = include_str!("../../data/models/paradl-vgg16.toml");
        let model = Model::from_toml_str(text, "paradl-vgg16.toml").unwrap();
        let split = CnnSplit::Spatial { degree: 4, dims: SpatialDims::H, until: None, halos };
        let layers = local_layers(&model, split, micro_batch, Dtype::Fp32).unwrap();
        (model, layers)
    }

    #[test]
    fn padded_pooling_grows_the_stripes_as_chainermnx_and_chainer_do() {
        let (model, layers) = paradl_vgg16(SpatialHalos::PaddedPooling, 32);
        let pools: Vec<&LocalLayer> =
            layers.iter().filter(|l| matches!(l.layer.kind, LayerKind::MaxPool { .. })).collect();
        // Chainer's cover_all: out = (rows + 2 - 2 + 2 - 1) / 2 + 1 from 56, 29, 16, 9, 6 rows.
        let rows: Vec<u64> = pools.iter().map(|l| l.layer.output.0[1]).collect();
        assert_eq!(rows, vec![29, 16, 9, 6, 4]);
        // Each pooling receives one row (2 / 2) of its input from each side, forward only.
        for pool in &pools {
            let [c, h, w] = pool.layer.input.0[..] else { panic!("{:?}", pool.layer.input) };
            let halo = pool.halo.as_ref().unwrap();
            assert!(halo.forward && !halo.backward);
            assert_eq!(halo.dims[0].from_lower, Bytes(c * w * 32 * 4));
            assert_eq!(halo.dims[0].from_upper, Bytes(c * w * 32 * 4));
            assert!(h >= 2 * (pool.layer.output.0[1] - 1), "{}", pool.layer.name);
        }
        // The gathered map is 512 x (4 x 4) x 7, and fc6 takes all of it: 57,344 inputs.
        let end = spatial_region_end(&model, None);
        assert_eq!(layers[end].before_forward[0].bytes, Bytes(512 * 16 * 7 * 32 * 4));
        let fc6 = layers.iter().find(|l| l.layer.name == "classifier.0").unwrap();
        assert_eq!(fc6.layer.input.0, vec![512 * 16 * 7]);
        assert_eq!(fc6.layer.cost.params, 512 * 16 * 7 * 4096 + 4096);
        let params: u64 = layers.iter().map(|l| l.layer.cost.params).sum();
        assert_eq!(params, 270_478_120);
        // The whole model is torchvision's VGG-16.
        assert_eq!(model.layers.iter().map(|l| l.cost.params).sum::<u64>(), 138_357_544);
    }

    #[test]
    fn padded_pooling_keeps_every_convolutions_exact_halo() {
        let (_, every) = paradl_vgg16(SpatialHalos::EveryWindow, 8);
        let (_, padded) = paradl_vgg16(SpatialHalos::PaddedPooling, 8);
        let convs = |layers: &[LocalLayer]| -> Vec<(Option<Halo>, u64)> {
            layers
                .iter()
                .filter(|l| is_conv(&l.layer.kind))
                .map(|l| (l.halo.clone(), l.layer.output.0[0] * l.layer.output.0[2]))
                .collect()
        };
        // Same exchanges (a row of C x W each side, forward and backward) on the same columns;
        // only the rows of the later stripes differ.
        assert_eq!(convs(&every), convs(&padded));
        assert_eq!(convs(&padded).len(), 13);
        // Without pooling halos the stripes keep their exact share: 7 rows / 4 -> 2 at the end.
        let end = every.iter().position(|l| l.layer.name == "flatten").unwrap();
        assert_eq!(every[end].layer.input.0, vec![512, 7, 7]);
        assert_eq!(padded[end].layer.input.0, vec![512, 16, 7]);
    }

    #[test]
    fn grids_are_as_even_as_possible() {
        assert_eq!(spatial_grid(4, SpatialDims::Hw), vec![2, 2]);
        assert_eq!(spatial_grid(8, SpatialDims::Hw), vec![4, 2]);
        assert_eq!(spatial_grid(8, SpatialDims::Dhw), vec![2, 2, 2]);
        assert_eq!(spatial_grid(12, SpatialDims::Dhw), vec![3, 2, 2]);
        for index in 0..12 {
            let grid = [3, 2, 2];
            assert_eq!(grid_index(&grid_coordinates(index, &grid), &grid), index);
        }
    }

    fn flops_of(layers: &[LocalLayer], index: usize) -> f64 {
        layers[index].layer.cost.training_flops()
    }

    #[test]
    fn filter_channel_and_spatial_conserve_the_flops_of_split_layers() {
        let model = zoo::by_name("vgg16").unwrap();
        let whole = local_layers(&model, CnnSplit::None, 1, Dtype::Fp32).unwrap();
        for split in [
            CnnSplit::Filter { degree: 4, backward: FilterBackward::InputAllreduce },
            CnnSplit::Channel(2),
            CnnSplit::Spatial {
                degree: 4,
                dims: SpatialDims::H,
                until: None,
                halos: SpatialHalos::EveryWindow,
            },
            CnnSplit::Spatial {
                degree: 4,
                dims: SpatialDims::Hw,
                until: None,
                halos: SpatialHalos::EveryWindow,
            },
        ] {
            let layers = local_layers(&model, split, 1, Dtype::Fp32).unwrap();
            for (index, layer) in model.layers.iter().enumerate() {
                if !matches!(layer.kind, LayerKind::Conv { .. }) || index == 0 {
                    continue;
                }
                // Uneven tiles (14 rows over 4 ranks) give every rank the busiest one's share.
                if let CnnSplit::Spatial { degree, dims, .. } = split {
                    let grid = spatial_grid(degree, dims);
                    let axes = split_axes(3, dims);
                    let even =
                        |shape: &Shape| axes.iter().zip(&grid).all(|(&a, &g)| shape.0[a] % u64::from(g) == 0);
                    if !(even(&layer.input) && even(&layer.output)) {
                        continue;
                    }
                }
                let sum = f64::from(split.degree()) * flops_of(&layers, index);
                let full = flops_of(&whole, index);
                // Channel ranks each add the bias to their partial sums: a hair over.
                let tolerance = if matches!(split, CnnSplit::Channel(_)) { 1e-3 } else { 1e-9 };
                assert!((sum / full - 1.0).abs() < tolerance, "{split:?} {}: {sum} vs {full}", layer.name);
            }
        }
    }

    #[test]
    fn filter_allgathers_outputs_and_channel_allreduces_them() {
        let model = zoo::by_name("vgg16").unwrap();
        let (b, width) = (32u64, 4u64);
        let filter = local_layers(
            &model,
            CnnSplit::Filter { degree: 4, backward: FilterBackward::OutputAlltoall },
            b,
            Dtype::Fp32,
        )
        .unwrap();
        let channel = local_layers(&model, CnnSplit::Channel(2), b, Dtype::Fp32).unwrap();
        let conv = 2; // features.2: 64 x 224 x 224 in and out
        let activation = Bytes(64 * 224 * 224 * b * width);
        let gather = filter[conv].after_forward[0];
        assert_eq!((gather.kind, gather.bytes), (CollectiveKind::AllGather, activation));
        // Each rank's allgather share moves activation x (p - 1) / p.
        assert_eq!(gather.bytes.0 * 3 / 4, 64 * 224 * 224 * b * width * 3 / 4);
        // The backward is ChainerMN's alltoall of the output gradient, before the layer's
        // backward kernels, on the same buffer; nothing on the input gradient.
        let alltoall = filter[conv].before_backward[0];
        assert_eq!((alltoall.kind, alltoall.bytes), (CollectiveKind::AllToAll, activation));
        assert!(filter[conv].after_backward_data.is_empty());
        assert_eq!(filter[conv].layer.output.0, vec![16, 224, 224]);
        let reduce = channel[conv].after_forward[0];
        assert_eq!((reduce.kind, reduce.bytes), (CollectiveKind::AllReduce, activation));
        assert_eq!(channel[conv].layer.input.0, vec![32, 224, 224]);
        assert_eq!(channel[conv].after_backward_data[0].kind, CollectiveKind::AllGather);
        // Replicated layers between: full shapes, no collective.
        assert_eq!(filter[conv + 1].role, Role::Replicated);
        assert_eq!(filter[conv + 1].layer.input.0, vec![64, 224, 224]);
        // The first layer needs no input gradient, but its weights need its output's: ChainerMN
        // runs the alltoall there too.
        assert!(filter[0].after_backward_data.is_empty());
        assert_eq!(filter[0].before_backward[0].kind, CollectiveKind::AllToAll);
        // Every split layer has one allgather and one alltoall; replicated layers none.
        for local in &filter {
            let split = local.role == Role::FilterSplit;
            assert_eq!(local.after_forward.len(), usize::from(split), "{}", local.layer.name);
            assert_eq!(local.before_backward.len(), usize::from(split), "{}", local.layer.name);
        }
        // The default backward: an allreduce of the input gradient after backward-data, none
        // on the first layer; the same forward.
        let textbook = local_layers(
            &model,
            CnnSplit::Filter { degree: 4, backward: FilterBackward::InputAllreduce },
            b,
            Dtype::Fp32,
        )
        .unwrap();
        let reduce = textbook[conv].after_backward_data[0];
        assert_eq!((reduce.kind, reduce.bytes), (CollectiveKind::AllReduce, activation));
        assert!(textbook[conv].before_backward.is_empty());
        assert!(textbook[0].after_backward_data.is_empty() && textbook[0].before_backward.is_empty());
        assert_eq!(textbook[conv].after_forward, filter[conv].after_forward);
    }

    #[test]
    fn spatial_gathers_before_the_first_non_spatial_layer() {
        let model = zoo::by_name("resnet50").unwrap();
        let layers = local_layers(
            &model,
            CnnSplit::Spatial {
                degree: 4,
                dims: SpatialDims::H,
                until: None,
                halos: SpatialHalos::EveryWindow,
            },
            2,
            Dtype::Fp32,
        )
        .unwrap();
        let end = spatial_region_end(&model, None);
        assert!(matches!(model.layers[end].kind, LayerKind::GlobalAvgPool));
        assert_eq!(layers[end].before_forward[0].bytes, Bytes(2048 * 7 * 7 * 2 * 4));
        assert_eq!(layers[end].before_forward[0].kind, CollectiveKind::AllGather);
        assert_eq!(layers[0].layer.input.0, vec![3, 56, 224]);
        assert_eq!(layers[end + 1].role, Role::Replicated);
    }

    #[test]
    fn an_earlier_gather_point_splits_only_the_layers_up_to_it() {
        // ParaDL's CosmoFlow: CONV_1 .. APOOL_2 on slabs, an allgather of APOOL_2's output,
        // CONV_3 onwards replicated (spatial_cosmoflow.py).
        let model = zoo::by_name("cosmoflow-256").unwrap();
        let last = model.layers.iter().position(|l| l.name == "APOOL_2").unwrap();
        let split = CnnSplit::Spatial {
            degree: 4,
            dims: SpatialDims::H,
            until: Some(last as u32),
            halos: SpatialHalos::EveryWindow,
        };
        let layers = local_layers(&model, split, 1, Dtype::Fp32).unwrap();
        assert_eq!(spatial_region_end(&model, Some(last as u32)), last + 1);
        for layer in &layers[..=last] {
            assert_eq!(layer.role, Role::SpatialSplit, "{}", layer.layer.name);
        }
        let conv3 = &layers[last + 1];
        assert_eq!(conv3.layer.name, "CONV_3");
        assert_eq!(conv3.role, Role::Replicated);
        // The whole APOOL_2 output (32 x 64^3 fp32) is gathered before CONV_3.
        assert_eq!(conv3.before_forward[0].kind, CollectiveKind::AllGather);
        assert_eq!(conv3.before_forward[0].bytes, Bytes(32 * 64 * 64 * 64 * 4));
        assert_eq!(conv3.layer.input.0, vec![32, 64, 64, 64]);
        // Past the automatic end, the automatic end holds.
        assert_eq!(spatial_region_end(&model, Some(10_000)), automatic_spatial_end(&model));
        // The split is cheaper per rank than one device's whole model, and the replicated tail
        // costs every rank the same.
        let split_flops: f64 = layers[..=last].iter().map(|l| l.layer.cost.forward_flops).sum();
        let whole: f64 = model.layers[..=last].iter().map(|l| l.cost.forward_flops).sum();
        assert!(split_flops < whole / 3.5, "{split_flops} vs {whole}");
    }

    #[test]
    fn host_staging_of_one_exchange_is_its_closed_form() {
        let rate: sim_core::units::Bandwidth = "1 GB/s".parse().unwrap();
        let comm = |group, kind| Comm { group, kind, bytes: Bytes(1200), what: "" };
        let within = HostStaging::new(CnnTransport::Mpi, rate, 4, 4).unwrap();
        let across = HostStaging::new(CnnTransport::Mpi, rate, 8, 4).unwrap();
        let managed = HostStaging::new(CnnTransport::MpiManaged, rate, 3, 4).unwrap();
        assert!(HostStaging::new(CnnTransport::Device, rate, 8, 4).is_none());
        assert!(!within.every_message && across.every_message && managed.every_message);
        // MPI_Allreduce through coll/cuda: send and receive buffers to the host, result back.
        let reduce = comm(GroupKind::Channel, CollectiveKind::AllReduce);
        assert_eq!(within.collective_bytes(&reduce, 3), Bytes(3600));
        // An allgather: the (p - 1) / p a rank receives, only when every message is staged.
        let gather = comm(GroupKind::Filter, CollectiveKind::AllGather);
        assert_eq!(within.collective_bytes(&gather, 4), Bytes(0));
        assert_eq!(across.collective_bytes(&gather, 8), Bytes(1050));
        assert_eq!(managed.collective_bytes(&gather, 3), Bytes(800));
        // The filter backward is ChainerMN's alltoall, not MPI_Allreduce: no coll/cuda triple.
        let alltoall = comm(GroupKind::Filter, CollectiveKind::AllToAll);
        assert_eq!(across.collective_bytes(&alltoall, 8), Bytes(1050));
        assert_eq!(within.collective_bytes(&alltoall, 4), Bytes(0));
        // Pipelined with the transfer (pml/ob1's fragments), except coll/cuda's allreduce.
        assert!(across.pipelined(&gather) && across.pipelined(&alltoall));
        assert!(!within.pipelined(&reduce));
        // Not a CNN group's collective (the NCCL gradient allreduce), or a group of one.
        assert_eq!(managed.collective_bytes(&comm(GroupKind::Data, CollectiveKind::AllReduce), 4), Bytes(0));
        assert_eq!(managed.collective_bytes(&reduce, 1), Bytes(0));
        assert_eq!((managed.halo_bytes(Bytes(70)), within.halo_bytes(Bytes(70))), (Bytes(70), Bytes(0)));
        // 1200 bytes at 1 GB/s: 1.2 us.
        assert_eq!(rate.time_to_send(Bytes(1200)).unwrap(), sim_core::units::SimDuration::from_ns(1200));
    }

    #[test]
    fn filter_backwards_parse_and_refuse_other_names() {
        for backward in FilterBackward::ALL {
            assert_eq!(backward.name().parse::<FilterBackward>(), Ok(backward));
        }
        let error = "reduce-scatter".parse::<FilterBackward>().unwrap_err();
        assert!(error.contains("\"input-allreduce\"") && error.contains("\"output-alltoall\""), "{error}");
    }

    #[test]
    fn transports_parse_and_refuse_other_names() {
        for transport in CnnTransport::ALL {
            assert_eq!(transport.name().parse::<CnnTransport>(), Ok(transport));
        }
        let error = "nccl".parse::<CnnTransport>().unwrap_err();
        assert!(error.contains("\"device\"") && error.contains("\"mpi-managed\""), "{error}");
    }

    #[test]
    fn degrees_that_cannot_split_say_what_would() {
        let resnet = zoo::by_name("resnet50").unwrap();
        // ParaDL's channel = 3 on the RGB input splits it 1 channel per rank (and the
        // 64-channel convolutions unevenly); 4 ranks cannot share 3 channels.
        assert!(check(&resnet, CnnSplit::Channel(3)).is_ok());
        let error = check(&resnet, CnnSplit::Channel(4)).unwrap_err().to_string();
        assert!(error.contains("conv1 has 3 input channels") && error.contains("valid: 1 to 3"), "{error}");
        let error =
            check(&resnet, CnnSplit::Filter { degree: 128, backward: FilterBackward::InputAllreduce })
                .unwrap_err()
                .to_string();
        assert!(error.contains("64 output channels") && error.contains("evenly: 1, 2, 4, 8)"), "{error}");
        let error = check(
            &resnet,
            CnnSplit::Spatial {
                degree: 8,
                dims: SpatialDims::H,
                until: None,
                halos: SpatialHalos::EveryWindow,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("7 positions along the height") && error.contains("at most 7"), "{error}");
        let error = check(
            &resnet,
            CnnSplit::Spatial {
                degree: 8,
                dims: SpatialDims::Dhw,
                until: None,
                halos: SpatialHalos::EveryWindow,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("spatial-dims") && error.contains("\"h\", \"hw\""), "{error}");
        let gpt = zoo::by_name("megatron-1.7b").unwrap();
        let error = check(&gpt, CnnSplit::Filter { degree: 2, backward: FilterBackward::InputAllreduce })
            .unwrap_err()
            .to_string();
        assert!(error.contains("no convolution"), "{error}");
    }
}
