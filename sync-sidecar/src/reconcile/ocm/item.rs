//! A Placement as one pass of the reconciler holds it: what deciding it
//! reads (the reconciler's target and its decider both look down at it).

use std::sync::Arc;

use serde_json::Value;

use super::clusters::Inventory;
use super::decisions::{Existing, decided};
use super::placement::Placement;
use super::policy::Subject;
use super::sig::Slice;
use crate::replication::document::ObjectKey;

/// One workload a Placement's ManifestWorkReplicaSets deliver.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub(crate) subject: Subject,
    pub(crate) manifest: Value,
}

/// A Placement of a pass, with what deciding it reads.
pub(crate) struct PlacementItem {
    pub(crate) key: ObjectKey,
    pub(crate) raw: Value,
    pub(crate) placement: Placement,
    pub(crate) existing: Vec<Existing>,
    pub(crate) workloads: Vec<Workload>,
    pub(crate) inventory: Arc<Inventory>,
    pub(crate) sig: Vec<Slice>,
}

impl PlacementItem {
    /// Whether it has decided clusters.
    pub(crate) fn is_placed(&self) -> bool {
        !decided(&self.existing).is_empty()
    }
}
