//! Every file format parasim reads or writes for timelines: import of real profiler traces
//! (PyTorch Kineto / Chrome trace JSON, Horovod timelines) into the execution graph, export of
//! simulated timelines as Chrome trace JSON for Perfetto, and the compact binary trace format.
//!
//! Status: empty. The formats land with the trace issue; the crate exists now so the workspace
//! has its final shape and the dependency direction (`sim-core` <- `traces` <- `validation`)
//! is fixed from the start.
