//! Policy engines for placement-policy: the [`PolicyEngine`] trait, the OPA REST
//! client ([`Opa`]), the embedded Rego engine ([`Embedded`]), decision parsing
//! ([`Decision`]), the annotation merge into a JSON patch ([`placement`]) and
//! the rule of what a decision with errors may do to a placement ([`verdict`]).
//!
//! Every public item has one path: the module of its topic
//! (`policy_client::engine::PolicyEngine`, `policy_client::opa::Opa`); the
//! crate root re-exports none of them.
//!
//! No Kubernetes server code lives here.
//!
//! [`PolicyEngine`]: engine::PolicyEngine
//! [`Opa`]: opa::Opa
//! [`Embedded`]: embedded::Embedded
//! [`Decision`]: decision::Decision

mod compiled;
pub mod configmaps;
pub mod decision;
mod delegating;
pub mod delivery;
pub mod embedded;
mod embedded_builtins;
pub mod engine;
pub mod engine_metrics;
pub mod input;
mod input_reads;
pub mod karmada;
pub mod kube_client;
mod memo;
pub mod ocm;
pub mod opa;
pub mod ownership_keys;
pub mod ownership_secret;
pub mod placement;
pub mod rego_analysis;
mod rego_value;
pub mod retry;
pub mod revision_board;
pub mod revision_feed;
pub mod text;
pub mod verdict;

/// The decision the shipped policies define (`package io.k8s.federation.admission`).
pub const DEFAULT_DECISION_PATH: &str = "io/k8s/federation/admission";
