//! The placement admission webhook: answers `admission.k8s.io/v1` AdmissionReviews
//! by asking a policy engine for placement annotations and merging them in as a
//! JSON patch, or denying with the policy's errors.

pub mod admission;
mod budget;
pub mod config;
pub mod events;
pub mod metrics;
pub mod presence;
pub mod readiness;
pub mod review;
pub mod run;
pub mod self_managed;
pub mod server;
mod sizing;

pub use admission::{Admission, AdmissionSettings, Mode, PlacementFailure};
pub use config::Cli;
pub use metrics::Metrics;
pub use policy_client::ADMISSION_INPUT_KEY;
pub use presence::PolicyPresence;
