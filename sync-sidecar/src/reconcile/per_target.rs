//! What each kind of target (workloads, Karmada bindings, OCM Placements)
//! gives the pass driver: its objects in a pass, their evaluation, and the
//! writes that act on it; and what the blast-radius guard weighs of an
//! evaluation before anything is written.

use std::collections::BTreeSet;

use tokio_util::sync::CancellationToken;

use super::changes::ItemKey;
use super::common::Common;
use super::step::Step;
use crate::replication::document::ObjectKey;

/// One kind of target, kept placed by the policy.
pub(crate) trait TargetReconciler {
    /// One object of a pass, as read from the watch.
    type Item;
    /// One object's evaluation, before anything is written.
    type Evaluation: Weighed;

    /// The objects of `only` (or every one in scope), with their target.
    fn items(&self, c: &Common, only: Option<&BTreeSet<ItemKey>>) -> Vec<(usize, Self::Item)>;

    /// Whether the object has a placement (the guard weighs moves against
    /// every placed object in scope).
    fn is_placed(&self, item: &Self::Item) -> bool;

    /// Ask the decision for one object and plan its writes.
    async fn evaluate(&self, c: &Common, i: usize, item: Self::Item) -> Self::Evaluation;

    /// Act on one object's evaluation: write it through the write step,
    /// report or note it.
    async fn act(
        &self,
        c: &Common,
        evaluation: Self::Evaluation,
        cancel: &CancellationToken,
    ) -> Step;
}

/// What the pass (its order, its retries) and the blast-radius guard read of
/// one object's evaluation.
pub(crate) trait Weighed {
    /// The target the object is of.
    fn target(&self) -> usize;

    /// The object's key (`None`: a workload without one).
    fn object(&self) -> Option<ObjectKey>;

    /// The resourceVersion the evaluation read (its writes are preconditioned
    /// on it).
    fn planned_from(&self) -> Option<String>;

    /// Would this change rewrite or remove a placement the object has?
    fn replaces_a_placement(&self) -> bool;

    /// The clusters this write takes out of the placement the object has.
    fn clusters_taken_out(&self) -> BTreeSet<String>;

    /// Whether this write itself changes where the object's replicas run
    /// (a pass sends these first): it takes clusters out, unless a kind
    /// says more.
    fn moves_replicas(&self) -> bool {
        !self.clusters_taken_out().is_empty()
    }

    /// What it writes, for the fingerprint of a held move.
    fn written(&self) -> serde_json::Result<Vec<u8>>;

    /// Whether acting on it may write to the API server. One that does not
    /// (already placed, undefined, failed, due later) is acted on as soon as
    /// it is evaluated, instead of kept with the writes that wait for the
    /// pass's moves. Unless a kind says, every one may.
    fn writes(&self) -> bool {
        true
    }
}
