//! Scenario files end to end: the compute knobs, the filter and input keys, one-GPU steps against published
//! timings, and random scenario text that must give an error or a result, never a panic.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod compute_knobs;
mod filter_keys;
mod fuzz;
mod input;
mod iteration_times;
mod jobs;
mod mixed;
mod overrides;
mod single_gpu;
mod variability;
