//! NCCL's tuner: how NCCL picks the algorithm and protocol of an allreduce.
//!
//! NCCL does not simulate its algorithms to choose among them: at initialisation it fills a
//! table of `latency` and `bandwidth` per (algorithm, protocol) from the topology it detected
//! (`ncclTopoTuneModel` in `src/graph/tuning.cc`) and runs, for every collective, the entry
//! with the smallest `latency + size / bandwidth` (`ncclTopoGetAlgoTime`). This module is that
//! model, with the topology's numbers (channels and their bandwidths) derived from parasim's
//! [`TunerFabric`] instead of NCCL's graph search:
//!
//! - **Channels and their bandwidth.** Inside one server, one channel per NVLink
//!   (per-GPU NVLink bandwidth over NCCL's per-link rate, `SM80_NVLINK_BW` = 20 GB/s and
//!   friends in `src/graph/topo.h`); across servers, one channel per NIC, each at the smaller of
//!   its NIC's rate and its share of the GPU's intra-server bandwidth.
//! - **Bus bandwidth** `channels x bandwidth`, then NCCL's refinements: LL rings at half of it
//!   and at most `llMaxBw`; LL128 rings at 0.92 of it and at most 20-40 GB/s per channel;
//!   trees at 0.92 of it and at most `perChMaxTreeBw` per channel, LL trees at 1/3.8 of it,
//!   LL128 trees at 120/128 (7/9 in one server); a ring's algorithm bandwidth is
//!   `ranks / steps` of it, a tree's half. Medium-sized trees are further corrected by NCCL's
//!   `treeCorrectionFactor` table.
//! - **Latency**: the base latency of the (algorithm, protocol) plus, for a ring,
//!   `2(p-1)` hop latencies (the `2(n-1)` hops between servers at the network's, the others at
//!   least at the network post overhead), for a tree `2((ppn - 1) intra + log2(n) inter)`;
//!   the network latency adds the transport's message overhead (twice for Simple, whose data
//!   is flushed). Rings across servers in their bandwidth regime pay 1.4 times their latency.
//!
//! The CPU-dependent LL bandwidth of NCCL's table across servers takes the AMD row for AMD
//! hosts (`cluster.network.host-cpu`), else the Intel row. The model sees
//! the NICs' line rate ([`TunerFabric::nic_line_rate`]), as NCCL does; the per-protocol
//! slowdown ([`allreduce_slowdown`]) applies to what they deliver.
//!
//! In-network algorithms are priced here too, from the same fabric: NVLS and NVLS-tree by
//! NCCL's own model, CollNet ([`collnet_model`]) on the links' rates, which its closed-form
//! timing (`collnet`) shares, so the choice and the timing agree.
//!
//! Pure functions of a [`TunerFabric`] and a release's table (`tables`): nothing here sees the
//! network model or the group's placement beyond its ranks and servers.

use crate::graph::CollectiveAlgorithm;
use crate::nccl::protocol::{Family, Hop, Protocol};
use crate::nccl::tables::{NcclTable, NcclVersion, PlateauRule};

/// GPU generations, as NCCL's tuning tables index them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuGeneration {
    /// Volta (sm70).
    Volta,
    /// Ampere (sm80).
    #[default]
    Ampere,
    /// Hopper (sm90).
    Hopper,
    /// Blackwell (sm100).
    Blackwell,
}

impl GpuGeneration {
    /// The generation's row in NCCL's tables (Volta 0 to Blackwell 3).
    pub fn index(self) -> usize {
        match self {
            GpuGeneration::Volta => 0,
            GpuGeneration::Ampere => 1,
            GpuGeneration::Hopper => 2,
            GpuGeneration::Blackwell => 3,
        }
    }

    /// NCCL's data rate of one NVLink (GB/s, `src/graph/topo.h`).
    pub fn nvlink_rate(self) -> f64 {
        match self {
            GpuGeneration::Volta | GpuGeneration::Ampere => 20.0,
            GpuGeneration::Hopper => 20.6,
            GpuGeneration::Blackwell => 40.1,
        }
    }

    /// The generation of a device by its catalog name (`a100-sxm4-80gb`, `h100-...`, ...);
    /// Ampere when the name says nothing NCCL would distinguish. Pascal (`p100`) is Volta's row:
    /// NCCL's tuner has no row before sm70 (`compCapIndex` in `tuning.cc`).
    pub fn of_device(name: &str) -> GpuGeneration {
        let name = name.to_ascii_lowercase();
        if name.starts_with("v100") || name.starts_with("p100") {
            GpuGeneration::Volta
        } else if name.starts_with("h100") || name.starts_with("h200") || name.starts_with("gh200") {
            GpuGeneration::Hopper
        } else if name.starts_with("b100") || name.starts_with("b200") || name.starts_with("gb200") {
            GpuGeneration::Blackwell
        } else {
            GpuGeneration::Ampere
        }
    }
}

/// What NCCL's tuner needs to know about the cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunerFabric {
    /// Per-GPU bandwidth inside a server, one direction (GB/s).
    pub intra: f64,
    /// Links inside a server.
    pub intra_hop: Hop,
    /// Bandwidth of one NIC, one direction (GB/s): what it delivers.
    pub nic: f64,
    /// The NIC's line rate (GB/s): what NCCL detects and its tuner chooses by, before the
    /// transport's efficiency ([`TunerFabric::nic`] over the `efficiency` key).
    pub nic_line_rate: f64,
    /// NICs per server.
    pub nics_per_node: u32,
    /// The transport's message overhead (us): NCCL's `latencyInter`.
    pub net_latency_us: f64,
    /// The GPUs' generation.
    pub generation: GpuGeneration,
    /// The servers' CPUs are AMD's: NCCL's LL cap across servers takes its AMD row.
    pub amd_hosts: bool,
    /// The NCCL release whose constants ([`NcclTable`]) the model uses.
    pub nccl: NcclVersion,
}

impl TunerFabric {
    /// The constants of this fabric's NCCL release.
    pub fn table(&self) -> &'static NcclTable {
        NcclTable::of(self.nccl)
    }
}

/// NCCL's channels and the bandwidth of each (GB/s) as its release sees them: its graph
/// search, simplified (see the module documentation; one server: [`NcclTable::intra_graph`]
/// over the GPU's NVLinks, counted at parasim's per-link rate).
fn channels(fabric: &TunerFabric, ranks: u32, nodes: u32) -> (f64, f64) {
    if nodes <= 1 {
        let nvlinks = fabric.intra / fabric.generation.nvlink_rate();
        fabric.table().intra_graph(fabric.generation.index(), nvlinks)
    } else {
        let ppn = f64::from(ranks) / f64::from(nodes);
        let channels = f64::from(fabric.nics_per_node.max(1)).min(ppn.max(1.0));
        (channels, fabric.nic.min(fabric.intra / channels))
    }
}

/// NCCL's `MAXCHANNELS` (`src/include/device.h`): no communicator has more channels.
const MAX_CHANNELS: u32 = 32;

/// The channels of an NCCL communicator: the graph search's channels (`channels`) doubled
/// by `ncclTopoPostset` (`src/graph/connect.cc`: "Duplication should be complete now",
/// `nChannels = comm->nChannels = std::min(MAXCHANNELS, nChannels*2)`), at most
/// `MAXCHANNELS`: 24 on one 8-GPU A100 server (12 NVLinks' worth), 16 across servers with 8
/// NICs each.
pub fn comm_channels(fabric: &TunerFabric, ranks: u32, nodes: u32) -> u32 {
    let (graph, _) = channels(fabric, ranks, nodes);
    ((graph as u32).max(1) * 2).min(MAX_CHANNELS)
}

/// NCCL's threads per channel before it shrinks a launch (`comm->maxThreads`, set by
/// `ncclTopoTuneModel` in `src/graph/tuning.cc` from `NCCL_LL_MAX_NTHREADS` = 512,
/// `NCCL_LL128_MAX_NTHREADS` = 640 and `NCCL_SIMPLE_MAX_NTHREADS` = 512; a Simple ring whose
/// graph moves at most `PCI_BW` = 12 GB/s gets 256).
pub fn max_threads(fabric: &TunerFabric, family: Family, protocol: Protocol, ranks: u32, nodes: u32) -> u32 {
    match protocol {
        Protocol::Ll => 512,
        Protocol::Ll128 => 640,
        Protocol::Simple => {
            let (count, per_channel) = channels(fabric, ranks, nodes);
            if family == Family::Ring && count * per_channel <= 12.0 { 256 } else { 512 }
        }
    }
}

/// NCCL's bytes of a collective per thread below which it launches fewer channels
/// (`comm->threadThresholds`: `NCCL_LL_THREAD_THRESHOLD` = 8 times the ranks on rings,
/// `NCCL_LL128_THREAD_THRESHOLD` = 8, `NCCL_SIMPLE_THREAD_THRESHOLD` = 64; `src/include/comm.h`
/// and `ncclTopoTuneModel`).
pub fn thread_threshold(family: Family, protocol: Protocol, ranks: u32) -> u64 {
    match (protocol, family) {
        (Protocol::Ll, Family::Ring) => 8 * u64::from(ranks),
        (Protocol::Ll, Family::Tree) | (Protocol::Ll128, _) => 8,
        (Protocol::Simple, _) => 64,
    }
}

/// How many channels NCCL runs a ring or tree collective of `bytes` on: all of the
/// communicator's ([`comm_channels`]), one fewer while `bytes < channels x threads x
/// threshold` and more than one is left (`getAlgoInfo` in `src/enqueue.cc` up to NCCL 2.18,
/// `topoGetAlgoInfo` since: "Ring/Tree channel tuning"). Small collectives run on few
/// channels; on one 8-GPU A100 server a ring/LL allreduce uses one channel per 32 KiB.
pub fn launch_channels(
    fabric: &TunerFabric,
    family: Family,
    protocol: Protocol,
    ranks: u32,
    nodes: u32,
    bytes: u64,
) -> u32 {
    let threads = u64::from(max_threads(fabric, family, protocol, ranks, nodes));
    let per_channel = threads * thread_threshold(family, protocol, ranks);
    let all = comm_channels(fabric, ranks, nodes);
    // The largest count c <= all with bytes >= c x per_channel, at least one.
    let fit = bytes / per_channel.max(1);
    fit.clamp(1, u64::from(all)) as u32
}

/// NCCL's bus bandwidth of a ring or tree allreduce on the links alone and after its
/// protocol and per-channel refinements (GB/s).
fn bus_bandwidths(
    fabric: &TunerFabric,
    family: Family,
    protocol: Protocol,
    ranks: u32,
    nodes: u32,
) -> (f64, f64) {
    let table = fabric.table();
    let g = fabric.generation.index();
    let n_index = if nodes <= 2 { nodes as usize - 1 } else { 2 };
    let (channels, per_channel) = channels(fabric, ranks, nodes);
    // What the links carry (parasim's rates) and what NCCL's release sees of them.
    let link_bus = if nodes <= 1 { fabric.intra } else { channels * per_channel };
    let mut bus = channels * per_channel;
    if let Some(cap) = table.bus_cap[g] {
        bus = bus.min(cap);
    }
    // Single server: the GPU's row; several: the CPU's, AMD's or Intel's (`index1` in
    // `ncclTopoTuneModel`).
    let cpu_row = if fabric.amd_hosts { 1 } else { 0 };
    let ll_max = if nodes == 1 { table.ll_max_gpu[g][n_index] } else { table.ll_max_cpu[cpu_row][n_index] };
    let ppn = f64::from(ranks) / f64::from(nodes.max(1));
    match (family, protocol) {
        (Family::Ring, Protocol::Ll) => bus = ll_max.min(bus * table.ring_ll_share),
        (Family::Ring, Protocol::Ll128) => {
            let share = if ppn < 2.0 { table.ring_ll128_share_one_per_node } else { 0.92 };
            bus = (bus * share).min(channels * table.ring_ll128_per_channel[g][n_index]);
        }
        (Family::Ring, Protocol::Simple) => {}
        (Family::Tree, _) => {
            bus = (bus * 0.92).min(channels * table.tree_per_channel[g][n_index]);
            match protocol {
                Protocol::Ll => bus = (bus / 3.8).min(ll_max),
                Protocol::Ll128 => {
                    let factor = if nodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 };
                    bus = (bus * factor).min(channels * table.tree_ll128_per_channel[g][n_index]);
                }
                Protocol::Simple => {}
            }
        }
    }
    (link_bus, bus)
}

/// How much slower than its links NCCL's model says an allreduce by `algorithm` and
/// `protocol` moves its data: the links' bus bandwidth over NCCL's refined one (at least 1;
/// `None` for algorithms the model does not refine). The flow models carry this many bytes
/// per byte of data, so a protocol's bandwidth share and its per-channel limits hold in
/// every fidelity, contended or not. A tree of `bytes` is further slowed by NCCL's
/// [`tree_correction`] for its size.
pub fn allreduce_slowdown(
    fabric: &TunerFabric,
    algorithm: CollectiveAlgorithm,
    protocol: Protocol,
    ranks: u32,
    nodes: u32,
    bytes: u64,
) -> Option<f64> {
    let family = match algorithm {
        CollectiveAlgorithm::Ring => Family::Ring,
        CollectiveAlgorithm::Tree => Family::Tree,
        _ => return None,
    };
    if ranks <= 1 || nodes == 0 {
        return None;
    }
    let (link_bus, mut bus) = bus_bandwidths(fabric, family, protocol, ranks, nodes);
    if family == Family::Tree {
        bus *= tree_correction(protocol, bytes);
    }
    (bus > 0.0).then(|| (link_bus / bus).max(1.0))
}

/// The most data one channel of NCCL's tree moves over a hop inside a server (GB/s): NCCL's
/// per-channel tree cap on one server (`perChMaxTreeBws`, `tuning.cc`, the generation's N1
/// column: 38.7 GB/s on Hopper, 24 on Ampere), which NCCL counts per channel of its graph
/// search; the communicator runs each graph channel as two (`ncclTopoPostset` duplicates them,
/// one tree each way), so each of those moves half of it: 19.35 GB/s on Hopper. The one-server
/// column is the channel's own rate, without the network (whose share the links already
/// give); the same table bounds the tree's bus bandwidth ([`allreduce_slowdown`]), here it
/// bounds how fast one chunk crosses one hop, which is what a tree's pipeline fill takes.
pub fn tree_channel_rate(fabric: &TunerFabric) -> Option<f64> {
    let rate = fabric.table().tree_per_channel[fabric.generation.index()][0] / 2.0;
    (rate > 0.0).then_some(rate)
}

/// NCCL's latency (us) and algorithm bandwidth (GB/s) of an allreduce over `ranks` ranks on
/// `nodes` servers by `algorithm` (ring or tree) and `protocol`, for a collective launch of
/// `launch_us`; `None` if NCCL would not use the combination.
pub fn allreduce_model(
    fabric: &TunerFabric,
    algorithm: CollectiveAlgorithm,
    protocol: Protocol,
    ranks: u32,
    nodes: u32,
    launch_us: f64,
) -> Option<(f64, f64)> {
    if ranks <= 1 || nodes == 0 {
        return None;
    }
    // NCCL's tuner sees the NICs' line rate, not what the transport delivers.
    let fabric = &TunerFabric { nic: fabric.nic_line_rate, ..*fabric };
    let family = match algorithm {
        CollectiveAlgorithm::Ring => Family::Ring,
        CollectiveAlgorithm::Tree => Family::Tree,
        CollectiveAlgorithm::Nvls | CollectiveAlgorithm::NvlsTree => {
            return nvls_model(fabric, algorithm, protocol, ranks, nodes);
        }
        CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain => {
            // Simple only, as NCCL; the switches' reduction needs at least two servers.
            if protocol != Protocol::Simple || nodes < 2 {
                return None;
            }
            return collnet_model(fabric, algorithm, ranks / nodes);
        }
        _ => return None,
    };
    let table = fabric.table();
    // LL128 needs NVLink inside servers (NCCL enables it up to PATH_NVB), and on the GPUs the
    // release enables it on.
    if protocol == Protocol::Ll128
        && (fabric.intra_hop != Hop::NvLink || !table.ll128_generations[fabric.generation.index()])
    {
        return None;
    }
    let ppn = f64::from(ranks) / f64::from(nodes);
    let (_, bus) = bus_bandwidths(fabric, family, protocol, ranks, nodes);
    let steps = 2.0 * f64::from(ranks - 1);
    let algbw = if family == Family::Ring { bus * f64::from(ranks) / steps } else { bus * 0.5 };
    // Latency.
    let us = |d: units::SimDuration| d.as_ps() as f64 / 1e6;
    let multi_server = nodes > 1;
    let base = us(protocol.base_latency(
        table,
        family,
        units::SimDuration::from_ps((launch_us * 1e6).round() as u64),
    ));
    let intra = table.hop_latency_us(family, protocol, fabric.intra_hop, multi_server);
    let net_family = if ppn <= 1.0 && table.one_per_node_tree_net_hop { Family::Tree } else { family };
    let mut inter = table.hop_latency_us(net_family, protocol, Hop::Net, multi_server);
    if table.tuner_net_latency {
        inter += fabric.net_latency_us;
        if protocol == Protocol::Simple {
            inter += fabric.net_latency_us;
        }
    }
    let latency = match family {
        Family::Ring => {
            let intra = if nodes > 1 { intra.max(us(protocol.ring_net_overhead(table))) } else { intra };
            let inter_steps = if nodes == 1 { 0.0 } else { 2.0 * f64::from(nodes - 1) };
            base + (steps - inter_steps) * intra + inter_steps * inter
        }
        Family::Tree => base + 2.0 * ((ppn - 1.0) * intra + f64::from(nodes.ilog2()) * inter),
    };
    Some((latency, algbw))
}

/// NCCL's NVLS channels on NVSwitch 3 systems (`NCCL_NVLS_NCHANNELS`' default).
const NVLS_CHANNELS: f64 = 16.0;

/// NCCL's model of NVLS (one server) and NVLS-tree (several): Simple protocol only, no base
/// latency, 25 us over NVLink plus 20.9 us (and the transport's overhead, twice) per tree
/// level and direction across servers; per channel, the smaller of the switch's rate
/// (`nvlsEfficiency` of the channel's NVLink share, doubled for allreduce's two pipelined
/// operations) and the NICs' share (doubled on two servers), NVLS-tree at most
/// `perChMaxNVLSTreeBw`.
fn nvls_model(
    fabric: &TunerFabric,
    algorithm: CollectiveAlgorithm,
    protocol: Protocol,
    ranks: u32,
    nodes: u32,
) -> Option<(f64, f64)> {
    let tree = algorithm == CollectiveAlgorithm::NvlsTree;
    if !fabric.table().nvls {
        return None;
    }
    let efficiency = match fabric.generation {
        GpuGeneration::Volta | GpuGeneration::Ampere => return None,
        GpuGeneration::Hopper => 0.85,
        GpuGeneration::Blackwell => 0.74,
    };
    if protocol != Protocol::Simple || fabric.intra_hop != Hop::NvLink || tree != (nodes > 1) {
        return None;
    }
    let channels = NVLS_CHANNELS;
    let intra = fabric.intra / channels * efficiency * (channels - 1.0) / channels * 2.0;
    let mut bw = intra;
    if tree {
        let nics = fabric.nic * f64::from(fabric.nics_per_node.max(1));
        let inter = nics / channels * if nodes <= 2 { 2.0 } else { 1.0 };
        const NVLS_TREE: [[f64; 3]; 4] =
            [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]];
        let n_index = if nodes <= 2 { nodes as usize - 1 } else { 2 };
        bw = bw.min(inter).min(NVLS_TREE[fabric.generation.index()][n_index]);
    }
    let algbw = channels * bw * f64::from(ranks) / (2.0 * f64::from(ranks - 1));
    let net = 20.9 + 2.0 * fabric.net_latency_us;
    let latency = 25.0 + if tree { 2.0 * f64::from(nodes.ilog2()) * net } else { 0.0 };
    Some((latency, algbw))
}

/// NCCL's latency (us) and the algorithm bandwidth (GB/s) of a CollNet allreduce with `g`
/// GPUs per server on `fabric` (its NICs at `fabric.nic`); `None` for other algorithms.
pub fn collnet_model(fabric: &TunerFabric, algorithm: CollectiveAlgorithm, g: u32) -> Option<(f64, f64)> {
    let direct = match algorithm {
        CollectiveAlgorithm::CollNetDirect => true,
        CollectiveAlgorithm::CollNetChain => false,
        _ => return None,
    };
    let g_f = f64::from(g.max(1));
    let nics = f64::from(fabric.nics_per_node.clamp(1, g.max(1)));
    // Seconds per byte of buffer, each stage; bandwidths in GB/s.
    let network = 1.0 / (nics * fabric.nic);
    let inside = if g <= 1 {
        0.0
    } else if direct {
        (g_f - 1.0) / g_f / fabric.intra
    } else {
        1.0 / fabric.intra
    };
    let mut algbw = 1.0 / network.max(inside);
    if direct && matches!(fabric.generation, GpuGeneration::Hopper | GpuGeneration::Blackwell) {
        algbw *= 0.85;
    }
    let overhead = 2.0 * fabric.net_latency_us;
    let peers = g_f - 1.0;
    let latency = if direct {
        2.0 * (peers.min(1.0) * 3.7 + peers * 0.4) + 31.0 + overhead
    } else {
        2.0 * peers * 2.8 + 30.0 + overhead
    };
    Some((latency, algbw))
}

// NCCL's treeCorrectionFactor (powers of two from 64 B).
const TREE_CORRECTION: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
        1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9,
        0.9, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7,
        0.8, 0.9, 0.9,
    ],
];

/// NCCL's `treeCorrectionFactor` (`ncclTopoGetAlgoTime` in `src/graph/tuning.cc`):
/// "Trees are not perfectly sticking to the model for medium sizes", so NCCL scales a tree's
/// bandwidth by a factor per power of two of the size (64 B to 256 MiB, one row per
/// protocol): down to 0.4 for LL at 256-512 KiB, 0.6 for LL128 from 64 KiB to 4 MiB, 0.5 for
/// Simple from 128 KiB to 1 MiB. The table is NCCL's own reading of how fast its trees really
/// move medium buffers (unchanged from NCCL 2.4 to 2.2x), so parasim applies it to the tree's
/// data ([`allreduce_slowdown`]) as well as to the choice.
pub fn tree_correction(protocol: Protocol, bytes: u64) -> f64 {
    let sixty_fourths = bytes >> 6;
    if sixty_fourths == 0 {
        return 1.0;
    }
    let log = sixty_fourths.ilog2() as usize;
    let row = match protocol {
        Protocol::Ll => 0,
        Protocol::Ll128 => 1,
        Protocol::Simple => 2,
    };
    TREE_CORRECTION[row].get(log).copied().unwrap_or(1.0)
}

/// NCCL's estimated time (us) of an allreduce of `bytes` (see [`allreduce_model`]), with its
/// per-size corrections: medium trees are slower than the model, and rings across servers in
/// their bandwidth regime pay 1.4 times their latency.
pub fn allreduce_time(
    fabric: &TunerFabric,
    algorithm: CollectiveAlgorithm,
    protocol: Protocol,
    ranks: u32,
    nodes: u32,
    launch_us: f64,
    bytes: u64,
) -> Option<f64> {
    let (mut latency, mut bandwidth) = allreduce_model(fabric, algorithm, protocol, ranks, nodes, launch_us)?;
    if bandwidth <= 0.0 {
        return None;
    }
    if algorithm == CollectiveAlgorithm::Tree {
        bandwidth *= tree_correction(protocol, bytes);
    }
    if algorithm == CollectiveAlgorithm::Ring && protocol == Protocol::Simple && nodes > 1 {
        let channels = channels(fabric, ranks, nodes).0 as u64;
        latency *= ring_plateau(fabric.table(), fabric.generation, bytes, channels, ranks);
    }
    Some(latency + bytes as f64 / (1000.0 * bandwidth))
}

/// NCCL's "plateau effect" factor on the latency of a ring/Simple allreduce of `bytes` across
/// servers on `channels` channels of `ranks` ranks: the release's factor
/// ([`NcclTable::plateau`]) once its rule holds, else 1.
pub fn ring_plateau(
    table: &NcclTable,
    generation: GpuGeneration,
    bytes: u64,
    channels: u64,
    ranks: u32,
) -> f64 {
    let applies = match table.plateau_rule {
        PlateauRule::BytesPerRank(per_rank) => bytes >= u64::from(ranks) * per_rank,
        PlateauRule::BytesPerChannelRank(per) => bytes / (channels * u64::from(ranks)).max(1) >= per,
    };
    if applies { table.plateau[generation.index()] } else { 1.0 }
}

/// A DGX A100-like server for tests: 240 GB/s NVLink per GPU, 8 NICs of 25 GB/s.
#[cfg(test)]
pub(crate) fn dgx_a100() -> TunerFabric {
    TunerFabric {
        intra: 240.0,
        intra_hop: Hop::NvLink,
        nic: 25.0,
        nic_line_rate: 25.0,
        nics_per_node: 8,
        net_latency_us: 0.0,
        generation: GpuGeneration::Ampere,
        amd_hosts: false,
        nccl: NcclVersion::V2_27,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_hosts_take_the_amd_row_of_the_ll_cap_across_servers() {
        // Two servers: ring LL is min(llMaxBw, bus / 2); 8 NICs x 25 GB/s = 200, halved 100,
        // capped at 39.0 (Intel row) or 22.5 (AMD row); one server keeps the GPU's row.
        let amd = TunerFabric { amd_hosts: true, ..dgx_a100() };
        assert_eq!(bus_bandwidths(&dgx_a100(), Family::Ring, Protocol::Ll, 16, 2).1, 39.0);
        assert_eq!(bus_bandwidths(&amd, Family::Ring, Protocol::Ll, 16, 2).1, 22.5);
        assert_eq!(bus_bandwidths(&amd, Family::Ring, Protocol::Ll, 64, 8).1, 19.0);
        assert_eq!(
            bus_bandwidths(&amd, Family::Ring, Protocol::Ll, 8, 1),
            bus_bandwidths(&dgx_a100(), Family::Ring, Protocol::Ll, 8, 1)
        );
    }

    /// Issue 38's packet-steps "regression": a 1 GiB allreduce on 1,024 ranks of 128 DGX
    /// A100-like servers runs the tree where it once ran the ring. NCCL's own model (tuning.cc
    /// of 2.19 through 2.30.7: `getNetOverhead` on every intra-server ring step, tripled for
    /// Simple, then the 1.4 plateau factor) charges the ring's 2,046 steps some 4.4 ms
    /// (LL128) to 9.7 ms (Simple) of latency, and no tree correction applies at 1 GiB
    /// (`logSize < 23`), so NCCL picks tree/Simple too: the choice is NCCL's; what costs 10x
    /// under packet-steps is simulating the tree message by message.
    #[test]
    fn nccl_picks_the_tree_for_1_gib_on_1024_ranks_of_128_servers() {
        let time = |a, p| allreduce_time(&dgx_a100(), a, p, 1024, 128, 8.4, 1 << 30).unwrap();
        let tree = time(CollectiveAlgorithm::Tree, Protocol::Simple);
        for protocol in [Protocol::Ll, Protocol::Ll128, Protocol::Simple] {
            assert!(tree < time(CollectiveAlgorithm::Ring, protocol), "{protocol:?}");
            assert!(tree <= time(CollectiveAlgorithm::Tree, protocol), "{protocol:?}");
        }
        assert!((tree - 15341.0).abs() < 1.0, "{tree}");
        assert!((time(CollectiveAlgorithm::Ring, Protocol::Ll128) - 17843.5).abs() < 1.0);
    }

    #[test]
    fn ring_latency_and_bandwidth_follow_nccls_table() {
        // One server of 8: ring LL latency 6.6 + 14 x 0.6 us; bus bandwidth min(87.7, 240/2).
        let (latency, algbw) =
            allreduce_model(&dgx_a100(), CollectiveAlgorithm::Ring, Protocol::Ll, 8, 1, 8.4).unwrap();
        assert!((latency - (6.6 + 14.0 * 0.6)).abs() < 1e-9, "{latency}");
        assert!((algbw - 87.7 * 8.0 / 14.0).abs() < 1e-9, "{algbw}");
        // Two servers, tree Simple: 8.4 + 2 (7 x 4.0 + 1 x 14) us; 8 channels of 25 GB/s at
        // 0.92, at most 23.6 each, halved.
        let (latency, algbw) =
            allreduce_model(&dgx_a100(), CollectiveAlgorithm::Tree, Protocol::Simple, 16, 2, 8.4).unwrap();
        assert!((latency - (8.4 + 2.0 * (7.0 * 4.0 + 14.0))).abs() < 1e-9, "{latency}");
        assert!((algbw - 0.5 * (8.0 * 25.0 * 0.92_f64).min(8.0 * 23.6)).abs() < 1e-9, "{algbw}");
    }

    #[test]
    fn a_communicator_has_twice_its_graphs_channels() {
        // One A100 server: 240 / 20 GB/s = 12 graph channels, 24 in the communicator; two
        // servers of 8 GPUs with 8 NICs: 8 and 16; never more than MAXCHANNELS.
        assert_eq!(comm_channels(&dgx_a100(), 8, 1), 24);
        assert_eq!(comm_channels(&dgx_a100(), 16, 2), 16);
        let wide = TunerFabric { intra: 900.0, ..dgx_a100() };
        assert_eq!(comm_channels(&wide, 8, 1), 32);
    }

    #[test]
    fn nccl_launches_one_channel_per_threads_times_threshold_bytes() {
        let a100 = dgx_a100();
        // Ring/LL over 8 ranks: 512 threads x 8 x 8 bytes = 32 KiB per channel.
        let ring_ll = |ranks, bytes| launch_channels(&a100, Family::Ring, Protocol::Ll, ranks, 1, bytes);
        assert_eq!(ring_ll(8, 8), 1);
        assert_eq!(ring_ll(8, 64 << 10), 2);
        assert_eq!(ring_ll(8, (256 << 10) - 1), 7);
        assert_eq!(ring_ll(8, 256 << 10), 8);
        assert_eq!(ring_ll(8, 1 << 20), 24, "capped at the communicator's 24");
        // Two ranks: 512 x 8 x 2 = 8 KiB per channel.
        assert_eq!(ring_ll(2, 16 << 10), 2);
        // Tree/LL128 across two servers: 640 threads x 8 bytes; 16 channels at most.
        assert_eq!(launch_channels(&a100, Family::Tree, Protocol::Ll128, 16, 2, 64 << 10), 12);
        assert_eq!(launch_channels(&a100, Family::Tree, Protocol::Ll128, 16, 2, 1 << 20), 16);
        // Simple: 512 threads x 64 bytes = 32 KiB per channel, whatever the ranks.
        assert_eq!(launch_channels(&a100, Family::Ring, Protocol::Simple, 2, 1, 96 << 10), 3);
    }

    #[test]
    fn the_tuner_chooses_by_line_rate_and_the_links_move_what_they_deliver() {
        // NICs delivering 16 of their 25 GB/s: NCCL's model is the line rate's...
        let derated = TunerFabric { nic: 16.0, ..dgx_a100() };
        let model =
            |f: &TunerFabric| allreduce_model(f, CollectiveAlgorithm::Tree, Protocol::Ll128, 16, 2, 8.4);
        assert_eq!(model(&derated), model(&dgx_a100()));
        // ...while the protocol's slowdown is over the delivered rate: 8 x 16 x 0.92 is below
        // the 8 x 20 GB/s LL128 limit, so only the protocol's share remains.
        let slowdown =
            allreduce_slowdown(&derated, CollectiveAlgorithm::Ring, Protocol::Ll128, 16, 2, 1 << 30).unwrap();
        assert!((slowdown - 1.0 / 0.92).abs() < 1e-9, "{slowdown}");
    }

    #[test]
    fn medium_trees_move_their_data_at_nccls_corrected_rate() {
        // treeCorrectionFactor: LL at 256 KiB (64 B x 2^12) 0.4, LL128 at 1 MiB 0.6, Simple at
        // 64 B and 256 MiB 0.9, and 1 beyond the table (512 MiB and up).
        assert_eq!(tree_correction(Protocol::Ll, 256 << 10), 0.4);
        assert_eq!(tree_correction(Protocol::Ll128, 1 << 20), 0.6);
        assert_eq!(tree_correction(Protocol::Simple, 64), 0.9);
        assert_eq!(tree_correction(Protocol::Simple, 256 << 20), 0.9);
        assert_eq!(tree_correction(Protocol::Simple, 1 << 30), 1.0);
        assert_eq!(tree_correction(Protocol::Ll, 8), 1.0);
        // The tree's slowdown over its links grows by the same factor; rings are not corrected.
        let tree =
            |bytes| allreduce_slowdown(&dgx_a100(), CollectiveAlgorithm::Tree, Protocol::Ll128, 16, 2, bytes);
        assert!((tree(1 << 20).unwrap() * 0.6 - tree(1 << 30).unwrap()).abs() < 1e-9);
        let ring =
            |bytes| allreduce_slowdown(&dgx_a100(), CollectiveAlgorithm::Ring, Protocol::Ll128, 16, 2, bytes);
        assert_eq!(ring(1 << 20), ring(1 << 30));
    }

    #[test]
    fn slow_simple_rings_get_half_the_threads() {
        let pcie = TunerFabric { intra: 10.0, intra_hop: Hop::Pci, ..dgx_a100() };
        assert_eq!(max_threads(&pcie, Family::Ring, Protocol::Simple, 4, 1), 256);
        assert_eq!(max_threads(&pcie, Family::Tree, Protocol::Simple, 4, 1), 512);
        assert_eq!(max_threads(&dgx_a100(), Family::Ring, Protocol::Simple, 8, 1), 512);
        assert_eq!(max_threads(&dgx_a100(), Family::Ring, Protocol::Ll128, 8, 1), 640);
    }

    /// The (algorithm, protocol) NCCL's model picks for an allreduce of `bytes`.
    fn fastest(fabric: &TunerFabric, ranks: u32, nodes: u32, bytes: u64) -> (CollectiveAlgorithm, Protocol) {
        let mut best = (f64::INFINITY, CollectiveAlgorithm::Ring, Protocol::Simple);
        for algorithm in [CollectiveAlgorithm::Ring, CollectiveAlgorithm::Tree] {
            for protocol in Protocol::ALL {
                if let Some(t) = allreduce_time(fabric, algorithm, protocol, ranks, nodes, 8.4, bytes)
                    && t < best.0
                {
                    best = (t, algorithm, protocol);
                }
            }
        }
        (best.1, best.2)
    }

    #[test]
    fn nccl_2_11_prices_one_a100_server_as_its_tuning_cc() {
        // v2.11.4-1: 12 NVLinks at SM80_NVLINK_WIDTH 22 = 264 GB/s, capped at 235 on sm80;
        // ring/LL at a quarter of it (58.75), latency 3.6 + 14 x 0.47 us.
        let old = TunerFabric { nccl: NcclVersion::V2_11, ..dgx_a100() };
        let (latency, algbw) =
            allreduce_model(&old, CollectiveAlgorithm::Ring, Protocol::Ll, 8, 1, 8.4).unwrap();
        assert!((latency - (3.6 + 14.0 * 0.47)).abs() < 1e-9, "{latency}");
        assert!((algbw - 235.0 / 4.0 * 8.0 / 14.0).abs() < 1e-9, "{algbw}");
        // Ring/LL128: 10 + 14 x 1.9 us, min(235 x 0.92, 12 channels x 20 GB/s).
        let (latency, algbw) =
            allreduce_model(&old, CollectiveAlgorithm::Ring, Protocol::Ll128, 8, 1, 8.4).unwrap();
        assert!((latency - (10.0 + 14.0 * 1.9)).abs() < 1e-9, "{latency}");
        assert!((algbw - 235.0 * 0.92 * 8.0 / 14.0).abs() < 1e-9, "{algbw}");
        // Tree/Simple: no base latency, 28 us per hop.
        let (latency, _) =
            allreduce_model(&old, CollectiveAlgorithm::Tree, Protocol::Simple, 8, 1, 8.4).unwrap();
        assert!((latency - 2.0 * 7.0 * 28.0).abs() < 1e-9, "{latency}");
        // The same communicator's channels: 12 graph channels at 22 GB/s, 24 in all.
        assert_eq!(comm_channels(&old, 8, 1), 24);
    }

    #[test]
    fn each_nccl_release_chooses_as_its_model_says() {
        // One A100 server of 8 (NCCL's own arithmetic, from the tables above): at 64 KiB both
        // take ring/LL; at 2 MiB 2.11's quartered LL loses to LL128 (10.18 + 62.5 us against
        // 36.6 + 17.0), while 2.27's halved LL still wins (15.0 + 41.9 against 40.6 + 16.6);
        // at 32 MiB both take Simple.
        let old = TunerFabric { nccl: NcclVersion::V2_11, ..dgx_a100() };
        let new = dgx_a100();
        assert_eq!(fastest(&old, 8, 1, 64 << 10), (CollectiveAlgorithm::Ring, Protocol::Ll));
        assert_eq!(fastest(&new, 8, 1, 64 << 10), (CollectiveAlgorithm::Ring, Protocol::Ll));
        assert_eq!(fastest(&old, 8, 1, 2 << 20), (CollectiveAlgorithm::Ring, Protocol::Ll128));
        assert_eq!(fastest(&new, 8, 1, 2 << 20), (CollectiveAlgorithm::Ring, Protocol::Ll));
        assert_eq!(fastest(&old, 8, 1, 32 << 20), (CollectiveAlgorithm::Ring, Protocol::Simple));
        assert_eq!(fastest(&new, 8, 1, 32 << 20), (CollectiveAlgorithm::Ring, Protocol::Simple));
        // Eight servers: small buffers take tree/LL in both releases.
        assert_eq!(fastest(&old, 64, 8, 8 << 10), (CollectiveAlgorithm::Tree, Protocol::Ll));
        assert_eq!(fastest(&new, 64, 8, 8 << 10), (CollectiveAlgorithm::Tree, Protocol::Ll));
    }

    #[test]
    fn nccl_2_11_has_no_nvls_and_no_ll128_on_hopper() {
        let hopper = TunerFabric { intra: 370.0, generation: GpuGeneration::Hopper, ..dgx_a100() };
        let old = TunerFabric { nccl: NcclVersion::V2_11, ..hopper };
        assert!(allreduce_model(&hopper, CollectiveAlgorithm::Nvls, Protocol::Simple, 8, 1, 8.4).is_some());
        assert!(allreduce_model(&old, CollectiveAlgorithm::Nvls, Protocol::Simple, 8, 1, 8.4).is_none());
        assert!(allreduce_model(&hopper, CollectiveAlgorithm::Ring, Protocol::Ll128, 8, 1, 8.4).is_some());
        assert!(allreduce_model(&old, CollectiveAlgorithm::Ring, Protocol::Ll128, 8, 1, 8.4).is_none());
    }

    #[test]
    fn the_ring_plateau_is_the_releases() {
        let (old, new) = (NcclTable::of(NcclVersion::V2_11), NcclTable::of(NcclVersion::V2_27));
        // 2.11: 1.9 once the buffer is ranks x 4 KiB; 2.27: 1.4 on Ampere once each channel
        // has 64 bytes per rank.
        assert_eq!(ring_plateau(old, GpuGeneration::Ampere, 16 * 4096, 8, 16), 1.9);
        assert_eq!(ring_plateau(old, GpuGeneration::Ampere, 16 * 4096 - 1, 8, 16), 1.0);
        assert_eq!(ring_plateau(new, GpuGeneration::Ampere, 8 * 16 * 64, 8, 16), 1.4);
        assert_eq!(ring_plateau(new, GpuGeneration::Volta, 8 * 16 * 64, 8, 16), 1.9);
    }

    #[test]
    fn small_allreduces_take_a_low_latency_protocol_and_large_ones_simple() {
        assert_eq!(fastest(&dgx_a100(), 64, 8, 1024), (CollectiveAlgorithm::Tree, Protocol::Ll));
        assert_eq!(fastest(&dgx_a100(), 64, 8, 1 << 30).1, Protocol::Simple);
    }

    #[test]
    fn each_nic_carries_its_share_once_whatever_the_servers() {
        // DGX A100: 8 NICs of 25 GB/s carry the buffer at 200 GB/s; a chain moves it over
        // 240 GB/s of NVLink, Direct 7/8 of it: the NICs set both paces.
        let fabric = dgx_a100();
        let (chain_latency, chain) = collnet_model(&fabric, CollectiveAlgorithm::CollNetChain, 8).unwrap();
        let (direct_latency, direct) = collnet_model(&fabric, CollectiveAlgorithm::CollNetDirect, 8).unwrap();
        assert!((chain - 200.0).abs() < 1e-9 && (direct - 200.0).abs() < 1e-9, "{chain} {direct}");
        // NCCL's latencies: 2 x 7 x 2.8 + 30, and 2 x (3.7 + 7 x 0.4) + 31.
        assert!((chain_latency - 69.2).abs() < 1e-9, "{chain_latency}");
        assert!((direct_latency - 44.0).abs() < 1e-9, "{direct_latency}");
        // NVLink slower than the NICs: the chain's whole buffer over it, Direct's 7/8.
        let slow = TunerFabric { intra: 100.0, ..fabric };
        assert!((collnet_model(&slow, CollectiveAlgorithm::CollNetChain, 8).unwrap().1 - 100.0).abs() < 1e-9);
        let direct = collnet_model(&slow, CollectiveAlgorithm::CollNetDirect, 8).unwrap().1;
        assert!((direct - 800.0 / 7.0).abs() < 1e-9, "{direct}");
        assert!(collnet_model(&fabric, CollectiveAlgorithm::Ring, 8).is_none());
    }
}
