//! The decisions of a Placement as stored and as chosen: the labels and
//! limits OCM's scheduler uses, the decisions that exist, and the outcome
//! the policy and the candidates give.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::reconcile::ocm::clusters::{Candidates, Misconfigured, Unsatisfied};
use crate::reconcile::ocm::placement::Placement;
use crate::reconcile::ocm::policy::{Allowed, reason};

/// The label every consumer finds a Placement's decisions by.
pub(crate) const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
pub(crate) const GROUP_INDEX_LABEL: &str =
    "cluster.open-cluster-management.io/decision-group-index";
pub(crate) const GROUP_NAME_LABEL: &str = "cluster.open-cluster-management.io/decision-group-name";
/// At most this many decisions in one PlacementDecision.
pub(crate) const MAX_DECISIONS_PER_OBJECT: usize = 100;

pub(crate) const SATISFIED: &str = "PlacementSatisfied";
pub(crate) const MISCONFIGURED: &str = "PlacementMisconfigured";

/// One decided cluster (`status.decisions[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterDecision {
    pub(crate) cluster_name: String,
    #[serde(default)]
    pub(crate) reason: String,
}

/// A PlacementDecision as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Existing {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) decisions: Vec<ClusterDecision>,
}

impl Existing {
    pub(crate) fn parse(json: &[u8]) -> Result<Existing, serde_json::Error> {
        #[derive(Deserialize)]
        struct Meta {
            name: String,
            #[serde(default)]
            labels: BTreeMap<String, String>,
        }
        #[derive(Deserialize, Default)]
        struct Status {
            #[serde(default)]
            decisions: Vec<ClusterDecision>,
        }
        #[derive(Deserialize)]
        struct Object {
            metadata: Meta,
            #[serde(default)]
            status: Status,
        }
        let object: Object = serde_json::from_slice(json)?;
        Ok(Existing {
            name: object.metadata.name,
            labels: object.metadata.labels,
            decisions: object.status.decisions,
        })
    }
}

/// The clusters a Placement has, over its PlacementDecisions.
pub(crate) fn decided(existing: &[Existing]) -> BTreeSet<String> {
    existing
        .iter()
        .flat_map(|e| &e.decisions)
        .filter(|d| !d.cluster_name.is_empty())
        .map(|d| d.cluster_name.clone())
        .collect()
}

/// What decides a Placement, before its decisions are planned.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Clusters chosen (maybe none), and how many of `numberOfClusters`
    /// could not be.
    Decided {
        chosen: Vec<ClusterDecision>,
        unscheduled: usize,
        /// The candidates the Placement selected (for the message when the
        /// policy allows none of them).
        candidates: Vec<String>,
        /// The errors of the workloads left out of the decision (see
        /// [`super::policy`]): said in the Placement's conditions.
        left_out: Vec<String>,
    },
    /// The Placement selects nothing (no bound set, ...): as OCM, its
    /// decisions are emptied.
    Unsatisfied(Unsatisfied),
    /// The policy reports errors: its decisions stay.
    Denied(Vec<String>),
    /// Its configuration cannot be honoured: its decisions stay.
    Misconfigured(String),
}

/// Choose the clusters of a Placement: its `candidates` the policy allows
/// (`allowed`; `Allowed::Undefined` is never passed here). With
/// `numberOfClusters`, the clusters it has come first (OCM's Steady), then
/// the policy's weight, then the name; the decisions are sorted by name
/// (OCM's default `sortBy`).
pub(crate) fn choose(
    placement: &Placement,
    candidates: Result<Candidates, Misconfigured>,
    allowed: &Allowed,
    current: &BTreeSet<String>,
) -> Outcome {
    let candidates = match candidates {
        Err(Misconfigured(message)) => return Outcome::Misconfigured(message),
        Ok(Candidates::Unsatisfied(u)) => return Outcome::Unsatisfied(u),
        Ok(Candidates::Clusters(c)) => c,
    };
    let (allowed, left_out) = match allowed {
        Allowed::Denied(errors) => return Outcome::Denied(errors.clone()),
        Allowed::Undefined => {
            return Outcome::Denied(vec!["the policy has no decision yet".into()]);
        }
        Allowed::Clusters { allowed, left_out } => (allowed, left_out),
    };
    let mut feasible: Vec<(&String, u64)> = candidates
        .keys()
        .filter_map(|name| match allowed {
            None => Some((name, 0)),
            Some(allowed) => allowed.get(name).map(|c| (name, c.weight)),
        })
        .collect();
    let mut unscheduled = 0;
    if let Some(wanted) = placement.spec.number_of_clusters {
        let wanted = usize::try_from(wanted.max(0)).unwrap_or(0);
        feasible.sort_by(|(a, wa), (b, wb)| {
            current
                .contains(*b)
                .cmp(&current.contains(*a))
                .then(wb.cmp(wa))
                .then(a.cmp(b))
        });
        feasible.truncate(wanted);
        unscheduled = wanted.saturating_sub(feasible.len());
    }
    let mut chosen: Vec<ClusterDecision> = feasible
        .into_iter()
        .map(|(name, _)| ClusterDecision {
            cluster_name: name.clone(),
            reason: reason(allowed.as_ref().and_then(|a| a.get(name))),
        })
        .collect();
    chosen.sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
    Outcome::Decided {
        chosen,
        unscheduled,
        candidates: candidates.into_keys().collect(),
        left_out: left_out.clone(),
    }
}
