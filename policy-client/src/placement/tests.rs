use super::*;
use serde_json::json;

/// One key for the whole test run, as webhook and remediator share one.
fn keys() -> &'static OwnershipKeys {
    static KEYS: std::sync::OnceLock<OwnershipKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| OwnershipKeys::ephemeral().unwrap())
}

fn decision(pairs: &[(&str, &str)]) -> Decision {
    Decision {
        annotations: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Decision::default()
    }
}

fn apply(object: &Value, patch: &Patch) -> Value {
    let mut doc = object.clone();
    json_patch::patch(&mut doc, patch).expect("patch applies");
    doc
}

fn patch_json(patch: &Patch) -> Value {
    serde_json::to_value(patch).unwrap()
}

#[test]
fn adds_whole_map_when_annotations_absent() {
    let obj = json!({"metadata": {"name": "rs"}});
    let patch = plan_patch(&obj, &decision(&[("example.com/placement", "eu")]), keys())
        .unwrap()
        .unwrap();
    let ops = patch_json(&patch);
    assert_eq!(ops[0]["op"], "add");
    assert_eq!(ops[0]["path"], "/metadata/annotations");
    assert_eq!(ops[0]["value"]["example.com/placement"], "eu");
    assert_eq!(ops.as_array().unwrap().len(), 1);
    let out = apply(&obj, &patch);
    assert_eq!(
        out["metadata"]["annotations"]["example.com/placement"],
        "eu"
    );
    assert_eq!(out["metadata"]["name"], "rs");
}

#[test]
fn adds_metadata_when_absent() {
    let obj = json!({"kind": "ReplicaSet"});
    let patch = plan_patch(&obj, &decision(&[("a", "b")]), keys())
        .unwrap()
        .unwrap();
    assert_eq!(patch_json(&patch)[0]["path"], "/metadata");
    assert_eq!(apply(&obj, &patch)["metadata"]["annotations"]["a"], "b");
}

#[test]
fn null_annotations_are_treated_as_absent() {
    let obj = json!({"metadata": {"annotations": null}});
    let patch = plan_patch(&obj, &decision(&[("a", "b")]), keys())
        .unwrap()
        .unwrap();
    assert_eq!(patch_json(&patch)[0]["path"], "/metadata/annotations");
}

#[test]
fn escapes_json_pointer_tokens() {
    let obj = json!({"metadata": {"annotations": {"keep": "me"}}});
    let patch = plan_patch(
        &obj,
        &decision(&[("federation.kubernetes.io/x", "1")]),
        keys(),
    )
    .unwrap()
    .unwrap();
    let ops = patch_json(&patch);
    assert_eq!(
        ops[0]["path"],
        "/metadata/annotations/federation.kubernetes.io~1x"
    );
    let out = apply(&obj, &patch);
    assert_eq!(
        out["metadata"]["annotations"]["federation.kubernetes.io/x"],
        "1"
    );
    assert_eq!(out["metadata"]["annotations"]["keep"], "me");
    // `~` cannot appear in a valid key, but the pointer still escapes it first.
    assert_eq!(pointer(&["a", "b~/c"]).as_str(), "/a/b~0~1c");
}

#[test]
fn no_patch_when_nothing_changes() {
    let obj = json!({"metadata": {"annotations": {"a": "b", "c": "d"}}});
    assert_eq!(
        plan_patch(&obj, &decision(&[("a", "b")]), keys()).unwrap(),
        None
    );
    assert_eq!(plan_patch(&obj, &decision(&[]), keys()).unwrap(), None);
    let bare = json!({"metadata": {}});
    assert_eq!(plan_patch(&bare, &decision(&[]), keys()).unwrap(), None);
}

#[test]
fn policy_value_replaces_developer_value_and_records_the_request() {
    let obj = json!({"metadata": {"annotations": {"p": "developer", "other": "x"}}});
    let patch = plan_patch(&obj, &decision(&[("p", "policy")]), keys())
        .unwrap()
        .unwrap();
    let out = apply(&obj, &patch);
    let ann = &out["metadata"]["annotations"];
    assert_eq!(ann["p"], "policy");
    assert_eq!(ann["other"], "x");
    let record = ownership(&out, keys());
    assert_eq!(
        record["p"],
        OwnedValue {
            written: digest("policy"),
            requested: Some("developer".into())
        }
    );
    // Replacing an existing key is a `replace`, not a remove + add.
    let ops = patch_json(&patch);
    assert!(
        ops.as_array()
            .unwrap()
            .iter()
            .any(|op| op["op"] == "replace" && op["path"] == "/metadata/annotations/p")
    );
}

#[test]
fn merge_is_idempotent() {
    let obj = json!({"metadata": {"annotations": {"p": "developer"}}});
    let d = decision(&[("p", "policy"), ("q", "{\"a\":1}")]);
    let once = apply(&obj, &plan_patch(&obj, &d, keys()).unwrap().unwrap());
    assert_eq!(plan_patch(&once, &d, keys()).unwrap(), None);
}

#[test]
fn developer_view_restores_the_request() {
    let obj = json!({"metadata": {"annotations": {"p": "developer"}}});
    let placed = apply(
        &obj,
        &plan_patch(&obj, &decision(&[("p", "policy"), ("n", "new")]), keys())
            .unwrap()
            .unwrap(),
    );
    let view = developer_view(&placed, keys());
    assert_eq!(view, obj);
}

#[test]
fn changed_value_is_a_new_developer_request() {
    let obj = json!({"metadata": {"annotations": {"p": "developer"}}});
    let d = decision(&[("p", "policy")]);
    let mut placed = apply(&obj, &plan_patch(&obj, &d, keys()).unwrap().unwrap());
    placed["metadata"]["annotations"]["p"] = json!("edited");
    let view = developer_view(&placed, keys());
    assert_eq!(view["metadata"]["annotations"]["p"], "edited");
    assert!(
        view["metadata"]["annotations"]
            .get(OWNERSHIP_ANNOTATION)
            .is_none()
    );
    // Re-placing records the new request.
    let again = apply(&placed, &plan_patch(&placed, &d, keys()).unwrap().unwrap());
    let record = ownership(&again, keys());
    assert_eq!(record["p"].requested.as_deref(), Some("edited"));
}

#[test]
fn value_the_policy_stops_setting_is_restored() {
    let obj = json!({"metadata": {"annotations": {"p": "developer"}}});
    let placed = apply(
        &obj,
        &plan_patch(&obj, &decision(&[("p", "policy"), ("n", "x")]), keys())
            .unwrap()
            .unwrap(),
    );
    let patch = plan_patch(&placed, &decision(&[]), keys())
        .unwrap()
        .unwrap();
    let restored = apply(&placed, &patch);
    assert_eq!(restored, obj);
}

#[test]
fn no_record_when_policy_agrees_with_developer() {
    let obj = json!({"metadata": {"annotations": {"p": "same"}}});
    assert_eq!(
        plan_patch(&obj, &decision(&[("p", "same")]), keys()).unwrap(),
        None
    );
}

#[test]
fn invalid_keys_are_named_errors() {
    let obj = json!({"metadata": {}});
    for (key, fragment) in [
        ("a/b/c", "at most one '/'"),
        ("/name", "prefix part must not be empty"),
        ("Bad_Prefix/name", "DNS subdomain"),
        ("example.com/", "name part must not be empty"),
        ("-leading", "must start and end"),
        ("has space", "must consist"),
    ] {
        let err = plan_patch(&obj, &decision(&[(key, "v")]), keys()).unwrap_err();
        match &err {
            MergeError::InvalidKey { key: k, reason } => {
                assert_eq!(k, key);
                assert!(reason.contains(fragment), "{key}: {reason}");
            }
            other => panic!("{key}: unexpected {other:?}"),
        }
    }
    let long_name = "n".repeat(64);
    assert!(validate_annotation_key(&long_name).is_err());
    assert!(validate_annotation_key(&"n".repeat(63)).is_ok());
    assert!(validate_annotation_key("Example.COM/Name_1.x").is_ok());
    assert!(validate_annotation_key("federation.kubernetes.io/replica-set-preferences").is_ok());
}

#[test]
fn reserved_key_is_refused() {
    let obj = json!({"metadata": {}});
    assert_eq!(
        plan_patch(&obj, &decision(&[(OWNERSHIP_ANNOTATION, "{}")]), keys()).unwrap_err(),
        MergeError::ReservedKey(OWNERSHIP_ANNOTATION.into())
    );
}

#[test]
fn oversize_annotations_are_a_named_error() {
    let obj = json!({"metadata": {"annotations": {"dev": "x".repeat(200 * 1024)}}});
    let err = plan_patch(&obj, &decision(&[("p", &"y".repeat(60 * 1024))]), keys()).unwrap_err();
    assert!(
        matches!(
            err,
            MergeError::TooLarge {
                limit: TOTAL_ANNOTATION_SIZE_LIMIT,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("limit of 262144 bytes"));
    // The ownership record costs a digest, not a copy of the value.
    let obj = json!({"metadata": {}});
    let near = TOTAL_ANNOTATION_SIZE_LIMIT - 300;
    assert!(plan_patch(&obj, &decision(&[("p", &"y".repeat(near))]), keys()).is_ok());
    let at = TOTAL_ANNOTATION_SIZE_LIMIT;
    assert!(plan_patch(&obj, &decision(&[("p", &"y".repeat(at))]), keys()).is_err());
}

/// A record someone else wrote (or edited) is not honoured: it can neither
/// hide an annotation from the policy nor make the webhook remove it.
#[test]
fn a_forged_record_hides_and_removes_nothing() {
    let forged = serde_json::to_string(&json!({
        "owned": {"team": {"written": digest("payments"), "requested": null}},
        "mac": "hmac-sha256:AAAA"
    }))
    .unwrap();
    let obj = json!({"kind": "ReplicaSet", "metadata": {"name": "rs", "namespace": "ns",
        "annotations": {"team": "payments", OWNERSHIP_ANNOTATION: forged}}});
    assert_eq!(
        developer_view(&obj, keys())["metadata"]["annotations"]["team"],
        "payments",
        "the policy sees the annotation"
    );
    let out = apply(
        &obj,
        &plan_patch(&obj, &decision(&[]), keys()).unwrap().unwrap(),
    );
    assert_eq!(
        out["metadata"]["annotations"]["team"], "payments",
        "not removed"
    );
    assert!(
        out["metadata"]["annotations"]
            .get(OWNERSHIP_ANNOTATION)
            .is_none()
    );
    // The same record with a tag the keys made for other content fails too.
    let (placed, _) = placed_object("rs");
    let mut edited = placed.clone();
    let record = edited["metadata"]["annotations"][OWNERSHIP_ANNOTATION]
        .as_str()
        .unwrap()
        .replace("\"requested\":\"developer\"", "\"requested\":\"forged\"");
    edited["metadata"]["annotations"][OWNERSHIP_ANNOTATION] = json!(record);
    assert!(
        ownership(&edited, keys()).is_empty(),
        "an edited record does not verify"
    );
}

fn placed_object(name: &str) -> (Value, Patch) {
    let obj = json!({"kind": "ReplicaSet", "metadata": {"name": name, "namespace": "ns",
        "annotations": {"p": "developer"}}});
    let patch = plan_patch(&obj, &decision(&[("p", "policy")]), keys())
        .unwrap()
        .unwrap();
    (apply(&obj, &patch), patch)
}

/// The record belongs to its object: on the same object it restores the
/// developer's request; copied to another object (another name, namespace
/// or kind) it is ignored and the copy's annotations are its request.
#[test]
fn a_record_verifies_only_on_its_own_object() {
    let (placed, _) = placed_object("rs");
    assert_eq!(
        developer_view(&placed, keys())["metadata"]["annotations"]["p"],
        "developer"
    );
    let mut copy = placed.clone();
    copy["metadata"]["name"] = json!("rs-copy");
    assert!(ownership(&copy, keys()).is_empty());
    let view = developer_view(&copy, keys());
    assert_eq!(view["metadata"]["annotations"]["p"], "policy");
    assert!(
        view["metadata"]["annotations"]
            .get(OWNERSHIP_ANNOTATION)
            .is_none()
    );
    // The copy placed again: a record of its own, which verifies.
    let again = apply(
        &copy,
        &plan_patch(&copy, &decision(&[("p", "policy")]), keys())
            .unwrap()
            .unwrap_or(json_patch::Patch(vec![])),
    );
    assert_eq!(again["metadata"]["annotations"]["p"], "policy");
    let mut moved = placed.clone();
    moved["metadata"]["namespace"] = json!("elsewhere");
    assert!(ownership(&moved, keys()).is_empty());
    let other_keys = OwnershipKeys::ephemeral().unwrap();
    assert!(
        ownership(&placed, &other_keys).is_empty(),
        "another key does not verify"
    );
}

/// `object` as the API server stores it: with `uid`, created `after`
/// seconds from now.
fn stored(object: &Value, uid: &str, after: i64) -> Value {
    let mut stored = object.clone();
    let created = k8s_openapi::jiff::Timestamp::from_second(now_unix() + after).unwrap();
    stored["metadata"]["uid"] = json!(uid);
    stored["metadata"]["creationTimestamp"] = json!(created.to_string());
    stored
}

/// A record belongs to what identifies its object: made on a stored
/// object, its uid and API group (so not onto the object recreated under
/// its name, nor another group's kind of the same name); made at the
/// creation, its creation time (so not onto an object, or a generateName
/// sibling, created later). Placing the stored object again binds it to
/// the uid.
#[test]
fn a_record_is_bound_to_the_uid_or_the_creation_time() {
    let object = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"generateName": "web-", "namespace": "ns",
            "annotations": {"p": "developer"}}});
    let decision = decision(&[("p", "policy")]);
    // Made at the creation: no uid yet.
    let creating = apply(
        &object,
        &plan_patch(&object, &decision, keys()).unwrap().unwrap(),
    );
    let record = creating["metadata"]["annotations"][OWNERSHIP_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(record.contains("\"creating\":"), "{record}");
    assert!(!ownership(&creating, keys()).is_empty(), "while created");
    assert_eq!(
        plan_patch(&creating, &decision, keys()).unwrap(),
        None,
        "called again on the same CREATE: the same record"
    );
    let mut first = stored(&creating, "uid-1", 1);
    first["metadata"]["name"] = json!("web-abcde");
    assert!(!ownership(&first, keys()).is_empty(), "stored at once");
    let mut later = stored(&creating, "uid-2", 120);
    later["metadata"]["name"] = json!("web-fghij");
    assert!(ownership(&later, keys()).is_empty(), "a sibling made later");
    assert_eq!(
        developer_view(&later, keys())["metadata"]["annotations"]["p"],
        "policy"
    );
    // Placed again, stored, the same: nothing to write (the record stays
    // as made). Placed otherwise: bound to the uid.
    assert_eq!(plan_patch(&first, &decision, keys()).unwrap(), None);
    let other = self::decision(&[("p", "elsewhere")]);
    let bound = apply(
        &first,
        &plan_patch(&first, &other, keys()).unwrap().unwrap(),
    );
    let record = bound["metadata"]["annotations"][OWNERSHIP_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(!record.contains("creating"), "{record}");
    assert_eq!(
        ownership(&bound, keys())["p"].requested.as_deref(),
        Some("developer")
    );
    // The same name, another uid (deleted and created again, even at
    // once), or another API group's kind of the same name: not its
    // record.
    let mut recreated = bound.clone();
    recreated["metadata"]["uid"] = json!("uid-3");
    assert!(ownership(&recreated, keys()).is_empty());
    let mut other_group = bound.clone();
    other_group["apiVersion"] = json!("example.com/v1");
    assert!(ownership(&other_group, keys()).is_empty());
    // The version is no part of the object's identity.
    let mut other_version = bound.clone();
    other_version["apiVersion"] = json!("apps/v1beta2");
    assert!(!ownership(&other_version, keys()).is_empty());
}

#[test]
fn malformed_objects_are_errors() {
    assert!(matches!(
        plan_patch(&json!([1]), &decision(&[]), keys()),
        Err(MergeError::InvalidObject(_))
    ));
    assert!(matches!(
        plan_patch(
            &json!({"metadata": {"annotations": {"a": 1}}}),
            &decision(&[]),
            keys()
        ),
        Err(MergeError::InvalidObject(_))
    ));
    assert!(matches!(
        plan_patch(&json!({"metadata": "x"}), &decision(&[]), keys()),
        Err(MergeError::InvalidObject(_))
    ));
}

#[test]
fn unreadable_record_is_ignored() {
    let obj = json!({"metadata": {"annotations": {"p": "v", OWNERSHIP_ANNOTATION: "not json"}}});
    let view = developer_view(&obj, keys());
    assert_eq!(view["metadata"]["annotations"], json!({"p": "v"}));
    let patch = plan_patch(&obj, &decision(&[]), keys()).unwrap().unwrap();
    assert_eq!(
        apply(&obj, &patch)["metadata"]["annotations"],
        json!({"p": "v"})
    );
}
