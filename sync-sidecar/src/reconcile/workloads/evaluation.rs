//! One workload's evaluation, and what the blast-radius guard weighs of it.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use super::assess::Assessment;
use crate::reconcile::per_target::Weighed;
use crate::replication::document::ObjectKey;

/// One workload's evaluation, before anything is patched.
pub(crate) struct WorkloadEvaluation {
    pub(crate) i: usize,
    pub(crate) object: Arc<DynamicObject>,
    /// The object carries a placement the policy wrote (its ownership record).
    pub(crate) placed: bool,
    /// `None` when the query failed.
    pub(crate) assessment: Option<Assessment>,
}

impl Weighed for WorkloadEvaluation {
    fn target(&self) -> usize {
        self.i
    }

    fn object(&self) -> Option<ObjectKey> {
        ObjectKey::of(&self.object.metadata)
    }

    fn planned_from(&self) -> Option<String> {
        self.object.metadata.resource_version.clone()
    }

    /// A new signature of the ownership record that changes no annotation
    /// (after a key rotation) replaces nothing.
    fn replaces_a_placement(&self) -> bool {
        self.placed
            && matches!(&self.assessment, Some(Assessment::Stale { changed, .. }) if !changed.is_empty())
    }

    /// The names in the old values of the annotations it changes that its
    /// new values lack (names as a placement annotation writes them, e.g.
    /// the keys of `{"clusters": {"eu-1": {...}}}`).
    fn clusters_taken_out(&self) -> BTreeSet<String> {
        let Some(Assessment::Stale { patch, changed }) = &self.assessment else {
            return BTreeSet::new();
        };
        let before = serde_json::json!({"metadata": {"annotations": self.object.metadata.annotations.clone().unwrap_or_default()}});
        let mut after = before.clone();
        if json_patch::patch(&mut after, patch).is_err() {
            return BTreeSet::new();
        }
        let names = |doc: &Value| -> BTreeSet<String> {
            changed
                .iter()
                .filter_map(|key| doc["metadata"]["annotations"][key].as_str())
                .flat_map(placement_names)
                .collect()
        };
        names(&before).difference(&names(&after)).cloned().collect()
    }

    fn written(&self) -> serde_json::Result<Vec<u8>> {
        match &self.assessment {
            Some(Assessment::Stale { patch, .. }) => serde_json::to_vec(patch),
            _ => Ok(Vec::new()),
        }
    }
}

/// The names a placement annotation's value holds: runs of the characters
/// of a cluster name (letters, digits, `.`, `-`, `_`), whatever the format
/// around them (JSON keys or strings, a list).
fn placement_names(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_a_placement_are_read_whatever_its_format() {
        let names: Vec<String> =
            placement_names(r#"{"clusters":{"eu-1":{"weight":1},"gce-europe_west.2":{}}}"#)
                .collect();
        assert_eq!(
            names,
            ["clusters", "eu-1", "weight", "1", "gce-europe_west.2"]
        );
        assert_eq!(placement_names("eu-1, eu-2").count(), 2);
    }
}
