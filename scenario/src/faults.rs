//! Network faults (`[faults]`): links at a fraction of their bandwidth, or down. A fault names
//! one link as `parasim topo --json` lists it (`link_list`: `"nic 3.0 -> switch 1"`), or a kind
//! of link (`link_kind`: `NIC`, `leaf-spine`, `spine-core`, `global`, ...) and the fraction of
//! that kind's cables to hit, drawn with ChaCha8 seeded by `simulation.seed`. A fault hits a
//! cable: the named link and its reverse. Routes that cross a link that is down go the
//! fewest-hop way around it; a fault that cuts ranks off is an error naming the links and the
//! ranks, before anything runs.

use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use topology::{HostId, LinkId, Topology};

/// `[faults]` as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct FaultsSection {
    #[serde(default)]
    links: Vec<LinkFaultSection>,
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

/// One validated fault.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkFault {
    /// The links hit.
    pub target: FaultTarget,
    /// What happens to them.
    pub effect: FaultEffect,
}

/// Validated `[faults]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Faults {
    /// The link faults, in the order given.
    pub links: Vec<LinkFault>,
    /// `simulation.seed`, for faults drawn by kind.
    pub seed: u64,
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
            links.push(LinkFault { target, effect });
        }
        Ok(Faults { links, seed })
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
                        let mut kinds: Vec<&str> = cables.iter().map(|&id| topology.link_kind(id)).collect();
                        kinds.sort_unstable();
                        kinds.dedup();
                        return Err(FaultError {
                            key: format!("faults.links[{index}].kind"),
                            message: format!(
                                "is \"{kind}\"; this cluster's links are of kinds {}",
                                kinds.join(", ")
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
            links: vec![LinkFault { target: FaultTarget::Kind { kind: kind.into(), fraction }, effect }],
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
            }],
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
            links: vec![LinkFault { target: FaultTarget::Link(name.clone()), effect: FaultEffect::Down }],
            seed: 0,
        };
        let error = faults.apply(&mut topology).expect_err("rank 5 is cut off");
        assert!(error.message.contains("ranks 5;") && error.message.contains(&name), "{}", error.message);
        // A leaf-spine cable: redundant paths, nothing cut off.
        by_kind("leaf-spine", 0.05, true, 3).apply(&mut fat_tree()).expect("routed around");
    }

    #[test]
    fn ranges_are_compact() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(ranges(&[]), "");
    }
}
