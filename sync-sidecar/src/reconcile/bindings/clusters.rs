//! Karmada's Clusters as the scheduler reads them, decoded once per change
//! of the replicated store rather than once per decision: at 100 members the
//! decoding of every Cluster for each binding was most of placement-sync's
//! CPU in scheduler mode (BENCHMARKS.md §10).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Map, Value};

use crate::replication::watched::WatchedType;

/// The replicated Clusters and their decoded form.
pub(crate) struct KnownClusters {
    watched: Arc<WatchedType>,
    decoded: Mutex<Decoded>,
}

#[derive(Default)]
struct Decoded {
    /// The store's change count they were decoded at.
    at: Option<u64>,
    /// Each Cluster's JSON as decoded (an unchanged one is not decoded
    /// again: the store replaces an object's buffer when it changes).
    json: BTreeMap<String, Bytes>,
    clusters: Arc<BTreeMap<String, Value>>,
}

impl KnownClusters {
    pub(crate) fn new(watched: Arc<WatchedType>) -> KnownClusters {
        KnownClusters {
            watched,
            decoded: Mutex::default(),
        }
    }

    /// The Clusters by name, each with what the scheduler reads of it.
    pub(crate) fn get(&self) -> Arc<BTreeMap<String, Value>> {
        let objects = &self.watched.objects;
        let mut decoded = self.decoded.lock();
        // Read before the snapshot: a change in between is decoded next time.
        let at = objects.changes();
        if decoded.at == Some(at) {
            return decoded.clusters.clone();
        }
        let mut json = BTreeMap::new();
        let mut clusters = BTreeMap::new();
        for (key, bytes) in objects.snapshot(|_| true) {
            let unchanged = decoded.json.get(&key.name).is_some_and(|before| {
                before.as_ptr() == bytes.as_ptr() && before.len() == bytes.len()
            });
            let cluster = match decoded.clusters.get(&key.name) {
                Some(cluster) if unchanged => cluster.clone(),
                _ => match serde_json::from_slice::<Value>(&bytes) {
                    Ok(cluster) => scheduled_view(cluster),
                    Err(_) => continue,
                },
            };
            clusters.insert(key.name.clone(), cluster);
            json.insert(key.name, bytes);
        }
        *decoded = Decoded {
            at: Some(at),
            json,
            clusters: Arc::new(clusters),
        };
        decoded.clusters.clone()
    }
}

/// What the scheduler's filters read of a Cluster: its name and labels
/// (label selectors) and its spec (field selectors, zones, taints). Its
/// status (API enablements, resource summary) is most of its size.
fn scheduled_view(mut cluster: Value) -> Value {
    let mut view = Map::new();
    if let Some(metadata) = cluster.get_mut("metadata").and_then(Value::as_object_mut) {
        let kept: Map<String, Value> = ["name", "labels"]
            .into_iter()
            .filter_map(|field| Some((field.to_owned(), metadata.remove(field)?)))
            .collect();
        view.insert("metadata".to_owned(), Value::Object(kept));
    }
    if let Some(spec) = cluster.get_mut("spec").map(Value::take) {
        view.insert("spec".to_owned(), spec);
    }
    Value::Object(view)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::replication::document::ObjectKey;

    fn watched() -> Arc<WatchedType> {
        Arc::new(WatchedType {
            resource: kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced: false,
            labels: None,
            objects: Default::default(),
        })
    }

    fn cluster(name: &str, region: &str) -> Bytes {
        Bytes::from(
            json!({
                "metadata": {"name": name, "labels": {"tier": "gold"}, "resourceVersion": "1"},
                "spec": {"region": region, "taints": []},
                "status": {"apiEnablements": [{"groupVersion": "apps/v1"}]},
            })
            .to_string(),
        )
    }

    /// A Cluster is decoded to what the filters read, and decoded again
    /// only after the store holds a new version of it.
    #[test]
    fn clusters_are_decoded_again_only_when_they_change() {
        let watched = watched();
        let objects = &watched.objects;
        objects.apply(ObjectKey::new(None, "eu-1"), cluster("eu-1", "eu-west"));
        objects.apply(ObjectKey::new(None, "us-1"), cluster("us-1", "us-east"));
        let known = KnownClusters::new(watched.clone());
        let first = known.get();
        assert_eq!(
            first["eu-1"],
            json!({"metadata": {"name": "eu-1", "labels": {"tier": "gold"}},
                   "spec": {"region": "eu-west", "taints": []}})
        );
        assert!(Arc::ptr_eq(&first, &known.get()), "no change: the same map");
        objects.apply(ObjectKey::new(None, "eu-1"), cluster("eu-1", "eu-central"));
        let second = known.get();
        assert_eq!(second["eu-1"]["spec"]["region"], "eu-central");
        assert_eq!(second["us-1"], first["us-1"]);
        objects.delete(&ObjectKey::new(None, "us-1"));
        assert_eq!(
            known.get().keys().collect::<Vec<_>>(),
            ["eu-1"],
            "a deleted Cluster is gone"
        );
    }
}
