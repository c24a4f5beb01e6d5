//! Open Cluster Management's Placements as placement-policy decides them: a
//! Placement that opts out of OCM's scheduler and names ours
//! ([`placement`]) is decided by the policy over the clusters it selects
//! ([`clusters`]), the answers for its workloads read together ([`policy`]),
//! and written as OCM writes its decisions ([`decisions`]), and optionally
//! as SIG-Multicluster PlacementDecisions ([`sig`]). Pure functions; the
//! reconciler's target is `reconcile::placements`.

pub(crate) mod clusters;
pub(crate) mod decisions;
pub(crate) mod item;
pub(crate) mod placement;
pub(crate) mod policy;
pub(crate) mod sig;
