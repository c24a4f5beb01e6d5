use super::*;
use serde_json::json;

fn rs_resource() -> ApiResource {
    ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        plural: "replicasets".into(),
    }
}

#[test]
fn paths() {
    let key = ObjectKey::new(Some("default"), "nginx-eu");
    assert_eq!(
        type_path("kubernetes", "replicasets"),
        "kubernetes/replicasets"
    );
    assert_eq!(type_path("/a/b/", "pods"), "a/b/pods");
    assert_eq!(
        object_path("kubernetes", "replicasets", &key, true),
        "kubernetes/replicasets/default/nginx-eu"
    );
    let cluster = ObjectKey::new(None, "gce-europe-west1");
    assert_eq!(
        object_path("kubernetes", "clusters", &cluster, false),
        "kubernetes/clusters/gce-europe-west1"
    );
    assert_eq!(key.to_string(), "default/nginx-eu");
    assert_eq!(cluster.to_string(), "gce-europe-west1");
}

#[test]
fn managed_fields_are_stripped_and_type_filled_in() {
    let object: DynamicObject = serde_json::from_value(json!({
        "metadata": {
            "name": "nginx-eu",
            "namespace": "default",
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            "labels": {"app": "nginx-eu"}
        },
        "spec": {"replicas": 4}
    }))
    .unwrap();
    let value = object_value(&object, &rs_resource());
    assert_eq!(value["apiVersion"], "apps/v1");
    assert_eq!(value["kind"], "ReplicaSet");
    assert!(value["metadata"].get("managedFields").is_none());
    assert_eq!(value["metadata"]["labels"]["app"], "nginx-eu");
    assert_eq!(value["spec"]["replicas"], 4);

    let mut other = json!({"metadata": {"managedFields": []}, "kind": "Cluster"});
    strip_managed_fields(&mut other);
    assert_eq!(other, json!({"metadata": {}, "kind": "Cluster"}));
    let mut no_meta = json!({"kind": "X"});
    strip_managed_fields(&mut no_meta);
    assert_eq!(no_meta, json!({"kind": "X"}));
}

#[test]
fn existing_type_meta_is_kept() {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "a"}
    }))
    .unwrap();
    let value = object_value(&object, &rs_resource());
    assert_eq!(value["kind"], "ReplicaSet");
}

fn document(objects: &[(ObjectKey, &str)], namespaced: bool) -> Value {
    let objects: Vec<(ObjectKey, Bytes)> = objects
        .iter()
        .map(|(k, json)| (k.clone(), Bytes::copy_from_slice(json.as_bytes())))
        .collect();
    let json = type_document(objects.iter().map(|(k, json)| (k, json)), namespaced);
    serde_json::from_slice(&json.joined()).expect("the document is JSON")
}

#[test]
fn whole_type_documents() {
    let a = ObjectKey::new(Some("ns1"), "a");
    let b = ObjectKey::new(Some("ns1"), "b\"q\"");
    let c = ObjectKey::new(Some("ns2"), "c");
    let doc = document(
        &[(a.clone(), "1"), (b.clone(), "2"), (c.clone(), "3")],
        true,
    );
    assert_eq!(doc, json!({"ns1": {"a": 1, "b\"q\"": 2}, "ns2": {"c": 3}}));
    // The same objects in a cluster-scoped layout.
    let doc = document(&[(a, "1"), (b, "2"), (c, "3")], false);
    assert_eq!(doc, json!({"a": 1, "b\"q\"": 2, "c": 3}));

    let x = ObjectKey::new(None, "x");
    let y = ObjectKey::new(Some("ns"), "y");
    let doc = document(&[(x, r#"{"k":"v"}"#), (y, "[]")], true);
    assert_eq!(doc, json!({"x": {"k": "v"}, "ns": {"y": []}}));

    assert_eq!(document(&[], true), json!({}));
}

/// A watched object's JSON is, byte for byte, what `object_value` makes of
/// the same object decoded as a `DynamicObject` (list items without their
/// type, watch events with it, an empty kind filled in).
#[test]
fn a_watched_objects_json_is_object_value_encoded() {
    for object in [
        json!({"metadata": {"name": "a", "namespace": "n", "labels": {"z": "1", "a": "2"}}, "data": {"k": "v"}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "a"}, "spec": {"replicas": 2}, "status": {}}),
        json!({"kind": "", "metadata": {"name": "b", "annotations": {"x": "y"}}, "aaa": [1, {"b": null}], "zzz": true}),
        json!({"spec": {}}),
    ] {
        let watched: WatchedObject = serde_json::from_value(object.clone()).unwrap();
        let json = watched.json(&rs_resource());
        assert_eq!(json.len(), json.capacity());
        let dynamic: DynamicObject = serde_json::from_value(object).unwrap();
        let expected = serde_json::to_vec(&object_value(&dynamic, &rs_resource())).unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            String::from_utf8(expected).unwrap()
        );
    }
}

#[test]
fn a_watched_object_is_keyed_by_its_metadata() {
    let watched: WatchedObject =
        serde_json::from_value(json!({"metadata": {"name": "a", "namespace": "n"}})).unwrap();
    assert_eq!(
        ObjectKey::of(watched.meta()),
        Some(ObjectKey::new(Some("n"), "a"))
    );
    let unnamed: WatchedObject = serde_json::from_value(json!({"kind": "X"})).unwrap();
    assert_eq!(ObjectKey::of(unnamed.meta()), None);
    assert!(serde_json::from_value::<WatchedObject>(json!([1])).is_err());
}
