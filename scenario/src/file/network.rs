//! `[cluster.network]`: the fabric between servers, read from its wire form into a
//! [`NetworkSpec`]. Every key is checked against the keys its topology uses, so a key that
//! would be silently ignored is an error.

use serde::Deserialize;
use sim_core::units::{Bandwidth, Bytes, SimDuration};
use topology::{
    CascadeSpec, DragonflySpec, FabricSpec, LinkSpec, NcclAlgorithms, NcclProtocols, NcclSettings,
    NetworkSpec, Routing, Transport, TransportKind, XgftSpec,
};

use super::LinkSection;

/// The wire form of `[cluster.network]`; see the README's scenario reference.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct NetworkSection {
    topology: Option<String>,
    link_bandwidth: Option<Bandwidth>,
    link_latency: Option<SimDuration>,
    routing: Option<String>,
    nics_per_node: Option<u32>,
    rail_optimized: Option<bool>,
    gpu_to_nic: Option<LinkSection>,
    radix: Option<u32>,
    levels: Option<u32>,
    simgrid: Option<String>,
    down: Option<Vec<u32>>,
    up: Option<Vec<u32>>,
    count: Option<Vec<u32>>,
    oversubscription: Option<Vec<f64>>,
    tier_bandwidth: Option<Vec<Bandwidth>>,
    tier_latency: Option<Vec<SimDuration>>,
    groups: Option<u32>,
    routers_per_group: Option<u32>,
    hosts_per_router: Option<u32>,
    global_links_per_router: Option<u32>,
    local_bandwidth: Option<Bandwidth>,
    local_latency: Option<SimDuration>,
    global_bandwidth: Option<Bandwidth>,
    global_latency: Option<SimDuration>,
    dims: Option<Vec<u32>>,
    transport: Option<String>,
    message_overhead: Option<SimDuration>,
    channel_overhead: Option<SimDuration>,
    ll_host_rate: Option<Bandwidth>,
    efficiency: Option<f64>,
    host_cpu: Option<String>,
    nccl_version: Option<String>,
    nccl_algorithms: Option<Vec<String>>,
    nccl_protocols: Option<Vec<String>>,
    nccl_buffsize: Option<Bytes>,
    sharp: Option<bool>,
}

/// The topologies `cluster.network.topology` accepts, with the keys each one uses besides the
/// common ones.
const TOPOLOGIES: &[(&str, &[&str])] = &[
    ("switch", &[]),
    ("fat-tree", &["radix", "levels", "oversubscription", "tier-bandwidth", "tier-latency"]),
    ("leaf-spine", &["radix", "oversubscription", "tier-bandwidth", "tier-latency"]),
    ("xgft", &["simgrid", "down", "up", "count", "oversubscription", "tier-bandwidth", "tier-latency"]),
    (
        "dragonfly",
        &[
            "groups",
            "routers-per-group",
            "hosts-per-router",
            "global-links-per-router",
            "local-bandwidth",
            "local-latency",
            "global-bandwidth",
            "global-latency",
        ],
    ),
    ("cascade-dragonfly", &["simgrid"]),
    ("torus", &["dims"]),
    ("ring", &[]),
    ("fully-connected", &[]),
];

/// Keys every topology accepts.
const COMMON: &[&str] = &[
    "topology",
    "link-bandwidth",
    "link-latency",
    "routing",
    "nics-per-node",
    "rail-optimized",
    "gpu-to-nic",
    "transport",
    "message-overhead",
    "channel-overhead",
    "ll-host-rate",
    "efficiency",
    "host-cpu",
    "nccl-version",
    "nccl-algorithms",
    "nccl-protocols",
    "nccl-buffsize",
    "sharp",
];

/// A problem with one key of `[cluster.network]`: the key (without the `cluster.network.`
/// prefix) and what is wrong.
pub(super) type KeyError = (&'static str, String);

impl NetworkSection {
    /// The keys present in the file, as written there.
    fn present(&self) -> Vec<&'static str> {
        let flags: [(&'static str, bool); 36] = [
            ("topology", self.topology.is_some()),
            ("link-bandwidth", self.link_bandwidth.is_some()),
            ("link-latency", self.link_latency.is_some()),
            ("routing", self.routing.is_some()),
            ("nics-per-node", self.nics_per_node.is_some()),
            ("rail-optimized", self.rail_optimized.is_some()),
            ("gpu-to-nic", self.gpu_to_nic.is_some()),
            ("radix", self.radix.is_some()),
            ("levels", self.levels.is_some()),
            ("simgrid", self.simgrid.is_some()),
            ("down", self.down.is_some()),
            ("up", self.up.is_some()),
            ("count", self.count.is_some()),
            ("oversubscription", self.oversubscription.is_some()),
            ("tier-bandwidth", self.tier_bandwidth.is_some()),
            ("tier-latency", self.tier_latency.is_some()),
            ("groups", self.groups.is_some()),
            ("routers-per-group", self.routers_per_group.is_some()),
            ("hosts-per-router", self.hosts_per_router.is_some()),
            ("global-links-per-router", self.global_links_per_router.is_some()),
            ("local-bandwidth", self.local_bandwidth.is_some()),
            ("local-latency", self.local_latency.is_some()),
            ("global-bandwidth", self.global_bandwidth.is_some()),
            ("global-latency", self.global_latency.is_some()),
            ("dims", self.dims.is_some()),
            ("transport", self.transport.is_some()),
            ("message-overhead", self.message_overhead.is_some()),
            ("channel-overhead", self.channel_overhead.is_some()),
            ("ll-host-rate", self.ll_host_rate.is_some()),
            ("efficiency", self.efficiency.is_some()),
            ("host-cpu", self.host_cpu.is_some()),
            ("nccl-version", self.nccl_version.is_some()),
            ("nccl-algorithms", self.nccl_algorithms.is_some()),
            ("nccl-protocols", self.nccl_protocols.is_some()),
            ("nccl-buffsize", self.nccl_buffsize.is_some()),
            ("sharp", self.sharp.is_some()),
        ];
        flags.into_iter().filter(|&(_, present)| present).map(|(key, _)| key).collect()
    }

    /// `nccl-algorithms`, `nccl-protocols` and `nccl-buffsize`: the run's NCCL settings
    /// (NCCL's defaults for the keys not given).
    fn nccl_settings(&self) -> Result<NcclSettings, KeyError> {
        let mut nccl = NcclSettings::DEFAULT;
        if let Some(names) = &self.nccl_algorithms {
            nccl.algorithms =
                NcclAlgorithms::from_names(names).map_err(|message| ("nccl-algorithms", message))?;
        }
        if let Some(names) = &self.nccl_protocols {
            nccl.protocols =
                NcclProtocols::from_names(names).map_err(|message| ("nccl-protocols", message))?;
        }
        if let Some(bytes) = self.nccl_buffsize {
            nccl.buffsize =
                NcclSettings::check_buffsize(bytes.0).map_err(|message| ("nccl-buffsize", message))?;
        }
        Ok(nccl)
    }

    /// Validates the section. `default_link` is each NIC's link when none is given,
    /// `default_gpu_to_nic` the PCIe link used when GPUs share NICs.
    /// Every link latency is at most [`super::MAX_LINK_LATENCY`]: a wire or switch hop of
    /// seconds is a typo (`"100000 s"` for `"100000 ns"`), and would run as a job that moves
    /// nothing.
    fn check_latencies(&self) -> Result<(), KeyError> {
        let single = [
            ("link-latency", self.link_latency),
            ("local-latency", self.local_latency),
            ("global-latency", self.global_latency),
            ("gpu-to-nic", self.gpu_to_nic.as_ref().and_then(|section| section.latency)),
        ];
        let tiers = self.tier_latency.iter().flatten().map(|latency| ("tier-latency", Some(*latency)));
        for (key, latency) in single.into_iter().chain(tiers) {
            if let Some(latency) = latency {
                super::check_latency(latency).map_err(|message| (key, message))?;
            }
        }
        Ok(())
    }

    pub(super) fn to_spec(
        &self,
        default_link: LinkSpec,
        default_gpu_to_nic: LinkSpec,
    ) -> Result<NetworkSpec, KeyError> {
        self.check_latencies()?;
        let topology = self.topology.as_deref().unwrap_or("switch");
        let names: Vec<&str> = TOPOLOGIES.iter().map(|(name, _)| *name).collect();
        let (_, specific) = TOPOLOGIES.iter().find(|(name, _)| *name == topology).ok_or_else(|| {
            ("topology", format!("unknown topology {topology:?}; valid: {}", names.join(", ")))
        })?;
        if let Some(key) =
            self.present().into_iter().find(|key| !COMMON.contains(key) && !specific.contains(key))
        {
            let mut valid: Vec<&str> = COMMON.to_vec();
            valid.extend_from_slice(specific);
            return Err((
                key,
                format!("does not apply to topology {topology:?}; its keys are: {}", valid.join(", ")),
            ));
        }
        let efficiency = self.efficiency.unwrap_or(1.0);
        if !(efficiency.is_finite() && efficiency > 0.0 && efficiency <= 1.0) {
            return Err((
                "efficiency",
                format!("{efficiency} is not a fraction in (0, 1] of the links' line rate"),
            ));
        }
        let kind = match &self.transport {
            Some(name) => name.parse::<TransportKind>().map_err(|e| ("transport", e.to_string()))?,
            None => TransportKind::default(),
        };
        let transport = Transport {
            kind,
            message_overhead: self.message_overhead.unwrap_or(kind.default_message_overhead()),
            channel_overhead: self.channel_overhead.unwrap_or(SimDuration::ZERO),
            ll_host_rate: self.ll_host_rate,
            efficiency,
            host_cpu: match &self.host_cpu {
                Some(name) => name.parse::<topology::HostCpu>().map_err(|message| ("host-cpu", message))?,
                None => topology::HostCpu::default(),
            },
            nccl_version: match &self.nccl_version {
                Some(name) => {
                    name.parse::<topology::NcclVersion>().map_err(|message| ("nccl-version", message))?
                }
                None => topology::NcclVersion::default(),
            },
            sharp: self.sharp.unwrap_or(false),
            nccl: self.nccl_settings()?,
        };
        if transport.sharp && kind != TransportKind::InfiniBand {
            return Err((
                "sharp",
                format!(
                    "needs InfiniBand switches (SHARP is theirs), but the transport is {:?}: set transport = \"infiniband\" or remove the key",
                    kind.name()
                ),
            ));
        }
        let link = LinkSpec::new(
            self.link_bandwidth.unwrap_or(default_link.bandwidth),
            self.link_latency.unwrap_or(default_link.latency),
        );
        let fabric = match topology {
            "switch" => FabricSpec::Switch { link },
            "fat-tree" => {
                let radix = self.radix.ok_or((
                    "radix",
                    "is required for a fat-tree (switch radix k: k^3/4 hosts at 3 levels)".to_string(),
                ))?;
                let levels = self.levels.unwrap_or(3);
                let mut spec = XgftSpec::k_ary(radix, levels, self.tiers(levels, link)?)
                    .map_err(|e| ("radix", e.to_string()))?;
                self.oversubscribe(&mut spec)?;
                FabricSpec::FatTree(spec)
            }
            "leaf-spine" => {
                let radix =
                    self.radix.ok_or(("radix", "is required for a leaf-spine (switch radix)".to_string()))?;
                let mut spec = XgftSpec::leaf_spine(radix, self.tiers(2, link)?)
                    .map_err(|e| ("radix", e.to_string()))?;
                self.oversubscribe(&mut spec)?;
                FabricSpec::FatTree(spec)
            }
            "xgft" => {
                let mut spec = match (&self.simgrid, &self.down, &self.up, &self.count) {
                    (Some(text), None, None, None) => {
                        let spec =
                            XgftSpec::from_simgrid(text, link).map_err(|e| ("simgrid", e.to_string()))?;
                        let levels = spec.levels;
                        XgftSpec { links: self.tiers(levels, link)?, ..spec }
                    }
                    (None, Some(down), Some(up), count) => {
                        let levels = down.len() as u32;
                        XgftSpec {
                            levels,
                            down: down.clone(),
                            up: up.clone(),
                            count: count.clone().unwrap_or_else(|| vec![1; down.len()]),
                            links: self.tiers(levels, link)?,
                            oversubscription: vec![1.0; down.len()],
                        }
                    }
                    _ => {
                        return Err((
                            "simgrid",
                            "an xgft needs either `simgrid = \"LEVELS;DOWN;UP;COUNT\"` or the lists `down` and `up` \
                             (and optionally `count`), not both"
                                .into(),
                        ));
                    }
                };
                self.oversubscribe(&mut spec)?;
                FabricSpec::FatTree(spec)
            }
            "dragonfly" => {
                let required = |value: Option<u32>, key: &'static str| {
                    value.ok_or((key, "is required for a dragonfly (groups, routers-per-group, hosts-per-router, global-links-per-router)".to_string()))
                };
                FabricSpec::Dragonfly(DragonflySpec {
                    groups: required(self.groups, "groups")?,
                    routers_per_group: required(self.routers_per_group, "routers-per-group")?,
                    hosts_per_router: required(self.hosts_per_router, "hosts-per-router")?,
                    global_links_per_router: required(
                        self.global_links_per_router,
                        "global-links-per-router",
                    )?,
                    terminal: link,
                    local: LinkSpec::new(
                        self.local_bandwidth.unwrap_or(link.bandwidth),
                        self.local_latency.unwrap_or(link.latency),
                    ),
                    global: LinkSpec::new(
                        self.global_bandwidth.unwrap_or(link.bandwidth),
                        self.global_latency.unwrap_or(link.latency),
                    ),
                })
            }
            "cascade-dragonfly" => {
                let text = self.simgrid.as_deref().ok_or((
                    "simgrid",
                    "is required for a cascade-dragonfly: SimGrid's \"G,GL;C,CL;R,RL;NODES\", e.g. \"4,1;2,1;4,1;4\"".to_string(),
                ))?;
                FabricSpec::CascadeDragonfly(
                    CascadeSpec::from_simgrid(text, link).map_err(|e| ("simgrid", e.to_string()))?,
                )
            }
            "torus" => {
                let dims = self
                    .dims
                    .clone()
                    .ok_or(("dims", "is required for a torus, e.g. dims = [4, 4, 4]".to_string()))?;
                FabricSpec::Torus { dims, link }
            }
            "ring" => FabricSpec::Ring { link },
            _ => FabricSpec::FullyConnected { link },
        };
        let routing = match &self.routing {
            Some(text) => text.parse::<Routing>().map_err(|e| ("routing", e.to_string()))?,
            None => Routing::Auto,
        };
        let gpu_to_nic = self.gpu_to_nic.as_ref().map(|section| {
            LinkSpec::new(
                section.bandwidth.unwrap_or(default_gpu_to_nic.bandwidth),
                section.latency.unwrap_or(default_gpu_to_nic.latency),
            )
        });
        let fabric = scale_fabric(fabric, efficiency)?;
        Ok(NetworkSpec {
            transport,
            fabric,
            routing,
            nics_per_node: self.nics_per_node,
            rail_optimized: self.rail_optimized.unwrap_or(false),
            // Shared NICs need the PCIe hop; default it to the device's PCIe link.
            gpu_to_nic: gpu_to_nic.or(self.nics_per_node.map(|_| default_gpu_to_nic)),
        })
    }

    /// One link per fat-tree level: `tier-bandwidth` / `tier-latency` lists (level 0 = NIC to
    /// leaf) or `link` everywhere.
    fn tiers(&self, levels: u32, link: LinkSpec) -> Result<Vec<LinkSpec>, KeyError> {
        let levels = levels as usize;
        for (key, length) in [
            ("tier-bandwidth", self.tier_bandwidth.as_ref().map(Vec::len)),
            ("tier-latency", self.tier_latency.as_ref().map(Vec::len)),
        ] {
            if let Some(length) = length
                && length != levels
            {
                return Err((
                    key,
                    format!("has {length} entries; the fat-tree has {levels} levels (level 0 = NIC to leaf)"),
                ));
            }
        }
        Ok((0..levels)
            .map(|level| {
                LinkSpec::new(
                    self.tier_bandwidth.as_ref().map_or(link.bandwidth, |list| list[level]),
                    self.tier_latency.as_ref().map_or(link.latency, |list| list[level]),
                )
            })
            .collect())
    }

    /// Applies `oversubscription` (one factor per level, bandwidth of that level's cables
    /// divided by it).
    fn oversubscribe(&self, spec: &mut XgftSpec) -> Result<(), KeyError> {
        if let Some(factors) = &self.oversubscription {
            if factors.len() != spec.levels as usize {
                return Err((
                    "oversubscription",
                    format!(
                        "has {} entries; the fat-tree has {} levels (level 0 = NIC to leaf)",
                        factors.len(),
                        spec.levels
                    ),
                ));
            }
            if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f >= 1.0)) {
                return Err((
                    "oversubscription",
                    format!("{bad} is not a factor of at least 1 (2 means 2:1)"),
                ));
            }
            spec.oversubscription = factors.clone();
        }
        Ok(())
    }
}

/// `fabric` with every cable carrying `efficiency` of its line rate (`efficiency` key: what
/// the transport delivers of the links' signalling rate).
fn scale_fabric(fabric: FabricSpec, efficiency: f64) -> Result<FabricSpec, KeyError> {
    if efficiency == 1.0 {
        return Ok(fabric);
    }
    let scale = |link: LinkSpec| -> Result<LinkSpec, KeyError> {
        let bits = (link.bandwidth.bits_per_second() as f64 * efficiency).round() as u64;
        let bandwidth = Bandwidth::from_bits_per_second(bits).ok_or((
            "efficiency",
            format!("{efficiency} of {} is not a representable bandwidth", link.bandwidth),
        ))?;
        Ok(LinkSpec::new(bandwidth, link.latency))
    };
    Ok(match fabric {
        FabricSpec::Switch { link } => FabricSpec::Switch { link: scale(link)? },
        FabricSpec::Ring { link } => FabricSpec::Ring { link: scale(link)? },
        FabricSpec::FullyConnected { link } => FabricSpec::FullyConnected { link: scale(link)? },
        FabricSpec::Torus { dims, link } => FabricSpec::Torus { dims, link: scale(link)? },
        FabricSpec::FatTree(mut spec) => {
            spec.links = spec.links.into_iter().map(scale).collect::<Result<_, _>>()?;
            FabricSpec::FatTree(spec)
        }
        FabricSpec::Dragonfly(spec) => FabricSpec::Dragonfly(DragonflySpec {
            terminal: scale(spec.terminal)?,
            local: scale(spec.local)?,
            global: scale(spec.global)?,
            ..spec
        }),
        FabricSpec::CascadeDragonfly(spec) => FabricSpec::CascadeDragonfly(CascadeSpec {
            terminal: scale(spec.terminal)?,
            green: scale(spec.green)?,
            black: scale(spec.black)?,
            blue: scale(spec.blue)?,
            ..spec
        }),
    })
}
