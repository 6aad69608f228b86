//! Cluster graphs.
