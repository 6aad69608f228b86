//! Simulated-versus-measured comparison: accuracy metrics and the bundled suite of published
//! measurements and real traces (`data/validation/`), run by `parasim validate`.
//!
//! Status: empty. The suite lands with the validation issue; this crate will only compare
//! results, never reach into engine internals.
