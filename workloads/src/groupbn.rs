//! Group ("sync") batch norm: every batch norm reduces its statistics over a group of GPUs of
//! one server instead of over its own batch (`[parallelism] batch-norm-group`), and what that
//! costs in the lowering.
//!
//! The mechanism is NVIDIA's NHWC batch norm with `bn_group` (MXNet's `BatchNorm` and
//! `BatchNormAddRelu`, as NVIDIA's MLPerf ResNet-50 runs them with `BN_GROUP=2`; the same
//! kernels ported to PyTorch are NVIDIA/apex `apex/contrib/csrc/groupbn/`). It does not call
//! NCCL: inside the batch-norm kernel, once the grid has reduced its partial sums of a block of
//! 64 channels, CTA 0 writes them with a flag word next to every value into the peer GPU's
//! buffer (`st.global.wt.v4.b32 {x0, magic, x2, magic}` through CUDA IPC pointers), and every
//! CTA spins on its own buffer until the peer's flags carry this call's `magic`
//! (`parallel_sums_16x2` in `nhwc_batch_norm_kernel.h`). The forward does it twice in a row,
//! for the mean and then, from the global mean, for the variance; the backward twice, for the
//! scale and the shift gradients. A group of 4 or 8 repeats each exchange 2 or 3 times with
//! other peers (`sync_iters = bn_group == 8 ? 3 : bn_group >> 1`, `NhwcBatchNorm::fwd`).
//!
//! The price of one exchange is one hop of the same mechanism NCCL's LL protocol uses (data
//! and flag written together to the peer, which polls the flag): NCCL's own per-hop latency
//! for LL inside a server (`hwLat`, `src/graph/tuning.cc`: 0.6 us over NVLink in 2.27, 0.47
//! in 2.11-2.13, 1.0 us over PCIe), plus the bytes (8 per channel: the fp32 value and its
//! flag) at the intra-node link's rate. docs/strategies.md, "Group batch norm", has the
//! sources and what is not modelled.
//!
//! ```
//! use workloads::groupbn::BatchNormGroup;
//! use sim_core::units::{Bandwidth, SimDuration};
//!
//! let group = BatchNormGroup::new(2, SimDuration::from_ns(600), Bandwidth::from_bytes_per_second(300_000_000_000).unwrap());
//! // 64 channels: two exchanges, each 0.6 us plus 512 B at 300 GB/s.
//! let time = group.exchange_time(64).unwrap();
//! assert_eq!(time.as_ps(), 2 * (600_000 + 1_707));
//! assert_eq!(BatchNormGroup::NONE.exchange_time(64).unwrap(), SimDuration::ZERO);
//! ```

use sim_core::units::{Bandwidth, Bytes, SimDuration, UnitError};

use crate::layer::{Layer, LayerKind, Traffic};

/// The group sizes NVIDIA's group batch norm supports (MXNet's `--bn-group` choices in the
/// MLPerf ResNet-50's `train_imagenet.py`: 1, 2, 4, 8).
pub const VALID_SIZES: [u32; 4] = [1, 2, 4, 8];

/// Sequential peer exchanges in one batch-norm kernel, forward or backward, per round of the
/// group: the forward exchanges the mean and then the variance (computed from the global
/// mean), the backward the scale gradient and then the shift gradient
/// (`nhwc_batch_norm_fwd`, `nhwc_batch_norm_bwd*`: two `ParallelSums::dispatchX` calls each).
pub const EXCHANGES_PER_PASS: u64 = 2;

/// Bytes written to the peer per channel and exchange: the fp32 partial sum and a 32-bit flag
/// word beside it (`st.global.wt.v4.b32 {x[0], magic, x[2], magic}`).
pub const BYTES_PER_CHANNEL: u64 = 8;

/// How many GPUs share each batch norm's statistics, and what one peer exchange costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchNormGroup {
    /// GPUs per group (1: every GPU normalizes over its own batch).
    pub size: u32,
    /// One peer write and its flag seen by the peer: NCCL's LL hop latency inside a server.
    pub hop_latency: SimDuration,
    /// The intra-node link's rate per direction.
    pub peer_bandwidth: Bandwidth,
}

impl BatchNormGroup {
    /// No group: every batch norm normalizes over its own GPU's batch (the default).
    pub const NONE: BatchNormGroup = BatchNormGroup {
        size: 1,
        hop_latency: SimDuration::ZERO,
        peer_bandwidth: match Bandwidth::from_bits_per_second(1) {
            Some(rate) => rate,
            None => panic!("non-zero"),
        },
    };

    /// A group of `size` GPUs whose peer exchanges take `hop_latency` plus their bytes at
    /// `peer_bandwidth`.
    pub fn new(size: u32, hop_latency: SimDuration, peer_bandwidth: Bandwidth) -> BatchNormGroup {
        BatchNormGroup { size, hop_latency, peer_bandwidth }
    }

    /// Whether statistics are shared (a group of more than one GPU).
    pub fn is_grouped(&self) -> bool {
        self.size > 1
    }

    /// Rounds of exchange with successive peers per exchange: 1 for a pair, 2 for 4 GPUs, 3
    /// for 8 (`sync_iters`, `NhwcBatchNorm::fwd`; MXNet's `bn_group_to_sync_depth`).
    pub fn rounds(&self) -> u64 {
        match self.size {
            0 | 1 => 0,
            size => u64::from(size.ilog2()),
        }
    }

    /// The time one batch-norm kernel of `channels` channels (forward or backward) spends in
    /// its peer exchanges: [`EXCHANGES_PER_PASS`] x [`rounds`](Self::rounds) x (hop latency +
    /// `channels` x [`BYTES_PER_CHANNEL`] at the peer link's rate). Zero without a group.
    pub fn exchange_time(&self, channels: u64) -> Result<SimDuration, UnitError> {
        let exchanges = EXCHANGES_PER_PASS * self.rounds();
        if exchanges == 0 {
            return Ok(SimDuration::ZERO);
        }
        let bytes = Bytes(channels.saturating_mul(BYTES_PER_CHANNEL));
        let one = self.hop_latency.saturating_add(self.peer_bandwidth.time_to_send(bytes)?);
        one.checked_mul(exchanges).map_err(|_| UnitError::OutOfRange {
            input: format!("{exchanges} exchanges of {one}"),
            quantity: "group batch-norm exchange time",
            reason: "longer than the largest representable duration",
        })
    }

    /// Adds to `layers` (one rank's layers, in forward order, after fusion) what NVIDIA's
    /// ResNet symbol runs only with a group: before each projection shortcut's batch norm,
    /// `conv1sc + conv3 * 0` ("a work around to enforce strict ordering of bn layers",
    /// `symbols/resnet-v1b-fl.py`, `residual_unit`), so that both GPUs of a group run their
    /// batch norms, and so their exchanges, in the same order. Priced at its least: one
    /// element-wise kernel (read both inputs, write the sum: 3 elements per output element)
    /// folded into the shortcut batch norm's forward, and in the backward one more add of the
    /// two gradients that now reach the main branch's last convolution (3 per element).
    /// Shortcut batch norms are recognised by the zoo's torchvision names
    /// (`layerN.M.downsample.1`). Returns how many were found.
    pub fn apply_ordering_add<'l>(&self, layers: impl IntoIterator<Item = &'l mut Layer>) -> usize {
        if !self.is_grouped() {
            return 0;
        }
        let mut found = 0;
        for layer in layers {
            if layer.kind == LayerKind::BatchNorm && layer.name.contains(".downsample.") {
                let n = layer.cost.activation_elements;
                let add = |traffic: Traffic| Traffic {
                    per_sample: traffic.per_sample.saturating_add(3 * n),
                    per_batch: traffic.per_batch,
                };
                layer.cost.forward_traffic = add(layer.cost.forward_traffic);
                layer.cost.backward_data_traffic = add(layer.cost.backward_data_traffic);
                found += 1;
            }
        }
        found
    }
}

impl Default for BatchNormGroup {
    fn default() -> Self {
        BatchNormGroup::NONE
    }
}

/// The channels a batch norm normalizes: the first dimension of its input (`[C, H, W]`).
pub fn channels(layer: &Layer) -> u64 {
    layer.input.0.first().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(latency_ns: u64, gbytes: u64) -> BatchNormGroup {
        let rate = Bandwidth::from_bytes_per_second(gbytes * 1_000_000_000).expect("rate");
        BatchNormGroup::new(2, SimDuration::from_ns(latency_ns), rate)
    }

    #[test]
    fn rounds_follow_the_kernels_sync_iters() {
        let rounds = |size| BatchNormGroup { size, ..pair(600, 300) }.rounds();
        assert_eq!([rounds(1), rounds(2), rounds(4), rounds(8)], [0, 1, 2, 3]);
    }

    /// One batch norm of 2048 channels (ResNet-50's last stage) in a pair over a 300 GB/s
    /// NVSwitch link with NCCL 2.27's 0.6 us LL hop: 2 x (0.6 us + 16 KiB / 300 GB/s).
    #[test]
    fn one_layer_exchange_is_the_closed_form() {
        let group = pair(600, 300);
        let bytes = 2048 * 8;
        let transfer_ps = (bytes as u64 * 1_000_000_000_000).div_ceil(300_000_000_000);
        assert_eq!(transfer_ps, 54_614);
        assert_eq!(group.exchange_time(2048).unwrap(), SimDuration::from_ps(2 * (600_000 + transfer_ps)));
        // A group of 8: three rounds per exchange.
        let eight = BatchNormGroup { size: 8, ..group };
        assert_eq!(eight.exchange_time(2048).unwrap(), SimDuration::from_ps(6 * (600_000 + transfer_ps)));
    }

    #[test]
    fn no_group_costs_nothing_and_adds_nothing() {
        assert_eq!(BatchNormGroup::NONE.exchange_time(4096).unwrap(), SimDuration::ZERO);
        let mut model = crate::family::resnet50();
        let before = model.layers.clone();
        assert_eq!(BatchNormGroup::NONE.apply_ordering_add(&mut model.layers), 0);
        assert_eq!(model.layers, before);
    }

    /// ResNet-50 has four projection shortcuts; each one's batch norm gains 3 elements per
    /// element of traffic in each pass.
    #[test]
    fn the_ordering_add_lands_on_the_four_shortcut_batch_norms() {
        let mut model = crate::family::resnet50();
        let before = model.layers.clone();
        assert_eq!(pair(600, 300).apply_ordering_add(&mut model.layers), 4);
        for (old, new) in before.iter().zip(&model.layers) {
            if old.name.ends_with(".downsample.1") {
                let n = old.cost.activation_elements;
                assert_eq!(new.cost.forward_traffic.per_sample, old.cost.forward_traffic.per_sample + 3 * n);
                assert_eq!(
                    new.cost.backward_data_traffic.per_sample,
                    old.cost.backward_data_traffic.per_sample + 3 * n
                );
            } else {
                assert_eq!(new, old);
            }
        }
        let layer1 = model.layers.iter().find(|l| l.name == "layer1.0.downsample.1").expect("shortcut");
        assert_eq!((channels(layer1), layer1.cost.activation_elements), (256, 256 * 56 * 56));
    }
}
