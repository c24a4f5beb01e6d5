//! Policy engines for placement-policy: the [`PolicyEngine`] trait, the OPA REST
//! client ([`Opa`]), the embedded Rego engine ([`Embedded`]), decision parsing
//! ([`Decision`]), the annotation merge into a JSON patch ([`placement`]) and
//! the rule of what a decision with errors may do to a placement ([`verdict`]).
//!
//! No Kubernetes server code lives here.

mod compiled;
pub mod configmaps;
pub mod decision;
mod delegating;
pub mod embedded;
pub mod engine;
pub mod input;
mod input_reads;
pub mod karmada;
pub mod kube_client;
mod memo;
pub mod opa;
pub mod ownership_keys;
pub mod ownership_secret;
pub mod placement;
mod rego_value;
pub mod retry;
pub mod revision_board;
pub mod revision_feed;
pub mod text;
pub mod verdict;

pub use decision::{Decision, DecisionError};
pub use embedded::{DEFAULT_DECISION_CACHE_BYTES, Embedded};
pub use engine::{
    CompileError, DecisionCacheStats, EncodedJson, EngineError, ErrorClass, PolicyEngine,
    QueryOutcome,
};
pub use input::{
    ADMISSION_INPUT_KEY, BINDING_INPUT_KEY, PLACEMENT_INPUT_KEY, PolicyInput, RequestMeta,
    policy_input,
};
pub use input_reads::Uncacheable;
pub use opa::{Opa, OpaConfig, Token};
pub use ownership_keys::{LoadingKeys, OwnershipKeys, SharedKeys};
pub use reqwest::Url;
pub use retry::Backoff;
pub use revision_board::{AnnouncedWrites, RevisionBoard};
pub use revision_feed::RememberingEngine;

/// The decision the shipped policies define (`package io.k8s.federation.admission`).
pub const DEFAULT_DECISION_PATH: &str = "io/k8s/federation/admission";
