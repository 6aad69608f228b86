//! The input pipeline: where a training step's samples come from before the first kernel can
//! run (`[workload.input]`, docs/compute-model.md "Input pipeline").
//!
//! A *loader* decodes and augments samples on the host at `rate` samples per second, working
//! `prefetch` batches ahead of the step that consumes them, as the data loaders of the
//! frameworks do (PyTorch's `DataLoader`, Chainer's `MultithreadIterator`). Each loader feeds
//! either its own rank (`per-rank`) or one model-parallel group: one rank of the group loads
//! the whole batch and broadcasts it to the others every iteration (`per-group`, ChainerMN's
//! `create_multi_node_iterator`), which costs a network broadcast of the batch plus the host's
//! serialisation of it at `broadcast-rate`. A step whose loader cannot keep up waits: it is
//! *input-bound*, and `parasim run` reports the wait.
//!
//! In steady state with prefetching, a per-rank loader makes the iteration
//! `max(step, samples / rate)`; a per-group loader adds the broadcast, which no prefetching
//! hides: `max(step, samples / rate) + bytes / broadcast-rate` (plus the network's part).
//!
//! ```
//! use sim_core::units::{Bytes, SimDuration};
//! use workloads::input::{InputCopy, InputPipeline, Loader};
//!
//! let input = InputPipeline { loader: Loader::PerGroup, rate: 400.0, prefetch: 1,
//!     broadcast_rate: Some("1 GB/s".parse()?), sample_bytes: None, copy: InputCopy::None };
//! assert_eq!(input.load_time(512)?, SimDuration::from_ms(1280));
//! // 512 samples of 3 x 224 x 224 fp32 values: 308 MB broadcast at 1 GB/s.
//! assert_eq!(input.unpack_time(Bytes(512 * 602_112))?, SimDuration::from_ns(308_281_344));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use sim_core::units::{Bandwidth, Bytes, SimDuration, UnitError};

/// Which ranks run a data loader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loader {
    /// Every rank that takes input (the first pipeline stage) loads its replica's batch itself.
    PerRank,
    /// One rank of each model-parallel group (tensor, spatial, filter or channel ranks of the
    /// first pipeline stage) loads the group's batch and broadcasts it to the others.
    PerGroup,
    /// No loader modelled: the data is on the device already, or its cost is not modelled.
    None,
}

impl Loader {
    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            Loader::PerRank => "per-rank",
            Loader::PerGroup => "per-group",
            Loader::None => "none",
        }
    }
}

impl fmt::Display for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Loader {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "per-rank" => Ok(Loader::PerRank),
            "per-group" => Ok(Loader::PerGroup),
            "none" => Ok(Loader::None),
            other => Err(format!("{other:?}: valid loaders are per-rank, per-group and none")),
        }
    }
}

/// Whether the copy of the batch from host memory to the device is modelled, and where it runs.
///
/// Chainer's `StandardUpdater` copies each batch inside the training step: its converter
/// (`concat_examples` -> `to_device` -> `cupy.asarray`) stages the NumPy batch in a pinned
/// buffer and issues `cudaMemcpyAsync` on CuPy's current stream, which is the stream the
/// kernels run on (the legacy default stream unless the program sets another; Chainer v7.0.0
/// `chainer/training/updaters/standard_updater.py` `update_core`, `chainer/backends/cuda.py`
/// `_array_to_gpu`; CuPy v7.0.0 `cupy/core/core.pyx` `_send_object_to_gpu`). Work on one
/// stream runs in order, so the copy starts after the previous step's kernels and the step's
/// first kernel waits for it: it adds `bytes / host-link` to every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputCopy {
    /// Not modelled (the default): the batch is on the device when the step starts, or its
    /// copy overlaps with the kernels (a side stream, a prefetcher).
    #[default]
    None,
    /// The batch (of the loader's sample size) is copied over the rank's host link on the
    /// compute stream at the start of every iteration, by every rank of the first pipeline
    /// stage.
    ComputeStream,
}

impl InputCopy {
    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            InputCopy::None => "none",
            InputCopy::ComputeStream => "compute-stream",
        }
    }
}

impl fmt::Display for InputCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for InputCopy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(InputCopy::None),
            "compute-stream" => Ok(InputCopy::ComputeStream),
            other => Err(format!("{other:?}: valid copies are none and compute-stream")),
        }
    }
}

/// How samples reach the GPUs (`[workload.input]`).
#[derive(Debug, Clone, PartialEq)]
pub struct InputPipeline {
    /// Which ranks load.
    pub loader: Loader,
    /// Samples per second one loader decodes and augments (a property of the host and of the
    /// framework's loader: a Python loader bound by its interpreter does not scale with cores).
    /// Unused, and not checked, without a loader ([`Loader::None`]).
    pub rate: f64,
    /// Batches a loader works ahead of the step (Chainer's and PyTorch's default: 1 and 2).
    pub prefetch: u32,
    /// Per-group loaders: the host's rate of serialising the broadcast batch and of unpacking
    /// it on the receivers (pickling, MPI host copies); `None` counts the network only.
    pub broadcast_rate: Option<Bandwidth>,
    /// Bytes of one loaded sample; `None`: the model's input in fp32.
    pub sample_bytes: Option<Bytes>,
    /// Whether the step copies its batch to the device ([`InputCopy`]).
    pub copy: InputCopy,
}

impl InputPipeline {
    /// Time one loader takes to produce `samples`.
    pub fn load_time(&self, samples: u64) -> Result<SimDuration, UnitError> {
        SimDuration::from_secs_f64(samples as f64 / self.rate)
    }

    /// Host time to serialise (or unpack) a broadcast batch of `bytes`.
    pub fn unpack_time(&self, bytes: Bytes) -> Result<SimDuration, UnitError> {
        match self.broadcast_rate {
            Some(rate) => rate.time_to_send(bytes),
            None => Ok(SimDuration::ZERO),
        }
    }

    /// Bytes of one sample as loaded: `sample_bytes`, else `input_elements` fp32 values.
    pub fn bytes_per_sample(&self, input_elements: u64) -> Bytes {
        self.sample_bytes.unwrap_or(Bytes(input_elements.saturating_mul(4)))
    }

    /// Checks the values a scenario gave: the key that is wrong and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.loader != Loader::None && !(self.rate.is_finite() && self.rate > 0.0) {
            return Err((
                "rate",
                format!("{}: give the samples per second one loader produces, a number above 0", self.rate),
            ));
        }
        if self.loader != Loader::None
            && (self.rate < 1e-6 || SimDuration::from_secs_f64(1.0 / self.rate).is_err())
        {
            return Err((
                "rate",
                format!("{}: too slow to simulate (at least 1e-6 samples per second)", self.rate),
            ));
        }
        if !(1..=64).contains(&self.prefetch) {
            return Err(("prefetch", format!("{}: batches loaded ahead, from 1 to 64", self.prefetch)));
        }
        if self.broadcast_rate.is_some() && self.loader != Loader::PerGroup {
            return Err((
                "broadcast-rate",
                format!(
                    "is set, but loader = {:?} broadcasts nothing: it applies to loader = \"per-group\"",
                    self.loader.name()
                ),
            ));
        }
        if self.sample_bytes == Some(Bytes::ZERO) {
            return Err(("sample-bytes", "0 B: a sample holds at least one byte".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(loader: Loader) -> InputPipeline {
        InputPipeline {
            loader,
            rate: 250.0,
            prefetch: 1,
            broadcast_rate: None,
            sample_bytes: None,
            copy: InputCopy::None,
        }
    }

    #[test]
    fn load_time_is_samples_over_rate() {
        assert_eq!(pipeline(Loader::PerRank).load_time(500).unwrap(), SimDuration::from_ms(2000));
        assert_eq!(pipeline(Loader::PerRank).load_time(0).unwrap(), SimDuration::ZERO);
    }

    #[test]
    fn unpack_time_is_zero_without_a_broadcast_rate() {
        let mut input = pipeline(Loader::PerGroup);
        assert_eq!(input.unpack_time(Bytes(1 << 30)).unwrap(), SimDuration::ZERO);
        input.broadcast_rate = Some("1 GB/s".parse().unwrap());
        assert_eq!(input.unpack_time(Bytes(1_000_000_000)).unwrap(), SimDuration::from_ms(1000));
    }

    #[test]
    fn sample_bytes_default_to_fp32_inputs() {
        let input = pipeline(Loader::PerRank);
        assert_eq!(input.bytes_per_sample(3 * 224 * 224), Bytes(602_112));
        let given = InputPipeline { sample_bytes: Some(Bytes(150_528)), ..input };
        assert_eq!(given.bytes_per_sample(3 * 224 * 224), Bytes(150_528));
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |input: InputPipeline| input.validate().unwrap_err().0;
        assert_eq!(bad(InputPipeline { rate: 0.0, ..pipeline(Loader::PerRank) }), "rate");
        assert_eq!(bad(InputPipeline { rate: f64::NAN, ..pipeline(Loader::PerRank) }), "rate");
        assert_eq!(bad(InputPipeline { rate: 1e-9, ..pipeline(Loader::PerRank) }), "rate");
        assert_eq!(bad(InputPipeline { prefetch: 0, ..pipeline(Loader::PerRank) }), "prefetch");
        let broadcast = Some("1 GB/s".parse().unwrap());
        assert_eq!(
            bad(InputPipeline { broadcast_rate: broadcast, ..pipeline(Loader::PerRank) }),
            "broadcast-rate"
        );
        assert_eq!(
            bad(InputPipeline { sample_bytes: Some(Bytes::ZERO), ..pipeline(Loader::PerRank) }),
            "sample-bytes"
        );
        assert!(InputPipeline { broadcast_rate: broadcast, ..pipeline(Loader::PerGroup) }.validate().is_ok());
    }

    #[test]
    fn loaders_parse_and_print() {
        for loader in [Loader::PerRank, Loader::PerGroup, Loader::None] {
            assert_eq!(loader.name().parse::<Loader>().unwrap(), loader);
        }
        assert!("per-node".parse::<Loader>().unwrap_err().contains("per-rank, per-group and none"));
        for copy in [InputCopy::None, InputCopy::ComputeStream] {
            assert_eq!(copy.name().parse::<InputCopy>().unwrap(), copy);
        }
        assert!("async".parse::<InputCopy>().unwrap_err().contains("none and compute-stream"));
    }

    #[test]
    fn a_copy_without_a_loader_needs_no_rate() {
        let copy = InputPipeline { rate: f64::NAN, copy: InputCopy::ComputeStream, ..pipeline(Loader::None) };
        assert!(copy.validate().is_ok());
    }
}
