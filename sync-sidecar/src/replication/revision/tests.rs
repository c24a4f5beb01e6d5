use super::*;
use crate::replication::document::ObjectKey;
use crate::replication::health::cluster_kind;
use crate::replication::objects::TypeObjects;
use bytes::Bytes;
use kube::api::{ApiResource, GroupVersionKind};
use serde_json::json;

fn watched(objects: &[(&str, Value)]) -> WatchedType {
    let store = TypeObjects::default();
    for (name, object) in objects {
        store.apply(
            ObjectKey::new(None, name),
            Bytes::from(object.to_string().into_bytes()),
        );
    }
    WatchedType {
        resource: ApiResource::from_gvk(&GroupVersionKind::gvk(
            "placement-policy.io",
            "v1alpha1",
            "Cluster",
        )),
        namespaced: false,
        labels: None,
        objects: store,
    }
}

#[test]
fn the_revision_follows_configuration_not_status_or_health() {
    let kind = cluster_kind("placement-policy.io", "clusters");
    let cluster = |phase: &str, pci: &str, rv: &str| {
        json!({"metadata": {"name": "a", "resourceVersion": rv,
            "labels": {"placement-policy.io/pci-compliance-level": pci}},
            "spec": {"region": "europe-west1"}, "status": {"phase": phase}})
    };
    let running = type_revision(kind, &watched(&[("a", cluster("running", "2", "1"))]));
    let offline = type_revision(kind, &watched(&[("a", cluster("offline", "2", "2"))]));
    let relabelled = type_revision(kind, &watched(&[("a", cluster("running", "3", "3"))]));
    assert_eq!(running, offline, "health is not configuration");
    assert_ne!(running, relabelled);
    assert_ne!(
        running,
        type_revision(
            kind,
            &watched(&[
                ("a", cluster("running", "2", "1")),
                ("b", cluster("running", "2", "1"))
            ])
        ),
        "an added cluster"
    );
    assert_ne!(
        configured_revision("p1", &running),
        configured_revision("p2", &running)
    );
}
