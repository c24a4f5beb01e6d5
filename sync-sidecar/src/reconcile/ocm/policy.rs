//! What the policy allows a Placement: the answers of the decision for each
//! of its subjects (the workloads its ManifestWorkReplicaSets deliver, and
//! the Placement itself), each the delivery guard's answer for that object,
//! read together. A cluster is allowed when every answer that names clusters
//! allows it; an answer that names none (a ConfigMap, a Namespace) does not
//! restrict, unless its object carries a placement requirement (then it is
//! an error: a requirement is never unbounded).
//!
//! Errors: a ManifestWorkReplicaSet one of whose workloads has errors is
//! left out, and the Placement is decided from the others (the delivery
//! guard refuses its ManifestWorks on every cluster), so one tenant's error
//! never freezes a Placement shared with other workloads. Errors of the
//! Placement itself, or of every ManifestWorkReplicaSet that names it, leave
//! nothing to decide from: its decisions stay as they are.

use std::collections::{BTreeMap, BTreeSet};

use policy_client::decision::Decision;
use policy_client::delivery::{Refusal, allowed};
use policy_client::engine::QueryOutcome;
use policy_client::ownership_keys::OwnershipKeys;
use policy_client::placement::desired_annotations;
use serde::Deserialize;
use serde_json::Value;

/// The placement the policy decides: Federation v1's replica-set preferences.
pub(crate) const PREFERENCES_ANNOTATION: &str = "federation.kubernetes.io/replica-set-preferences";
/// Why each cluster is allowed, in the policy's words (`{name: reason}`),
/// when asked with `input._placement`.
pub(crate) const REASONS_ANNOTATION: &str = "placement-policy.io/cluster-reasons";

/// One object the policy was asked about for a Placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Subject {
    /// `Deployment shop/web`, `Placement shop/web`.
    pub(crate) name: String,
    /// What delivers it (`ManifestWorkReplicaSet shop/web`); `None` for the
    /// Placement itself.
    pub(crate) carrier: Option<String>,
}

impl Subject {
    /// A workload `name` that `carrier` delivers.
    pub(crate) fn workload(name: String, carrier: String) -> Subject {
        Subject {
            name,
            carrier: Some(carrier),
        }
    }

    /// The Placement `name` itself.
    pub(crate) fn placement(name: String) -> Subject {
        Subject {
            name,
            carrier: None,
        }
    }
}

/// What one answer allows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    /// The engine has no decision yet (not in sync): nothing is decided.
    Undefined,
    /// The object gets no placement: it restricts nothing.
    Unrestricted,
    /// These clusters, with the policy's weight and reason of each.
    Clusters(BTreeMap<String, Allowance>),
    /// The policy reports errors, or its answer cannot be read.
    Errors(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Allowance {
    pub(crate) weight: u64,
    pub(crate) reason: Option<String>,
}

#[derive(Deserialize)]
struct Preferences {
    clusters: BTreeMap<String, ClusterPreference>,
}

#[derive(Deserialize)]
struct ClusterPreference {
    #[serde(default)]
    weight: Option<i64>,
}

/// Read the answer `outcome` for `object` (as the webhook would write it:
/// the policy's annotations over the developer's).
pub(crate) fn read(object: &Value, outcome: &QueryOutcome, keys: &OwnershipKeys) -> Read {
    let result = match outcome {
        QueryOutcome::Undefined => return Read::Undefined,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(decision) => decision,
        Err(e) => return Read::Errors(vec![e.to_string()]),
    };
    if decision.is_denied() {
        return Read::Errors(decision.errors);
    }
    let annotations = match desired_annotations(object, &decision, keys) {
        Ok(a) => a,
        Err(e) => return Read::Errors(vec![e.to_string()]),
    };
    let Some(preferences) = annotations.get(PREFERENCES_ANNOTATION) else {
        return unrestricted(object, &decision);
    };
    let preferences = match serde_json::from_str::<Preferences>(preferences) {
        Ok(p) => p.clusters,
        Err(e) => {
            return Read::Errors(vec![format!(
                "the policy's {PREFERENCES_ANNOTATION} cannot be read: {e}"
            )]);
        }
    };
    // Federation's "*": every cluster.
    if preferences.contains_key("*") {
        return unrestricted(object, &decision);
    }
    let reasons: BTreeMap<String, String> = decision
        .annotations
        .get(REASONS_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let mut clusters = BTreeMap::new();
    for (name, preference) in preferences {
        let weight = match preference.weight {
            Some(w) if w < 0 => {
                return Read::Errors(vec![format!(
                    "the policy's {PREFERENCES_ANNOTATION} gives cluster {name} a negative weight ({w})"
                )]);
            }
            Some(w) => w as u64,
            None => 1,
        };
        let reason = reasons.get(&name).cloned();
        clusters.insert(name, Allowance { weight, reason });
    }
    Read::Clusters(clusters)
}

/// An answer that names no clusters for `object`: unrestricted, unless the
/// object carries a placement requirement, which the policy then cannot
/// keep (the delivery guard refuses it too: [`allowed`]).
fn unrestricted(object: &Value, decision: &Decision) -> Read {
    match allowed(object, decision) {
        Err(refusal @ Refusal::Unbounded { .. }) => Read::Errors(vec![refusal.to_string()]),
        _ => Read::Unrestricted,
    }
}

/// The answers for a Placement's subjects read together.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Allowed {
    /// Some answer is undefined: decide nothing now.
    Undefined,
    /// Nothing to decide from (errors of the Placement itself, or of every
    /// ManifestWorkReplicaSet): every error, each with its subject.
    Denied(Vec<String>),
    /// The clusters of the subjects decided from.
    Clusters {
        /// `None`: no answer restricts; else the clusters every restricting
        /// answer allows, with the summed weight and each subject's reason.
        allowed: Option<BTreeMap<String, Combined>>,
        /// The errors of the ManifestWorkReplicaSets left out, each with
        /// its carrier and subject.
        left_out: Vec<String>,
    },
}

impl Allowed {
    /// Clusters allowed with nothing left out.
    pub(crate) fn clusters(allowed: Option<BTreeMap<String, Combined>>) -> Allowed {
        Allowed::Clusters {
            allowed,
            left_out: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Combined {
    pub(crate) weight: u64,
    /// (subject, the policy's reason), in the order of the subjects.
    pub(crate) reasons: Vec<(String, String)>,
}

/// Read `answers` together (see the module documentation for errors).
pub(crate) fn combine(answers: &[(Subject, Read)]) -> Allowed {
    if answers.iter().any(|(_, r)| *r == Read::Undefined) {
        return Allowed::Undefined;
    }
    let failing: BTreeSet<Option<&str>> = answers
        .iter()
        .filter(|(_, read)| matches!(read, Read::Errors(_)))
        .map(|(subject, _)| subject.carrier.as_deref())
        .collect();
    if !failing.is_empty() {
        let decided_from = answers
            .iter()
            .filter_map(|(subject, _)| subject.carrier.as_deref())
            .any(|carrier| !failing.contains(&Some(carrier)));
        // The Placement's own errors, or no workload left to decide from.
        if failing.contains(&None) || !decided_from {
            return Allowed::Denied(
                answers
                    .iter()
                    .flat_map(|(subject, read)| errors(read, &subject.name))
                    .collect(),
            );
        }
    }
    let left_out: Vec<String> = answers
        .iter()
        .flat_map(|(subject, read)| {
            let named = match &subject.carrier {
                Some(carrier) => format!("{carrier}: {}", subject.name),
                None => subject.name.clone(),
            };
            errors(read, &named)
        })
        .collect();
    let mut allowed: Option<BTreeMap<String, Combined>> = None;
    for (subject, read) in answers {
        if failing.contains(&subject.carrier.as_deref()) {
            continue;
        }
        let Read::Clusters(clusters) = read else {
            continue;
        };
        let mut next = BTreeMap::new();
        for (name, allowance) in clusters {
            let mut combined = match &allowed {
                None => Combined::default(),
                Some(so_far) => match so_far.get(name) {
                    Some(c) => c.clone(),
                    None => continue,
                },
            };
            combined.weight = combined.weight.saturating_add(allowance.weight);
            if let Some(reason) = &allowance.reason {
                combined
                    .reasons
                    .push((subject.name.clone(), reason.clone()));
            }
            next.insert(name.clone(), combined);
        }
        allowed = Some(next);
    }
    Allowed::Clusters { allowed, left_out }
}

/// The errors of `read`, each prefixed with `subject`.
fn errors(read: &Read, subject: &str) -> Vec<String> {
    match read {
        Read::Errors(errors) => errors.iter().map(|e| format!("{subject}: {e}")).collect(),
        _ => Vec::new(),
    }
}

/// Longest reason of one ClusterDecision.
const REASON_LIMIT: usize = 1000;

/// The reason of one decided cluster: the policy's reasons, each followed
/// by the subjects it was given for.
pub(crate) fn reason(combined: Option<&Combined>) -> String {
    let reasons = combined.map(|c| c.reasons.as_slice()).unwrap_or_default();
    if reasons.is_empty() {
        return "selected by the Placement; the placement policy restricts none of its workloads"
            .to_owned();
    }
    let mut grouped: Vec<(&str, Vec<&str>)> = Vec::new();
    for (subject, reason) in reasons {
        match grouped.iter_mut().find(|(r, _)| *r == reason.as_str()) {
            Some((_, subjects)) => subjects.push(subject),
            None => grouped.push((reason, vec![subject])),
        }
    }
    let text = grouped
        .iter()
        .map(|(reason, subjects)| format!("{reason} ({})", subjects.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    policy_client::text::truncate(&format!("placement policy: {text}"), REASON_LIMIT).into_owned()
}

#[cfg(test)]
mod tests;
