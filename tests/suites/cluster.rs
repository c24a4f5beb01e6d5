//! The end-to-end tests that need the single-node cluster's assets: the
//! project's images in a real cluster (`cluster`: `kubectl apply -f
//! deploy/`; `operations`: `helm install` and the faults of a working day),
//! and the Helm chart rendered by the real helm against a loopback API
//! server (`chart`). One binary, so the harness links once; each module is
//! one file or folder of `tests/e2e/`.
//!
//! One cluster test at a time: the tests of `cluster` and `operations` take
//! [`placement_tests::serial`] (one lock for the binary), as they ran one
//! binary after the other when each was a target of its own; `operations`
//! installs its release in the shared cluster, `cluster` starts clusters of
//! its own. The `chart` tests (no cluster) run beside them.

#[path = "../e2e/chart/mod.rs"]
mod chart;
#[path = "../e2e/cluster.rs"]
mod cluster;
#[path = "../e2e/operations/mod.rs"]
mod operations;
