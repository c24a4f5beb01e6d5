//! The blast-radius guard of remediation. A pass over every workload is
//! weighed as one change before anything is patched, by its causes
//! ([`crate::cause`]):
//!
//! - a person's edit (a policy ConfigMap, a replicated object's spec, labels
//!   or annotations), or an unknown cause, that would rewrite or remove the
//!   placement of more than a configured share of the placed workloads is
//!   held (no PATCH) and reported on the ConfigMaps of the policy namespace
//!   (an annotation listing the affected objects, a Warning Event, a metric)
//!   until an administrator confirms that change;
//! - a change of cluster health re-places at once what it moves (a write that
//!   takes an unhealthy cluster out of a placement), whatever edits are held
//!   beside it: the outage's moves are weighed apart from the edits', so one
//!   tenant's edit cannot hold a failover; unless a large share of the
//!   clusters turned unhealthy together ([`crate::config::guard::PartitionRule`]),
//!   which is then guarded like an edit, every move with it.
//!
//! ```sh
//! kubectl annotate cm -n <policy namespace> <a policy ConfigMap> \
//!     placement-policy.io/confirm-remediation=<id from the report>
//! ```
//!
//! The id names one held occurrence of a change: it is made (at random) when
//! a pass is first held, and kept while the passes held after it make the
//! same moves or fewer (the edited workloads and the placements they would
//! get): unrelated later edits, and workloads deleted meanwhile, leave it as
//! it is, so the confirmation still applies; a pass that moves more, or
//! elsewhere, is another change, with a new id. Once nothing is held (the
//! change was applied, or reverted) the occurrence is over: the same change
//! made again later is held under a new id, never let through by a
//! confirmation left behind. A confirmation is used once (the annotation is
//! removed when the change is applied), and only a ConfigMap of the policy
//! namespace confirms (a tenant's labelled policy ConfigMap elsewhere neither
//! confirms nor gets the report).
//!
//! A mistake that empties a decision (a partial policy set, a data feed gone
//! wrong) then strips nothing; a planned migration is one annotation away;
//! an outage needs no one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cause::Causes;
use crate::config::guard::{BlastRadius, PartitionRule};
use crate::replication::health::ClusterHealth;

/// Annotation on the policy ConfigMaps reporting a held change.
pub(crate) const HELD_ANNOTATION: &str = "placement-policy.io/remediation-held";
/// Annotation an administrator sets (on any policy ConfigMap) to the id of a
/// held change to let it through.
pub(crate) const CONFIRM_ANNOTATION: &str = "placement-policy.io/confirm-remediation";
/// Objects named in the report; the count is always complete.
pub(crate) const LISTED: usize = 50;

/// The guard's rule, one place for every kind of target.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) radius: BlastRadius,
    pub(crate) partition: PartitionRule,
    /// The health of the replicated clusters.
    pub(crate) health: Arc<ClusterHealth>,
    /// The change held now, if any.
    pub(crate) held: Arc<Mutex<Option<Occurrence>>>,
}

/// What the guard holds of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Nothing: it is applied.
    Nothing,
    /// The edits' moves; the outage's go through.
    Edits,
    /// Every move (a partition: the outage's are weighed too).
    Everything,
}

/// One held occurrence of a change: its id, and the moves it was held with.
#[derive(Debug)]
pub(crate) struct Occurrence {
    id: String,
    moves: BTreeSet<String>,
}

impl Guard {
    /// What of a pass of `causes` is held, when it would rewrite or remove
    /// `outage` placements by taking unhealthy clusters out of them and
    /// `edits` others, of `placed` placements. Health and status changes
    /// alone are not weighed, nor an outage's moves beside an edit, unless
    /// the health shows a partition, which is then recorded in `causes` (and
    /// guarded until the change is applied).
    pub(crate) fn weigh(
        &self,
        causes: &mut Causes,
        outage: usize,
        edits: usize,
        placed: usize,
        now: Instant,
    ) -> Hold {
        if let Some(clusters) = self.health.partition(&self.partition, now) {
            causes.partition.extend(clusters);
        }
        if !causes.guarded() {
            Hold::Nothing
        } else if !causes.partition.is_empty() {
            if self.radius.holds(outage + edits, placed) {
                Hold::Everything
            } else {
                Hold::Nothing
            }
        } else if self.radius.holds(edits, placed) {
            Hold::Edits
        } else {
            Hold::Nothing
        }
    }

    /// Whether no pass of `causes` can be held, whatever it moves: no edit
    /// or unknown cause among them, and no partition.
    pub(crate) fn holds_nothing(&self, causes: &Causes, now: Instant) -> bool {
        !causes.guarded() && self.health.partition(&self.partition, now).is_none()
    }

    /// The id of the held change making `moves` (each a move's fingerprint):
    /// that of the occurrence held since, when these moves are among the
    /// ones it was held with; a new one otherwise.
    pub(crate) fn occurrence(&self, moves: BTreeSet<String>) -> String {
        let mut held = self.held.lock();
        if let Some(occurrence) = held.as_mut()
            && moves.is_subset(&occurrence.moves)
        {
            return occurrence.id.clone();
        }
        let id = new_id();
        *held = Some(Occurrence {
            id: id.clone(),
            moves,
        });
        id
    }

    /// Nothing is held any more (applied, or nothing left to hold): the
    /// occurrence is over.
    pub(crate) fn release(&self) {
        *self.held.lock() = None;
    }
}

/// A new occurrence's id: random, so that no two occurrences share one.
fn new_id() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random source works");
    crate::hex::hex(&bytes, 8)
}

/// The report written on the policy ConfigMaps: `off[i]` are the clusters
/// the change takes off `objects[i]` (for the listed ones), what
/// `kubectl placement held` shows it would move.
pub(crate) fn report(
    id: &str,
    cause: &str,
    objects: &[String],
    off: &[BTreeSet<String>],
    placed: usize,
    namespace: &str,
) -> Value {
    let moves: Vec<Value> = objects
        .iter()
        .zip(off)
        .take(LISTED)
        .map(|(object, off)| json!({"object": object, "off": off}))
        .collect();
    json!({
        "id": id,
        "cause": cause,
        "affected": objects.len(),
        "placed": placed,
        "objects": objects.iter().take(LISTED).collect::<Vec<_>>(),
        "moves": moves,
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
    /// partition are; beside an edit, only the edit's moves, unless a
    /// partition.
    #[test]
    fn the_guard_weighs_edits_and_partitions_not_outages() {
        use crate::cause::Cause;
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
            held: Arc::default(),
        };
        let now = Instant::now();
        let mut outage = Causes::default();
        outage.add(Cause::Health);
        assert_eq!(
            guard.weigh(&mut outage, 12, 0, 12, now),
            Hold::Nothing,
            "an outage re-places"
        );
        let mut edit = outage.clone();
        edit.add(Cause::Policy("r2".into()));
        assert_eq!(guard.weigh(&mut edit, 0, 12, 12, now), Hold::Edits);
        assert_eq!(
            guard.weigh(&mut edit, 12, 0, 12, now),
            Hold::Nothing,
            "the outage's moves beside an edit: not weighed"
        );
        assert_eq!(
            guard.weigh(&mut edit, 6, 6, 12, now),
            Hold::Nothing,
            "the edit's within the radius"
        );
        assert_eq!(guard.weigh(&mut edit, 1, 11, 12, now), Hold::Edits);
        let mut resync = Causes::default();
        resync.add(Cause::Resync);
        assert_eq!(guard.weigh(&mut resync, 0, 12, 12, now), Hold::Edits);
        for (n, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            let key = ObjectKey::new(None, name);
            health.observe("clusters", key.clone(), true, now);
            if n < 3 {
                health.observe("clusters", key, false, now);
            }
        }
        assert_eq!(
            guard.weigh(&mut outage, 12, 0, 12, now),
            Hold::Everything,
            "3 of 4 together"
        );
        assert_eq!(outage.partition.len(), 3, "recorded with the change");
        // Beside an edit, a partition is recorded too: everything weighed.
        assert_eq!(guard.weigh(&mut edit, 8, 4, 12, now), Hold::Everything);
        assert_eq!(edit.partition.len(), 3);
    }

    /// An occurrence keeps its id while the moves held are among the ones it
    /// was held with; more or other moves, or a new occurrence after the
    /// last one ended, get a new id.
    #[test]
    fn an_occurrence_keeps_its_id_until_it_ends_or_moves_more() {
        let guard = Guard {
            radius: BlastRadius {
                share: 0.5,
                min: 10,
            },
            partition: PartitionRule {
                threshold: 0.55,
                window: std::time::Duration::from_secs(60),
            },
            health: Arc::default(),
            held: Arc::default(),
        };
        let moves = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        let id = guard.occurrence(moves(&["a=1", "b=1", "c=1"]));
        assert_eq!(guard.occurrence(moves(&["a=1", "b=1", "c=1"])), id);
        assert_eq!(guard.occurrence(moves(&["a=1", "c=1"])), id, "fewer");
        let other = guard.occurrence(moves(&["a=2", "b=1", "c=1"]));
        assert_ne!(other, id, "elsewhere");
        guard.release();
        let again = guard.occurrence(moves(&["a=2", "b=1", "c=1"]));
        assert_ne!(again, other, "the same change again, after it ended");
    }

    #[test]
    fn the_report_lists_a_bounded_number_of_objects_and_the_command() {
        let objects: Vec<String> = (0..200).map(|n| format!("ns/rs-{n}")).collect();
        let off: Vec<BTreeSet<String>> = (0..LISTED).map(|_| ["eu-2".to_owned()].into()).collect();
        let report = report("abc", "the policy set", &objects, &off, 300, "policies");
        assert_eq!(report["affected"], 200);
        assert_eq!(report["objects"].as_array().map(Vec::len), Some(LISTED));
        assert_eq!(report["moves"].as_array().map(Vec::len), Some(LISTED));
        assert_eq!(
            report["moves"][0],
            json!({"object": "ns/rs-0", "off": ["eu-2"]}),
            "what the change would take off each listed object"
        );
        assert!(
            report["confirm"]
                .as_str()
                .unwrap()
                .contains("confirm-remediation=abc")
        );
    }
}
