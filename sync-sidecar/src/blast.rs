//! The blast-radius guard of remediation: one policy or data change that would
//! rewrite or remove the placement of more than a configured share of the
//! placed workloads is held (no PATCH) and reported on the policy ConfigMaps
//! (an annotation listing the affected objects, a Warning Event, a metric)
//! until an administrator confirms exactly that change:
//!
//! ```sh
//! kubectl annotate cm -n <policy namespace> <any policy ConfigMap> \
//!     placement-policy.io/confirm-remediation=<id from the report>
//! ```
//!
//! A mistake that empties a decision (a partial policy set, a data feed gone
//! wrong) then strips nothing; a planned migration is one annotation away.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};
use serde_json::{Value, json};

/// Annotation on the policy ConfigMaps reporting a held change.
pub const HELD_ANNOTATION: &str = "placement-policy.io/remediation-held";
/// Annotation an administrator sets (on any policy ConfigMap) to the id of a
/// held change to let it through.
pub const CONFIRM_ANNOTATION: &str = "placement-policy.io/confirm-remediation";
/// Objects named in the report; the count is always complete.
const LISTED: usize = 50;

/// How much of the placed workloads one change may re-place unconfirmed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlastRadius {
    /// Share of the placed workloads (0 to 1).
    pub share: f64,
    /// Changes of at most this many placements are never held.
    pub min: usize,
}

impl BlastRadius {
    /// Whether re-placing `affected` of `placed` workloads must be held.
    pub fn holds(&self, affected: usize, placed: usize) -> bool {
        affected > self.min && affected as f64 > self.share * placed as f64
    }
}

/// A stable id of one change: which objects get which patch.
pub fn change_id(mut items: Vec<(String, String)>) -> String {
    items.sort();
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for (object, patch) in &items {
        context.update(object.as_bytes());
        context.update(&[0]);
        context.update(patch.as_bytes());
        context.update(&[0]);
    }
    context
        .finish()
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The report written on the policy ConfigMaps.
pub fn report(id: &str, objects: &[String], placed: usize, namespace: &str) -> Value {
    json!({
        "id": id,
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
    async fn list(&self) -> Result<Vec<ConfigMap>, kube::Error> {
        let apis: Vec<Api<ConfigMap>> = match self.selection.watched_namespaces() {
            Some(namespaces) => namespaces
                .iter()
                .map(|ns| Api::namespaced(self.client.clone(), ns))
                .collect(),
            None => vec![Api::all(self.client.clone())],
        };
        let mut policies = Vec::new();
        for api in apis {
            for cm in api.list(&ListParams::default()).await?.items {
                let namespace = cm.metadata.namespace.as_deref().unwrap_or_default();
                let name = cm.metadata.name.as_deref().unwrap_or_default();
                if self
                    .selection
                    .classify(namespace, name, cm.metadata.labels.as_ref())
                    == Some(ConfigMapKind::Policy)
                {
                    policies.push(cm);
                }
            }
        }
        Ok(policies)
    }

    fn api(&self, cm: &ConfigMap) -> Api<ConfigMap> {
        Api::namespaced(
            self.client.clone(),
            cm.metadata.namespace.as_deref().unwrap_or_default(),
        )
    }

    /// Where the report goes, for the confirmation command.
    pub(crate) fn namespace(&self) -> String {
        self.selection
            .policy_namespace
            .clone()
            .or_else(|| self.selection.namespaces.first().cloned())
            .unwrap_or_default()
    }

    /// Whether an administrator confirmed the change `id`.
    pub(crate) async fn confirmed(&self, id: &str) -> bool {
        match self.list().await {
            Ok(configmaps) => configmaps
                .iter()
                .any(|cm| annotation(cm, CONFIRM_ANNOTATION).is_some_and(|v| v.trim() == id)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the policy ConfigMaps for a confirmation");
                false
            }
        }
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

    #[test]
    fn change_ids_depend_on_the_change_not_its_order() {
        let a = change_id(vec![
            ("ns/a".into(), "[1]".into()),
            ("ns/b".into(), "[2]".into()),
        ]);
        let b = change_id(vec![
            ("ns/b".into(), "[2]".into()),
            ("ns/a".into(), "[1]".into()),
        ]);
        let c = change_id(vec![
            ("ns/a".into(), "[1]".into()),
            ("ns/b".into(), "[3]".into()),
        ]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn the_report_lists_a_bounded_number_of_objects_and_the_command() {
        let objects: Vec<String> = (0..200).map(|n| format!("ns/rs-{n}")).collect();
        let report = report("abc", &objects, 300, "policies");
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
