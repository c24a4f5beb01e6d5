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
mod tests {
    use super::*;
    use policy_client::karmada::{NO_CLUSTER, PREFERENCES_ANNOTATION};
    use serde_json::json;

    fn allows(clusters: &[&str]) -> QueryOutcome {
        let prefs: serde_json::Map<String, Value> = clusters
            .iter()
            .map(|c| ((*c).to_owned(), json!({"weight": 1})))
            .collect();
        QueryOutcome::Defined(json!({
            "annotations": {PREFERENCES_ANNOTATION: json!({"clusters": prefs}).to_string()},
            "errors": [],
        }))
    }

    fn stored(names: &[&str], record: &str, on: &[&str]) -> Value {
        let clusters: Vec<Value> = on
            .iter()
            .map(|c| json!({"name": c, "replicas": 1}))
            .collect();
        json!({"metadata": {"name": "web-deployment", "resourceVersion": "5",
                            "annotations": {ALLOWED_CLUSTERS_ANNOTATION: record}},
               "spec": {"placement": {"clusterAffinity": {"clusterNames": names}},
                        "clusters": clusters}})
    }

    fn admitted(raw: &Value, plan: &Guarding) -> Value {
        let Guarding::Bounded { patch, .. } = plan else {
            panic!("not bounded: {plan:?}")
        };
        let mut out = raw.clone();
        if let Some(p) = patch {
            json_patch::patch(&mut out, p).unwrap();
        }
        out
    }

    #[test]
    fn a_wider_answer_widens_from_the_propagation_policys_placement() {
        let requested = json!({"clusterAffinity": {"clusterNames": ["member-eu-1", "member-eu-2", "member-us-1"]}});
        let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
        let plan = guard(
            &raw,
            Some(&requested),
            &allows(&["member-eu-1", "member-eu-2"]),
        );
        let out = admitted(&raw, &plan);
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["member-eu-1", "member-eu-2"])
        );
        assert_eq!(
            out["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
            "member-eu-1,member-eu-2"
        );
        assert!(matches!(plan, Guarding::Bounded { moves: true, .. }));
        assert_eq!(
            guard(
                &out,
                Some(&requested),
                &allows(&["member-eu-1", "member-eu-2"])
            ),
            Guarding::Bounded {
                bound: Bound::Clusters(["member-eu-1".into(), "member-eu-2".into()].into()),
                patch: None,
                moves: false
            },
            "no write once admitted"
        );
    }

    #[test]
    fn a_narrower_answer_narrows_and_none_selects_nothing() {
        let requested = json!({});
        let raw = stored(
            &["member-eu-1", "member-eu-2"],
            "member-eu-1,member-eu-2",
            &["member-eu-2"],
        );
        let out = admitted(
            &raw,
            &guard(&raw, Some(&requested), &allows(&["member-eu-1"])),
        );
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["member-eu-1"])
        );
        let out = admitted(&raw, &guard(&raw, Some(&requested), &allows(&[])));
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!([NO_CLUSTER])
        );
        // Without its PropagationPolicy, what is stored can only narrow.
        let out = admitted(
            &raw,
            &guard(&raw, None, &allows(&["member-eu-1", "member-us-1"])),
        );
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["member-eu-1"])
        );
    }

    #[test]
    fn errors_and_undefined_keep_what_is_stored() {
        let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
        let errors =
            QueryOutcome::Defined(json!({"annotations": {}, "errors": ["no cluster satisfies"]}));
        let Guarding::Kept(why) = guard(&raw, Some(&json!({})), &errors) else {
            panic!("errors must keep the placement")
        };
        assert!(why.contains("no cluster satisfies"), "{why}");
        assert_eq!(
            guard(&raw, Some(&json!({})), &QueryOutcome::Undefined),
            Guarding::Undefined
        );
        let bad = QueryOutcome::Defined(json!({
            "annotations": {PREFERENCES_ANNOTATION: "not json"}, "errors": []}));
        assert!(matches!(
            guard(&raw, Some(&json!({})), &bad),
            Guarding::Kept(_)
        ));
    }

    #[test]
    fn the_schedulers_own_result_is_no_change_the_guardrail_sees() {
        let raw = stored(&["member-eu-1"], "member-eu-1", &["member-eu-1"]);
        let mut rescheduled = raw.clone();
        rescheduled["spec"]["clusters"] = json!([{"name": "member-eu-1", "replicas": 4}]);
        assert_eq!(guarded_view(&raw), guarded_view(&rescheduled));
        let mut rewritten = raw.clone();
        rewritten["spec"]["placement"] = json!({});
        assert_ne!(guarded_view(&raw), guarded_view(&rewritten));
    }
}
