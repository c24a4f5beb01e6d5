//! One Placement's evaluation, and what the blast-radius guard weighs of it.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use crate::reconcile::ocm::decisions::PlacementWrite;
use crate::reconcile::ocm::item::PlacementItem;
use crate::reconcile::ocm::sig::SliceWrite;
use crate::reconcile::per_target::Weighed;
use crate::replication::document::ObjectKey;

/// One Placement's evaluation, before anything is written.
pub(crate) struct PlacementEvaluation {
    pub(crate) i: usize,
    pub(crate) item: Arc<PlacementItem>,
    pub(crate) verdict: Verdict,
}

pub(crate) enum Verdict {
    /// A query failed: retried.
    Failed,
    /// The engine has no decision yet: nothing to write.
    Nothing,
    Planned(Box<Planned>),
}

pub(crate) struct Planned {
    pub(crate) write: PlacementWrite,
    pub(crate) sig: SliceWrite,
    /// The policy reports errors, or the Placement is misconfigured: its
    /// decisions stay as they are.
    pub(crate) failed: bool,
    /// When a toleration runs out.
    pub(crate) recheck: Option<Timestamp>,
}

impl Weighed for PlacementEvaluation {
    fn target(&self) -> usize {
        self.i
    }

    fn object(&self) -> Option<ObjectKey> {
        Some(self.item.key.clone())
    }

    fn planned_from(&self) -> Option<String> {
        self.item.placement.metadata.resource_version.clone()
    }

    /// Whether this would remove a cluster the Placement has.
    fn replaces_a_placement(&self) -> bool {
        self.item.is_placed() && !self.clusters_taken_out().is_empty()
    }

    /// The clusters the Placement has that this change (with its later
    /// step, when this is the first of two) takes out.
    fn clusters_taken_out(&self) -> BTreeSet<String> {
        match &self.verdict {
            Verdict::Planned(p) => p.write.removes.clone(),
            _ => BTreeSet::new(),
        }
    }

    /// What this moves, for the fingerprint of a held move: the clusters
    /// taken out, the same in both steps of a change that adds first.
    fn written(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(&self.clusters_taken_out())
    }
}
