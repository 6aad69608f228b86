//! What the user asks for: the inter-node network ([`NetworkSpec`]), its fabric
//! ([`FabricSpec`] and the per-shape specs) and its routing ([`Routing`]).
//!
//! These are plain data with public fields, checked when [`crate::Topology::build`] builds
//! them. The constructors below fill in the standard shapes.

use std::fmt;
use std::str::FromStr;

use units::{Bandwidth, SimDuration};

use crate::{LinkSpec, TopologyError};

/// The network between servers: its fabric, its routing and how servers attach to it.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkSpec {
    /// The switches and cables between the NICs.
    pub fabric: FabricSpec,
    /// How routes are chosen; [`Routing::Auto`] is the fabric's default.
    pub routing: Routing,
    /// NICs per server; `None` is one per GPU (the GPU is then the fabric's terminal itself).
    /// Otherwise in `1..=gpus_per_node`: NIC `i` of a server serves its GPUs
    /// `i*g/n .. (i+1)*g/n` (integer division).
    pub nics_per_node: Option<u32>,
    /// Rail-optimized wiring: NIC `i` of every server is terminal `i * nodes + node`, so the
    /// same NIC of consecutive servers shares a leaf (a "rail", as in DGX SuperPOD). Otherwise
    /// a server's NICs are consecutive terminals and share a leaf.
    pub rail_optimized: bool,
    /// The PCIe link between a GPU and its NIC; used (and required) only when GPUs share NICs
    /// (`nics_per_node` less than the GPUs per server).
    pub gpu_to_nic: Option<LinkSpec>,
    /// The transport the communication library runs over the fabric, and its costs.
    pub transport: Transport,
}

/// The kind of transport between servers: what carries a communication library's messages
/// over the fabric (NCCL's net plugin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// InfiniBand verbs with GPUDirect RDMA (NCCL's `IB` transport).
    #[default]
    InfiniBand,
    /// RDMA over Converged Ethernet (NCCL's `IB` transport on RoCE NICs).
    Roce,
    /// TCP-based GPUDirect (GCP's GPUDirect-TCPX / TCPXO net plugins).
    TcpDirect,
    /// Plain TCP sockets through host memory (NCCL's `Socket` transport).
    Ethernet,
}

impl TransportKind {
    /// Every kind, in the order error messages list them.
    pub const ALL: [TransportKind; 4] =
        [TransportKind::InfiniBand, TransportKind::Roce, TransportKind::TcpDirect, TransportKind::Ethernet];

    /// The name scenario files use.
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::InfiniBand => "infiniband",
            TransportKind::Roce => "roce",
            TransportKind::TcpDirect => "tcp-direct",
            TransportKind::Ethernet => "ethernet",
        }
    }

    /// The software cost of one message over the fabric on top of NCCL's own per-hop network
    /// latencies (which NCCL measured on InfiniBand): zero for RDMA transports; for TCP-based
    /// ones the proxy/network-thread cost of every message. `tcp-direct`'s 15 us comes from
    /// the one published TCPXO curve in `data/validation` (its small-size floor of 123 us,
    /// under the tree/Simple allreduce GCP's TCPXO configuration runs: see
    /// `scenarios/nccl-2x8-h100.toml`), so that floor does not validate it; plain sockets add
    /// their copies through host memory on top.
    pub const fn default_message_overhead(self) -> SimDuration {
        match self {
            TransportKind::InfiniBand | TransportKind::Roce => SimDuration::ZERO,
            TransportKind::TcpDirect => SimDuration::from_us(15),
            TransportKind::Ethernet => SimDuration::from_us(60),
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TransportKind {
    type Err = TopologyError;
    fn from_str(input: &str) -> Result<TransportKind, TopologyError> {
        TransportKind::ALL.into_iter().find(|k| k.name() == input).ok_or_else(|| TopologyError::Invalid {
            parameter: "transport",
            problem: format!(
                "unknown transport {input:?}; valid: {}",
                TransportKind::ALL.map(|k| format!("{:?}", k.name())).join(", ")
            ),
        })
    }
}

/// The transport between servers and what it costs beyond the links' latency and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transport {
    /// What carries the messages.
    pub kind: TransportKind,
    /// Software cost per message per network hop, added to every step of a collective that
    /// crosses the fabric (see [`TransportKind::default_message_overhead`]).
    pub message_overhead: SimDuration,
    /// Fixed cost of every channel (CUDA block) a collective runs on, inside servers as well
    /// as across them: the communication library's per-channel work on this system, on top
    /// of its per-step latencies. NCCL runs fewer channels for smaller buffers (`enqueue.cc`),
    /// so this cost grows with the size until every channel is in use. Zero by default.
    pub channel_overhead: SimDuration,
    /// The rate at which an LL step reaches the network through host memory: NCCL's network
    /// transport keeps LL's send buffer in host memory and its proxy posts a step only once
    /// every line of it is there (`netSendSetup` and `netSendProxy` in `src/transport/net.cc`),
    /// so each network hop of an LL collective's first chunk waits for the whole chunk at this
    /// rate. `None` (the default): no such cost.
    pub ll_host_rate: Option<Bandwidth>,
    /// The share of the links' line rate the transport delivers (the fabric's links are
    /// already scaled by it; kept for what sees line rates, such as NCCL's tuner).
    pub efficiency: f64,
    /// The servers' CPU vendor: NCCL's tuner caps the LL protocol's bandwidth across servers
    /// by a row of its table chosen by it (`llMaxBws`, `tuning.cc`).
    pub host_cpu: HostCpu,
    /// The NCCL release whose tuner constants price and choose the collectives
    /// (`sim_core::nccl::tables::NcclTable`): NCCL's tables changed between releases.
    pub nccl_version: NcclVersion,
    /// The switches reduce in the network (InfiniBand SHARP): NCCL's CollNet algorithms can
    /// run an allreduce's cross-server part in the switches.
    pub sharp: bool,
    /// The run's own NCCL settings (its environment, or what a tuner plugin decides for it):
    /// which algorithms and protocols NCCL may choose, and its Simple buffer.
    pub nccl: NcclSettings,
}

/// What a run's NCCL configuration fixes that NCCL's defaults would not: `NCCL_ALGO` (and
/// `NCCL_NVLS_ENABLE=0`, or a tuner plugin's rule), `NCCL_PROTO` and `NCCL_BUFFSIZE`. The
/// default is NCCL's own: every algorithm and protocol, 4 MiB buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclSettings {
    /// The algorithms NCCL's tuner may choose for an allreduce.
    pub algorithms: NcclAlgorithms,
    /// The protocols NCCL's tuner may choose.
    pub protocols: NcclProtocols,
    /// `NCCL_BUFFSIZE`: the Simple protocol's buffer per connection (bytes), which NCCL cuts
    /// into `NCCL_STEPS` = 8 steps; a tree's Simple chunk is one step (`calcCollChunking` in
    /// `src/enqueue.cc`, 2.20 and later). 4 MiB by default (`DEFAULT_BUFFSIZE` in
    /// `src/include/comm.h`). The LL and LL128 buffers are not this one (`NCCL_LL_BUFFSIZE`,
    /// `NCCL_LL128_BUFFSIZE`).
    pub buffsize: u64,
}

impl NcclSettings {
    /// NCCL's defaults.
    pub const DEFAULT: NcclSettings =
        NcclSettings { algorithms: NcclAlgorithms::ALL, protocols: NcclProtocols::ALL, buffsize: 4 << 20 };

    /// `NCCL_STEPS` (`src/include/device.h`): the steps a connection's buffer is cut into.
    pub const STEPS: u64 = 8;

    /// A tree's Simple chunk: one step of the buffer.
    pub fn simple_step(&self) -> u64 {
        self.buffsize / NcclSettings::STEPS
    }

    /// Checks an `NCCL_BUFFSIZE` value: a positive multiple of [`NcclSettings::STEPS`] bytes.
    pub fn check_buffsize(bytes: u64) -> Result<u64, String> {
        if bytes == 0 || bytes % NcclSettings::STEPS != 0 {
            return Err(format!(
                "is {bytes} bytes; give a positive multiple of {} bytes (NCCL cuts its buffer into NCCL_STEPS = {} \
                 steps; NCCL's default is 4 MiB)",
                NcclSettings::STEPS,
                NcclSettings::STEPS
            ));
        }
        Ok(bytes)
    }
}

impl Default for NcclSettings {
    fn default() -> NcclSettings {
        NcclSettings::DEFAULT
    }
}

/// A set of names, one bit each, parsed from a list (case-insensitively, `-` and `_` ignored,
/// so NCCL's own spellings such as `NVLSTree` and `CollnetDirect` are accepted).
fn parse_set(names: &[String], valid: &[&str], what: &str) -> Result<u8, String> {
    let normalize = |name: &str| name.to_ascii_lowercase().replace(['-', '_'], "");
    if names.is_empty() {
        return Err(format!("is empty: NCCL would have no {what} to run; valid: {}", valid.join(", ")));
    }
    let mut set = 0u8;
    for name in names {
        let index = valid
            .iter()
            .position(|v| normalize(v) == normalize(name))
            .ok_or_else(|| format!("has unknown {what} {name:?}; valid: {}", valid.join(", ")))?;
        set |= 1 << index;
    }
    Ok(set)
}

/// True if the name is a member of `set`; names not in `valid` are not restricted.
fn set_allows(set: u8, valid: &[&str], name: &str) -> bool {
    valid.iter().position(|&n| n == name).is_none_or(|index| set & (1 << index) != 0)
}

/// The names of the members of `set`.
fn set_names(set: u8, valid: &[&'static str]) -> Vec<&'static str> {
    valid.iter().enumerate().filter(|&(index, _)| set & (1 << index) != 0).map(|(_, &name)| name).collect()
}

/// The allreduce algorithms NCCL may choose (`NCCL_ALGO`; NVLS and NVLS-tree also go with
/// `NCCL_NVLS_ENABLE=0`), by parasim's algorithm names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclAlgorithms(u8);

impl NcclAlgorithms {
    /// NCCL's algorithms, by the names parasim's `--algorithm` takes.
    pub const NAMES: [&'static str; 6] =
        ["ring", "tree", "nvls", "nvls-tree", "collnet-direct", "collnet-chain"];

    /// Every algorithm.
    pub const ALL: NcclAlgorithms = NcclAlgorithms(0b11_1111);

    /// The algorithms of a list such as `NCCL_ALGO`'s (`["ring", "tree"]`).
    pub fn from_names(names: &[String]) -> Result<NcclAlgorithms, String> {
        parse_set(names, &NcclAlgorithms::NAMES, "algorithm").map(NcclAlgorithms)
    }

    /// True if the algorithm of this name (parasim's, e.g. `nvls-tree`) may run; names that
    /// are not NCCL algorithms are not restricted.
    pub fn allows(self, name: &str) -> bool {
        set_allows(self.0, &NcclAlgorithms::NAMES, name)
    }

    /// The names in the set.
    pub fn names(self) -> Vec<&'static str> {
        set_names(self.0, &NcclAlgorithms::NAMES)
    }
}

/// The protocols NCCL may choose (`NCCL_PROTO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclProtocols(u8);

impl NcclProtocols {
    /// NCCL's protocols.
    pub const NAMES: [&'static str; 3] = ["LL", "LL128", "Simple"];

    /// Every protocol.
    pub const ALL: NcclProtocols = NcclProtocols(0b111);

    /// The protocols of a list such as `NCCL_PROTO`'s (`["Simple"]`).
    pub fn from_names(names: &[String]) -> Result<NcclProtocols, String> {
        parse_set(names, &NcclProtocols::NAMES, "protocol").map(NcclProtocols)
    }

    /// True if the protocol of this name (`LL`, `LL128`, `Simple`) may run.
    pub fn allows(self, name: &str) -> bool {
        set_allows(self.0, &NcclProtocols::NAMES, name)
    }

    /// The names in the set.
    pub fn names(self) -> Vec<&'static str> {
        set_names(self.0, &NcclProtocols::NAMES)
    }
}

/// The vendor of the servers' CPUs, as NCCL's topology detection reports it
/// (`ncclTopoCpuType`): its tuner takes the AMD row of its LL bandwidth table for AMD hosts
/// and the Intel row for every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostCpu {
    /// Intel Xeon (NCCL's default row).
    #[default]
    Intel,
    /// AMD EPYC.
    Amd,
    /// Arm (Grace and others).
    Arm,
    /// IBM POWER.
    Power,
}

impl HostCpu {
    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            HostCpu::Intel => "intel",
            HostCpu::Amd => "amd",
            HostCpu::Arm => "arm",
            HostCpu::Power => "power",
        }
    }
}

impl std::str::FromStr for HostCpu {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [HostCpu::Intel, HostCpu::Amd, HostCpu::Arm, HostCpu::Power]
            .into_iter()
            .find(|cpu| cpu.name() == text)
            .ok_or_else(|| format!("unknown host CPU {text:?}; valid: intel, amd, arm, power"))
    }
}

/// An NCCL release line with its own tuner constants (`src/graph/tuning.cc`,
/// `src/graph/search.cc`, `src/enqueue.cc`). Releases whose constants are the same share a
/// variant; the scenario names one release of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
pub enum NcclVersion {
    /// NCCL 2.10 and 2.11 (tables as at tag v2.11.4-1): ring/LL at a quarter of the links,
    /// base latencies 3.6/10/8.4 us (ring) and 4.4/4.4/0 us (tree), no NVLS.
    V2_11,
    /// NCCL 2.12 and 2.13 (v2.12.12-1): as 2.11, except a ring/Simple network hop of 28 us.
    V2_12,
    /// NCCL 2.23 to 2.27 (v2.27.3-1), parasim's tables before versions were selectable and
    /// the default: ring/LL at half the links, base latencies 6.6/14/8.4 us (ring) and
    /// 6.8/14/8.4 us (tree), NVLS on Hopper and later.
    #[default]
    V2_27,
}

impl NcclVersion {
    /// Every version, oldest first.
    pub const ALL: [NcclVersion; 3] = [NcclVersion::V2_11, NcclVersion::V2_12, NcclVersion::V2_27];

    /// The scenario spelling (`"2.11"`).
    pub fn name(self) -> &'static str {
        match self {
            NcclVersion::V2_11 => "2.11",
            NcclVersion::V2_12 => "2.12",
            NcclVersion::V2_27 => "2.27",
        }
    }

    /// The releases that share this version's constants (`"2.10, 2.11"`).
    pub fn releases(self) -> &'static [&'static str] {
        match self {
            NcclVersion::V2_11 => &["2.10", "2.11"],
            NcclVersion::V2_12 => &["2.12", "2.13"],
            NcclVersion::V2_27 => &["2.23", "2.24", "2.25", "2.26", "2.27"],
        }
    }
}

impl std::str::FromStr for NcclVersion {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        NcclVersion::ALL.into_iter().find(|version| version.releases().contains(&text)).ok_or_else(|| {
            let valid: Vec<&str> =
                NcclVersion::ALL.iter().flat_map(|version| version.releases().iter().copied()).collect();
            format!("unknown NCCL version {text:?}; valid: {}", valid.join(", "))
        })
    }
}

impl Transport {
    /// `kind` with its default costs.
    pub const fn new(kind: TransportKind) -> Transport {
        Transport {
            kind,
            message_overhead: kind.default_message_overhead(),
            channel_overhead: SimDuration::ZERO,
            ll_host_rate: None,
            efficiency: 1.0,
            host_cpu: HostCpu::Intel,
            nccl_version: NcclVersion::V2_27,
            sharp: false,
            nccl: NcclSettings::DEFAULT,
        }
    }
}

impl Default for Transport {
    fn default() -> Transport {
        Transport::new(TransportKind::InfiniBand)
    }
}

impl NetworkSpec {
    /// "switch, 200 Gb/s 1 us per GPU" (or "per NIC, 4 NICs for 8 GPUs" when GPUs share
    /// NICs), or the fabric's own description: what reports print for the network between
    /// servers of `devices_per_node` devices, each called `device` ("GPU", "CPU"); ", SHARP"
    /// when the switches reduce.
    pub fn describe(&self, devices_per_node: u32, device: &str) -> String {
        let fabric = self.describe_fabric(devices_per_node, device);
        if self.transport.sharp { format!("{fabric}, SHARP") } else { fabric }
    }

    fn describe_fabric(&self, devices_per_node: u32, device: &str) -> String {
        match &self.fabric {
            FabricSpec::Switch { link } => {
                let per = match self.nics_per_node {
                    Some(nics) if nics < devices_per_node => {
                        format!("per NIC, {nics} NICs for {devices_per_node} {device}s per node")
                    }
                    _ => format!("per {device}"),
                };
                format!("switch, {} {} {per}", link.bandwidth.display_bits(), link.latency)
            }
            fabric => fabric.to_string(),
        }
    }

    /// One non-blocking switch, one `link` per GPU: the simplest cluster network.
    pub fn single_switch(link: LinkSpec) -> NetworkSpec {
        NetworkSpec::new(FabricSpec::Switch { link })
    }

    /// `fabric` with its default routing, one NIC per GPU, no rails.
    pub fn new(fabric: FabricSpec) -> NetworkSpec {
        NetworkSpec {
            fabric,
            routing: Routing::Auto,
            nics_per_node: None,
            rail_optimized: false,
            gpu_to_nic: None,
            transport: Transport::default(),
        }
    }
}

/// The shape of the inter-node fabric. Every fabric has *terminals* (the NICs, or the GPUs
/// when each GPU has its own NIC), numbered densely; see the crate documentation for how
/// servers map onto them. A fabric may have more terminal positions than the cluster needs:
/// the first ones are populated, the rest stay empty.
#[derive(Debug, Clone, PartialEq)]
pub enum FabricSpec {
    /// One non-blocking switch; every terminal has one `link` to it. Sized by the cluster.
    Switch {
        /// Terminal-to-switch link.
        link: LinkSpec,
    },
    /// An extended generalized fat-tree (XGFT), which covers k-ary n-trees and leaf-spine.
    FatTree(XgftSpec),
    /// A dragonfly with all-to-all groups (Kim et al. 2008).
    Dragonfly(DragonflySpec),
    /// SimGrid 3.32's Cray-Cascade-like dragonfly (groups of chassis of routers).
    CascadeDragonfly(CascadeSpec),
    /// An n-dimensional torus of routers with wraparound links, one terminal per router
    /// (routers in mixed-radix order, dimension 0 fastest). A dimension of size 2 has one
    /// cable between its two routers, not two; a dimension of size 1 has none. The terminal
    /// links are `link` too.
    Torus {
        /// Routers along each dimension.
        dims: Vec<u32>,
        /// Every link: router to router and terminal to router.
        link: LinkSpec,
    },
    /// A bidirectional ring of routers, one per terminal: the one-dimensional torus sized by
    /// the cluster.
    Ring {
        /// Every link: router to router and terminal to router.
        link: LinkSpec,
    },
    /// A direct cable between every pair of terminals, no switches. Sized by the cluster.
    FullyConnected {
        /// Every terminal-to-terminal link.
        link: LinkSpec,
    },
}

impl FabricSpec {
    /// The link between a terminal (a NIC) and the fabric (`None` for a fat-tree without
    /// levels, which [`crate::Topology::build`] refuses).
    pub fn terminal_link(&self) -> Option<LinkSpec> {
        match self {
            FabricSpec::Switch { link }
            | FabricSpec::Torus { link, .. }
            | FabricSpec::Ring { link }
            | FabricSpec::FullyConnected { link } => Some(*link),
            FabricSpec::FatTree(spec) => spec.links.first().copied(),
            FabricSpec::Dragonfly(spec) => Some(spec.terminal),
            FabricSpec::CascadeDragonfly(spec) => Some(spec.terminal),
        }
    }

    /// The fabric's name, as scenario files and messages write it.
    pub fn name(&self) -> &'static str {
        match self {
            FabricSpec::Switch { .. } => "switch",
            FabricSpec::FatTree(_) => "fat-tree",
            FabricSpec::Dragonfly(_) => "dragonfly",
            FabricSpec::CascadeDragonfly(_) => "cascade-dragonfly",
            FabricSpec::Torus { .. } => "torus",
            FabricSpec::Ring { .. } => "ring",
            FabricSpec::FullyConnected { .. } => "fully-connected",
        }
    }

    /// The routings this fabric accepts, the default first.
    pub fn valid_routings(&self) -> &'static [Routing] {
        match self {
            FabricSpec::FatTree(_) => &[Routing::DModK, Routing::Ecmp],
            FabricSpec::Dragonfly(_) | FabricSpec::CascadeDragonfly(_) => {
                &[Routing::Minimal, Routing::Valiant, Routing::Ugal]
            }
            FabricSpec::Switch { .. }
            | FabricSpec::Torus { .. }
            | FabricSpec::Ring { .. }
            | FabricSpec::FullyConnected { .. } => &[Routing::Shortest],
        }
    }

    /// `routing` with [`Routing::Auto`] replaced by this fabric's default; an error naming the
    /// valid ones if the fabric cannot route that way.
    pub fn resolve_routing(&self, routing: Routing) -> Result<Routing, TopologyError> {
        let valid = self.valid_routings();
        if routing == Routing::Auto {
            return Ok(valid[0]);
        }
        if valid.contains(&routing) {
            Ok(routing)
        } else {
            let names: Vec<String> = valid
                .iter()
                .enumerate()
                .map(|(i, r)| if i == 0 { format!("\"{r}\" (the default)") } else { format!("\"{r}\"") })
                .collect();
            Err(TopologyError::UnsupportedRouting {
                routing,
                fabric: self.name(),
                valid: format!("{}, or \"auto\"", names.join(", ")),
            })
        }
    }
}

impl fmt::Display for FabricSpec {
    /// A one-line description: `fat-tree 3;2,2,4;1,2,2;1,1,1`, `torus 4x4x4`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>();
        match self {
            FabricSpec::Switch { link } | FabricSpec::Ring { link } | FabricSpec::FullyConnected { link } => {
                write!(f, "{}, {} {} links", self.name(), link.bandwidth.display_bits(), link.latency)
            }
            FabricSpec::FatTree(x) => write!(
                f,
                "fat-tree {};{};{};{}",
                x.levels,
                list(&x.down).join(","),
                list(&x.up).join(","),
                list(&x.count).join(",")
            ),
            FabricSpec::Dragonfly(d) => write!(
                f,
                "dragonfly {} groups x {} routers x {} hosts, {} global links per router",
                d.groups, d.routers_per_group, d.hosts_per_router, d.global_links_per_router
            ),
            FabricSpec::CascadeDragonfly(c) => write!(
                f,
                "cascade-dragonfly {},{};{},{};{},{};{}",
                c.groups,
                c.global_links,
                c.chassis_per_group,
                c.chassis_links,
                c.routers_per_chassis,
                c.router_links,
                c.hosts_per_router
            ),
            FabricSpec::Torus { dims, link } => write!(
                f,
                "torus {}, {} {} links",
                list(dims).join("x"),
                link.bandwidth.display_bits(),
                link.latency
            ),
        }
    }
}

/// How a route is chosen among the fabric's paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Routing {
    /// The fabric's default: D-mod-K on fat-trees, minimal on dragonflies, shortest
    /// (dimension order on tori) elsewhere.
    Auto,
    /// The fabric's unique or canonical shortest path: switch, fully connected, ring and
    /// torus (dimension-order: dimension 0 first, the shorter way round, ties the positive
    /// way).
    Shortest,
    /// Fat-trees: every up-port (and parallel cable) chosen by a deterministic hash of
    /// (source host, destination host, flow id, level).
    Ecmp,
    /// Fat-trees: destination-mod-k, as SimGrid 3.32 and InfiniBand's ftree routing do.
    DModK,
    /// Dragonflies: at most one global hop.
    Minimal,
    /// Dragonflies: through an intermediate group chosen by a deterministic hash of
    /// (source, destination, flow id), then minimally to the destination.
    Valiant,
    /// Dragonflies: minimal or Valiant per flow, chosen by the flow model from its link loads
    /// (see [`crate::Topology::route_candidates`]).
    Ugal,
}

impl Routing {
    /// The name scenario files use.
    pub fn name(self) -> &'static str {
        match self {
            Routing::Auto => "auto",
            Routing::Shortest => "shortest",
            Routing::Ecmp => "ecmp",
            Routing::DModK => "dmodk",
            Routing::Minimal => "minimal",
            Routing::Valiant => "valiant",
            Routing::Ugal => "ugal",
        }
    }

    const ALL: [Routing; 7] = [
        Routing::Auto,
        Routing::Shortest,
        Routing::Ecmp,
        Routing::DModK,
        Routing::Minimal,
        Routing::Valiant,
        Routing::Ugal,
    ];
}

impl fmt::Display for Routing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Routing {
    type Err = TopologyError;
    fn from_str(input: &str) -> Result<Routing, TopologyError> {
        Routing::ALL.into_iter().find(|r| r.name() == input).ok_or_else(|| TopologyError::Invalid {
            parameter: "routing",
            problem: format!(
                "unknown routing {input:?}; valid: \"auto\", \"shortest\", \"ecmp\", \"dmodk\", \"minimal\", \
                 \"valiant\", \"ugal\""
            ),
        })
    }
}

/// An extended generalized fat-tree, XGFT(levels; down; up) with parallel cables, in SimGrid's
/// notation (`LEVELS;DOWN;UP;COUNT`). Level 0 is the terminals, level `levels` the top
/// switches.
///
/// Switches at level `l` (1-based) number `prod(down[l..]) * prod(up[..l])`; terminal
/// positions number `prod(down)`. Terminals are numbered so that consecutive ones share a leaf
/// switch, then a pod, as in SimGrid (`h<i>` is leaf position `i`).
#[derive(Debug, Clone, PartialEq)]
pub struct XgftSpec {
    /// Number of switch levels.
    pub levels: u32,
    /// `down[l]`: children of each switch at level `l + 1`.
    pub down: Vec<u32>,
    /// `up[l]`: parents of each node at level `l` (`up[0]` = leaves per terminal).
    pub up: Vec<u32>,
    /// `count[l]`: parallel cables between a node at level `l` and each of its parents. Each
    /// cable is its own pair of links (its own [`crate::LinkId`]s); see the crate
    /// documentation for how D-mod-K picks among them.
    pub count: Vec<u32>,
    /// `links[l]`: the cables between level `l` and level `l + 1` (`links[0]`: terminal to
    /// leaf).
    pub links: Vec<LinkSpec>,
    /// `oversubscription[l]` (at least 1) divides the bandwidth of the cables between level
    /// `l` and level `l + 1`, both directions: `2.0` at the top tier of a 3-level tree is the
    /// classic "2:1 at the core". The structure (how many parents) is unchanged; use `up` for
    /// fewer parents. Empty means 1 everywhere.
    pub oversubscription: Vec<f64>,
}

impl XgftSpec {
    /// The k-ary n-tree of `levels` levels built from `k`-port switches: `2 (k/2)^levels`
    /// hosts. With 3 levels it is the classic fat-tree of k^3/4 hosts, SimGrid
    /// `3;k/2,k/2,k;1,k/2,k/2;1,1,1` (k = 4: 8 edge, 8 aggregation, 4 core switches); with 2,
    /// it is [`XgftSpec::leaf_spine`]. `links`: one per level, terminal links first.
    pub fn k_ary(k: u32, levels: u32, links: Vec<LinkSpec>) -> Result<XgftSpec, TopologyError> {
        if k < 2 || k % 2 != 0 {
            return Err(TopologyError::Invalid {
                parameter: "fat-tree k",
                problem: format!("switch radix must be even and at least 2, got {k}"),
            });
        }
        if levels == 0 {
            return Err(TopologyError::Zero { what: "fat-tree levels" });
        }
        let half = k / 2;
        let n = levels as usize;
        let mut down = vec![half; n];
        down[n - 1] = k;
        let mut up = vec![half; n];
        up[0] = 1;
        Ok(XgftSpec { levels, down, up, count: vec![1; n], links, oversubscription: Vec::new() })
    }

    /// A two-level leaf-spine fabric of `radix`-port switches: `radix` leaves of `radix/2`
    /// hosts, `radix/2` spines; SimGrid `2;r/2,r;1,r/2;1,1`. `links`: terminal-to-leaf and
    /// leaf-to-spine.
    pub fn leaf_spine(radix: u32, links: Vec<LinkSpec>) -> Result<XgftSpec, TopologyError> {
        XgftSpec::k_ary(radix, 2, links).map_err(|error| match error {
            TopologyError::Invalid { problem, .. } => {
                TopologyError::Invalid { parameter: "leaf-spine radix", problem }
            }
            other => other,
        })
    }

    /// Parses SimGrid's `LEVELS;DOWN;UP;COUNT` string (e.g. `3;2,2,4;1,2,2;1,1,1`), every
    /// level's cables being `link`.
    pub fn from_simgrid(text: &str, link: LinkSpec) -> Result<XgftSpec, TopologyError> {
        let invalid = |problem: String| TopologyError::Invalid { parameter: "fat-tree", problem };
        let parts: Vec<&str> = text.split(';').collect();
        let [levels, down, up, count] = parts[..] else {
            return Err(invalid(format!(
                "{text:?} is not LEVELS;DOWN;UP;COUNT (e.g. \"3;2,2,4;1,2,2;1,1,1\")"
            )));
        };
        let number = |s: &str| {
            s.trim().parse::<u32>().map_err(|_| invalid(format!("{s:?} in {text:?} is not a whole number")))
        };
        let list = |s: &str| s.split(',').map(number).collect::<Result<Vec<u32>, TopologyError>>();
        let levels = number(levels)?;
        Ok(XgftSpec {
            levels,
            down: list(down)?,
            up: list(up)?,
            count: list(count)?,
            links: vec![link; levels as usize],
            oversubscription: Vec::new(),
        })
    }

    /// Terminal positions: the product of `down`.
    pub fn terminal_capacity(&self) -> u64 {
        // Saturating: a hostile spec's degrees can multiply past u64 (then it is refused as too large).
        self.down.iter().fold(1u64, |capacity, &d| capacity.saturating_mul(u64::from(d)))
    }

    /// The tree cut to the switches `terminals` (filling positions `0..terminals`) need, and how
    /// it was cut; `None` when it is needed whole. A top switch whose subtrees below hold no
    /// terminal carries no route, so the top level keeps only the subtrees the terminals fill
    /// (`down` of the top level shrinks); when one subtree holds them all, the top level is
    /// dropped (no route between its terminals climbs above the subtree's root level), and so
    /// on down. The levels kept are wired as before, so every route, and every simulated time,
    /// is the full tree's. Subtrees stay whole (the tree stays regular): a partly filled last
    /// subtree keeps its empty leaves.
    pub fn pruned(&self, terminals: u64) -> Option<(XgftSpec, String)> {
        let mut spec = self.clone();
        let full_capacity = self.terminal_capacity();
        if terminals == 0 || terminals >= full_capacity || self.down.len() != self.levels as usize {
            return None;
        }
        while spec.levels > 1 {
            let top = spec.levels as usize - 1;
            let below: u64 =
                spec.down[..top].iter().fold(1u64, |below, &d| below.saturating_mul(u64::from(d)));
            let needed = terminals.div_ceil(below.max(1));
            if needed > 1 {
                break;
            }
            for list in [&mut spec.down, &mut spec.up, &mut spec.count] {
                list.truncate(top);
            }
            spec.links.truncate(top);
            spec.oversubscription.truncate(top);
            spec.levels -= 1;
        }
        let top = spec.levels as usize - 1;
        let below: u64 = spec.down[..top].iter().fold(1u64, |below, &d| below.saturating_mul(u64::from(d)));
        let needed = u32::try_from(terminals.div_ceil(below.max(1))).unwrap_or(u32::MAX);
        spec.down[top] = spec.down[top].min(needed);
        let dropped = self.levels - spec.levels;
        let mut cuts = Vec::new();
        if dropped > 0 {
            cuts.push(format!(
                "{dropped} top level{} dropped (one subtree holds every NIC)",
                if dropped == 1 { "" } else { "s" }
            ));
        }
        let top_down = self.down.get(top).copied().unwrap_or_default();
        if spec.down[top] < top_down {
            cuts.push(format!("{} of the {top_down} subtrees under the top switches kept", spec.down[top]));
        }
        let how = format!(
            "from {} (room for {full_capacity} NICs) to the switches {terminals} NICs need: {}; routes are the full tree's",
            FabricSpec::FatTree(self.clone()),
            cuts.join(", ")
        );
        Some((spec, how))
    }
}

/// A dragonfly with all-to-all groups (Kim, Dally, Scott, Abts 2008): `groups` groups of
/// `routers_per_group` routers, every pair of routers of a group joined by a local link, each
/// router with `hosts_per_router` terminals and `global_links_per_router` global ports.
///
/// Global links use the consecutive ("absolute") arrangement: group `i` has `a*h` global ports
/// numbered `k = router * h + port`; with `m = floor(a*h / (groups - 1))` links per group
/// pair, port `k` carries copy `k / (groups - 1)` of the link to the `k mod (groups - 1)`-th
/// other group (other groups in increasing order, skipping `i`), and ports past `m *
/// (groups - 1)` stay unused. With `groups = a*h + 1` (a balanced, maximum-size dragonfly)
/// router `r` of group `i` reaches groups `r*h .. r*h + h - 1`, skipping `i`, once each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DragonflySpec {
    /// Number of groups (at most `routers_per_group * global_links_per_router + 1`).
    pub groups: u32,
    /// Routers in a group (`a`).
    pub routers_per_group: u32,
    /// Terminals on each router (`p`).
    pub hosts_per_router: u32,
    /// Global ports on each router (`h`).
    pub global_links_per_router: u32,
    /// Terminal-to-router link.
    pub terminal: LinkSpec,
    /// Router-to-router link inside a group.
    pub local: LinkSpec,
    /// Link between groups.
    pub global: LinkSpec,
}

impl DragonflySpec {
    /// Kim et al.'s balanced maximum-size dragonfly for `h` global ports per router: `p = h`
    /// terminals per router, `a = 2h` routers per group, `a*h + 1` groups.
    pub fn balanced(h: u32, terminal: LinkSpec, local: LinkSpec, global: LinkSpec) -> DragonflySpec {
        DragonflySpec {
            groups: 2 * h * h + 1,
            routers_per_group: 2 * h,
            hosts_per_router: h,
            global_links_per_router: h,
            terminal,
            local,
            global,
        }
    }

    /// Terminal positions: groups x routers x hosts per router.
    pub fn terminal_capacity(&self) -> u64 {
        u64::from(self.groups)
            .saturating_mul(u64::from(self.routers_per_group))
            .saturating_mul(u64::from(self.hosts_per_router))
    }
}

/// SimGrid 3.32's Cray-Cascade-like dragonfly, `G,GL;C,CL;R,RL;NODES`: `groups` groups of
/// `chassis_per_group` chassis of `routers_per_chassis` routers ("blades") with
/// `hosts_per_router` terminals each. Routers of a chassis are all-to-all ("green" links);
/// routers at the same blade position of the chassis of a group are all-to-all ("black");
/// one "blue" link joins each pair of groups, attached in group `i` to router `j` (chassis 0,
/// blade `j`) for the link to group `j`, which is why `groups <= routers_per_chassis`. A link
/// of `k` parallel cables (`GL`, `CL`, `RL`) is one link of `k` times the bandwidth, as in
/// SimGrid. Terminals are numbered group, chassis, blade, host, as SimGrid numbers its hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CascadeSpec {
    /// Number of groups (`G`).
    pub groups: u32,
    /// Parallel cables of each blue link (`GL`).
    pub global_links: u32,
    /// Chassis per group (`C`).
    pub chassis_per_group: u32,
    /// Parallel cables of each black link (`CL`).
    pub chassis_links: u32,
    /// Routers (blades) per chassis (`R`).
    pub routers_per_chassis: u32,
    /// Parallel cables of each green link (`RL`).
    pub router_links: u32,
    /// Terminals per router (`NODES`).
    pub hosts_per_router: u32,
    /// Terminal-to-router link.
    pub terminal: LinkSpec,
    /// One cable of a green link (between routers of a chassis).
    pub green: LinkSpec,
    /// One cable of a black link (between chassis of a group).
    pub black: LinkSpec,
    /// One cable of a blue link (between groups).
    pub blue: LinkSpec,
}

impl CascadeSpec {
    /// Parses SimGrid's `G,GL;C,CL;R,RL;NODES` (e.g. `4,1;2,1;4,1;4`), every cable being
    /// `link`.
    pub fn from_simgrid(text: &str, link: LinkSpec) -> Result<CascadeSpec, TopologyError> {
        let invalid = |problem: String| TopologyError::Invalid { parameter: "cascade-dragonfly", problem };
        let numbers: Result<Vec<u32>, _> = text.split([';', ',']).map(|s| s.trim().parse::<u32>()).collect();
        let shape_ok = text.split(';').map(|part| part.split(',').count()).eq([2, 2, 2, 1]);
        match numbers {
            Ok(n) if shape_ok => Ok(CascadeSpec {
                groups: n[0],
                global_links: n[1],
                chassis_per_group: n[2],
                chassis_links: n[3],
                routers_per_chassis: n[4],
                router_links: n[5],
                hosts_per_router: n[6],
                terminal: link,
                green: link,
                black: link,
                blue: link,
            }),
            _ => Err(invalid(format!(
                "{text:?} is not G,GL;C,CL;R,RL;NODES of whole numbers (e.g. \"4,1;2,1;4,1;4\")"
            ))),
        }
    }

    /// Terminal positions: groups x chassis x routers x hosts per router.
    pub fn terminal_capacity(&self) -> u64 {
        [self.groups, self.chassis_per_group, self.routers_per_chassis, self.hosts_per_router]
            .iter()
            .fold(1u64, |capacity, &n| capacity.saturating_mul(u64::from(n)))
    }
}

#[cfg(test)]
mod nccl_settings_tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn nccl_algo_lists_take_parasims_names_and_nccls_spellings() {
        let ring_tree = NcclAlgorithms::from_names(&names(&["ring", "tree"])).unwrap();
        assert_eq!(ring_tree, NcclAlgorithms::from_names(&names(&["Ring", "TREE"])).unwrap());
        assert!(ring_tree.allows("ring") && ring_tree.allows("tree"));
        assert!(
            !ring_tree.allows("nvls") && !ring_tree.allows("nvls-tree") && !ring_tree.allows("collnet-chain")
        );
        // NCCL_ALGO's spellings (`src/graph/tuning.cc`: "NVLSTree", "CollnetDirect").
        let nvls_tree = NcclAlgorithms::from_names(&names(&["NVLSTree", "CollnetDirect"])).unwrap();
        assert_eq!(nvls_tree.names(), ["nvls-tree", "collnet-direct"]);
        // Algorithms that are not NCCL's are not restricted.
        assert!(ring_tree.allows("halving-doubling"));
        assert_eq!(NcclAlgorithms::ALL.names(), NcclAlgorithms::NAMES);
        let unknown = NcclAlgorithms::from_names(&names(&["tree", "butterfly"])).unwrap_err();
        assert!(
            unknown.contains("unknown algorithm \"butterfly\"") && unknown.contains("nvls-tree"),
            "{unknown}"
        );
        assert!(NcclAlgorithms::from_names(&[]).unwrap_err().contains("is empty"));
    }

    #[test]
    fn nccl_proto_lists_and_buffer_sizes_are_checked() {
        let simple = NcclProtocols::from_names(&names(&["simple"])).unwrap();
        assert!(simple.allows("Simple") && !simple.allows("LL") && !simple.allows("LL128"));
        assert_eq!(simple.names(), ["Simple"]);
        assert!(
            NcclProtocols::from_names(&names(&["LL256"])).unwrap_err().contains("unknown protocol \"LL256\"")
        );
        assert!(NcclProtocols::from_names(&[]).unwrap_err().contains("is empty"));
        // NCCL_BUFFSIZE: NCCL's default 4 MiB, cut into 8 steps of 512 KiB (a tree's Simple chunk).
        assert_eq!(NcclSettings::DEFAULT.simple_step(), 512 << 10);
        assert_eq!(NcclSettings { buffsize: 8 << 20, ..NcclSettings::DEFAULT }.simple_step(), 1 << 20);
        assert_eq!(NcclSettings::check_buffsize(8 << 20), Ok(8 << 20));
        for bad in [0, 1004, (4 << 20) + 4] {
            assert!(NcclSettings::check_buffsize(bad).unwrap_err().contains("multiple of 8 bytes"), "{bad}");
        }
        assert_eq!(Transport::new(TransportKind::TcpDirect).nccl, NcclSettings::DEFAULT);
    }
}
