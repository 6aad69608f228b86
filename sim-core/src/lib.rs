//! parasim's engine.
pub use units;
pub mod collective;
pub mod exec;
pub mod graph;
pub mod network;
pub mod queue;
pub mod stats;
