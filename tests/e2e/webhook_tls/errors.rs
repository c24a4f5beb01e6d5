//! Errors over real TLS: named, fail closed where policies exist, bounded,
//! and never showing a credential.

use super::*;

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
