//! The webhook over real TLS with a real HTTP client, on the embedded engine and
//! against a real OPA server; the same AdmissionReviews through both engines
//! must get the same answers.

use base64::Engine as _;
use placement_tests::PREFS;
use placement_tests::{OpaServer, WebhookProcess, project_bin, repo_root, scratch_dir};
use serde_json::{Value, json};

mod engines;
mod errors;
mod serving;

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

async fn post_json(webhook: &WebhookProcess, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = webhook.post(path, serde_json::to_vec(body).unwrap()).await;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}
