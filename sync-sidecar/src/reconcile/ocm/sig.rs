//! The SIG-Multicluster PlacementDecision (KEP-5313, `multicluster.x-k8s.io/v1alpha1`,
//! as `sigs.k8s.io/cluster-inventory-api` v0.1.0 defines it): each decision of
//! a Placement also published for consumers written for the standard. A
//! data-only object (no status): `decisions` of `clusterProfileRef` (the
//! ClusterProfile OCM keeps of the cluster in the Placement's namespace) and
//! `reason`, `schedulerName`, at most 100 decisions per slice, the slices of
//! one decision labelled with the same `decision-key` and their
//! `decision-index`, and `placement-key` naming the Placement; owned by the
//! Placement.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use super::decisions::{ClusterDecision, MAX_DECISIONS_PER_OBJECT, owner_reference};
use super::placement::Placement;

pub(crate) const API_VERSION: &str = "multicluster.x-k8s.io/v1alpha1";
/// The group, version and plural of the type.
pub(crate) const TYPE: (&str, &str, &str) =
    ("multicluster.x-k8s.io", "v1alpha1", "placementdecisions");
pub(crate) const DECISION_KEY_LABEL: &str = "multicluster.x-k8s.io/decision-key";
pub(crate) const DECISION_INDEX_LABEL: &str = "multicluster.x-k8s.io/decision-index";
pub(crate) const PLACEMENT_KEY_LABEL: &str = "multicluster.x-k8s.io/placement-key";

/// A published slice as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Slice {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) decisions: Value,
    pub(crate) scheduler_name: Option<String>,
}

impl Slice {
    pub(crate) fn parse(json: &[u8]) -> Result<Slice, serde_json::Error> {
        #[derive(Deserialize)]
        struct Meta {
            name: String,
            #[serde(default)]
            labels: BTreeMap<String, String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Object {
            metadata: Meta,
            #[serde(default)]
            decisions: Value,
            #[serde(default)]
            scheduler_name: Option<String>,
        }
        let object: Object = serde_json::from_slice(json)?;
        Ok(Slice {
            name: object.metadata.name,
            labels: object.metadata.labels,
            decisions: object.decisions,
            scheduler_name: object.scheduler_name,
        })
    }
}

/// The slices to write (whole objects, for a server-side apply) and the
/// names of those to delete.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SliceWrite {
    pub(crate) apply: Vec<(String, Value)>,
    pub(crate) delete: Vec<String>,
}

impl SliceWrite {
    pub(crate) fn is_empty(&self) -> bool {
        self.apply.is_empty() && self.delete.is_empty()
    }
}

/// The slices of `placement` deciding `decided` by `scheduler_name`, against
/// its `existing` slices (those labelled with its decision key).
pub(crate) fn plan(
    placement: &Placement,
    decided: &[ClusterDecision],
    scheduler_name: &str,
    existing: &[Slice],
) -> SliceWrite {
    let mut chunks: Vec<&[ClusterDecision]> = decided.chunks(MAX_DECISIONS_PER_OBJECT).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let mut write = SliceWrite::default();
    let mut names = Vec::new();
    for (index, chunk) in chunks.into_iter().enumerate() {
        let name = format!("{}-decision-{}", placement.metadata.name, index + 1);
        let labels: BTreeMap<String, String> = [
            (
                DECISION_KEY_LABEL.to_owned(),
                placement.metadata.name.clone(),
            ),
            (DECISION_INDEX_LABEL.to_owned(), index.to_string()),
            (
                PLACEMENT_KEY_LABEL.to_owned(),
                placement.metadata.name.clone(),
            ),
        ]
        .into();
        let decisions: Vec<Value> = chunk
            .iter()
            .map(|d| json!({"clusterProfileRef": {"name": d.cluster_name}, "reason": d.reason}))
            .collect();
        let decisions = Value::Array(decisions);
        let same = existing.iter().any(|e| {
            e.name == name
                && labels.iter().all(|(k, v)| e.labels.get(k) == Some(v))
                && e.decisions == decisions
                && e.scheduler_name.as_deref() == Some(scheduler_name)
        });
        if !same {
            write.apply.push((
                name.clone(),
                json!({
                    "apiVersion": API_VERSION,
                    "kind": "PlacementDecision",
                    "metadata": {
                        "name": name,
                        "namespace": placement.metadata.namespace,
                        "labels": labels,
                        "ownerReferences": [owner_reference(placement)],
                    },
                    "decisions": decisions,
                    "schedulerName": scheduler_name,
                }),
            ));
        }
        names.push(name);
    }
    write.delete = existing
        .iter()
        .filter(|e| !names.contains(&e.name))
        .map(|e| e.name.clone())
        .collect();
    write
}

#[cfg(test)]
mod tests;
