//! Both engines give the same answers; the admission cases on the embedded
//! engine.

use super::*;

fn apply_patch(object: &Value, patch: &Value) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("RFC 6902 patch");
    let mut doc = object.clone();
    json_patch::patch(&mut doc, &patch).expect("patch applies");
    doc
}

/// `review` with its patch decoded, and the time an ownership record made on
/// a CREATE names (and so its signature) left out: two webhooks answering
/// the same CREATE a second apart write records of different times.
fn comparable(review: &Value) -> Value {
    use base64::Engine as _;
    let mut review = review.clone();
    let Some(encoded) = review["response"]["patch"].as_str() else {
        return review;
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64 patch");
    let mut patch: Value = serde_json::from_slice(&bytes).expect("JSON patch");
    for op in patch.as_array_mut().into_iter().flatten() {
        let record = op["value"]
            .as_str()
            .and_then(|v| serde_json::from_str::<Value>(v).ok())
            .filter(|r| r.get("creating").is_some());
        if let Some(mut record) = record {
            let record = record.as_object_mut().unwrap();
            record.remove("creating");
            record.remove("mac");
            op["value"] = Value::Object(record.clone());
        }
    }
    review["response"]["patch"] = patch;
    review
}

#[tokio::test(flavor = "multi_thread")]
async fn both_engines_give_the_same_answers() {
    let opa = OpaServer::start();
    opa.load_shipped_policies(true).await;
    let embedded = embedded_webhook(&[]);
    let remote = opa_webhook(&opa, &[]).await;
    for (name, case) in cases() {
        let (status_a, a) = post_json(&embedded, "/mutate", &case).await;
        let (status_b, b) = post_json(&remote, "/mutate", &case).await;
        assert_eq!(status_a, 200, "{name}: embedded HTTP {status_a}: {a}");
        assert_eq!(status_b, 200, "{name}: OPA HTTP {status_b}: {b}");
        assert_eq!(
            comparable(&a),
            comparable(&b),
            "{name}: engines disagree\nembedded: {a}\nOPA: {b}"
        );
        assert_eq!(
            a["response"]["uid"], case["request"]["uid"],
            "{name}: uid echoed"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admission_cases_on_the_embedded_engine() {
    let webhook = embedded_webhook(&[]);
    let cases: std::collections::HashMap<_, _> = cases().into_iter().collect();

    // Placement merged in as a base64 JSON patch; developer annotations kept.
    let create = &cases["create EU/PCI ReplicaSet"];
    let (status, answer) = post_json(&webhook, "/mutate", create).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let patched = apply_patch(
        &create["request"]["object"],
        &decode_patch(&answer).expect("a patch"),
    );
    assert_eq!(
        placed_clusters(&patched),
        vec!["gce-europe-west1", "gce-europe-west2"]
    );
    assert_eq!(patched["metadata"]["annotations"]["team"], "payments");

    // Re-reviewing the placed object changes nothing: no patch at all.
    let mut again = create.clone();
    again["request"]["operation"] = json!("UPDATE");
    again["request"]["oldObject"] = patched.clone();
    again["request"]["object"] = patched.clone();
    let (_, answer) = post_json(&webhook, "/mutate", &again).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(
        answer["response"].get("patch").is_none(),
        "idempotent: {answer}"
    );

    // Errors deny, every message listed.
    let (_, answer) = post_json(&webhook, "/mutate", &cases["forbidden clusters"]).await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 403);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "requested replica-set-preferences includes invalid clusters: gce-us-central1"
        ),
        "{message}"
    );

    // The developer's explicit request is intersected, spread evenly, rebalance kept.
    let requested = &cases["developer request intersected"];
    let (_, answer) = post_json(&webhook, "/mutate", requested).await;
    let patched = apply_patch(
        &requested["request"]["object"],
        &decode_patch(&answer).expect("a patch"),
    );
    assert_eq!(placed_clusters(&patched), vec!["gce-europe-west2"]);
    let prefs: Value =
        serde_json::from_str(patched["metadata"]["annotations"][PREFS].as_str().unwrap()).unwrap();
    assert_eq!(
        prefs,
        json!({"clusters": {"gce-europe-west2": {"weight": 1}}, "rebalance": false})
    );

    // DELETE, subresources and other kinds pass untouched.
    for name in [
        "delete untouched",
        "status subresource untouched",
        "other kinds untouched",
    ] {
        let (_, answer) = post_json(&webhook, "/mutate", &cases[name]).await;
        assert_eq!(answer["response"]["allowed"], true, "{name}");
        assert!(
            answer["response"].get("patch").is_none(),
            "{name}: {answer}"
        );
    }

    // /validate enforces errors but never patches.
    let (_, answer) = post_json(&webhook, "/validate", create).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
    let (_, answer) = post_json(&webhook, "/validate", &cases["forbidden clusters"]).await;
    assert_eq!(answer["response"]["allowed"], false);

    // Probes and metrics.
    let client = webhook.https_client();
    let health = client.get(webhook.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let ready = client.get(webhook.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let metrics = webhook.metrics().await;
    assert!(
        metrics.contains(
            r#"placement_webhook_admission_requests_total{operation="CREATE",outcome="patched"}"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains(r#"outcome="denied""#), "{metrics}");
    assert!(
        metrics.contains("placement_webhook_admission_duration_seconds_bucket"),
        "{metrics}"
    );
}
