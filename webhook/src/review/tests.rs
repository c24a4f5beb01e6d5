use super::*;
use serde_json::json;

fn review(request: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND, "request": request}))
        .unwrap()
}

#[test]
fn parses_a_create() {
    let body = review(json!({
        "uid": "u1",
        "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
        "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
        "namespace": "default",
        "operation": "CREATE",
        "userInfo": {"username": "dev"},
        "object": {"metadata": {"name": "rs"}},
        "dryRun": false
    }));
    let Parsed::Request(req) = parse(&body).unwrap() else {
        panic!()
    };
    assert_eq!(req.uid, "u1");
    assert_eq!(req.operation, Operation::Create);
    assert_eq!(req.object.unwrap()["metadata"]["name"], "rs");
}

/// A well-formed review parsed in one pass reads as it does step by step.
#[test]
fn one_pass_reads_as_the_steps_do() {
    let body = review(json!({
        "uid": "u2",
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "subResource": "",
        "namespace": "team",
        "name": "web",
        "operation": "UPDATE",
        "userInfo": {"username": "dev", "groups": ["a"]},
        "object": {"metadata": {"name": "web", "annotations": {"k": "v\u{e9}"}}},
        "oldObject": {"metadata": {"name": "web"}},
        "dryRun": true,
        "options": {"kind": "UpdateOptions"}
    }));
    let (Parsed::Request(whole), Parsed::Request(in_steps)) =
        (parse(&body).unwrap(), parse_in_steps(&body).unwrap())
    else {
        panic!("both parse the review")
    };
    assert_eq!(format!("{whole:?}"), format!("{in_steps:?}"));
    assert_eq!(whole.uid, "u2");
}

#[test]
fn rejects_wrong_versions_and_garbage() {
    assert!(matches!(parse(b"{"), Err(ReviewError::NotJson(_))));
    let v1beta1 = serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": KIND, "request": {"uid": "x"}}),
    )
    .unwrap();
    let err = parse(&v1beta1).unwrap_err();
    assert!(
        err.to_string().contains("admission.k8s.io/v1beta1"),
        "{err}"
    );
    assert!(matches!(
        parse(&review(json!({"operation": "CREATE"}))),
        Err(ReviewError::MissingUid)
    ));
    assert!(matches!(
        parse(&review(
            json!({"uid": "", "operation": "CREATE", "kind": {}, "resource": {}})
        )),
        Err(ReviewError::MissingUid)
    ));
    // JSON that is not a review object has no version to accept.
    for body in [&b"[]"[..], b"\"x\"", b"null"] {
        assert!(
            matches!(parse(body), Err(ReviewError::UnsupportedVersion { .. })),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn broken_request_with_uid_is_malformed_not_an_error() {
    let body = review(json!({"uid": "u2", "operation": "EXPLODE"}));
    match parse(&body).unwrap() {
        Parsed::Malformed { uid, message } => {
            assert_eq!(uid, "u2");
            assert!(
                message.contains("malformed AdmissionReview request"),
                "{message}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn objects_that_are_not_objects_are_named() {
    for (object, kind) in [
        (json!("rs"), "a string"),
        (json!(7), "a number"),
        (json!([{"metadata": {}}]), "an array"),
    ] {
        let body = review(json!({
            "uid": "u3",
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "operation": "UPDATE",
            "object": {"metadata": {}},
            "oldObject": object,
        }));
        match parse(&body).unwrap() {
            Parsed::Malformed { uid, message } => {
                assert_eq!(uid, "u3");
                assert!(
                    message.contains(&format!(
                        "request.oldObject must be a JSON object (the Kubernetes object under review), not {kind}"
                    )),
                    "{message}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn denials_and_warnings_are_bounded() {
    let huge = "v".repeat(5 * 1024 * 1024);
    let denial = AdmissionResponse::deny("u", 403, "Forbidden", huge.clone());
    let message = denial.status.unwrap().message;
    assert!(message.len() <= policy_client::text::MAX_MESSAGE_BYTES);
    assert!(message.ends_with("more bytes]"), "{}", &message[4000..]);
    let warned = AdmissionResponse::allow("u").with_warning(huge);
    assert!(warned.warnings[0].len() <= MAX_WARNING_BYTES);
}

#[test]
fn patch_is_base64_on_the_wire() {
    let patch: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]),
    )
    .unwrap();
    let response = AdmissionResponse::allow("u").with_patch(&patch);
    let wire = serde_json::to_value(AdmissionReviewResponse::from(response.clone())).unwrap();
    let encoded = wire["response"]["patch"]
        .as_str()
        .expect("patch is a string");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let ops: Value = serde_json::from_slice(&decoded).unwrap();
    assert_eq!(ops[0]["path"], "/metadata/annotations");
    assert_eq!(wire["response"]["patchType"], "JSONPatch");
    assert_eq!(wire["apiVersion"], API_VERSION);
    assert_eq!(wire["kind"], KIND);
    assert_eq!(response.decoded_patch(), Some(patch));
}
