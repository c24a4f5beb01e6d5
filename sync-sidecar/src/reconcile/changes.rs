//! The targets whose own content changed since the reconciler last saw them
//! (a workload's developer view, a binding's spec), fed by the watches: each
//! is evaluated on its own, so a create or an edit never costs a pass over
//! everything, and a status update costs nothing.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::replication::document::ObjectKey;
use crate::replication::watched::{Subscription, WatchChange};

/// One target object: the index of its watched type and its key.
pub(crate) type ItemKey = (usize, ObjectKey);

#[derive(Default)]
pub(crate) struct Changes {
    seen: parking_lot::Mutex<HashMap<ItemKey, u64>>,
    due: parking_lot::Mutex<BTreeSet<ItemKey>>,
    pub(crate) notify: Notify,
}

impl Changes {
    /// An object as watched, by the fingerprint of what decides its
    /// placement; `announce`: a new or changed fingerprint is due.
    pub(crate) fn observe(&self, key: ItemKey, fingerprint: u64, announce: bool) {
        let before = self.seen.lock().insert(key.clone(), fingerprint);
        if announce && before != Some(fingerprint) {
            self.due.lock().insert(key);
            self.notify.notify_one();
        }
    }

    /// `key` is due: something it is decided from changed elsewhere (an OCM
    /// Placement's ManifestWorkReplicaSets or PlacementDecisions).
    pub(crate) fn due(&self, key: ItemKey) {
        self.due.lock().insert(key);
        self.notify.notify_one();
    }

    pub(crate) fn forget(&self, key: &ItemKey) {
        self.seen.lock().remove(key);
        self.due.lock().remove(key);
    }

    pub(crate) fn take(&self) -> BTreeSet<ItemKey> {
        std::mem::take(&mut *self.due.lock())
    }
}

/// A stable hash of a JSON value.
pub(crate) fn fingerprint(value: &serde_json::Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

/// Follow a watch, handing each object (or `None`, deleted) to `seen`, with
/// whether it is news (not part of the first list, which the first pass
/// covers).
pub(crate) fn follow(
    mut watch: Subscription,
    cancel: CancellationToken,
    seen: impl Fn(&ObjectKey, Option<&Value>, bool) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut listed_once = false;
        loop {
            let change = tokio::select! {
                c = watch.changes.recv() => c,
                _ = cancel.cancelled() => break,
            };
            match change {
                Some(WatchChange::Applied {
                    key, json, listed, ..
                }) => {
                    let Ok(object) = serde_json::from_slice::<Value>(&json) else {
                        continue;
                    };
                    seen(&key, Some(&object), !listed || listed_once);
                }
                Some(WatchChange::Deleted { key, .. }) => seen(&key, None, true),
                Some(WatchChange::ListDone { .. }) => listed_once = true,
                None => break,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_objects_are_due_once_per_change() {
        let changes = Changes::default();
        let key = |name: &str| (0, ObjectKey::new(Some("team-a"), name));
        changes.observe(key("listed"), 1, false);
        assert!(
            changes.take().is_empty(),
            "the first list is the first pass's"
        );
        changes.observe(key("listed"), 1, true);
        changes.observe(key("created"), 5, true);
        assert_eq!(changes.take(), [key("created")].into());
        changes.observe(key("listed"), 2, true);
        changes.observe(key("created"), 6, true);
        changes.forget(&key("created"));
        assert_eq!(changes.take(), [key("listed")].into());
        assert!(changes.take().is_empty());
    }
}
