//! What loading a ConfigMap's modules came to: the outcome, and the
//! annotations that carry it back onto the ConfigMap (ours, and kube-mgmt's for
//! the tools that read those).

use policy_client::engine::CompileError;
use serde::Serialize;
use serde_json::json;

/// Annotation on a policy ConfigMap with the load outcome of its modules.
pub(super) const STATUS_ANNOTATION: &str = "placement-policy.io/policy-status";

/// kube-mgmt's status annotation, written beside ours so that kube-mgmt users'
/// tooling keeps working.
pub(super) const KUBE_MGMT_STATUS_ANNOTATION: &str = "openpolicyagent.org/kube-mgmt-status";
/// kube-mgmt's retry counter; placement-sync retries by itself, so always "0".
pub(super) const KUBE_MGMT_RETRIES_ANNOTATION: &str = "openpolicyagent.org/kube-mgmt-retries";

/// The value of the [`STATUS_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub(super) enum PolicyStatus {
    /// Every module of the ConfigMap compiled and is loaded.
    Ok,
    /// At least one module did not compile; `errors` locate each problem
    /// (`file` is the module id).
    Error { errors: Vec<CompileError> },
}

impl PolicyStatus {
    /// kube-mgmt's form: `{"status":"ok"}`, or `{"status":"error","error":E}`
    /// where `E` is the error itself when there is one and a list otherwise
    /// (kube-mgmt's own shape, kept for the tools that parse it).
    pub(super) fn to_kube_mgmt_annotation(&self) -> String {
        match self {
            PolicyStatus::Ok => r#"{"status":"ok"}"#.to_owned(),
            PolicyStatus::Error { errors } => match errors.as_slice() {
                [one] => json!({"status": "error", "error": one}).to_string(),
                many => json!({"status": "error", "error": many}).to_string(),
            },
        }
    }

    /// The annotation text: compact JSON, stable for equal content so an
    /// unchanged outcome is never written again.
    pub(super) fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| r#"{"status":"error"}"#.to_owned())
    }

    /// The status of a ConfigMap from the outcome of each of its modules.
    pub(super) fn from_outcomes<'a>(
        outcomes: impl IntoIterator<Item = &'a Result<(), Vec<CompileError>>>,
    ) -> Self {
        let errors: Vec<CompileError> = outcomes
            .into_iter()
            .filter_map(|o| o.as_ref().err())
            .flatten()
            .cloned()
            .collect();
        if errors.is_empty() {
            PolicyStatus::Ok
        } else {
            PolicyStatus::Error { errors }
        }
    }
}

/// Result of syncing the modules of one ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ModuleSync {
    /// Whether the engine's policy set changed (a module was put or deleted).
    pub changed: bool,
    /// Outcome for the ConfigMap (`None` when it is gone).
    pub status: Option<PolicyStatus>,
}

#[cfg(test)]
mod tests;
