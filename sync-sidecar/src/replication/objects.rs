//! The objects of one replicated type, each kept as the JSON the engine
//! receives: about a tenth of the memory of a decoded object (a
//! `DynamicObject` of a 0.5 KB ConfigMap takes several KiB), and in key order,
//! so the whole-type document is written straight from these bytes.
//!
//! Fed by the type's watch events with a reflector's semantics: a (re)list is
//! collected aside and replaces the objects only once complete.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use bytes::Bytes;
use policy_client::engine::EncodedJson;
use tokio::sync::watch;

use crate::replication::document::ObjectKey;

#[derive(Default)]
struct Objects {
    current: BTreeMap<ObjectKey, Bytes>,
    /// A list in progress (between `Init` and `InitDone`).
    listing: Option<BTreeMap<ObjectKey, Bytes>>,
}

pub(crate) struct TypeObjects {
    objects: RwLock<Objects>,
    /// `true` once the first list is complete.
    listed: watch::Sender<bool>,
    /// Counts the changes of `current`, for readers that keep something
    /// derived from it.
    changes: AtomicU64,
}

impl Default for TypeObjects {
    fn default() -> Self {
        TypeObjects {
            objects: RwLock::default(),
            listed: watch::Sender::new(false),
            changes: AtomicU64::new(0),
        }
    }
}

impl TypeObjects {
    /// A watched add or update; the object as it was before.
    pub(crate) fn apply(&self, key: ObjectKey, json: Bytes) -> Option<Bytes> {
        let previous = self.objects.write().current.insert(key, json);
        self.changed();
        previous
    }

    /// A watched deletion; the object as it was.
    pub(crate) fn delete(&self, key: &ObjectKey) -> Option<Bytes> {
        let previous = self.objects.write().current.remove(key);
        self.changed();
        previous
    }

    /// A (re)list begins.
    pub(crate) fn list_started(&self) {
        self.objects.write().listing = Some(BTreeMap::new());
    }

    /// One object of the list in progress.
    pub(crate) fn listed(&self, key: ObjectKey, json: Bytes) {
        let mut objects = self.objects.write();
        objects
            .listing
            .get_or_insert_with(BTreeMap::new)
            .insert(key, json);
    }

    /// The list is complete: it replaces what was known (objects deleted
    /// while disconnected disappear).
    pub(crate) fn list_done(&self) {
        {
            let mut objects = self.objects.write();
            let listing = objects.listing.take().unwrap_or_default();
            objects.current = listing;
        }
        self.changed();
        self.listed.send_replace(true);
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// How many times the objects changed: equal counts, the same objects.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Resolves once the first list is complete.
    pub(crate) async fn wait_until_listed(&self) {
        let mut listed = self.listed.subscribe();
        let _ = listed.wait_for(|done| *done).await;
    }

    pub(crate) fn get(&self, key: &ObjectKey) -> Option<Bytes> {
        self.objects.read().current.get(key).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.objects.read().current.len()
    }

    /// How many objects `keep` accepts.
    pub(crate) fn count(&self, keep: impl Fn(&ObjectKey) -> bool) -> usize {
        self.objects
            .read()
            .current
            .keys()
            .filter(|k| keep(k))
            .count()
    }

    /// The objects `keep` accepts, each with its JSON (buffers shared).
    pub(crate) fn snapshot(&self, keep: impl Fn(&ObjectKey) -> bool) -> Vec<(ObjectKey, Bytes)> {
        self.objects
            .read()
            .current
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The whole-type document (see [`crate::replication::document`] for its layout) of
    /// the objects `keep` accepts, encoded in pieces that share the objects'
    /// buffers, and how many it holds.
    pub(crate) fn document(
        &self,
        namespaced: bool,
        keep: impl Fn(&ObjectKey) -> bool,
    ) -> (EncodedJson, usize) {
        let objects = self.objects.read();
        let kept = objects.current.iter().filter(|(key, _)| keep(key));
        let mut count = 0;
        let json =
            crate::replication::document::type_document(kept.inspect(|_| count += 1), namespaced);
        (json, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(Some(ns), name)
    }

    fn doc(objects: &TypeObjects) -> Value {
        serde_json::from_slice(&objects.document(true, |_| true).0.joined()).unwrap()
    }

    #[tokio::test]
    async fn a_relist_replaces_the_objects_once_complete() {
        let objects = TypeObjects::default();
        objects.list_started();
        objects.listed(key("a", "x"), Bytes::from_static(b"1"));
        objects.listed(key("a", "gone"), Bytes::from_static(b"2"));
        assert_eq!(objects.len(), 0, "a list in progress is not served");
        objects.list_done();
        objects.wait_until_listed().await;
        assert_eq!(doc(&objects), json!({"a": {"x": 1, "gone": 2}}));

        objects.apply(key("b", "y"), Bytes::from_static(br#"{"v":3}"#));
        objects.delete(&key("a", "x"));
        assert_eq!(
            objects.get(&key("b", "y")).as_deref(),
            Some(&br#"{"v":3}"#[..])
        );
        assert_eq!(
            doc(&objects),
            json!({"a": {"gone": 2}, "b": {"y": {"v": 3}}})
        );

        // Relisted after a disconnect: `gone` was deleted meanwhile.
        objects.list_started();
        objects.listed(key("b", "y"), Bytes::from_static(b"4"));
        assert_eq!(
            objects.len(),
            2,
            "the old objects serve until the list is complete"
        );
        objects.list_done();
        assert_eq!(doc(&objects), json!({"b": {"y": 4}}));
        let (_, count) = objects.document(true, |k| k.namespace.as_deref() != Some("b"));
        assert_eq!(count, 0, "ignored namespaces are left out");
    }
}
