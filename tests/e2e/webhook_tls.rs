//! The webhook over real TLS with a real HTTP client, on the embedded engine and
//! against a real OPA server; the same AdmissionReviews through both engines
//! must get the same answers.

use base64::Engine as _;
use placement_tests::{OpaServer, WebhookProcess, project_bin, repo_root, scratch_dir};
use serde_json::{Value, json};

use placement_tests::PREFS;
const EU: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";
const PCI: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";

fn replicaset(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}, "annotations": annotations},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
            }
        }
    })
}

fn review(
    uid: &str,
    operation: &str,
    object: Option<Value>,
    old: Option<Value>,
    extra: Value,
) -> Value {
    let mut request = json!({
        "uid": uid,
        "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
        "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
        "namespace": "default",
        "operation": operation,
        "userInfo": {"username": "developer", "groups": ["system:authenticated"]},
        "dryRun": false
    });
    if let Some(object) = object {
        request["object"] = object;
    }
    if let Some(old) = old {
        request["oldObject"] = old;
    }
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            request[k] = v;
        }
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

fn decode_patch(response: &Value) -> Option<Value> {
    let encoded = response["response"]["patch"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("patch is base64");
    Some(serde_json::from_slice(&bytes).expect("patch is JSON"))
}

fn apply_patch(object: &Value, patch: &Value) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("RFC 6902 patch");
    let mut doc = object.clone();
    json_patch::patch(&mut doc, &patch).expect("patch applies");
    doc
}

fn placed_clusters(object: &Value) -> Vec<String> {
    placement_tests::placed_clusters(object)
        .unwrap_or_else(|| panic!("no placement annotation on {object}"))
}

/// The admission cases shared by both engines: (name, review).
fn cases() -> Vec<(&'static str, Value)> {
    let eu = replicaset(
        "nginx-eu",
        json!({EU: "true", PCI: "2", "team": "payments"}),
    );
    let forbidden = replicaset(
        "nginx-bad",
        json!({EU: "true", PCI: "2", PREFS: r#"{"clusters":{"gce-us-central1":{"weight":1},"gce-europe-west1":{"weight":1}}}"#}),
    );
    let bad_pci = replicaset("nginx-pci", json!({PCI: "high"}));
    let requested = replicaset(
        "nginx-req",
        json!({EU: "true", PREFS: r#"{"clusters":{"gce-europe-west2":{"weight":5}},"rebalance":false}"#}),
    );
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}});
    let mut pod_review = review("u-pod", "CREATE", Some(pod), None, json!({}));
    pod_review["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    pod_review["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
    vec![
        (
            "create EU/PCI ReplicaSet",
            review("u-create", "CREATE", Some(eu.clone()), None, json!({})),
        ),
        (
            "forbidden clusters",
            review("u-forbidden", "CREATE", Some(forbidden), None, json!({})),
        ),
        (
            "invalid PCI level",
            review("u-pci", "CREATE", Some(bad_pci), None, json!({})),
        ),
        (
            "developer request intersected",
            review("u-req", "CREATE", Some(requested), None, json!({})),
        ),
        (
            "update re-evaluated",
            review(
                "u-update",
                "UPDATE",
                Some(eu.clone()),
                Some(eu.clone()),
                json!({}),
            ),
        ),
        (
            "dry run",
            review(
                "u-dry",
                "CREATE",
                Some(eu.clone()),
                None,
                json!({"dryRun": true}),
            ),
        ),
        (
            "delete untouched",
            review("u-delete", "DELETE", None, Some(eu.clone()), json!({})),
        ),
        (
            "status subresource untouched",
            review(
                "u-status",
                "UPDATE",
                Some(eu.clone()),
                Some(eu),
                json!({"subResource": "status"}),
            ),
        ),
        ("other kinds untouched", pod_review),
    ]
}

fn embedded_webhook(extra: &[&str]) -> WebhookProcess {
    let mut args = vec![format!(
        "--policy-dir={}",
        repo_root().join("policies").display()
    )];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    WebhookProcess::start(&args)
}

async fn opa_webhook(opa: &OpaServer, extra: &[&str]) -> WebhookProcess {
    let mut args = vec![
        format!("--opa-url={}", opa.url()),
        format!("--opa-token-file={}", opa.token_file().display()),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    WebhookProcess::start(&args)
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

async fn post_json(webhook: &WebhookProcess, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = webhook.post(path, serde_json::to_vec(body).unwrap()).await;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
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

#[tokio::test(flavor = "multi_thread")]
async fn malformed_reviews_get_named_errors() {
    let webhook = embedded_webhook(&["--max-request-bytes=20000"]);
    let (status, body) = webhook.post("/mutate", b"{not json".to_vec()).await;
    assert_eq!(status, 400);
    assert!(
        body.contains("malformed AdmissionReview: body is not JSON"),
        "{body}"
    );

    let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}});
    let (status, body) = webhook
        .post("/mutate", serde_json::to_vec(&v1beta1).unwrap())
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("admission.k8s.io/v1"), "{body}");

    let no_uid = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}});
    let (status, body) = webhook
        .post("/mutate", serde_json::to_vec(&no_uid).unwrap())
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("no request.uid"), "{body}");

    let broken = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "b1", "operation": "CREATE"}});
    let (status, answer) = post_json(&webhook, "/mutate", &broken).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["uid"], "b1");
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed AdmissionReview request")
    );

    let huge = replicaset("big", json!({"filler": "x".repeat(30_000)}));
    let (status, body) = webhook
        .post(
            "/mutate",
            serde_json::to_vec(&review("u-big", "CREATE", Some(huge), None, json!({}))).unwrap(),
        )
        .await;
    assert_eq!(status, 413);
    assert!(body.contains("limit of 20000 bytes"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn engine_failures_fail_closed_when_policies_exist() {
    let mut opa = OpaServer::start();
    opa.load_shipped_policies(true).await;
    // Without API access the webhook cannot see policy ConfigMaps, so it must
    // assume they exist and fail closed.
    let webhook = opa_webhook(
        &opa,
        &["--engine-deadline=1500ms", "--engine-timeout=500ms"],
    )
    .await;
    let case = cases().remove(0).1;
    let (_, answer) = post_json(&webhook, "/mutate", &case).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    opa.kill();
    let (status, answer) = post_json(&webhook, "/mutate", &case).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 503);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("the policy engine is unavailable"),
        "{message}"
    );
    assert!(
        message.contains("attempts"),
        "retried before giving up: {message}"
    );

    // A fresh OPA without policies answers "undefined": never read as "no annotations".
    opa.restart();
    let (_, answer) = post_json(&webhook, "/mutate", &case).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("no decision"), "{message}");
    let metrics = webhook.metrics().await;
    assert!(metrics.contains(r#"outcome="failed_closed""#), "{metrics}");
    assert!(
        !webhook.log().contains(opa.token()),
        "the OPA token must never be logged"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_token_is_a_named_error_and_never_shown() {
    let opa = OpaServer::start();
    opa.load_shipped_policies(true).await;
    let dir = scratch_dir("wrong-token");
    let token = dir.join("token");
    std::fs::write(&token, "not-the-right-token-value").unwrap();
    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", opa.url()),
        format!("--opa-token-file={}", token.display()),
    ]);
    let (_, answer) = post_json(&webhook, "/mutate", &cases().remove(0).1).await;
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("rejected the credentials"), "{message}");
    assert!(!message.contains("not-the-right-token-value"));
    assert!(!webhook.log().contains("not-the-right-token-value"));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_policies_fail_open_with_a_warning() {
    let empty = scratch_dir("no-policies");
    let webhook = WebhookProcess::start(&[format!("--policy-dir={}", empty.display())]);
    let (_, answer) = post_json(&webhook, "/mutate", &cases().remove(0).1).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("patch").is_none());
    let warning = answer["response"]["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("admitted unchanged because no placement policy exists"),
        "{warning}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_policy_output_is_a_named_error() {
    let dir = scratch_dir("bad-output");
    std::fs::write(
        dir.join("bad.rego"),
        "package io.k8s.federation.admission\n\nannotations[\"not a/valid/key\"] := \"x\"\n\nerrors := []\n",
    )
    .unwrap();
    let webhook = WebhookProcess::start(&[format!("--policy-dir={}", dir.display())]);
    let (status, answer) = post_json(&webhook, "/mutate", &cases().remove(0).1).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid annotation key \"not a/valid/key\""),
        "{message}"
    );
}

#[test]
fn review_command_prints_the_placed_object() {
    let output = std::process::Command::new(project_bin("placement-webhook"))
        .current_dir(repo_root())
        .args(["review", "-o", "json", "examples/replicaset-eu-pci.yaml"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["review"]["response"]["allowed"], true);
    assert_eq!(
        placed_clusters(&out["object"]),
        vec!["gce-europe-west1", "gce-europe-west2"]
    );

    let output = std::process::Command::new(project_bin("placement-webhook"))
        .current_dir(repo_root())
        .args(["review", "examples/replicaset-forbidden.yaml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "denials exit 3");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("includes invalid clusters: gce-us-central1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_certificate_files_are_reloaded_when_they_change() {
    let webhook = embedded_webhook(&[]);
    let old_client = webhook.https_client();
    assert!(old_client.get(webhook.url("/healthz")).send().await.is_ok());

    // Rotate: a new CA and certificate written over the files the webhook serves.
    let rotated =
        placement_certs::generate_to_dir(&webhook.dir.join("certs"), &["127.0.0.1".into()])
            .unwrap();
    let new_ca = std::fs::read_to_string(&rotated.ca).unwrap();
    let new_client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(new_ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let mut served_new = false;
    for _ in 0..100 {
        if new_client.get(webhook.url("/healthz")).send().await.is_ok() {
            served_new = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        served_new,
        "the rotated certificate is served within 10 s:\n{}",
        webhook.log()
    );
    // A fresh connection trusting only the old CA no longer verifies.
    let fresh_old = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(webhook.ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    assert!(fresh_old.get(webhook.url("/healthz")).send().await.is_err());
}

/// Load `source` as the only module of a fresh OPA.
async fn opa_with_policy(source: &str) -> OpaServer {
    use policy_client::engine::PolicyEngine;
    let opa = OpaServer::start();
    opa.client()
        .put_policy("tests/policy.rego", source)
        .await
        .expect("load the policy into OPA");
    opa
}

#[tokio::test(flavor = "multi_thread")]
async fn opa_evaluation_errors_fail_at_once_with_the_policys_message() {
    // A complete rule with two values for this input: OPA answers HTTP 500
    // with eval_conflict_error, on every attempt.
    let opa = opa_with_policy(
        "package io.k8s.federation.admission\n\nerrors := []\n\nannotations = {\"a\": \"1\"} if input.metadata.name\n\nannotations = {\"a\": \"2\"} if input.kind\n",
    )
    .await;
    let webhook = opa_webhook(&opa, &["--engine-deadline=8s"]).await;
    let (status, answer) = post_json(&webhook, "/mutate", &cases().remove(0).1).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["status"]["reason"],
        "PolicyEvaluationError"
    );
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "tests/policy.rego:7:1: eval_conflict_error: rule data.io.k8s.federation.admission.annotations produced conflicting values"
        ),
        "the policy's own message: {message}"
    );
    // Not retried until the deadline: one attempt, no "gave up after N attempts".
    assert!(!message.contains("attempts"), "{message}");
    let metrics = webhook.metrics().await;
    assert!(
        metrics.contains(r#"placement_webhook_engine_errors_total{kind="evaluation"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn objects_that_are_not_objects_are_the_clients_fault() {
    let opa = OpaServer::start();
    opa.load_shipped_policies(true).await;
    let embedded = embedded_webhook(&[]);
    let remote = opa_webhook(&opa, &[]).await;
    let eu = replicaset(
        "nginx-eu",
        json!({EU: "true", PCI: "2", "team": "payments"}),
    );
    for webhook in [&embedded, &remote] {
        for (field, value) in [
            ("object", json!("a string")),
            ("object", json!(42)),
            ("object", json!([eu.clone()])),
            ("oldObject", json!([eu.clone()])),
        ] {
            let mut case = review(
                "u-bad",
                "UPDATE",
                Some(eu.clone()),
                Some(eu.clone()),
                json!({}),
            );
            case["request"][field] = value.clone();
            let (status, answer) = post_json(webhook, "/mutate", &case).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["response"]["allowed"], false, "{answer}");
            assert_eq!(answer["response"]["status"]["code"], 400, "{answer}");
            let message = answer["response"]["status"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("request.{field} must be a JSON object")),
                "{field} = {value}: {message}"
            );
        }
        // serde's private number marker used to be an input the embedded
        // engine could not convert: now it is just an object.
        let mut marked = eu.clone();
        marked["spec"]["x"] = json!({"$serde_json::private::Number": "not a number"});
        let (status, answer) = post_json(
            webhook,
            "/mutate",
            &review("u-marked", "CREATE", Some(marked), None, json!({})),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert!(decode_patch(&answer).is_some(), "placed: {answer}");
        let metrics = webhook.metrics().await;
        assert!(
            !metrics.contains("placement_webhook_engine_errors_total{"),
            "a client's bad input is not an engine error:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn denials_and_log_lines_are_bounded() {
    let webhook = embedded_webhook(&[]);
    // The policy quotes an invalid value in its error: 5 MiB of it.
    let huge = replicaset("huge", json!({PCI: "9".repeat(5 * 1024 * 1024) + "x"}));
    let (status, answer) = post_json(
        &webhook,
        "/mutate",
        &review("u-huge", "CREATE", Some(huge), None, json!({})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false, "denied");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("pci-compliance-level must be a non-negative integer"),
        "{}",
        &message[..200.min(message.len())]
    );
    assert!(message.len() <= 4096, "denial of {} bytes", message.len());
    let longest = webhook.log().lines().map(str::len).max().unwrap_or(0);
    assert!(longest <= 8192, "a log line of {longest} bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_as_an_http_date_is_honoured() {
    use axum::response::IntoResponse as _;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant, SystemTime};
    // A stand-in for an overloaded OPA: the first query gets 503 with
    // `Retry-After` as an HTTP-date two seconds ahead, later ones a decision.
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = Arc::clone(&arrivals);
    let app = axum::Router::new().fallback(move || {
        let seen = Arc::clone(&seen);
        async move {
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push(Instant::now());
                seen.len() == 1
            };
            if first {
                let when = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", when)],
                    "busy",
                )
                    .into_response()
            } else {
                axum::Json(json!({"result": {"annotations": {}, "errors": []}})).into_response()
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let webhook = WebhookProcess::start(&[
        format!("--opa-url=http://{addr}"),
        "--engine-deadline=8s".to_owned(),
    ]);
    let (_, answer) = post_json(&webhook, "/mutate", &cases().remove(0).1).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 2, "one retry");
    // The date has a resolution of one second: at least one second passed.
    let waited = arrivals[1] - arrivals[0];
    assert!(
        waited >= Duration::from_millis(950),
        "retried after {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_in_the_opa_url_are_never_printed() {
    let opa = OpaServer::start();
    opa.load_shipped_policies(true).await;
    // OPA here takes bearer tokens only: basic credentials are refused (401),
    // which the denial reports, without them.
    let url = opa
        .url()
        .replace("http://", "http://opa-user:hunter2-secret@");
    let webhook = WebhookProcess::start(&[format!("--opa-url={url}")]);
    let (_, answer) = post_json(&webhook, "/mutate", &cases().remove(0).1).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("rejected the credentials"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    let log = webhook.log();
    assert!(log.contains("OPA at http://redacted@127.0.0.1"), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
}

/// kube-apiserver calls webhooks over kept-alive HTTP/1.1 connections and
/// retries no admission call: a connection the webhook closes while the API
/// server is reusing it fails that write with `EOF` (seen in the operations
/// suite while a webhook pod was replaced). From SIGTERM on, the webhook
/// announces every close in the response before it (`Connection: close`) and
/// serves every request on a connection it has not announced closing.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_webhook_announces_each_close_to_kept_alive_clients() {
    use http_body_util::BodyExt as _;
    use hyper_util::rt::TokioIo;

    let webhook = embedded_webhook(&["--shutdown-delay=3s"]);
    let target = placement_tests::hostile::Target::new(
        webhook.admission_addr,
        &webhook.ca_pem,
        &[b"http/1.1"],
    );
    let stream = target.connect().await.expect("TLS connection");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    let driver = tokio::spawn(connection);
    let review = placement_tests::hostile::placement_review("keep-alive");
    let body = bytes::Bytes::from(serde_json::to_vec(&review).unwrap());
    let mut signalled = None;
    for i in 0..60 {
        if i == 3 {
            // SAFETY: kill(2) on the child's pid has no memory effects.
            unsafe { libc::kill(webhook.pid() as libc::pid_t, libc::SIGTERM) };
            signalled = Some(std::time::Instant::now());
        }
        sender.ready().await.unwrap_or_else(|e| {
            panic!(
                "request {i}: the webhook closed a kept-alive connection without announcing it ({e}); \
                 a client reusing it would fail with EOF"
            )
        });
        let request = hyper::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(body.clone()))
            .unwrap();
        let response = sender
            .send_request(request)
            .await
            .unwrap_or_else(|e| panic!("request {i} on a kept-alive connection failed: {e}"));
        let status = response.status();
        let closes = response
            .headers()
            .get(hyper::header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let answer = response.into_body().collect().await.expect("response body");
        assert_eq!(status, 200, "request {i}: {:?}", answer.to_bytes());
        if closes {
            let after = signalled.map(|at| at.elapsed());
            assert!(
                after.is_some(),
                "request {i}: the webhook closed a connection before it was asked to stop"
            );
            eprintln!("the close was announced {after:?} after SIGTERM (request {i})");
            // The connection ends after the announced close.
            tokio::time::timeout(std::time::Duration::from_secs(5), driver)
                .await
                .expect("the connection ends after the announced close")
                .expect("connection task")
                .expect("the connection ends cleanly");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("60 requests on one connection and no close announced after SIGTERM");
}
