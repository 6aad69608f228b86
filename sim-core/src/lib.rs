//! parasim's engine.
pub mod units;
