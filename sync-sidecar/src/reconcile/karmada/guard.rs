//! The guardrail's side in placement-sync: when the policy's answer for a
//! binding's template changes (a member relabelled or down, a policy or data
//! edit), the binding is admitted again with the user's placement (its
//! PropagationPolicy's, as Karmada's detector writes it) narrowed to the new
//! answer, so karmada-scheduler reschedules (a changed placement is what it
//! reschedules on). The webhook narrows that write again in admission
//! ([`policy_client::karmada`]), so neither side can widen what the other
//! bounded.

use policy_client::decision::Decision;
use policy_client::engine::QueryOutcome;
use policy_client::karmada::{
    ALLOWED_CLUSTERS_ANNOTATION, Bound, bound, guarded, scheduled_clusters,
};
use serde_json::Value;

/// What the guardrail does with one binding.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Guarding {
    /// No decision yet (the engine is not in sync): nothing.
    Undefined,
    /// The decision cannot be used (the policy's errors, an invalid
    /// placement): the binding keeps what is stored, and this says why.
    Kept(String),
    /// The binding as admitted under the answer; `patch` brings it there
    /// (`None`: it is there).
    Bounded {
        bound: Bound,
        patch: Option<json_patch::Patch>,
        /// The binding is on clusters and its placement changes:
        /// karmada-scheduler will schedule it again.
        moves: bool,
    },
}

/// The guardrail's plan for the stored binding `raw` under `outcome`;
/// `requested` is the placement its PropagationPolicy asks for (`None`: it
/// is gone, and what is stored can only be narrowed further).
pub(crate) fn guard(raw: &Value, requested: Option<&Value>, outcome: &QueryOutcome) -> Guarding {
    let result = match outcome {
        QueryOutcome::Undefined => return Guarding::Undefined,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(decision) => decision,
        Err(e) => return Guarding::Kept(e.to_string()),
    };
    if decision.is_denied() {
        return Guarding::Kept(format!(
            "the placement policy reports errors for its resource template: {}",
            decision.errors.join("; ")
        ));
    }
    let bound = match bound(&decision) {
        Ok(bound) => bound,
        Err(e) => return Guarding::Kept(e.to_string()),
    };
    let stored = raw
        .pointer("/spec/placement")
        .cloned()
        .unwrap_or(Value::Null);
    let admitted = guarded(raw, requested.unwrap_or(&stored), &bound);
    let patch = json_patch::diff(raw, &admitted);
    let moves = !scheduled_clusters(raw).is_empty()
        && admitted.pointer("/spec/placement") != raw.pointer("/spec/placement");
    Guarding::Bounded {
        bound,
        patch: (!patch.0.is_empty()).then_some(patch),
        moves,
    }
}

/// What decides a guarded binding's placement, for change detection: its
/// spec but for `clusters` (karmada-scheduler's result, which decides
/// nothing), the guardrail's record and whether it is being deleted.
pub(crate) fn guarded_view(raw: &Value) -> Value {
    let mut spec = raw.get("spec").cloned().unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut spec {
        fields.remove("clusters");
    }
    serde_json::json!([
        spec,
        raw.pointer("/metadata/annotations")
            .and_then(|a| a.get(ALLOWED_CLUSTERS_ANNOTATION)),
        raw.pointer("/metadata/deletionTimestamp").is_some(),
    ])
}

#[cfg(test)]
mod tests;
