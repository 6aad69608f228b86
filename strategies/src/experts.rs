//! How a rank runs its local experts (`parallelism.moe-experts`), and the host launches that
//! costs.
//!
//! Megatron-Core has two implementations of a mixture-of-experts layer's expert bank
//! (NVIDIA/Megatron-LM @ d98e8a64dd, megatron/core/transformer/moe/experts.py):
//! `TEGroupedMLP` (`--moe-grouped-gemm`) runs all local experts as one grouped `fc1`, one
//! activation and one grouped `fc2`; `SequentialMLP` (the default: `moe_grouped_gemm = False`
//! in megatron/core/transformer/transformer_config.py) holds one dense `MLP` module per local
//! expert (`self.local_experts.append(MLP(...))`) and calls them one after another on each
//! expert's tokens (`for expert, tokens, probs in zip(self.local_experts, ...)`). Each such
//! `MLP` is the class a dense transformer layer's feed-forward block is, so it costs the host
//! what a dense block's `fc1`, activation and `fc2` layers do: parasim counts the launches of a
//! sequential bank as those of its local experts' dense blocks. The GPU work is the same
//! grouped kernel's in either (the experts' products summed; smaller products' lower
//! efficiency is not modelled).

use workloads::layer::{Layer, LayerKind};

/// How a rank runs its local experts (`parallelism.moe-experts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MoeExperts {
    /// One grouped kernel per matrix product for all local experts (Megatron-Core's
    /// `TEGroupedMLP`, `--moe-grouped-gemm`; parasim's model of an expert bank since experts
    /// were added): a dense feed-forward block's launches.
    #[default]
    Grouped,
    /// One dense `MLP` module per local expert, called in turn (Megatron-Core's
    /// `SequentialMLP`, its default): a dense feed-forward block's launches per local expert.
    Sequential,
}

/// Host launches of one dense feed-forward block (`fc1`, activation, `fc2`; the gated form's
/// gate-up, GLU and down) per pass: forward and backward-data run all three layers, the
/// backward-weight only the two linear ones.
const DENSE_BLOCK_LAUNCHES: [u32; 3] = [3, 3, 2];

impl MoeExperts {
    /// Every implementation, in the order errors list them.
    pub const ALL: [MoeExperts; 2] = [MoeExperts::Grouped, MoeExperts::Sequential];

    /// The scenario name: `"grouped"` or `"sequential"`.
    pub const fn name(self) -> &'static str {
        match self {
            MoeExperts::Grouped => "grouped",
            MoeExperts::Sequential => "sequential",
        }
    }

    /// The host launches of the forward, backward-data and backward-weight passes of `layer`
    /// as one rank runs it (its local shapes): a local expert bank's are a dense feed-forward
    /// block's, once for a grouped bank and once per local expert for a sequential one; every
    /// other layer's pass is one launch.
    pub fn launches(self, layer: &Layer) -> [u32; 3] {
        match (self, &layer.kind) {
            (MoeExperts::Grouped, LayerKind::MoeExperts { .. }) => DENSE_BLOCK_LAUNCHES,
            (MoeExperts::Sequential, LayerKind::MoeExperts { experts, .. }) => {
                let local = u32::try_from(*experts).unwrap_or(u32::MAX).max(1);
                DENSE_BLOCK_LAUNCHES.map(|launches| launches.saturating_mul(local))
            }
            _ => [1; 3],
        }
    }
}

impl std::str::FromStr for MoeExperts {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        MoeExperts::ALL.into_iter().find(|e| e.name() == name).ok_or_else(|| {
            format!(
                "unknown expert implementation {name:?}; valid: \"grouped\" (all local experts as \
                 one grouped kernel per product: Megatron-Core's --moe-grouped-gemm), \"sequential\" \
                 (one MLP module per local expert, called in turn: Megatron-Core's default \
                 SequentialMLP)"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::layer::{Activation, Shape};

    fn bank(local: u64) -> Layer {
        let kind = LayerKind::MoeExperts {
            experts: local,
            top_k: 1,
            ffn_hidden: 64,
            activation: Activation::Gelu,
            gated: false,
            bias: false,
        };
        Layer::new("experts", kind, Shape::from([16, 32])).unwrap()
    }

    #[test]
    fn launches_are_a_dense_block_once_or_per_local_expert() {
        assert_eq!(MoeExperts::Grouped.launches(&bank(4)), [3, 3, 2]);
        assert_eq!(MoeExperts::Sequential.launches(&bank(4)), [12, 12, 8]);
        assert_eq!(MoeExperts::Sequential.launches(&bank(1)), MoeExperts::Grouped.launches(&bank(1)));
        let linear =
            Layer::new("fc", LayerKind::Linear { out_features: 8, bias: true }, Shape::from([16, 32]))
                .unwrap();
        assert_eq!(MoeExperts::Sequential.launches(&linear), [1, 1, 1]);
    }

    #[test]
    fn names_round_trip_and_a_bad_one_lists_the_valid() {
        for experts in MoeExperts::ALL {
            assert_eq!(experts.name().parse::<MoeExperts>(), Ok(experts));
        }
        let error = "grouped-gemm".parse::<MoeExperts>().unwrap_err();
        assert!(error.contains("\"grouped\"") && error.contains("\"sequential\""), "{error}");
    }
}
