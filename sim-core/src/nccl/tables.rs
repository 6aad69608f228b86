//! NCCL's tuner constants, one table per release line ([`NcclTable::of`]), and what each
//! protocol costs under a release.
//!
//! NCCL prices every (algorithm, protocol) of a collective with constants that changed
//! between releases: base and per-hop latencies, the protocols' bandwidth shares and
//! per-channel caps, the ring's "plateau" factor, the graph search's channel speeds. A
//! scenario names its release (`[cluster.network] nccl-version`, [`NcclVersion`]); the
//! protocols' costs (below) and the tuner (`tuner`) read every constant from the table of
//! that release, so one cluster is priced as one NCCL would price it.
//!
//! Every constant is transcribed from NCCL's source at the tag given with the table, and its
//! doc comment names the file and variable. Rows indexed "by generation" are Volta, Ampere,
//! Hopper, Blackwell (the tuner's `GpuGeneration`); rows "by servers" are NCCL's N1 / N2 /
//! N4 (one server, two, more).
//!
//! **What a protocol costs.** A protocol's base latency per collective, its latency per hop
//! by the kind of link crossed, and the share of the link bandwidth that carries data
//! ([`Protocol::base_latency`], [`Protocol::hop_latency`], [`Protocol::wire_ratio`]) are the
//! release's `baseLat`, `hwLat` and the "model refinements" of `ncclTopoTuneModel`
//! (`src/graph/tuning.cc`), which NCCL uses to choose a protocol and an algorithm for every
//! collective. The default (NCCL 2.23-2.27):
//!
//! | | LL | LL128 | Simple |
//! |---|---|---|---|
//! | base latency, ring / tree (us) | 6.6 / 6.8 | 14 / 14 | 8.4 / 8.4 |
//! | per hop over NVLink, ring / tree (us) | 0.6 / 0.6 | 1.9 / 1.25 | 3.4 / 4.0 |
//! | per hop over PCIe, ring / tree (us) | 1.0 / 1.0 | 2.5 / 1.9 | 5.7 / 4.0 |
//! | per hop over the network, ring / tree (us) | 2.7 / 5.0 | 4.0 / 8.5 | 14 / 14 |
//! | data per byte on the wire, ring | 1/2 | 0.92 | 1 |
//! | data per byte on the wire, tree | 1/3.8 | 120/128 (7/9 in one server) | 0.92 |
//!
//! NCCL's tuner also charges a ring over several servers its network post overhead on each
//! in-server step (1 us, 3 us with Simple), and a pipelined ring in its bandwidth regime 1.4
//! times its latency (NCCL's "plateau effect", Ampere and later). parasim's timing keeps the
//! plateau but lets a ring across servers pay its network hops only: its in-server hops are
//! done while the network hops of the same step still send (`overhead::step_extra`).
//!
//! Base latencies scale with the network settings' collective launch (8.4 us by default, the
//! Simple base): a launch of zero (replayed kernels that already include it) zeroes them all.
//!
//! The tables are static data: nothing here depends on a cluster, only on the release.
//!
//! ```
//! use sim_core::nccl::protocol::{Family, Protocol};
//! use sim_core::nccl::tables::NcclTable;
//! use topology::NcclVersion;
//!
//! // Ring/LL's base latency: 3.6 us in NCCL 2.11, 6.6 us in 2.27 (`baseLat`, tuning.cc).
//! assert_eq!(NcclTable::of(NcclVersion::V2_11).base_latency_us(Family::Ring, Protocol::Ll), 3.6);
//! assert_eq!(NcclTable::of(NcclVersion::V2_27).base_latency_us(Family::Ring, Protocol::Ll), 6.6);
//! ```

pub use topology::NcclVersion;

use units::SimDuration;

use crate::nccl::protocol::{Family, Hop, Protocol};

/// When NCCL's tuner charges a ring/Simple allreduce across servers its "plateau effect"
/// factor ([`NcclTable::plateau`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlateauRule {
    /// Once the buffer is at least `ranks x` this many bytes (NCCL 2.11: `info->nBytes >=
    /// info->comm->nRanks/16.0*65536`, `ncclTopoGetAlgoTime`).
    BytesPerRank(u64),
    /// Once each channel's share per rank is at least this many bytes (parasim's reading of
    /// the 2.2x rule, unchanged here so the default keeps its results).
    BytesPerChannelRank(u64),
}

/// One NCCL release line's tuner constants. Indexes: `[family]` is ring then tree,
/// `[protocol]` LL, LL128, Simple, `[hop]` NVLink, PCIe, network.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclTable {
    /// The release line.
    pub version: NcclVersion,
    /// The NCCL tag the constants are transcribed from.
    pub tag: &'static str,
    /// `baseLat` (us), `src/graph/tuning.cc`: a collective's fixed latency by algorithm and
    /// protocol, `[family][protocol]`.
    pub base_latency: [[f64; 3]; 2],
    /// `hwLat` (us), `src/graph/tuning.cc`: latency per hop, `[hop][family][protocol]`.
    pub hop_latency: [[[f64; 3]; 2]; 3],
    /// `intraLat *= 1.8` for LL when the communicator spans servers (`ncclTopoTuneModel`,
    /// 2.11); 1 where the release has no such rule.
    pub ll_intra_multi_node: f64,
    /// A ring's in-server hop costs at least the network post overhead when the ring spans
    /// servers (`getNetOverhead`, 2.19 and later: 1 us, 3 us with Simple).
    pub ring_net_overhead: bool,
    /// A ring with one GPU per server takes the tree's network hop latency (`interLat = ppn ==
    /// 1 ? hwLat[NET][TREE][p] : hwLat[NET][a][p]`, 2.2x); 2.11 takes the ring's.
    pub one_per_node_tree_net_hop: bool,
    /// The network hop latency includes the net plugin's `latencyInter` (2.14 and later), which
    /// parasim takes from the transport's message overhead.
    pub tuner_net_latency: bool,
    /// The share of the links' bus bandwidth ring/LL moves (`busBw * 1.0/4.0` in 2.11,
    /// `busBw * .5` from 2.19).
    pub ring_ll_share: f64,
    /// `llMaxBws` rows for one server, by generation (GB/s, `[generation][servers]`).
    pub ll_max_gpu: [[f64; 3]; 4],
    /// `llMaxBws` rows across servers, by CPU: Intel (and every other vendor), AMD.
    pub ll_max_cpu: [[f64; 3]; 2],
    /// Ring/LL128's share of the links with one GPU per server (`ppn < 2 ? 0.7 : 0.92` in
    /// 2.11; 0.92 in 2.2x).
    pub ring_ll128_share_one_per_node: f64,
    /// Ring/LL128's cap per channel (GB/s, `ll128MaxBwPerCh` in 2.11,
    /// `perChMaxRingLL128Bws` later), `[generation][servers]`.
    pub ring_ll128_per_channel: [[f64; 3]; 4],
    /// Tree/LL128's cap per channel (GB/s, `ll128MaxBwPerCh` in 2.11,
    /// `perChMaxTreeLL128Bws` later), `[generation][servers]`.
    pub tree_ll128_per_channel: [[f64; 3]; 4],
    /// `perChMaxTreeBws` (GB/s), `[generation][servers]` (2.11 has Volta and Ampere rows;
    /// everything that is not sm80 takes Volta's).
    pub tree_per_channel: [[f64; 3]; 4],
    /// `busBw = std::min(busBw, 235.0f)` on sm80 (2.11), by generation.
    pub bus_cap: [Option<f64>; 4],
    /// LL128 is enabled by default on this generation (2.11: "only on Volta/Ampere+NVLink").
    pub ll128_generations: [bool; 4],
    /// The release has NVLS and NVLS-tree (2.17 and later).
    pub nvls: bool,
    /// The ring's "plateau effect" factor on its latency, by generation
    /// (`ncclTopoGetAlgoTime`: `lat *= 1.9` in 2.11, `comm->minCompCap < 80 ? 1.9 : 1.4` later).
    pub plateau: [f64; 4],
    /// When the plateau factor applies.
    pub plateau_rule: PlateauRule,
    /// NCCL's data rate of one NVLink by generation (GB/s): `SM80_NVLINK_WIDTH` = 22 in 2.11's
    /// `src/graph/topo.h`, `SM80_NVLINK_BW` = 20 and `SM90_NVLINK_BW` = 20.6 later.
    pub nvlink_rate: [f64; 4],
    /// The graph search's intra-server speeds (`speedArrayIntra`, `src/graph/search.cc`),
    /// highest first, with which parasim re-runs the search on one NVSwitch server; `None`:
    /// one channel per NVLink (parasim's default reading of the 2.2x search).
    pub intra_speeds: Option<&'static [f64]>,
    /// A tree/Simple allreduce halves its chunk (from the step, `buffSize / NCCL_STEPS`) while
    /// a channel has fewer than `8 x`, `4 x` and `1 x` the tree's depth of chunks, down to
    /// 128, 64 and 32 KiB (`computeColl` in `src/enqueue.cc`, v2.11.4-1 to v2.19.4-1, the tree
    /// depth `nRanks / nNodes - 1 + log2(nNodes)` of `src/graph/connect.cc`); from 2.20 the
    /// chunk stays one step.
    pub tree_simple_chunk_shrinks: bool,
}

/// `speedArrayIntra` at v2.11.4-1 (`src/graph/search.cc`).
const SPEEDS_2_11: [f64; 13] = [44.0, 30.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0];

/// `llMaxBws` at v2.11.4-1: Volta-N1/Intel-N2/Intel-N4, then Ampere-N1/AMD-N2/AMD-N4.
const LL_MAX_2_11: [[f64; 3]; 2] = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0]];
/// `perChMaxTreeBws` at v2.11.4-1: Volta, Ampere.
const TREE_2_11: [[f64; 3]; 2] = [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8]];

/// NCCL 2.10 and 2.11 (`src/graph/tuning.cc`, `search.cc`, `topo.h` at v2.11.4-1; 2.10.3-1
/// has the same constants).
static V2_11: NcclTable = NcclTable {
    version: NcclVersion::V2_11,
    tag: "v2.11.4-1",
    // baseLat: Tree { 4.4, 4.4, 0 }, Ring { 3.6, 10.0, 8.4 }.
    base_latency: [[3.6, 10.0, 8.4], [4.4, 4.4, 0.0]],
    // hwLat: NVLINK Tree { .52, 1.25, 28 } Ring { .47, 1.9, 3.4 }; PCI Tree { 1.0, 1.9, 28 }
    // Ring { 1.0, 2.5, 5.7 }; NET Tree { 5.0, 8.5, 28 } Ring { 2.7, 4.0, 9.6 }.
    hop_latency: [
        [[0.47, 1.9, 3.4], [0.52, 1.25, 28.0]],
        [[1.0, 2.5, 5.7], [1.0, 1.9, 28.0]],
        [[2.7, 4.0, 9.6], [5.0, 8.5, 28.0]],
    ],
    ll_intra_multi_node: 1.8,
    ring_net_overhead: false,
    one_per_node_tree_net_hop: false,
    tuner_net_latency: false,
    ring_ll_share: 0.25,
    // index1 = nNodes == 1 ? compCap80 : cpuVendor == AMD: one server takes Ampere's row on
    // sm80 and Volta's on every other GPU.
    ll_max_gpu: [LL_MAX_2_11[0], LL_MAX_2_11[1], LL_MAX_2_11[0], LL_MAX_2_11[0]],
    ll_max_cpu: LL_MAX_2_11,
    ring_ll128_share_one_per_node: 0.7,
    // ll128MaxBwPerCh = 20.0, every generation and server count.
    ring_ll128_per_channel: [[20.0; 3]; 4],
    tree_ll128_per_channel: [[20.0; 3]; 4],
    tree_per_channel: [TREE_2_11[0], TREE_2_11[1], TREE_2_11[0], TREE_2_11[0]],
    bus_cap: [None, Some(235.0), None, None],
    // pEnable = ... ((minCompCap == 70 && maxCompCap == 70) || (minCompCap == 80 && maxCompCap == 80)).
    ll128_generations: [true, true, false, false],
    nvls: false,
    plateau: [1.9; 4],
    // info->nBytes >= info->comm->nRanks/16.0*65536.
    plateau_rule: PlateauRule::BytesPerRank(65536 / 16),
    // SM70_NVLINK_WIDTH 22.0, SM80_NVLINK_WIDTH 22.0 (cudaCompCap >= 80).
    nvlink_rate: [22.0; 4],
    intra_speeds: Some(&SPEEDS_2_11),
    tree_simple_chunk_shrinks: true,
};

/// NCCL 2.12 and 2.13 (v2.12.12-1; v2.13.4-1 the same): 2.11's constants except the
/// ring/Simple network hop, `hwLat[NET][Ring][Simple]` = 28 us.
static V2_12: NcclTable = NcclTable {
    version: NcclVersion::V2_12,
    tag: "v2.12.12-1",
    hop_latency: [
        [[0.47, 1.9, 3.4], [0.52, 1.25, 28.0]],
        [[1.0, 2.5, 5.7], [1.0, 1.9, 28.0]],
        [[2.7, 4.0, 28.0], [5.0, 8.5, 28.0]],
    ],
    ..V2_11
};

/// `llMaxBws` at v2.27.3-1: Volta-N1/Intel-N2/Intel-N4, Ampere-N1/AMD-N2/AMD-N4, Hopper,
/// Blackwell (`2*141.0, 2*45.0, 2*35.0`).
const LL_MAX_2_27: [[f64; 3]; 4] =
    [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]];

/// NCCL 2.23 to 2.27 (`src/graph/tuning.cc`, `topo.h` at v2.27.3-1): parasim's tables before
/// the version was selectable, the default.
static V2_27: NcclTable = NcclTable {
    version: NcclVersion::V2_27,
    tag: "v2.27.3-1",
    // baseLat: { 6.8, 14.0, 8.4 } (Tree), { 6.6, 14.0, 8.4 } (Ring).
    base_latency: [[6.6, 14.0, 8.4], [6.8, 14.0, 8.4]],
    // hwLat: NVLINK Tree { .6, 1.25, 4.0 } Ring { .6, 1.9, 3.4 }; PCI Tree { 1.0, 1.9, 4.0 }
    // Ring { 1.0, 2.5, 5.7 }; NET Tree { 5.0, 8.5, 14 } Ring { 2.7, 4.0, 14.0 }.
    hop_latency: [
        [[0.6, 1.9, 3.4], [0.6, 1.25, 4.0]],
        [[1.0, 2.5, 5.7], [1.0, 1.9, 4.0]],
        [[2.7, 4.0, 14.0], [5.0, 8.5, 14.0]],
    ],
    ll_intra_multi_node: 1.0,
    ring_net_overhead: true,
    one_per_node_tree_net_hop: true,
    tuner_net_latency: true,
    ring_ll_share: 0.5,
    ll_max_gpu: LL_MAX_2_27,
    ll_max_cpu: [LL_MAX_2_27[0], LL_MAX_2_27[1]],
    ring_ll128_share_one_per_node: 0.92,
    // perChMaxRingLL128Bws: Volta, Ampere 20.0; Hopper 36.7; Blackwell 40.0.
    ring_ll128_per_channel: [[20.0; 3], [20.0; 3], [36.7; 3], [40.0; 3]],
    // perChMaxTreeLL128Bws.
    tree_ll128_per_channel: [[20.0; 3], [20.0; 3], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]],
    // perChMaxTreeBws.
    tree_per_channel: [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]],
    bus_cap: [None; 4],
    ll128_generations: [true; 4],
    nvls: true,
    plateau: [1.9, 1.4, 1.4, 1.4],
    plateau_rule: PlateauRule::BytesPerChannelRank(64),
    // SM80_NVLINK_BW 20.0, SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1.
    nvlink_rate: [20.0, 20.0, 20.6, 40.1],
    intra_speeds: None,
    tree_simple_chunk_shrinks: false,
};

/// The graph search's most channels per graph (`ringGraph.maxChannels = MAXCHANNELS/2` in
/// `src/init.cc`).
const GRAPH_MAX_CHANNELS: u32 = 16;

impl NcclTable {
    /// The table of `version`.
    pub fn of(version: NcclVersion) -> &'static NcclTable {
        match version {
            NcclVersion::V2_11 => &V2_11,
            NcclVersion::V2_12 => &V2_12,
            NcclVersion::V2_27 => &V2_27,
        }
    }

    /// The default release's table (a scenario without `nccl-version`).
    pub fn default_table() -> &'static NcclTable {
        NcclTable::of(NcclVersion::default())
    }

    /// `baseLat` of `family` and `protocol` (us).
    pub fn base_latency_us(&self, family: Family, protocol: Protocol) -> f64 {
        self.base_latency[family_index(family)][protocol_index(protocol)]
    }

    /// `hwLat` of one `hop` (us), LL's in-server hops stretched when the communicator spans
    /// servers (`multi_server`, [`NcclTable::ll_intra_multi_node`]).
    pub fn hop_latency_us(&self, family: Family, protocol: Protocol, hop: Hop, multi_server: bool) -> f64 {
        let hop_index = match hop {
            Hop::NvLink => 0,
            Hop::Pci => 1,
            Hop::Net => 2,
        };
        let latency = self.hop_latency[hop_index][family_index(family)][protocol_index(protocol)];
        if multi_server && hop != Hop::Net && protocol == Protocol::Ll {
            latency * self.ll_intra_multi_node
        } else {
            latency
        }
    }

    /// The channels and their speed (GB/s) of NCCL's ring graph inside one NVLink server whose
    /// GPUs have `nvlinks` links each: [`NcclTable::intra_speeds`]'s search (the highest speed
    /// whose channels fill the GPU's links, else the best product while the next speed is more
    /// than 0.49 of the best, at most 16 channels; doubled at half the speed when at least
    /// 25 GB/s, `ncclTopoCompute`), or one channel per NVLink without a speed list.
    pub fn intra_graph(&self, generation_index: usize, nvlinks: f64) -> (f64, f64) {
        let rate = self.nvlink_rate[generation_index];
        let total = nvlinks * rate;
        let Some(speeds) = self.intra_speeds else {
            let channels = nvlinks.round().clamp(1.0, 32.0);
            return (channels, total / channels);
        };
        let max = f64::from(GRAPH_MAX_CHANNELS);
        let mut index = speeds.iter().position(|&speed| speed <= total).unwrap_or(speeds.len() - 1);
        let mut best = (0.0_f64, 0.0_f64);
        loop {
            let speed = speeds[index];
            let channels = (total / speed + 1e-9).floor().min(max);
            if channels * speed > best.0 * best.1 {
                best = (channels, speed);
            }
            if best.0 * best.1 >= total - 1e-9 {
                break;
            }
            match speeds.get(index + 1) {
                Some(&next) if best.0 == 0.0 || next / best.1 > 0.49 => index += 1,
                _ => break,
            }
        }
        if best.0 == 0.0 {
            return (1.0, total.min(speeds[speeds.len() - 1]));
        }
        if best.1 >= 25.0 {
            // `dupChannels = std::min(graph->nChannels*2, graph->maxChannels)`, speed divided by
            // DIVUP(dupChannels, nChannels).
            let doubled = (best.0 * 2.0).min(max);
            let divisor = (doubled / best.0).ceil();
            best = (doubled, best.1 / divisor);
        }
        best
    }
}

fn family_index(family: Family) -> usize {
    match family {
        Family::Ring => 0,
        Family::Tree => 1,
    }
}

fn protocol_index(protocol: Protocol) -> usize {
    match protocol {
        Protocol::Ll => 0,
        Protocol::Ll128 => 1,
        Protocol::Simple => 2,
    }
}

/// NCCL's base latency of the Simple protocol (us), the default collective launch.
pub const SIMPLE_BASE_US: f64 = 8.4;

/// What a protocol costs under a release's table.
impl Protocol {
    /// Base latency of one collective with this protocol, for a collective launch `launch`
    /// (the release's `baseLat`, [`NcclTable::base_latency`], scaled by `launch / 8.4 us`).
    pub fn base_latency(self, table: &NcclTable, family: Family, launch: SimDuration) -> SimDuration {
        let ps = launch.as_ps() as f64 * table.base_latency_us(family, self) / SIMPLE_BASE_US;
        SimDuration::from_ps(ps.round() as u64)
    }

    /// Latency of one hop of a step (the release's `hwLat`, [`NcclTable::hop_latency_us`]);
    /// `multi_server`: the collective spans servers.
    pub fn hop_latency(self, table: &NcclTable, family: Family, hop: Hop, multi_server: bool) -> SimDuration {
        let ns = table.hop_latency_us(family, self, hop, multi_server) * 1e3;
        SimDuration::from_ps((ns * 1e3).round() as u64)
    }

    /// The network post overhead NCCL's tuner charges every in-server step of a ring across
    /// servers at least (NCCL's `getNetOverhead`, 1 us on x86, tripled for Simple; zero in
    /// releases without it); in a ring whose steps are alike it is hidden behind the network
    /// hops (`collective::step_extra`).
    pub fn ring_net_overhead(self, table: &NcclTable) -> SimDuration {
        if !table.ring_net_overhead {
            return SimDuration::ZERO;
        }
        SimDuration::from_us(if self == Protocol::Simple { 3 } else { 1 })
    }

    /// Bytes on the wire per byte of data, as `(numerator, denominator)`: the inverse of
    /// NCCL's bandwidth factor for this protocol (`single_server`: the group is inside one
    /// server, where LL128 trees reach 7/9 rather than 120/128).
    /// Ring/LL moves the release's [`NcclTable::ring_ll_share`] (1/2, or 1/4 in NCCL 2.11).
    pub fn wire_ratio(self, table: &NcclTable, family: Family, single_server: bool) -> (u64, u64) {
        match (self, family) {
            (Protocol::Simple, Family::Ring) => (1, 1),
            (Protocol::Simple, Family::Tree) => (25, 23), // 1 / 0.92
            (Protocol::Ll, Family::Ring) => ((1.0 / table.ring_ll_share).round() as u64, 1),
            (Protocol::Ll, Family::Tree) => (19, 5), // 3.8
            (Protocol::Ll128, Family::Ring) => (25, 23),
            (Protocol::Ll128, Family::Tree) if single_server => (9, 7),
            (Protocol::Ll128, Family::Tree) => (128, 120),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_selects_its_releases_constants() {
        let old = NcclTable::of(NcclVersion::V2_11);
        let new = NcclTable::of(NcclVersion::V2_27);
        assert_eq!(old.tag, "v2.11.4-1");
        // baseLat.
        assert_eq!(old.base_latency_us(Family::Ring, Protocol::Ll128), 10.0);
        assert_eq!(old.base_latency_us(Family::Tree, Protocol::Ll), 4.4);
        assert_eq!(old.base_latency_us(Family::Tree, Protocol::Simple), 0.0);
        assert_eq!(new.base_latency_us(Family::Tree, Protocol::Ll), 6.8);
        assert_eq!(new.base_latency_us(Family::Ring, Protocol::Ll128), 14.0);
        // hwLat, with 2.11's LL in-server hops 1.8 times slower across servers.
        assert_eq!(old.hop_latency_us(Family::Tree, Protocol::Simple, Hop::NvLink, false), 28.0);
        assert_eq!(new.hop_latency_us(Family::Tree, Protocol::Simple, Hop::NvLink, false), 4.0);
        assert_eq!(old.hop_latency_us(Family::Ring, Protocol::Ll, Hop::NvLink, false), 0.47);
        assert!((old.hop_latency_us(Family::Ring, Protocol::Ll, Hop::NvLink, true) - 0.846).abs() < 1e-12);
        assert_eq!(new.hop_latency_us(Family::Ring, Protocol::Ll, Hop::NvLink, true), 0.6);
        assert_eq!(old.hop_latency_us(Family::Ring, Protocol::Simple, Hop::Net, false), 9.6);
        // 2.12 differs from 2.11 in its ring/Simple network hop only.
        let v2_12 = NcclTable::of(NcclVersion::V2_12);
        assert_eq!(v2_12.hop_latency_us(Family::Ring, Protocol::Simple, Hop::Net, false), 28.0);
        assert_eq!(
            NcclTable { hop_latency: old.hop_latency, tag: old.tag, version: old.version, ..v2_12.clone() },
            *old
        );
        // Bandwidth refinements.
        assert_eq!((old.ring_ll_share, new.ring_ll_share), (0.25, 0.5));
        assert_eq!(old.bus_cap[1], Some(235.0));
        assert_eq!(old.ll_max_gpu[2], [39.0, 39.0, 20.4], "2.11 knows no Hopper row: Volta's");
        assert_eq!(new.ll_max_gpu[2], [141.0, 45.0, 35.0]);
        assert!(!old.nvls && new.nvls);
        assert!(!old.ll128_generations[2] && new.ll128_generations[2]);
        assert_eq!((old.plateau[1], new.plateau[1]), (1.9, 1.4));
        assert_eq!(NcclTable::default_table().version, NcclVersion::V2_27);
    }

    #[test]
    fn the_graph_search_finds_nccls_channels_on_an_a100_server() {
        // 12 NVLinks: NCCL 2.11 sees 12 x 22 = 264 GB/s, 6 channels at 44 fill it, doubled to
        // 12 at 22 GB/s; 2.27 one channel per link, 12 at 20.
        assert_eq!(NcclTable::of(NcclVersion::V2_11).intra_graph(1, 12.0), (12.0, 22.0));
        assert_eq!(NcclTable::of(NcclVersion::V2_27).intra_graph(1, 12.0), (12.0, 20.0));
        // 6 NVLinks (132 GB/s): 44 x 3 fills them; doubled to 6 at 22.
        assert_eq!(NcclTable::of(NcclVersion::V2_11).intra_graph(1, 6.0), (6.0, 22.0));
    }

    #[test]
    fn versions_parse_from_any_of_their_releases_and_name_the_valid_ones() {
        assert_eq!("2.10".parse::<NcclVersion>(), Ok(NcclVersion::V2_11));
        assert_eq!("2.11".parse::<NcclVersion>(), Ok(NcclVersion::V2_11));
        assert_eq!("2.13".parse::<NcclVersion>(), Ok(NcclVersion::V2_12));
        assert_eq!("2.27".parse::<NcclVersion>(), Ok(NcclVersion::V2_27));
        let error = "2.18".parse::<NcclVersion>().unwrap_err();
        assert!(error.contains("\"2.18\"") && error.contains("2.10, 2.11, 2.12"), "{error}");
    }

    #[test]
    fn base_latencies_are_nccls_at_the_default_launch_and_vanish_without_one() {
        let launch = SimDuration::from_ns(8_400);
        let table = NcclTable::default_table();
        assert_eq!(Protocol::Ll.base_latency(table, Family::Ring, launch), SimDuration::from_ns(6_600));
        assert_eq!(Protocol::Ll128.base_latency(table, Family::Tree, launch), SimDuration::from_us(14));
        assert_eq!(Protocol::Simple.base_latency(table, Family::Tree, launch), launch);
        assert_eq!(Protocol::Ll.base_latency(table, Family::Tree, SimDuration::ZERO), SimDuration::ZERO);
        // NCCL 2.11: ring/LL 3.6 us, tree/Simple none (its 28 us hops carry it).
        let old = NcclTable::of(NcclVersion::V2_11);
        assert_eq!(Protocol::Ll.base_latency(old, Family::Ring, launch), SimDuration::from_ns(3_600));
        assert_eq!(Protocol::Simple.base_latency(old, Family::Tree, launch), SimDuration::ZERO);
    }

    #[test]
    fn ll_halves_the_bandwidth_and_simple_keeps_it_on_rings() {
        let table = NcclTable::default_table();
        assert_eq!(Protocol::Ll.wire_ratio(table, Family::Ring, false), (2, 1));
        assert_eq!(Protocol::Simple.wire_ratio(table, Family::Ring, false), (1, 1));
        let old = NcclTable::of(NcclVersion::V2_11);
        assert_eq!(Protocol::Ll.wire_ratio(old, Family::Ring, false), (4, 1));
        assert!(
            Protocol::Ll.hop_latency(table, Family::Ring, Hop::Net, true)
                < Protocol::Simple.hop_latency(table, Family::Ring, Hop::Net, true)
        );
    }
}
