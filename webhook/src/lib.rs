//! The placement admission webhook: answers `admission.k8s.io/v1` AdmissionReviews
//! by asking a policy engine for placement annotations and merging them in as a
//! JSON patch, or denying with the policy's errors.
//!
//! The binary parses [`Cli`] and calls [`serve()`], [`review()`] or [`certs()`];
//! nothing else is public.

#![deny(unreachable_pub)]

mod admission;
mod budget;
mod config;
mod events;
mod guardrail;
mod metrics;
mod offline_review;
mod presence;
mod readiness;
mod review;
mod run;
mod self_managed;
mod server;
mod sizing;

pub use config::{Cli, Command, LogFormat};
pub use offline_review::review;
pub use run::{RunError, certs, serve};
