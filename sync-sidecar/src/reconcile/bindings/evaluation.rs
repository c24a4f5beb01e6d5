//! One binding's evaluation, and what the blast-radius guard weighs of it.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;
use tokio::time::Instant;

use crate::reconcile::karmada::binding::{Binding, BindingWrite, Mode, Placement};
use crate::reconcile::karmada::guard::Guarding;
use crate::reconcile::per_target::Weighed;
use crate::replication::document::ObjectKey;

/// A binding of a pass: the fields the scheduler reads, and its JSON as the
/// watch holds it (the policy sees part of it), decoded when the binding is
/// evaluated: a pass over everything lists tens of thousands of bindings at
/// once, and only the few being evaluated or written need the whole object.
pub(crate) struct BindingItem {
    pub(crate) key: ObjectKey,
    pub(crate) binding: Binding,
    /// Scheduled by us, or guarded.
    pub(crate) mode: Mode,
    json: Bytes,
    raw: OnceLock<Value>,
}

impl BindingItem {
    pub(crate) fn new(key: ObjectKey, json: Bytes, binding: Binding, mode: Mode) -> BindingItem {
        BindingItem {
            key,
            binding,
            mode,
            json,
            raw: OnceLock::new(),
        }
    }

    /// The whole binding, decoded on first use. Its JSON was decoded into
    /// `binding` already, so this does not fail (`Null` if it ever did).
    pub(crate) fn raw(&self) -> &Value {
        self.raw
            .get_or_init(|| serde_json::from_slice(&self.json).unwrap_or_default())
    }
}

/// One binding's evaluation, before anything is written.
pub(crate) struct BindingEvaluation {
    pub(crate) i: usize,
    pub(crate) item: Arc<BindingItem>,
    pub(crate) verdict: Verdict,
}

pub(crate) enum Verdict {
    /// The query or the template lookup failed: retried.
    Failed,
    /// The template is gone (the binding follows it), or the engine has no
    /// decision yet: nothing to write.
    Nothing,
    Planned {
        placement: Placement,
        write: BindingWrite,
    },
    /// The guardrail's plan for another scheduler's binding.
    Guarded(Guarding),
    /// A guarded binding still delivers to members its record leaves out,
    /// past the grace karmada-scheduler had to move them: take them out.
    Repair(BTreeSet<String>),
    /// The same, within the grace: look again then.
    Overdue(Instant),
}

impl BindingEvaluation {
    /// Whether this write would move a placement the binding has.
    pub(crate) fn replaces_a_placement(&self) -> bool {
        match &self.verdict {
            Verdict::Planned { write, .. } => {
                !self.item.binding.clusters().is_empty() && write.moves
            }
            Verdict::Guarded(Guarding::Bounded {
                patch: Some(_),
                moves,
                ..
            }) => *moves,
            Verdict::Repair(_) => true,
            _ => false,
        }
    }

    /// The members a repair takes out of what the binding delivers.
    pub(crate) fn repaired_members(&self) -> Option<&BTreeSet<String>> {
        match &self.verdict {
            Verdict::Repair(members) => Some(members),
            _ => None,
        }
    }
}

impl Weighed for BindingEvaluation {
    fn target(&self) -> usize {
        self.i
    }

    fn object(&self) -> Option<ObjectKey> {
        Some(self.item.key.clone())
    }

    fn planned_from(&self) -> Option<String> {
        self.item.binding.resource_version().map(str::to_owned)
    }

    fn replaces_a_placement(&self) -> bool {
        BindingEvaluation::replaces_a_placement(self)
    }

    /// The members a repair takes out, or the clusters of `spec.clusters`
    /// the planned write drops.
    fn clusters_taken_out(&self) -> BTreeSet<String> {
        if let Some(members) = self.repaired_members() {
            return members.clone();
        }
        let Verdict::Planned { write, .. } = &self.verdict else {
            return BTreeSet::new();
        };
        let Some(clusters) = write
            .spec
            .as_ref()
            .and_then(|spec| spec.pointer("/spec/clusters"))
            .and_then(Value::as_array)
        else {
            return BTreeSet::new();
        };
        let kept: BTreeSet<&str> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
        self.item
            .binding
            .clusters()
            .iter()
            .filter(|c| !kept.contains(c.name.as_str()))
            .map(|c| c.name.clone())
            .collect()
    }

    /// A binding we schedule moves when its clusters change: after Karmada's
    /// taint manager evicted it from a failed member, our write takes
    /// nothing out but still puts the evicted replicas back to run.
    fn moves_replicas(&self) -> bool {
        match &self.verdict {
            Verdict::Planned { write, .. } => write.moves,
            _ => !self.clusters_taken_out().is_empty(),
        }
    }

    /// A binding placed as decided, one whose decision is missing or failed,
    /// one looked at again later and one the guardrail keeps as it is (an
    /// Event says why) send nothing.
    fn writes(&self) -> bool {
        match &self.verdict {
            Verdict::Failed | Verdict::Nothing | Verdict::Overdue(_) => false,
            Verdict::Guarded(Guarding::Bounded { patch, .. }) => patch.is_some(),
            Verdict::Guarded(Guarding::Undefined | Guarding::Kept(_)) => false,
            Verdict::Repair(_) => true,
            Verdict::Planned { write, .. } => !write.is_empty(),
        }
    }

    fn written(&self) -> serde_json::Result<Vec<u8>> {
        match &self.verdict {
            Verdict::Planned { write, .. } => serde_json::to_vec(&write.spec),
            Verdict::Repair(members) => serde_json::to_vec(members),
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::reconcile::karmada::binding::plan;

    fn scheduled(clusters: Value, to: Value) -> BindingEvaluation {
        evaluated(stored(clusters), to)
    }

    fn stored(clusters: Value) -> Value {
        json!({
            "apiVersion": "work.karmada.io/v1alpha2",
            "kind": "ResourceBinding",
            "metadata": {"name": "web-deployment", "namespace": "shop", "resourceVersion": "7",
                         "generation": 2},
            "spec": {
                "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop",
                             "name": "web", "uid": "a"},
                "schedulerName": "placement-policy",
                "replicas": 2,
                "clusters": clusters,
            },
        })
    }

    /// `raw`'s evaluation when the decision places it on `to`.
    fn evaluated(raw: Value, to: Value) -> BindingEvaluation {
        let json = Bytes::from(raw.to_string());
        let binding = Binding::parse(&json).unwrap();
        let placement = Placement::Clusters {
            clusters: serde_json::from_value(to).unwrap(),
            affinity: None,
        };
        let write = plan(&binding, &placement, "2026-11-27T19:00:00Z");
        let key = ObjectKey {
            namespace: Some("shop".into()),
            name: "web-deployment".into(),
        };
        let item = BindingItem::new(key, json, binding, Mode::Schedule);
        BindingEvaluation {
            i: 0,
            item: Arc::new(item),
            verdict: Verdict::Planned { placement, write },
        }
    }

    /// After Karmada's taint manager evicted a binding from a failed member,
    /// our move takes nothing out of it, and still goes first in its pass:
    /// it puts the evicted replica back to run.
    #[test]
    fn a_scheduled_move_after_an_eviction_moves_replicas() {
        let evicted = scheduled(
            json!([{"name": "member-eu-2", "replicas": 1}]),
            json!([{"name": "member-eu-2", "replicas": 2}]),
        );
        assert!(evicted.clusters_taken_out().is_empty());
        assert!(evicted.moves_replicas());
        let failed_over = scheduled(
            json!([{"name": "member-eu-2", "replicas": 1}, {"name": "member-us-1", "replicas": 1}]),
            json!([{"name": "member-eu-2", "replicas": 2}]),
        );
        assert_eq!(
            failed_over.clusters_taken_out(),
            BTreeSet::from(["member-us-1".to_owned()])
        );
        assert!(failed_over.moves_replicas());
        let placed = scheduled(
            json!([{"name": "member-eu-2", "replicas": 2}]),
            json!([{"name": "member-eu-2", "replicas": 2}]),
        );
        assert!(!placed.moves_replicas());
    }

    /// A binding written as planned plans nothing more, and writes nothing: a
    /// pass tallies it at once instead of keeping it with the writes that wait.
    #[test]
    fn a_binding_placed_as_decided_writes_nothing() {
        let to = json!([{"name": "member-eu-2", "replicas": 2}]);
        let first = scheduled(json!([]), to.clone());
        assert!(first.writes());
        let Verdict::Planned { write, .. } = &first.verdict else {
            panic!("planned")
        };
        let mut written = first.item.raw().clone();
        for patch in [&write.spec, &write.status].into_iter().flatten() {
            json_patch::merge(&mut written, patch);
        }
        let again = evaluated(written, to);
        assert!(!again.writes());
        for verdict in [
            Verdict::Failed,
            Verdict::Nothing,
            Verdict::Overdue(Instant::now()),
            Verdict::Guarded(Guarding::Undefined),
            Verdict::Guarded(Guarding::Kept("the policy's errors".into())),
        ] {
            let e = BindingEvaluation {
                verdict,
                ..scheduled(json!([]), json!([]))
            };
            assert!(!e.writes());
        }
        let repair = BindingEvaluation {
            verdict: Verdict::Repair(BTreeSet::from(["member-us-1".to_owned()])),
            ..scheduled(json!([]), json!([]))
        };
        assert!(repair.writes());
    }

    /// The whole binding is decoded from the watch's JSON when first asked for.
    #[test]
    fn a_pass_item_decodes_its_binding_when_asked() {
        let e = scheduled(json!([{"name": "member-eu-2", "replicas": 2}]), json!([]));
        assert!(e.item.raw.get().is_none());
        assert_eq!(e.item.raw()["spec"]["clusters"][0]["name"], "member-eu-2");
        assert_eq!(e.item.raw()["metadata"]["resourceVersion"], "7");
    }
}
