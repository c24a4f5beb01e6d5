//! The blast-radius guard of remediation. A pass over every workload is
//! weighed as one change before anything is patched, by its causes
//! ([`crate::reconcile::cause`]):
//!
//! - a person's edit (a policy ConfigMap, a replicated object's spec, labels
//!   or annotations), or an unknown cause, that would rewrite or remove the
//!   placement of more than a configured share of the placed workloads is
//!   held (no PATCH) and reported on the ConfigMaps of the policy namespace
//!   (an annotation listing the affected objects, a Warning Event, a metric)
//!   until an administrator confirms that change;
//! - a change of cluster health re-places at once, unless a large share of the
//!   clusters turned unhealthy together ([`crate::reconcile::health::PartitionRule`]),
//!   which is then guarded like an edit.
//!
//! ```sh
//! kubectl annotate cm -n <policy namespace> <a policy ConfigMap> \
//!     placement-policy.io/confirm-remediation=<id from the report>
//! ```
//!
//! The id names the change (the policy revision, the revisions of the edited
//! objects, a partition's clusters), not the workloads it affects, so
//! workloads created or deleted meanwhile do not invalidate it; it is used
//! once (the annotation is removed when the change is applied), and only a
//! ConfigMap of the policy namespace confirms (a tenant's labelled policy
//! ConfigMap elsewhere neither confirms nor gets the report).
//!
//! A mistake that empties a decision (a partial policy set, a data feed gone
//! wrong) then strips nothing; a planned migration is one annotation away;
//! an outage needs no one.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::reconcile::cause::Causes;
use crate::reconcile::health::{ClusterHealth, PartitionRule};

/// Annotation on the policy ConfigMaps reporting a held change.
pub(crate) const HELD_ANNOTATION: &str = "placement-policy.io/remediation-held";
/// Annotation an administrator sets (on any policy ConfigMap) to the id of a
/// held change to let it through.
pub(crate) const CONFIRM_ANNOTATION: &str = "placement-policy.io/confirm-remediation";
/// Objects named in the report; the count is always complete.
const LISTED: usize = 50;

/// How much of the placed workloads one change may re-place unconfirmed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BlastRadius {
    /// Share of the placed workloads (0 to 1).
    pub share: f64,
    /// Changes of at most this many placements are never held.
    pub min: usize,
}

impl BlastRadius {
    /// Whether re-placing `affected` of `placed` workloads is beyond the
    /// radius.
    pub(crate) fn holds(&self, affected: usize, placed: usize) -> bool {
        affected > self.min && affected as f64 > self.share * placed as f64
    }
}

/// The guard's rule, one place for every kind of target.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) radius: BlastRadius,
    pub(crate) partition: PartitionRule,
    /// The health of the replicated clusters.
    pub(crate) health: Arc<ClusterHealth>,
}

impl Guard {
    /// Whether a pass of `causes` that would rewrite or remove `affected` of
    /// `placed` placements is held. Health and status changes alone are not
    /// weighed, unless they show a partition, which is then recorded in
    /// `causes` (and guarded until the change is applied).
    pub(crate) fn holds(
        &self,
        causes: &mut Causes,
        affected: usize,
        placed: usize,
        now: Instant,
    ) -> bool {
        if !causes.guarded()
            && let Some(clusters) = self.health.partition(&self.partition, now)
        {
            causes.partition.extend(clusters);
        }
        causes.guarded() && self.radius.holds(affected, placed)
    }
}

/// The report written on the policy ConfigMaps.
pub(crate) fn report(
    id: &str,
    cause: &str,
    objects: &[String],
    placed: usize,
    namespace: &str,
) -> Value {
    json!({
        "id": id,
        "cause": cause,
        "affected": objects.len(),
        "placed": placed,
        "objects": objects.iter().take(LISTED).collect::<Vec<_>>(),
        "confirm": format!(
            "kubectl annotate configmap -n {namespace} <policy ConfigMap> --overwrite {CONFIRM_ANNOTATION}={id}"
        ),
    })
}

/// The policy ConfigMaps, where held changes are reported and confirmed.
#[derive(Clone)]
pub(crate) struct PolicyConfigMaps {
    pub(crate) client: kube::Client,
    pub(crate) selection: ConfigMapSelection,
    pub(crate) recorder: Recorder,
}

impl PolicyConfigMaps {
    /// The policy ConfigMaps of the policy namespace: the only ones that
    /// confirm a held change and get its report (the confirmer's namespace;
    /// tenants' labelled ConfigMaps elsewhere do neither).
    async fn list(&self) -> Result<Vec<ConfigMap>, kube::Error> {
        let Some(namespace) = &self.selection.policy_namespace else {
            return Ok(Vec::new());
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|cm| {
                self.selection.classify(
                    namespace,
                    cm.metadata.name.as_deref().unwrap_or_default(),
                    cm.metadata.labels.as_ref(),
                ) == Some(ConfigMapKind::Policy)
            })
            .collect())
    }

    fn api(&self, cm: &ConfigMap) -> Api<ConfigMap> {
        Api::namespaced(
            self.client.clone(),
            cm.metadata.namespace.as_deref().unwrap_or_default(),
        )
    }

    /// Where the report goes, for the confirmation command.
    pub(crate) fn namespace(&self) -> String {
        self.selection.policy_namespace.clone().unwrap_or_default()
    }

    /// Whether an administrator confirmed the change `id`; the confirmation
    /// is used up (removed, only while it still names `id`), so it lets
    /// exactly one change through.
    pub(crate) async fn take_confirmation(&self, id: &str) -> bool {
        let configmaps = match self.list().await {
            Ok(configmaps) => configmaps,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the policy ConfigMaps for a confirmation");
                return false;
            }
        };
        for cm in configmaps {
            let Some(value) = annotation(&cm, CONFIRM_ANNOTATION).filter(|v| v.trim() == id) else {
                continue;
            };
            let path = format!(
                "/metadata/annotations/{}",
                CONFIRM_ANNOTATION.replace('~', "~0").replace('/', "~1")
            );
            let used_up: Result<json_patch::Patch, _> = serde_json::from_value(json!([
                {"op": "test", "path": path, "value": value},
                {"op": "remove", "path": path},
            ]));
            let Ok(used_up) = used_up else {
                continue;
            };
            let name = cm.metadata.name.clone().unwrap_or_default();
            match self
                .api(&cm)
                .patch(&name, &PatchParams::default(), &Patch::<()>::Json(used_up))
                .await
            {
                Ok(_) => {
                    tracing::info!(configmap = %name, %id, "confirmation used");
                    return true;
                }
                Err(e) => {
                    tracing::warn!(configmap = %name, error = %e, "cannot use the confirmation; the change stays held");
                }
            }
        }
        false
    }

    /// Report the held change on every policy ConfigMap (once per change).
    pub(crate) async fn report(&self, report: &Value) {
        let text = report.to_string();
        let configmaps = match self.list().await {
            Ok(configmaps) => configmaps,
            Err(e) => {
                tracing::warn!(error = %e, "cannot report a held remediation on the policy ConfigMaps");
                return;
            }
        };
        if configmaps.is_empty() {
            tracing::warn!(
                "no policy ConfigMap in a policy namespace (--policy-namespace) to report the held remediation on, or to confirm it"
            );
        }
        for cm in configmaps {
            if annotation(&cm, HELD_ANNOTATION) == Some(text.as_str()) {
                continue;
            }
            let name = cm.metadata.name.clone().unwrap_or_default();
            let patch = json!({"metadata": {"annotations": {HELD_ANNOTATION: text}}});
            if let Err(e) = self
                .api(&cm)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(configmap = %name, error = %e, "cannot report a held remediation");
                continue;
            }
            let note = format!(
                "remediation held: it would rewrite or remove the placement of {} of {} placed workloads; confirm with {}",
                report["affected"],
                report["placed"],
                report["confirm"].as_str().unwrap_or_default()
            );
            let event = Event {
                type_: EventType::Warning,
                reason: "RemediationHeld".to_owned(),
                note: Some(policy_client::text::truncate(&note, 1000).into_owned()),
                action: "Remediate".to_owned(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &cm.object_ref(&())).await {
                tracing::warn!(configmap = %name, error = %e, "cannot publish the held-remediation Event");
            }
        }
    }

    /// Whether a held change is reported (by this replica or a leader
    /// before it); also when the ConfigMaps cannot be read.
    pub(crate) async fn held(&self) -> bool {
        match self.list().await {
            Ok(configmaps) => configmaps
                .iter()
                .any(|cm| annotation(cm, HELD_ANNOTATION).is_some()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the policy ConfigMaps for a held change");
                true
            }
        }
    }

    /// Remove the report where there is one (nothing is held any more).
    pub(crate) async fn clear(&self) {
        let Ok(configmaps) = self.list().await else {
            return;
        };
        for cm in configmaps {
            if annotation(&cm, HELD_ANNOTATION).is_none() {
                continue;
            }
            let name = cm.metadata.name.clone().unwrap_or_default();
            let patch = json!({"metadata": {"annotations": {HELD_ANNOTATION: null}}});
            if let Err(e) = self
                .api(&cm)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(configmap = %name, error = %e, "cannot clear a held-remediation report");
            }
        }
    }
}

fn annotation<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a: &BTreeMap<String, String>| a.get(key))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_changes_and_small_shares_pass_large_ones_are_held() {
        let guard = BlastRadius {
            share: 0.5,
            min: 10,
        };
        assert!(!guard.holds(10, 10), "at most `min` is never held");
        assert!(!guard.holds(30, 100), "30% of the placed");
        assert!(guard.holds(51, 100));
        assert!(guard.holds(11, 11), "everything");
        assert!(
            !BlastRadius { share: 1.0, min: 0 }.holds(100, 100),
            "share 1 holds nothing"
        );
    }

    /// A health-only pass is not weighed; an edit, an unknown cause and a
    /// partition are.
    #[test]
    fn the_guard_weighs_edits_and_partitions_not_outages() {
        use crate::reconcile::cause::Cause;
        use crate::replication::document::ObjectKey;
        let health = Arc::new(ClusterHealth::default());
        let guard = Guard {
            radius: BlastRadius {
                share: 0.5,
                min: 10,
            },
            partition: PartitionRule {
                threshold: 0.55,
                window: std::time::Duration::from_secs(60),
            },
            health: health.clone(),
        };
        let now = Instant::now();
        let mut outage = Causes::default();
        outage.add(Cause::Health);
        assert!(
            !guard.holds(&mut outage, 12, 12, now),
            "an outage re-places"
        );
        let mut edit = outage.clone();
        edit.add(Cause::Policy("r2".into()));
        assert!(guard.holds(&mut edit, 12, 12, now), "mixed: guarded");
        assert!(!guard.holds(&mut edit, 5, 12, now), "within the radius");
        let mut resync = Causes::default();
        resync.add(Cause::Resync);
        assert!(guard.holds(&mut resync, 12, 12, now));
        for (n, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            let key = ObjectKey::new(None, name);
            health.observe("clusters", key.clone(), true, now);
            if n < 3 {
                health.observe("clusters", key, false, now);
            }
        }
        assert!(guard.holds(&mut outage, 12, 12, now), "3 of 4 together");
        assert_eq!(outage.partition.len(), 3, "recorded with the change");
    }

    #[test]
    fn the_report_lists_a_bounded_number_of_objects_and_the_command() {
        let objects: Vec<String> = (0..200).map(|n| format!("ns/rs-{n}")).collect();
        let report = report("abc", "the policy set", &objects, 300, "policies");
        assert_eq!(report["affected"], 200);
        assert_eq!(report["objects"].as_array().map(Vec::len), Some(LISTED));
        assert!(
            report["confirm"]
                .as_str()
                .unwrap()
                .contains("confirm-remediation=abc")
        );
    }
}
