//! Network faults (`[faults]`): links at a fraction of their bandwidth, or down. A fault names
//! one link as `parasim topo --json` lists it (`link_list`: `"nic 3.0 -> switch 1"`), or a kind
//! of link (`link_kind`: `NIC`, `leaf-spine`, `spine-core`, `global`, ...) and the fraction of
//! that kind's cables to hit, drawn with ChaCha8 seeded by `simulation.seed`. A fault hits a
//! cable: the named link and its reverse. Routes that cross a link that is down go the
//! fewest-hop way around it; a fault that cuts ranks off is an error naming the links and the
//! ranks, before anything runs.
//!
//! A fault with `for-ms` holds only during a window (from `at-ms`, repeating every `every-ms`
//! if given): a NIC that flaps. Its flows stall while the link is down and resume when it is
//! back, as a transport retransmitting on its connection does; a window down longer than
//! NCCL's InfiniBand retry budget would fail the job instead, and is refused. `latency-noise`
//! adds a drawn extra latency to every link crossing. Both need the `flow` or `packet-steps`
//! model, which keep link state over time.

use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use sim_core::units::SimDuration;
use topology::{HostId, JitterShape, LatencyJitter, LinkId, LinkWindow, Topology};

/// `[faults]` as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct FaultsSection {
    #[serde(default)]
    links: Vec<LinkFaultSection>,
    latency_noise: Option<LatencyNoiseSection>,
}

/// `faults.latency-noise` as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LatencyNoiseSection {
    distribution: String,
    mean_us: f64,
    cv: f64,
    kind: Option<String>,
}

/// One `faults.links` entry as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LinkFaultSection {
    link: Option<String>,
    kind: Option<String>,
    fraction: Option<f64>,
    bandwidth_factor: Option<f64>,
    #[serde(default)]
    down: bool,
    at_ms: Option<f64>,
    for_ms: Option<f64>,
    every_ms: Option<f64>,
}

/// Which links a fault hits.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultTarget {
    /// One cable, by the name of one of its links.
    Link(String),
    /// A fraction of the cables of one kind, drawn with the seed.
    Kind {
        /// `topo --json`'s `kind` of the links (`NIC`, `leaf-spine`, ...).
        kind: String,
        /// The share of that kind's cables hit, in (0, 1].
        fraction: f64,
    },
}

/// What a fault does to the links it hits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FaultEffect {
    /// Bandwidth times this factor, in (0, 1].
    Degraded(f64),
    /// No traffic: routes go around.
    Down,
}

/// When a fault holds, if not for the whole run: from `start`, for `length`, again every
/// `every` if given (times from the start of the run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultWindow {
    /// When it first holds.
    pub start: SimDuration,
    /// How long it holds each time.
    pub length: SimDuration,
    /// Its period, if it repeats.
    pub every: Option<SimDuration>,
}

/// One validated fault.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkFault {
    /// The links hit.
    pub target: FaultTarget,
    /// What happens to them.
    pub effect: FaultEffect,
    /// When, if only for a while (`None`: the whole run).
    pub window: Option<FaultWindow>,
}

/// Validated `faults.latency-noise`: extra latency on every crossing of the links of `kind`
/// (all links if `None`), `mean` times a draw of mean 1 and coefficient of variation `cv`.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyNoise {
    /// The draws' distribution.
    pub shape: JitterShape,
    /// Mean extra latency per crossing.
    pub mean: SimDuration,
    /// Coefficient of variation of the draws.
    pub cv: f64,
    /// The kind of link it applies to (`topo --json`'s `kind`), or every link.
    pub kind: Option<String>,
}

/// Validated `[faults]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Faults {
    /// The link faults, in the order given.
    pub links: Vec<LinkFault>,
    /// Extra latency per link crossing, if any.
    pub latency_noise: Option<LatencyNoise>,
    /// `simulation.seed`, for faults drawn by kind and latency noise.
    pub seed: u64,
}

/// NCCL's InfiniBand transport gives up on a connection after its first send and
/// `NCCL_IB_RETRY_CNT` retries, each after a local ACK timeout of 4.096 us x
/// 2^`NCCL_IB_TIMEOUT` (the InfiniBand Architecture Specification's encoding); NCCL's defaults
/// are 20 and 7 (`src/transport/net_ib/connect.cc`, `NCCL_PARAM(IbTimeout, "IB_TIMEOUT", 20)`
/// and `NCCL_PARAM(IbRetryCnt, "IB_RETRY_CNT", 7)`, NVIDIA/nccl at 5067397): 8 x 4.29 s =
/// 34.4 s. A link down longer than that fails the job instead of stalling it.
pub const NCCL_IB_RETRY_BUDGET_S: f64 = 8.0 * 4.096e-6 * 1_048_576.0;

impl Faults {
    /// One line per fault that holds for a while and for latency noise, for reports: what
    /// it hits, what it does, when.
    pub fn describe_in_time(&self) -> Vec<String> {
        let ms = |d: SimDuration| format!("{} ms", trimmed(d.as_secs_f64() * 1e3));
        let mut lines: Vec<String> = self
            .links
            .iter()
            .filter_map(|fault| {
                let window = fault.window?;
                let what = match &fault.target {
                    FaultTarget::Link(name) => format!("\"{name}\" (both ways)"),
                    FaultTarget::Kind { kind, fraction } => {
                        format!("{}% of {kind} cables (drawn)", trimmed(fraction * 100.0))
                    }
                };
                let effect = match fault.effect {
                    FaultEffect::Down => "down".to_string(),
                    FaultEffect::Degraded(factor) => format!("at {factor}x bandwidth"),
                };
                let every = window.every.map(|every| format!(", every {}", ms(every))).unwrap_or_default();
                Some(format!("{what} {effect} for {} from {}{every}", ms(window.length), ms(window.start)))
            })
            .collect();
        if let Some(noise) = &self.latency_noise {
            let shape = match noise.shape {
                JitterShape::Lognormal => "lognormal",
                JitterShape::Gamma => "gamma",
                JitterShape::Normal => "normal",
            };
            let on = noise.kind.as_ref().map_or("every link".to_string(), |kind| format!("each {kind} link"));
            lines.push(format!(
                "latency noise: + {} us mean ({shape}, cv {}) per crossing of {on}",
                trimmed(noise.mean.as_secs_f64() * 1e6),
                noise.cv
            ));
        }
        lines
    }

    /// Whether some fault needs link state over time (a window or latency noise), which only
    /// the `flow` and `packet-steps` models keep: the key of the first such fault.
    pub fn needs_time_varying_links(&self) -> Option<String> {
        if let Some(index) = self.links.iter().position(|fault| fault.window.is_some()) {
            return Some(format!("faults.links[{index}].for-ms"));
        }
        self.latency_noise.as_ref().map(|_| "faults.latency-noise".to_string())
    }
}

impl FaultsSection {
    /// Validates the section; link names and kinds are checked against the topology when the
    /// faults are applied ([`Faults::apply`]).
    pub(crate) fn validate<E>(&self, seed: u64, invalid: &dyn Fn(&str, String) -> E) -> Result<Faults, E> {
        let mut links = Vec::with_capacity(self.links.len());
        for (index, fault) in self.links.iter().enumerate() {
            let key = |field: &str| format!("faults.links[{index}].{field}");
            let target = match (&fault.link, &fault.kind) {
                (Some(link), None) => {
                    if fault.fraction.is_some() {
                        return Err(invalid(
                            &key("fraction"),
                            "applies to faults by kind, not to a named link".into(),
                        ));
                    }
                    FaultTarget::Link(link.clone())
                }
                (None, Some(kind)) => {
                    let fraction = fault.fraction.ok_or_else(|| {
                        invalid(
                            &key("fraction"),
                            "is missing: a fault by kind hits this share of the kind's cables, in (0, 1]"
                                .into(),
                        )
                    })?;
                    if !(fraction > 0.0 && fraction <= 1.0) {
                        return Err(invalid(
                            &key("fraction"),
                            format!("is {fraction}; give a share above 0 and at most 1"),
                        ));
                    }
                    FaultTarget::Kind { kind: kind.clone(), fraction }
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        &key("kind"),
                        "and link are both given: a fault names one link or a kind of link".into(),
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        &key("link"),
                        "is missing: name a link as `parasim topo --json` lists it (link_list), or give kind and fraction".into(),
                    ));
                }
            };
            let effect = match (fault.bandwidth_factor, fault.down) {
                (Some(_), true) => {
                    return Err(invalid(
                        &key("bandwidth-factor"),
                        "and down = true are both given: a link is degraded or down".into(),
                    ));
                }
                (Some(factor), false) => {
                    if !(factor > 0.0 && factor <= 1.0) {
                        return Err(invalid(
                            &key("bandwidth-factor"),
                            format!(
                                "is {factor}; give a factor above 0 and at most 1 (0.5: half the bandwidth), or down = true"
                            ),
                        ));
                    }
                    FaultEffect::Degraded(factor)
                }
                (None, true) => FaultEffect::Down,
                (None, false) => {
                    return Err(invalid(
                        &key("bandwidth-factor"),
                        "is missing: give bandwidth-factor (in (0, 1]) or down = true".into(),
                    ));
                }
            };
            let window = window(fault, effect, &key, invalid)?;
            links.push(LinkFault { target, effect, window });
        }
        let latency_noise = match &self.latency_noise {
            Some(noise) => Some(noise.validate(invalid)?),
            None => None,
        };
        Ok(Faults { links, latency_noise, seed })
    }
}

/// The window of a fault with `for-ms` (and `at-ms`, `every-ms`); errors name the key.
fn window<E>(
    fault: &LinkFaultSection,
    effect: FaultEffect,
    key: &dyn Fn(&str) -> String,
    invalid: &dyn Fn(&str, String) -> E,
) -> Result<Option<FaultWindow>, E> {
    let Some(length_ms) = fault.for_ms else {
        for (field, value) in [("at-ms", fault.at_ms), ("every-ms", fault.every_ms)] {
            if value.is_some() {
                return Err(invalid(
                    &key("for-ms"),
                    format!(
                        "is missing: {field} times a fault that holds for a while; give for-ms (milliseconds it holds), or remove {field} for a fault over the whole run"
                    ),
                ));
            }
        }
        return Ok(None);
    };
    let duration = |field: &str, ms: f64, positive: bool| {
        let ok = ms.is_finite() && if positive { ms > 0.0 } else { ms >= 0.0 };
        if !ok {
            let bound = if positive { "above 0" } else { "0 or more" };
            return Err(invalid(&key(field), format!("is {ms}; give milliseconds, {bound}")));
        }
        SimDuration::from_secs_f64(ms * 1e-3)
            .map_err(|error| invalid(&key(field), format!("is {ms} ms: {error}")))
    };
    let length = duration("for-ms", length_ms, true)?;
    let start = duration("at-ms", fault.at_ms.unwrap_or(0.0), false)?;
    let every = match fault.every_ms {
        Some(ms) => {
            let every = duration("every-ms", ms, true)?;
            if every <= length {
                return Err(invalid(
                    &key("every-ms"),
                    format!(
                        "is {ms}, not longer than for-ms ({length_ms}): the link would never come back; give a period longer than the window"
                    ),
                ));
            }
            Some(every)
        }
        None => None,
    };
    if effect == FaultEffect::Down && length.as_secs_f64() > NCCL_IB_RETRY_BUDGET_S {
        return Err(invalid(
            &key("for-ms"),
            format!(
                "is {length_ms} ms: a link down that long outlasts NCCL's InfiniBand retries ({:.1} s: 8 tries of 4.096 us x 2^20 with its defaults NCCL_IB_TIMEOUT = 20 and NCCL_IB_RETRY_CNT = 7), so the job would fail rather than stall; model it as a failure ([failures] events with kind = \"link\"), or give a shorter window or a bandwidth-factor",
                NCCL_IB_RETRY_BUDGET_S
            ),
        ));
    }
    Ok(Some(FaultWindow { start, length, every }))
}

impl LatencyNoiseSection {
    fn validate<E>(&self, invalid: &dyn Fn(&str, String) -> E) -> Result<LatencyNoise, E> {
        let key = |field: &str| format!("faults.latency-noise.{field}");
        let shape = match self.distribution.as_str() {
            "lognormal" => JitterShape::Lognormal,
            "gamma" => JitterShape::Gamma,
            "normal" => JitterShape::Normal,
            other => {
                return Err(invalid(
                    &key("distribution"),
                    format!(
                        "is \"{other}\"; valid: \"lognormal\", \"gamma\", \"normal\" (truncated at zero)"
                    ),
                ));
            }
        };
        if !(self.mean_us.is_finite() && self.mean_us > 0.0) {
            return Err(invalid(
                &key("mean-us"),
                format!(
                    "is {}; give the mean extra latency per link crossed in microseconds, above 0",
                    self.mean_us
                ),
            ));
        }
        let mean = SimDuration::from_secs_f64(self.mean_us * 1e-6)
            .map_err(|error| invalid(&key("mean-us"), format!("is {}: {error}", self.mean_us)))?;
        if !(self.cv.is_finite() && (0.0..=10.0).contains(&self.cv)) {
            return Err(invalid(
                &key("cv"),
                format!(
                    "is {}; give the coefficient of variation (standard deviation over mean), 0 to 10",
                    self.cv
                ),
            ));
        }
        Ok(LatencyNoise { shape, mean, cv: self.cv, kind: self.kind.clone() })
    }
}

/// A fault could not be applied to the cluster: the key and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultError {
    /// The key at fault (`faults.links[0].link`).
    pub key: String,
    /// What is wrong and what would be valid.
    pub message: String,
}

impl Faults {
    /// Applies the faults to `topology`. Errors name the key: a link or kind the cluster does
    /// not have, or links down that cut ranks off (the links and the ranks).
    pub fn apply(&self, topology: &mut Topology) -> Result<(), FaultError> {
        let links = topology.link_count() as u32;
        // One id per cable: the lower of its two directions.
        let cables: Vec<LinkId> = (0..links)
            .map(LinkId)
            .filter(|&id| topology.reverse_of(id).is_none_or(|reverse| reverse.0 > id.0))
            .collect();
        let mut downed: Vec<(usize, LinkId)> = Vec::new();
        for (index, fault) in self.links.iter().enumerate() {
            let hit: Vec<LinkId> = match &fault.target {
                FaultTarget::Link(name) => {
                    let id = (0..links).map(LinkId).find(|&id| topology.link_name(id) == *name).ok_or_else(|| {
                        FaultError {
                            key: format!("faults.links[{index}].link"),
                            message: format!(
                                "is \"{name}\"; no link of this cluster has that name: `parasim topo --json` lists them (link_list), e.g. \"{}\"",
                                topology.link_name(LinkId(0))
                            ),
                        }
                    })?;
                    vec![id]
                }
                FaultTarget::Kind { kind, fraction } => {
                    let of_kind: Vec<LinkId> = cables
                        .iter()
                        .copied()
                        .filter(|&id| topology.link_kind(id) == kind.as_str())
                        .collect();
                    if of_kind.is_empty() {
                        return Err(FaultError {
                            key: format!("faults.links[{index}].kind"),
                            message: format!(
                                "is \"{kind}\"; this cluster's links are of kinds {}",
                                kinds_of(topology, &cables)
                            ),
                        });
                    }
                    let count = ((*fraction * of_kind.len() as f64).round() as usize).clamp(1, of_kind.len());
                    let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
                    rng.set_stream(index as u64);
                    let mut chosen: Vec<usize> = sample(&mut rng, of_kind.len(), count).into_vec();
                    chosen.sort_unstable();
                    chosen.into_iter().map(|i| of_kind[i]).collect()
                }
            };
            if let Some(window) = fault.window {
                // A fault for a while: the flow models apply it as time passes.
                let links: Vec<LinkId> =
                    hit.iter().flat_map(|&id| std::iter::once(id).chain(topology.reverse_of(id))).collect();
                let factor = match fault.effect {
                    FaultEffect::Degraded(factor) => factor,
                    FaultEffect::Down => 0.0,
                };
                topology
                    .add_window(LinkWindow {
                        links,
                        factor,
                        start: window.start,
                        length: window.length,
                        every: window.every,
                    })
                    .map_err(|error| FaultError {
                        key: format!("faults.links[{index}].for-ms"),
                        message: error.to_string(),
                    })?;
                continue;
            }
            for id in hit {
                let both = std::iter::once(id).chain(topology.reverse_of(id));
                for link in both {
                    match fault.effect {
                        FaultEffect::Degraded(factor) => {
                            topology.degrade(link, factor).map_err(|error| FaultError {
                                key: format!("faults.links[{index}].bandwidth-factor"),
                                message: error.to_string(),
                            })?;
                        }
                        FaultEffect::Down => {
                            topology.take_down(link);
                            downed.push((index, link));
                        }
                    }
                }
            }
        }
        if let Some(noise) = &self.latency_noise {
            let on: Vec<bool> = match &noise.kind {
                Some(kind) => {
                    let on: Vec<bool> =
                        (0..links).map(|id| topology.link_kind(LinkId(id)) == kind.as_str()).collect();
                    if !on.contains(&true) {
                        return Err(FaultError {
                            key: "faults.latency-noise.kind".into(),
                            message: format!(
                                "is \"{kind}\"; this cluster's links are of kinds {}",
                                kinds_of(topology, &cables)
                            ),
                        });
                    }
                    on
                }
                None => vec![true; links as usize],
            };
            // Its own stream of the seed, apart from the draws of faults by kind.
            let jitter = LatencyJitter {
                mean: noise.mean,
                cv: noise.cv,
                shape: noise.shape,
                on,
                seed: self.seed ^ LATENCY_NOISE_STREAM,
            };
            topology.set_latency_jitter(jitter).map_err(|error| FaultError {
                key: "faults.latency-noise".into(),
                message: error.to_string(),
            })?;
        }
        if let Some(&(index, _)) = downed.first() {
            // The ranks GPU 0, or the first GPU of the next server, cannot reach: GPUs are not
            // routers, so a GPU whose NIC cable is down still reaches the GPUs of its own
            // server, and only a search from another server finds it cut off.
            let hosts = topology.host_count() as u32;
            let mut cut = vec![false; hosts as usize];
            let per_node = topology.gpus_per_node();
            let sources = if hosts > per_node { vec![HostId(0), HostId(per_node)] } else { vec![HostId(0)] };
            for source in sources {
                let unreachable = topology.unreachable_from(source).map_err(|error| FaultError {
                    key: format!("faults.links[{index}]"),
                    message: error.to_string(),
                })?;
                for host in unreachable {
                    cut[host.0 as usize] = true;
                }
            }
            let count = cut.iter().filter(|&&c| c).count() as u32;
            if count > 0 {
                // Name the smaller side: the ranks cut off from the rest.
                let mut side: Vec<u32> =
                    (0..hosts).filter(|&h| cut[h as usize] == (count * 2 <= hosts)).collect();
                if side.is_empty() {
                    // Every rank is cut off from some other.
                    side = (0..hosts).collect();
                }
                let mut names: Vec<String> = downed
                    .iter()
                    .filter(|(_, id)| topology.reverse_of(*id).is_none_or(|r| r.0 > id.0))
                    .map(|(_, id)| format!("\"{}\"", topology.link_name(*id)))
                    .collect();
                names.dedup();
                return Err(FaultError {
                    key: format!("faults.links[{index}]"),
                    message: format!(
                        "the links down ({}) cut {} of the job's {hosts} ranks off from the rest: ranks {}; the job cannot run (take fewer links down, or degrade them with bandwidth-factor)",
                        names.join(", "),
                        side.len(),
                        ranges(&side)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// `x` with at most six decimals, trailing zeros dropped (`27.5`, not `27.500000000000004`).
fn trimmed(x: f64) -> String {
    let text = format!("{x:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Mixed into the seed of latency noise, so its draws are not the faults-by-kind stream's.
const LATENCY_NOISE_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;

/// The kinds of `cables`, sorted, once each, comma-separated.
fn kinds_of(topology: &Topology, cables: &[LinkId]) -> String {
    let mut kinds: Vec<&str> = cables.iter().map(|&id| topology.link_kind(id)).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds.join(", ")
}

/// `0-7, 12, 16-23`: sorted numbers as ranges.
fn ranges(numbers: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let start = numbers[i];
        let mut end = start;
        while i + 1 < numbers.len() && numbers[i + 1] == end + 1 {
            i += 1;
            end += 1;
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::{ClusterSpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, XgftSpec};

    /// 16 single-GPU hosts on a k = 4 fat-tree, 100 Gb/s links.
    fn fat_tree() -> Topology {
        let link = LinkSpec::new(
            sim_core::units::Bandwidth::from_bits_per_second(100_000_000_000).expect("positive"),
            sim_core::units::SimDuration::from_us(1),
        );
        let tree = XgftSpec::k_ary(4, 3, vec![link; 3]).expect("a k = 4 fat-tree");
        Topology::build(&ClusterSpec {
            nodes: 16,
            gpus_per_node: 1,
            intra_node: IntraNode::NvSwitch(link),
            network: NetworkSpec::new(FabricSpec::FatTree(tree)),
            host_memory: None,
        })
        .expect("builds")
    }

    fn by_kind(kind: &str, fraction: f64, down: bool, seed: u64) -> Faults {
        let effect = if down { FaultEffect::Down } else { FaultEffect::Degraded(0.5) };
        Faults {
            links: vec![LinkFault {
                target: FaultTarget::Kind { kind: kind.into(), fraction },
                effect,
                window: None,
            }],
            latency_noise: None,
            seed,
        }
    }

    fn hit(topology: &Topology) -> Vec<(u32, u64)> {
        (0..topology.link_count() as u32)
            .map(LinkId)
            .filter(|&id| {
                topology.is_down(id) || topology.link(id).bandwidth.bits_per_second() != 100_000_000_000
            })
            .map(|id| (id.0, topology.link(id).bandwidth.bits_per_second()))
            .collect()
    }

    #[test]
    fn faults_drawn_by_kind_are_the_same_for_the_same_seed() {
        let mut cables = 0;
        let mut draws = Vec::new();
        for seed in [1, 1, 2] {
            let mut topology = fat_tree();
            by_kind("leaf-spine", 0.25, false, seed).apply(&mut topology).expect("applies");
            let degraded = hit(&topology);
            cables = degraded.len();
            assert!(degraded.iter().all(|&(_, bits)| bits == 50_000_000_000));
            draws.push(degraded);
        }
        // 16 leaf-spine cables on a k = 4 fat-tree (8 leaves, 2 up each): a quarter is 4 cables,
        // 8 directed links.
        assert_eq!(cables, 8);
        assert_eq!(draws[0], draws[1], "same seed, same links");
        assert_ne!(draws[0], draws[2], "another seed, other links");
    }

    #[test]
    fn a_link_the_cluster_lacks_is_a_keyed_error_naming_a_valid_one() {
        let faults = Faults {
            links: vec![LinkFault {
                target: FaultTarget::Link("nic 99 -> nowhere".into()),
                effect: FaultEffect::Down,
                window: None,
            }],
            latency_noise: None,
            seed: 0,
        };
        let error = faults.apply(&mut fat_tree()).expect_err("no such link");
        assert_eq!(error.key, "faults.links[0].link");
        assert!(
            error.message.contains("nic 99 -> nowhere") && error.message.contains("link_list"),
            "{}",
            error.message
        );
        let error = by_kind("global", 0.5, true, 0).apply(&mut fat_tree()).expect_err("no such kind");
        assert_eq!(error.key, "faults.links[0].kind");
        assert!(error.message.contains("leaf-spine"), "{}", error.message);
    }

    #[test]
    fn links_down_that_cut_ranks_off_are_reported_with_the_ranks() {
        // Every NIC cable down cuts every rank off from every other: the smaller side is named.
        let error = by_kind("NIC", 1.0, true, 0).apply(&mut fat_tree()).expect_err("a partition");
        assert_eq!(error.key, "faults.links[0]");
        assert!(
            error.message.contains("cut 15 of the job's 16 ranks off") || error.message.contains("ranks 0"),
            "{}",
            error.message
        );
        // One NIC cable: rank 5 alone.
        let mut topology = fat_tree();
        let name = topology.link_name(topology.route(HostId(5), HostId(0)).expect("a route")[0]);
        let faults = Faults {
            links: vec![LinkFault {
                target: FaultTarget::Link(name.clone()),
                effect: FaultEffect::Down,
                window: None,
            }],
            latency_noise: None,
            seed: 0,
        };
        let error = faults.apply(&mut topology).expect_err("rank 5 is cut off");
        assert!(error.message.contains("ranks 5;") && error.message.contains(&name), "{}", error.message);
        // A leaf-spine cable: redundant paths, nothing cut off.
        by_kind("leaf-spine", 0.05, true, 3).apply(&mut fat_tree()).expect("routed around");
    }

    #[test]
    fn faults_in_time_are_described_without_float_noise() {
        let faults = Faults {
            links: vec![LinkFault {
                target: FaultTarget::Kind { kind: "NIC".into(), fraction: 0.07 },
                effect: FaultEffect::Degraded(0.5),
                window: Some(FaultWindow {
                    start: SimDuration::from_us(300),
                    length: SimDuration::from_us(2_200),
                    every: Some(SimDuration::from_ms(10)),
                }),
            }],
            latency_noise: Some(LatencyNoise {
                shape: JitterShape::Gamma,
                mean: SimDuration::from_ns(300),
                cv: 0.7,
                kind: None,
            }),
            seed: 0,
        };
        assert_eq!(
            faults.describe_in_time(),
            vec![
                "7% of NIC cables (drawn) at 0.5x bandwidth for 2.2 ms from 0.3 ms, every 10 ms".to_string(),
                "latency noise: + 0.3 us mean (gamma, cv 0.7) per crossing of every link".to_string(),
            ]
        );
        assert_eq!(Faults::default().describe_in_time(), Vec::<String>::new());
    }

    #[test]
    fn ranges_are_compact() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(ranges(&[]), "");
    }
}
