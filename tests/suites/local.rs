//! The end-to-end tests whose bed runs on loopback: etcd, kube-apiserver and
//! OPA (the harness's [`placement_tests::ControlPlane`], shared by the modules
//! that call `ControlPlane::shared`, each test in namespaces of its own, or
//! one of a test's own), the project's binaries as processes, and kube-mgmt
//! where its source is kept. One binary, so the harness links once; each
//! module is one file or folder of `tests/e2e/`.
//!
//! Tests of different modules run side by side (two at a time, as cargo runs
//! the tests of one binary); the tests that start a bed of their own one at a
//! time (`sync`, `kube_mgmt`) take [`placement_tests::serial`], one lock for
//! the whole binary. No test here needs Karmada or OCM, and no test's path
//! contains `karmada_` or `ocm_` (`scripts/test` skips those by name).

#[path = "../e2e/admission_e2e.rs"]
mod admission_e2e;
#[path = "../e2e/blast_radius/mod.rs"]
mod blast_radius;
#[path = "../e2e/docs/mod.rs"]
mod docs;
#[path = "../e2e/hostile/mod.rs"]
mod hostile;
#[path = "../e2e/kube_mgmt/mod.rs"]
mod kube_mgmt;
#[path = "../e2e/opa_client.rs"]
mod opa_client;
#[path = "../e2e/ownership.rs"]
mod ownership;
#[path = "../e2e/policy_input.rs"]
mod policy_input;
#[path = "../e2e/sync/mod.rs"]
mod sync;
#[path = "../e2e/webhook_auth.rs"]
mod webhook_auth;
#[path = "../e2e/webhook_tls/mod.rs"]
mod webhook_tls;
