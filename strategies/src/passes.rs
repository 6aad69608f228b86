//! Which passes of a training step a run simulates (`workload.passes`).
//!
//! `"training"`, the default, is the whole step: forward, backward, gradient synchronisation
//! and optimizer step. `"forward"` is the forward pass of a training step alone, as the
//! benchmarks that time a model's forward in training mode measure it (llm.c's
//! `train_gpt2.py --inference_only 1`: `model.train()`, autograd on, `model(x, y)` with the
//! loss, then no backward and no optimizer step): every forward kernel and the collectives and
//! pipeline sends of the forward, in the schedule's order; no backward, no gradient
//! collectives, no gradient-norm reduction and no optimizer step. Memory is the training
//! step's (the weights, gradients and optimizer states a training process holds, and the
//! activations autograd saves), so what fits is what the training job fits.

use std::fmt;

/// The passes of a step that run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Passes {
    /// Forward, backward, gradient synchronisation, optimizer step.
    #[default]
    Training,
    /// The forward pass of a training step alone.
    Forward,
}

impl Passes {
    /// Every value, for messages.
    pub const ALL: [Passes; 2] = [Passes::Training, Passes::Forward];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            Passes::Training => "training",
            Passes::Forward => "forward",
        }
    }

    /// Whether the backward pass, the gradients' synchronisation and the optimizer step run.
    pub const fn trains(self) -> bool {
        matches!(self, Passes::Training)
    }
}

impl fmt::Display for Passes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Passes {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Passes::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            format!(
                "unknown passes {name:?}; valid: \"training\" (forward, backward, gradient synchronisation, optimizer step) or \"forward\" (the forward pass of a training step alone)"
            )
        })
    }
}
