//! The validation crate's integration tests: checks of the suite's data that need a model
//! built (the families themselves run in `parasim validate`).

mod fuzz;
mod mpt;
