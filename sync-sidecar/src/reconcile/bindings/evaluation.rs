//! One binding's evaluation, and what the blast-radius guard weighs of it.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use tokio::time::Instant;

use crate::reconcile::karmada::binding::{Binding, BindingWrite, Mode, Placement};
use crate::reconcile::karmada::guard::Guarding;
use crate::reconcile::per_target::Weighed;
use crate::replication::document::ObjectKey;

/// A binding of a pass: its raw JSON (the policy sees part of it) and the
/// fields the scheduler reads.
pub(crate) struct BindingItem {
    pub(crate) key: ObjectKey,
    pub(crate) raw: Value,
    pub(crate) binding: Binding,
    /// Scheduled by us, or guarded.
    pub(crate) mode: Mode,
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

    fn written(&self) -> serde_json::Result<Vec<u8>> {
        match &self.verdict {
            Verdict::Planned { write, .. } => serde_json::to_vec(&write.spec),
            Verdict::Repair(members) => serde_json::to_vec(members),
            _ => Ok(Vec::new()),
        }
    }
}
