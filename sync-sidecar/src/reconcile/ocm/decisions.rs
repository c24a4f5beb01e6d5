//! The PlacementDecisions of a Placement and its status, as OCM's scheduler
//! writes them (`pkg/placement/controllers/scheduling/scheduling_controller.go`):
//! the decided clusters divided into decision groups
//! (`decisionStrategy.groupStrategy`), each group into objects of at most 100
//! decisions named `<placement>-decision-<n>` (n from 1), labelled with the
//! Placement and the group, owned by the Placement; then
//! `numberOfSelectedClusters`, `decisionGroups` and the conditions
//! `PlacementSatisfied` and `PlacementMisconfigured`.
//!
//! Rules of our own, beside OCM's: a decision with errors (of the Placement
//! itself, or of every workload), or a Placement whose configuration cannot
//! be honoured, changes no decision (its conditions say why); workloads
//! left out for their errors are named in its conditions while the others
//! decide it ([`super::policy`]); a cluster is added before one is removed (a change
//! that does both first writes both, and removes once that is stored).
//!
//! Here the decisions and the choice; the groups and objects are in
//! [`grouping`], the writes in [`writes`].

mod grouping;
mod model;
mod writes;

pub(crate) use self::grouping::owner_reference;
pub(crate) use self::model::{
    ClusterDecision, Existing, MAX_DECISIONS_PER_OBJECT, Outcome, PLACEMENT_LABEL, choose, decided,
};
pub(crate) use self::writes::{PlacementWrite, plan};

#[cfg(test)]
mod tests;
