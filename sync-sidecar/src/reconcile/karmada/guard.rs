//! The guardrail's side in placement-sync: when the policy's answer for a
//! binding's template changes (a member relabelled or down, a policy or data
//! edit), the binding is admitted again with the user's placement (its
//! PropagationPolicy's, as Karmada's detector writes it) narrowed to the new
//! answer, so karmada-scheduler reschedules (a changed placement is what it
//! reschedules on). The webhook narrows that write again in admission
//! ([`policy_client::karmada`]), so neither side can widen what the other
//! bounded.
//!
//! What the binding delivers is compared too: a member its record (the
//! clusters the guardrail last admitted it within) leaves out, still in
//! `spec.clusters` or `spec.requiredBy` after a grace, is one
//! karmada-scheduler failed to move off (it writes nothing when it cannot
//! satisfy the narrowed placement: a spread constraint, a division). The
//! reconciler then takes it out itself ([`without_members`]); Karmada's
//! binding controller removes the member's Work as an orphan. The record,
//! not the latest answer, is what the delivery is held to, so a policy
//! edit the blast-radius guard holds moves nothing here either.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use policy_client::decision::Decision;
use policy_client::delivery::allowed;
use policy_client::engine::QueryOutcome;
use policy_client::karmada::{
    ALLOWED_CLUSTERS_ANNOTATION, Bound, delivered_clusters, guarded, scheduled_clusters,
};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::reconcile::changes::ItemKey;

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

/// The guardrail's plan for the stored binding `raw` of `template` under
/// `outcome`; `requested` is the placement its PropagationPolicy asks for
/// (`None`: it is gone, and what is stored can only be narrowed further).
pub(crate) fn guard(
    raw: &Value,
    template: &Value,
    requested: Option<&Value>,
    outcome: &QueryOutcome,
) -> Guarding {
    let result = match outcome {
        QueryOutcome::Undefined => return Guarding::Undefined,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(decision) => decision,
        Err(e) => return Guarding::Kept(e.to_string()),
    };
    let bound = match allowed(template, &decision) {
        Ok(bound) => bound,
        Err(refusal) => return Guarding::Kept(format!("for its resource template, {refusal}")),
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

/// The members `raw` delivers to that its record (the clusters the
/// guardrail last admitted it within) leaves out; none without a record or
/// with a record that bounds nothing.
pub(crate) fn outside_record(raw: &Value) -> BTreeSet<String> {
    let record = raw
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ALLOWED_CLUSTERS_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(Bound::from_record);
    let Some(Bound::Clusters(allowed)) = record else {
        return BTreeSet::new();
    };
    delivered_clusters(raw)
        .into_keys()
        .filter(|member| !allowed.contains(member))
        .collect()
}

/// `raw` without `members` in `spec.clusters` and `spec.requiredBy[].clusters`,
/// as a patch of it.
pub(crate) fn without_members(raw: &Value, members: &BTreeSet<String>) -> json_patch::Patch {
    let keep = |clusters: &mut Value| {
        if let Some(list) = clusters.as_array_mut() {
            list.retain(|c| {
                c.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|name| !members.contains(name))
            });
        }
    };
    let mut repaired = raw.clone();
    if let Some(clusters) = repaired.pointer_mut("/spec/clusters") {
        keep(clusters);
    }
    if let Some(required) = repaired
        .pointer_mut("/spec/requiredBy")
        .and_then(Value::as_array_mut)
    {
        for snapshot in required {
            if let Some(clusters) = snapshot.get_mut("clusters") {
                keep(clusters);
            }
        }
    }
    json_patch::diff(raw, &repaired)
}

/// The condition placement-sync sets on a binding it took members out of.
pub(crate) const ENFORCED_CONDITION: &str = "PlacementPolicyEnforced";

/// `raw`'s `status.conditions` with [`ENFORCED_CONDITION`] set to `message`
/// (the others as they are).
pub(crate) fn enforced_conditions(raw: &Value, message: &str, now: &str) -> Value {
    let mut conditions: Vec<Value> = raw
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some(ENFORCED_CONDITION));
    conditions.push(json!({
        "type": ENFORCED_CONDITION,
        "status": "True",
        "reason": "ForbiddenClustersRemoved",
        "message": message,
        "lastTransitionTime": now,
    }));
    Value::Array(conditions)
}

/// What karmada-scheduler last said of a binding: its `Scheduled`
/// condition's status, reason and message.
pub(crate) fn scheduler_said(raw: &Value) -> String {
    let scheduled = raw
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Scheduled"));
    match scheduled {
        Some(c) => {
            let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
            format!(
                "Scheduled={} {}: {}",
                field("status"),
                field("reason"),
                field("message")
            )
        }
        None => "no Scheduled condition".to_owned(),
    }
}

/// When each guarded binding was first seen delivering outside its record.
#[derive(Debug, Default)]
pub(crate) struct Overdue {
    since: HashMap<ItemKey, Instant>,
}

/// What to do about a binding's members outside its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// None are: nothing.
    Nothing,
    /// Give karmada-scheduler until then.
    At(Instant),
    /// The grace is over: take them out.
    Now,
}

impl Overdue {
    /// `key` seen at `now` delivering to `outside` members its record
    /// leaves out.
    pub(crate) fn observe(
        &mut self,
        key: &ItemKey,
        outside: &BTreeSet<String>,
        now: Instant,
        grace: Duration,
    ) -> Due {
        if outside.is_empty() {
            self.since.remove(key);
            return Due::Nothing;
        }
        let since = *self.since.entry(key.clone()).or_insert(now);
        let due = since + grace;
        if now >= due { Due::Now } else { Due::At(due) }
    }

    /// `key` was repaired (or is gone).
    pub(crate) fn forget(&mut self, key: &ItemKey) {
        self.since.remove(key);
    }
}

#[cfg(test)]
mod tests;
