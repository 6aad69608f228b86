//! The lowering's build time on large models (how long lowering takes, not what it produces).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod timing;
