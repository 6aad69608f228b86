//! `[[cluster.node-groups]]`: a cluster whose servers carry different devices (half A100,
//! half H100). Each group is `nodes` consecutive servers of one catalog device; every rank
//! runs its own server's kernel times and is checked against its own device's memory.
//!
//! Each group's servers keep their own device's links (NVLink or PCIe switch, and host
//! links), unless the cluster's keys set one rate for all. What the groups share is modelled
//! once for the whole cluster, from the least capable group: the NCCL generation whose tuner
//! prices collectives (the oldest), the device-side copy rate (the slowest memory), and the
//! cluster-wide link figures derived from the server spec (the smallest of the groups'). Groups whose devices differ in kind (GPU or CPU), collective
//! library (NCCL or RCCL) or server interconnect (NVLink or none) are refused: those are
//! different servers, which the format does not describe.

use std::sync::Arc;

use serde::Deserialize;
use sim_core::units::Bandwidth;
use workloads::compute::ComputeModel;
use workloads::device::Device;

/// One `[[cluster.node-groups]]` table as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct NodeGroupSection {
    /// Servers in the group.
    pub(super) nodes: u32,
    /// Their device, a catalog name.
    pub(super) device: String,
}

/// One validated node group.
#[derive(Debug, Clone)]
pub struct NodeGroup {
    /// Its first server (groups follow each other in file order).
    pub first_node: u32,
    /// Servers in it.
    pub nodes: u32,
    /// The device of its GPUs (with `cluster.flops-scale` and `memory-bandwidth-scale` applied).
    pub device: Arc<Device>,
    /// The compute model that prices its kernels (`[compute]` on this device).
    pub compute: Arc<ComputeModel>,
    /// The rate of each direction of its servers' GPU links (NVLink through the NVSwitch, or
    /// the PCIe switch): its own device's, unless `cluster.intra-node.bandwidth` sets one rate
    /// for every server (`None`).
    pub intra_node: Option<Bandwidth>,
    /// The rate of its GPUs' host links: its own device's PCIe, unless
    /// `cluster.host-link.bandwidth` sets one for every server (`None`).
    pub host_link: Option<Bandwidth>,
}

/// How pipeline stages get their layers on a cluster of mixed devices
/// (`parallelism.stage-placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StagePlacement {
    /// As on a cluster of one device: the split by compute on the first group's device.
    #[default]
    InOrder,
    /// Each stage's layers balanced to its own (slowest) device: slower stages get fewer.
    BySpeed,
}

impl StagePlacement {
    /// The key's value.
    pub fn name(self) -> &'static str {
        match self {
            StagePlacement::InOrder => "in-order",
            StagePlacement::BySpeed => "by-speed",
        }
    }
}

impl std::str::FromStr for StagePlacement {
    type Err = String;
    fn from_str(text: &str) -> Result<StagePlacement, String> {
        match text {
            "in-order" => Ok(StagePlacement::InOrder),
            "by-speed" => Ok(StagePlacement::BySpeed),
            other => Err(format!(
                "is {other:?}; valid: \"in-order\" (stages split as on one device type, the default) or \"by-speed\" (each stage's layers balanced to its own devices' kernel times)"
            )),
        }
    }
}

/// The validated node groups of a scenario.
#[derive(Debug, Clone)]
pub struct NodeGroups {
    /// The groups, in file order.
    pub groups: Vec<NodeGroup>,
    /// GPUs per server (`cluster.gpus-per-node`).
    pub gpus_per_node: u32,
    /// How pipeline stages get their layers.
    pub stage_placement: StagePlacement,
}

impl NodeGroups {
    /// The group of the GPU rank `rank` runs on (rank `r` on GPU `r`, `gpus-per-node` per server).
    pub fn group_of_rank(&self, rank: u32) -> usize {
        let node = rank / self.gpus_per_node.max(1);
        self.groups
            .iter()
            .position(|group| node < group.first_node + group.nodes)
            .unwrap_or(self.groups.len() - 1)
    }

    /// The group server `node` belongs to, if any.
    pub fn group_of_node(&self, node: u32) -> Option<&NodeGroup> {
        self.groups.iter().find(|group| (group.first_node..group.first_node + group.nodes).contains(&node))
    }

    /// Whether the groups hold more than one device (same-named devices are one type).
    pub fn is_mixed(&self) -> bool {
        self.groups.iter().any(|group| group.device.name != self.groups[0].device.name)
    }

    /// The device types in order of first appearance: the index of each group's type.
    pub fn type_of_group(&self) -> Vec<usize> {
        let mut names: Vec<&str> = Vec::new();
        self.groups
            .iter()
            .map(|group| match names.iter().position(|name| *name == group.device.name) {
                Some(index) => index,
                None => {
                    names.push(&group.device.name);
                    names.len() - 1
                }
            })
            .collect()
    }

    /// The cluster's devices as the report names them: `"mixed (8 x A100-SXM4-80GB + 8 x
    /// H100-SXM5-80GB)"`, or the one device's name when every group has it.
    pub fn describe(&self) -> String {
        if !self.is_mixed() {
            return self.groups[0].device.display_name.clone();
        }
        let groups: Vec<String> = self
            .groups
            .iter()
            .map(|group| format!("{} x {}", group.nodes * self.gpus_per_node, group.device.display_name))
            .collect();
        format!("mixed ({})", groups.join(" + "))
    }
}

/// Checks that the groups' devices can share one kind of server and fabric, naming the
/// first group that cannot.
pub(super) fn check_alike(devices: &[Device]) -> Result<(), (usize, String)> {
    let Some(first) = devices.first() else { return Ok(()) };
    for (index, device) in devices.iter().enumerate().skip(1) {
        let differs = if device.kind != first.kind {
            Some(format!("a {} where group 0 has a {}", device.kind.noun(), first.kind.noun()))
        } else if device.collectives != first.collectives {
            Some(
                "another collective library than group 0's (NCCL and RCCL do not share a communicator)"
                    .into(),
            )
        } else if device.gpu_link_bandwidth().is_some() != first.gpu_link_bandwidth().is_some() {
            Some(
                "another server interconnect than group 0's (NVLink or Infinity Fabric against PCIe only)"
                    .into(),
            )
        } else {
            None
        };
        if let Some(differs) = differs {
            return Err((
                index,
                format!(
                    "is {:?}, {differs}: node groups may mix devices of one kind of server only (servers of different kinds are not modelled)",
                    device.name
                ),
            ));
        }
    }
    Ok(())
}

/// A device like `devices[0]` whose server links (NVLink or Infinity Fabric, PCIe) are the
/// slowest of all `devices`': the defaults of the links the groups share.
pub(super) fn link_device(devices: &[Device]) -> Option<Device> {
    let mut device = devices.first()?.clone();
    for other in &devices[1..] {
        device.pcie_bandwidth = device.pcie_bandwidth.min(other.pcie_bandwidth);
        device.nvlink_bandwidth = match (device.nvlink_bandwidth, other.nvlink_bandwidth) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        device.infinity_fabric_bandwidth =
            match (device.infinity_fabric_bandwidth, other.infinity_fabric_bandwidth) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
    }
    Some(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_placement_parses_its_two_values_and_names_them_back() {
        for placement in [StagePlacement::InOrder, StagePlacement::BySpeed] {
            assert_eq!(placement.name().parse::<StagePlacement>(), Ok(placement));
        }
        assert!("fastest".parse::<StagePlacement>().unwrap_err().contains("by-speed"));
    }
}
