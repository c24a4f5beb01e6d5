//! An Open Cluster Management Placement (`cluster.open-cluster-management.io/v1beta1`)
//! as the decider reads it: whether it opted in, what it selects from, and
//! how its decisions are grouped.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::Value;

/// OCM's scheduler skips a Placement with this annotation `"true"`
/// (`pkg/placement/controllers/scheduling/scheduling_controller.go`).
pub(crate) const DISABLE_ANNOTATION: &str =
    "cluster.open-cluster-management.io/experimental-scheduling-disable";
/// The decider a Placement names (`--scheduler-name`).
pub(crate) const SCHEDULER_ANNOTATION: &str = "placement-policy.io/scheduler-name";
/// The API group and version of Placements and PlacementDecisions.
pub(crate) const API_VERSION: &str = "cluster.open-cluster-management.io/v1beta1";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Meta {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) namespace: String,
    #[serde(default)]
    pub(crate) uid: String,
    #[serde(default)]
    pub(crate) resource_version: Option<String>,
    #[serde(default)]
    pub(crate) deletion_timestamp: Option<String>,
    #[serde(default)]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// `requiredClusterSelector` (and a decision group's `groupClusterSelector`):
/// the AND of its selectors; an empty one selects every cluster.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterSelector {
    #[serde(default)]
    pub(crate) label_selector: Option<LabelSelector>,
    #[serde(default)]
    pub(crate) claim_selector: Option<ClaimSelector>,
    #[serde(default)]
    pub(crate) cel_selector: Option<CelSelector>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClaimSelector {
    #[serde(default)]
    pub(crate) match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CelSelector {
    #[serde(default)]
    pub(crate) cel_expressions: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Predicate {
    #[serde(default)]
    pub(crate) required_cluster_selector: ClusterSelector,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Toleration {
    #[serde(default)]
    pub(crate) key: String,
    #[serde(default)]
    pub(crate) operator: String,
    #[serde(default)]
    pub(crate) value: String,
    #[serde(default)]
    pub(crate) effect: String,
    #[serde(default)]
    pub(crate) toleration_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DecisionGroup {
    #[serde(default)]
    pub(crate) group_name: String,
    #[serde(default)]
    pub(crate) group_cluster_selector: ClusterSelector,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupStrategy {
    #[serde(default)]
    pub(crate) decision_groups: Vec<DecisionGroup>,
    #[serde(default)]
    pub(crate) clusters_per_decision_group: Option<IntOrString>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DecisionStrategy {
    #[serde(default)]
    pub(crate) group_strategy: GroupStrategy,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Spec {
    #[serde(default)]
    pub(crate) cluster_sets: Vec<String>,
    #[serde(default)]
    pub(crate) number_of_clusters: Option<i32>,
    #[serde(default)]
    pub(crate) predicates: Vec<Predicate>,
    #[serde(default)]
    pub(crate) prioritizer_policy: Option<Value>,
    #[serde(default)]
    pub(crate) spread_policy: Option<Value>,
    #[serde(default)]
    pub(crate) tolerations: Vec<Toleration>,
    #[serde(default)]
    pub(crate) decision_strategy: DecisionStrategy,
    #[serde(default)]
    pub(crate) sort_by: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Status {
    #[serde(default)]
    pub(crate) number_of_selected_clusters: i64,
    #[serde(default)]
    pub(crate) decision_groups: Vec<Value>,
    #[serde(default)]
    pub(crate) conditions: Vec<Value>,
}

/// A Placement, decoded from the JSON the watch holds.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Placement {
    pub(crate) metadata: Meta,
    #[serde(default)]
    pub(crate) spec: Spec,
    #[serde(default)]
    pub(crate) status: Status,
}

/// Why a Placement is not decided by us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// OCM's scheduler decides it (no `experimental-scheduling-disable: "true"`).
    OcmSchedules,
    /// It names another decider, or none.
    OtherScheduler,
    Deleting,
}

impl Placement {
    pub(crate) fn parse(json: &[u8]) -> Result<Placement, serde_json::Error> {
        serde_json::from_slice(json)
    }

    /// Whether the decider named `scheduler_name` decides this Placement:
    /// it opted out of OCM's scheduler and names it.
    pub(crate) fn skip(&self, scheduler_name: &str) -> Option<Skip> {
        let annotations = &self.metadata.annotations;
        if annotations.get(DISABLE_ANNOTATION).map(String::as_str) != Some("true") {
            Some(Skip::OcmSchedules)
        } else if annotations.get(SCHEDULER_ANNOTATION).map(String::as_str) != Some(scheduler_name)
        {
            Some(Skip::OtherScheduler)
        } else if self.metadata.deletion_timestamp.is_some() {
            Some(Skip::Deleting)
        } else {
            None
        }
    }

    /// `namespace/name`.
    pub(crate) fn describe(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The spec fields this decider does not honour, by their paths: they
    /// rank or spread OCM's scores, and the policy's weights rank here.
    pub(crate) fn not_honoured(&self) -> Vec<&'static str> {
        let spec = &self.spec;
        let mut fields = Vec::new();
        let present = |value: Option<&Value>| {
            value.is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        };
        if present(
            spec.prioritizer_policy
                .as_ref()
                .and_then(|p| p.get("configurations")),
        ) {
            fields.push("spec.prioritizerPolicy.configurations");
        }
        if present(
            spec.spread_policy
                .as_ref()
                .and_then(|p| p.get("spreadConstraints")),
        ) {
            fields.push("spec.spreadPolicy.spreadConstraints");
        }
        if spec.sort_by.as_deref() == Some("Score") {
            fields.push("spec.sortBy: Score");
        }
        fields
    }

    /// The condition of `type_` as the Placement has it.
    pub(crate) fn condition(&self, type_: &str) -> Option<&Value> {
        self.status
            .conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
    }

    /// What the policy sees of the Placement (`input._placement`): its
    /// identity, labels, annotations and spec, not its status (which the
    /// decider writes itself).
    pub(crate) fn policy_view(raw: &Value) -> Value {
        policy_client::ocm::placement_view(raw)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// A Placement of namespace `shop` named `web`, opted in to the decider
    /// `placement-policy`, with `spec`.
    pub(crate) fn placement(spec: Value) -> (Value, Placement) {
        let raw = json!({
            "apiVersion": API_VERSION,
            "kind": "Placement",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "p-uid", "generation": 1,
                "resourceVersion": "5",
                "annotations": {DISABLE_ANNOTATION: "true", SCHEDULER_ANNOTATION: "placement-policy"},
            },
            "spec": spec,
        });
        let parsed = Placement::parse(raw.to_string().as_bytes()).unwrap();
        (raw, parsed)
    }

    #[test]
    fn a_placement_is_ours_only_when_it_opts_out_and_names_us() {
        let (raw, ours) = placement(json!({}));
        assert_eq!(ours.skip("placement-policy"), None);
        assert_eq!(ours.skip("other"), Some(Skip::OtherScheduler));
        let mut ocm = raw.clone();
        ocm["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(DISABLE_ANNOTATION);
        let ocm = Placement::parse(ocm.to_string().as_bytes()).unwrap();
        assert_eq!(ocm.skip("placement-policy"), Some(Skip::OcmSchedules));
        let mut not_true = raw.clone();
        not_true["metadata"]["annotations"][DISABLE_ANNOTATION] = json!("yes");
        let not_true = Placement::parse(not_true.to_string().as_bytes()).unwrap();
        assert_eq!(not_true.skip("placement-policy"), Some(Skip::OcmSchedules));
        let mut deleting = raw;
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-26T10:00:00Z");
        let deleting = Placement::parse(deleting.to_string().as_bytes()).unwrap();
        assert_eq!(deleting.skip("placement-policy"), Some(Skip::Deleting));
    }

    #[test]
    fn ranking_fields_are_named_as_not_honoured_and_defaults_are_not() {
        let (_, defaults) = placement(json!({
            "prioritizerPolicy": {"mode": "Additive"}, "spreadPolicy": {}, "sortBy": "ClusterName",
        }));
        assert!(defaults.not_honoured().is_empty());
        let (_, ranked) = placement(json!({
            "prioritizerPolicy": {"mode": "Exact", "configurations": [
                {"scoreCoordinate": {"type": "BuiltIn", "builtIn": "ResourceAllocatableCPU"}, "weight": 2}
            ]},
            "spreadPolicy": {"spreadConstraints": [{"topologyKey": "region", "topologyKeyType": "Label"}]},
            "sortBy": "Score",
        }));
        assert_eq!(
            ranked.not_honoured(),
            [
                "spec.prioritizerPolicy.configurations",
                "spec.spreadPolicy.spreadConstraints",
                "spec.sortBy: Score"
            ]
        );
    }

    #[test]
    fn the_policy_sees_the_placements_spec_not_its_status() {
        let (mut raw, _) = placement(json!({"numberOfClusters": 1}));
        raw["status"] = json!({"numberOfSelectedClusters": 1});
        let view = Placement::policy_view(&raw);
        assert_eq!(view["spec"]["numberOfClusters"], 1);
        assert_eq!(
            view["metadata"]["annotations"][SCHEDULER_ANNOTATION],
            "placement-policy"
        );
        assert!(view.get("status").is_none());
    }
}
