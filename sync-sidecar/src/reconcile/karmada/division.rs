//! Replica division: how a binding's replicas are spread over the clusters the
//! policy chose, the way karmada-scheduler divides by static weights.
//!
//! The rule (Karmada's `assignByStaticWeightStrategy`, `pkg/util/helper/
//! binding.go` and `webstermethod.go`), extended by Federation v1's per-cluster
//! `minReplicas`/`maxReplicas`:
//!
//! 1. Every cluster first gets its `minReplicas`.
//! 2. The remaining replicas are handed out one at a time by the Webster
//!    (Sainte-Laguë) method: the next replica goes to the cluster with the
//!    highest `weight / (2 * replicas + 1)` among those with a weight above 0
//!    and below their `maxReplicas`. When no cluster has a weight above 0,
//!    every cluster counts with weight 1 (as Karmada does).
//! 3. Ties go to the cluster with fewer replicas, then by name: ascending or
//!    descending as the parity of the FNV-1a hash of the template's UID says,
//!    so that one workload always divides the same way and different ones
//!    do not all favour the same cluster (Karmada's `tieBreakerByUID`).
//! 4. Clusters left with 0 replicas are dropped; the result is sorted by name.
//!
//! Without `minReplicas` and `maxReplicas` this is exactly karmada-scheduler's
//! division, remainders included.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// What the policy asks of one cluster (Federation v1's `ClusterPreferences`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterPreference {
    #[serde(default)]
    pub(crate) weight: i64,
    #[serde(default)]
    pub(crate) min_replicas: i64,
    #[serde(default)]
    pub(crate) max_replicas: Option<i64>,
}

/// Replicas that cannot be divided as the preferences ask.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DivisionError {
    #[error("cluster {cluster}: {what} must not be negative")]
    Negative { cluster: String, what: &'static str },
    #[error("cluster {cluster}: minReplicas {min} is above maxReplicas {max}")]
    MinAboveMax { cluster: String, min: i64, max: i64 },
    #[error(
        "the clusters' minReplicas add up to {min}, more than the {replicas} replicas to place"
    )]
    MinimumsExceedReplicas { min: i64, replicas: i32 },
    #[error(
        "only {placed} of {replicas} replicas can be placed: every cluster with a weight is at its maxReplicas"
    )]
    MaximumsTooLow { placed: i64, replicas: i32 },
}

/// One cluster in the division.
#[derive(Debug, Clone)]
struct Party<'a> {
    name: &'a str,
    votes: i64,
    seats: i64,
    max: Option<i64>,
}

impl Party<'_> {
    fn open(&self) -> bool {
        self.votes > 0 && self.max.is_none_or(|max| self.seats < max)
    }

    /// Webster priority order: `votes / (2 * seats + 1)`, compared exactly.
    fn priority_cmp(&self, other: &Party<'_>) -> Ordering {
        let mine = i128::from(self.votes) * i128::from(2 * other.seats + 1);
        let theirs = i128::from(other.votes) * i128::from(2 * self.seats + 1);
        mine.cmp(&theirs)
    }
}

/// Karmada's tie-breaker direction for a template UID: names descending when
/// the FNV-1a (32-bit) hash of the UID is odd, ascending otherwise (and for
/// an empty UID).
fn names_descending(uid: &str) -> bool {
    if uid.is_empty() {
        return false;
    }
    let mut hash: u32 = 0x811c_9dc5;
    for byte in uid.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash & 1 == 1
}

/// Divide `replicas` over the clusters of `preferences` (see the module
/// documentation); `uid` is the template's UID. Returns `(cluster, replicas)`
/// sorted by name, without clusters that get none.
pub(crate) fn divide(
    replicas: i32,
    preferences: &BTreeMap<String, ClusterPreference>,
    uid: &str,
) -> Result<Vec<(String, i32)>, DivisionError> {
    for (name, p) in preferences {
        let negative = |what| DivisionError::Negative {
            cluster: name.clone(),
            what,
        };
        if p.weight < 0 {
            return Err(negative("weight"));
        }
        if p.min_replicas < 0 {
            return Err(negative("minReplicas"));
        }
        match p.max_replicas {
            Some(max) if max < 0 => return Err(negative("maxReplicas")),
            Some(max) if p.min_replicas > max => {
                return Err(DivisionError::MinAboveMax {
                    cluster: name.clone(),
                    min: p.min_replicas,
                    max,
                });
            }
            _ => {}
        }
    }
    let all_weightless = preferences.values().all(|p| p.weight == 0);
    let mut parties: Vec<Party<'_>> = preferences
        .iter()
        .map(|(name, p)| Party {
            name,
            votes: if all_weightless { 1 } else { p.weight },
            seats: p.min_replicas,
            max: p.max_replicas,
        })
        .collect();
    let minimums: i64 = parties.iter().map(|p| p.seats).sum();
    let total = i64::from(replicas.max(0));
    if minimums > total {
        return Err(DivisionError::MinimumsExceedReplicas {
            min: minimums,
            replicas,
        });
    }
    let descending = names_descending(uid);
    // Whether `a` takes the next replica before `b`.
    let before = |a: &Party<'_>, b: &Party<'_>| match a.priority_cmp(b) {
        Ordering::Equal if a.seats != b.seats => a.seats < b.seats,
        Ordering::Equal if descending => a.name > b.name,
        Ordering::Equal => a.name < b.name,
        order => order == Ordering::Greater,
    };
    // Replicas are few (one per pod): a linear scan per replica is cheaper
    // than keeping a heap, and obviously the same order.
    for placed in minimums..total {
        let mut next: Option<usize> = None;
        for (i, party) in parties.iter().enumerate() {
            if party.open() && next.is_none_or(|n| before(party, &parties[n])) {
                next = Some(i);
            }
        }
        let Some(next) = next else {
            return Err(DivisionError::MaximumsTooLow { placed, replicas });
        };
        parties[next].seats += 1;
    }
    Ok(parties
        .into_iter()
        .filter(|p| p.seats > 0)
        .map(|p| (p.name.to_owned(), p.seats as i32))
        .collect())
}

#[cfg(test)]
mod tests;
