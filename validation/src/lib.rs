//! Simulated against measured: the bundled suite of published measurements and real traces
//! (`data/validation/`) that `parasim validate` runs, and the replay of real traces behind
//! `parasim replay`. This crate only compares results; it never reaches into engine
//! internals.

pub mod bounds;
pub mod case;
pub mod plot;
pub mod replay;
pub mod report;
pub mod run;
pub mod suite;
