//! Integration tests of the traces crate: the Chrome export against runs, import of the real
//! traces in `../shared/data/traces` (read from there, never copied), the binary format, and
//! replay.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod binary;
mod chakra;
mod common;
mod export;
mod fuzz;
mod kineto;
mod operators;
mod replay;
