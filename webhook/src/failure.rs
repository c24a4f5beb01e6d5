//! Why a review gets no placement: the failures admission answers by the
//! fail-closed-iff-policies-exist rule, each with its Event reason and HTTP
//! status.

use policy_client::decision::DecisionError;
use policy_client::engine::EngineError;
use policy_client::karmada::TemplateError;
use policy_client::placement::MergeError;

/// Why no placement could be computed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlacementFailure {
    #[error("the policy engine is unavailable: {0}")]
    EngineUnavailable(#[source] EngineError),
    /// The policy itself fails (OPA's `eval_*` errors): permanent, not retried.
    #[error("the placement policy failed to evaluate: {0}")]
    PolicyError(String),
    /// The engine cannot take the object: the client's fault, not the engine's.
    #[error("the policy engine cannot evaluate request.object / request.oldObject: {0}")]
    InvalidInput(String),
    #[error(
        "the policy engine returned no decision for data.{path} (undefined: the policy is not loaded, or the engine has not synced yet); check the annotation placement-policy.io/policy-status of the policy ConfigMaps, placement-sync's /readyz, or `kubectl placement status`"
    )]
    Undefined { path: String },
    #[error("the placement policy returned an invalid decision: {0}")]
    InvalidDecision(#[from] DecisionError),
    #[error("the placement policy's annotations cannot be applied: {0}")]
    InvalidAnnotations(#[from] MergeError),
    /// The webhook serves before its ownership keys are read: it cannot tell
    /// what the policy owns yet.
    #[error(
        "the ownership record's keys are not loaded yet: the webhook is reading, or making, its key Secret (--ownership-secret; the chart's <release>-ownership in the release namespace), which needs get and create on that Secret for the webhook's service account; its log says why it cannot"
    )]
    KeysUnavailable,
    /// A Karmada binding's template cannot be read: no decision for it.
    #[error("the binding's resource template gives no decision: {0}")]
    Template(#[from] TemplateFailure),
}

impl PlacementFailure {
    /// Event reason, `PascalCase`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            PlacementFailure::EngineUnavailable(_) => "PolicyEngineUnavailable",
            PlacementFailure::PolicyError(_) => "PolicyEvaluationError",
            PlacementFailure::InvalidInput(_) => "BadRequest",
            PlacementFailure::Undefined { .. } => "PolicyDecisionUndefined",
            PlacementFailure::InvalidDecision(_) => "InvalidPolicyDecision",
            PlacementFailure::InvalidAnnotations(_) => "InvalidPolicyAnnotations",
            PlacementFailure::KeysUnavailable => "OwnershipKeysUnavailable",
            PlacementFailure::Template(_) => "BindingTemplateUnavailable",
        }
    }

    pub(crate) fn status_code(&self) -> u16 {
        match self {
            PlacementFailure::EngineUnavailable(_)
            | PlacementFailure::Undefined { .. }
            | PlacementFailure::KeysUnavailable
            | PlacementFailure::Template(_) => 503,
            PlacementFailure::InvalidDecision(_)
            | PlacementFailure::InvalidAnnotations(_)
            | PlacementFailure::PolicyError(_) => 500,
            PlacementFailure::InvalidInput(_) => 400,
        }
    }

    pub(crate) fn from_engine(error: EngineError) -> Self {
        match error {
            EngineError::Evaluation(message) => PlacementFailure::PolicyError(message),
            EngineError::InvalidInput(message) => PlacementFailure::InvalidInput(message),
            other => PlacementFailure::EngineUnavailable(other),
        }
    }
}

/// Why a binding's template gives no decision.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateFailure {
    #[error("the binding names no resource template (spec.resource)")]
    NoReference,
    #[error("no Kubernetes API access to read the binding's resource template")]
    NoClient,
    #[error("its resource template {kind} {name} does not exist")]
    Gone { kind: String, name: String },
    #[error(transparent)]
    Unreadable(#[from] TemplateError),
}
