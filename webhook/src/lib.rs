//! The placement admission webhook: answers `admission.k8s.io/v1` AdmissionReviews
//! by asking a policy engine for placement annotations and merging them in as a
//! JSON patch, or denying with the policy's errors.
//!
//! The binary parses [`Cli`] and calls [`serve()`], [`review()`] or [`certs()`];
//! nothing else is public.
//!
//! Layers, each using only those below it (no module reaches one above, and
//! `server` is reached only from `run`):
//!
//! 1. `run` (`serve`, `certs`) and `offline_review` (`review`): wire the rest.
//! 2. `server` (HTTP: budgets and refusals before evaluation) and
//!    `self_managed` (certificates kept in a Secret).
//! 3. `admission` (the answer to one review; its children `delivery`, the
//!    delivery guard, and `guardrail`, the Karmada binding guardrail's one
//!    home, add to `impl Admission` and import nothing else from it).
//! 4. `failure` (why no placement), `events`, `readiness`, `budget`, `tls`.
//! 5. `review` (the wire types), `presence`, `metrics`, `sizing`.
//! 6. `config`: the flags, reaching no other module.

#![deny(unreachable_pub)]

mod admission;
mod budget;
mod config;
mod events;
mod failure;
mod metrics;
mod offline_review;
mod presence;
mod readiness;
mod review;
mod run;
mod self_managed;
mod server;
mod sizing;
mod tls;

pub use config::{Cli, Command, LogFormat};
pub use offline_review::review;
pub use run::{RunError, certs, serve};
