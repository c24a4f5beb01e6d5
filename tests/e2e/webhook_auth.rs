//! Who may reach the webhook, and what they can make it do, through a real
//! kube-apiserver: with `--client-ca-file` only clients holding a certificate
//! of that CA (the API server, configured through its AdmissionConfiguration)
//! may post reviews, the Karmada guardrail's binding reviews too; and the
//! Events any client can cause are deduplicated and rate-limited.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use placement_tests::{
    ControlPlane, Identity, WebhookProcess, repo_root, scratch_dir, unique_name, wait_for,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const EU: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";
const PCI: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";

/// A CA and one client certificate it signed, as PEM files in `dir`:
/// `{name}-ca.crt`, `{name}.crt`, `{name}.key`.
fn client_pki(dir: &Path, name: &str) {
    placement_tests::pki::client_pki(dir, name, &format!("{name} kube-apiserver"));
}

/// kube-apiserver's admission configuration: its webhook clients present
/// `apiserver.crt` to every webhook (`*`).
fn admission_configuration(dir: &Path) -> String {
    let kubeconfig = dir.join("webhook-clients.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            dir.join("apiserver.crt").display(),
            dir.join("apiserver.key").display()
        ),
    )
    .unwrap();
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    let config = dir.join("admission-configuration.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
            plugin("MutatingAdmissionWebhook"),
            plugin("ValidatingAdmissionWebhook")
        ),
    )
    .unwrap();
    format!("--admission-control-config-file={}", config.display())
}

fn replicaset(name: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns, "annotations": {EU: "true", PCI: "2"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
            }
        }
    })
}

fn review(uid: &str, object: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "namespace": object["metadata"]["namespace"],
            "name": object["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "anyone"},
            "object": object,
            "dryRun": false
        }
    }))
    .unwrap()
}

/// Whether a TLS client presenting the certificate `{name}.crt` gets an HTTP
/// answer from the webhook.
async fn answers_client_with(webhook: &WebhookProcess, dir: &Path, name: &str) -> bool {
    let body = review("cert-probe", &replicaset("probe", "default"));
    post_with_certificate(webhook, dir, name, &body)
        .await
        .is_some_and(|answer| answer.starts_with("HTTP/1.1 200"))
}

/// POST `body` to `/mutate` as a TLS client presenting the certificate
/// `{name}.crt`: the whole HTTP/1.1 answer, `None` when the handshake or
/// the request failed.
async fn post_with_certificate(
    webhook: &WebhookProcess,
    dir: &Path,
    name: &str,
    body: &[u8],
) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    placement_tests::install_crypto();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(webhook.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.join(format!("{name}.crt")))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(webhook.admission_addr)
        .await
        .unwrap();
    let name = ServerName::IpAddress(webhook.admission_addr.ip().into());
    let mut tls = connector.connect(name, tcp).await.ok()?;
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.ok()?;
    tls.write_all(body).await.ok()?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_authenticates_with_a_client_certificate() {
    let dir = scratch_dir("client-certificates");
    client_pki(&dir, "apiserver");
    client_pki(&dir, "stranger");
    let plane = ControlPlane::start_with_args(&[admission_configuration(&dir)]);
    plane.ensure_example_clusters();
    let ns = unique_name("client-cert");
    let policy_ns = format!("{ns}-policy");
    plane.create_namespace(&ns);
    plane.create_policy_namespace(&policy_ns);
    let webhook = WebhookProcess::start(&[
        format!("--policy-dir={}", repo_root().join("policies").display()),
        format!(
            "--client-ca-file={}",
            dir.join("apiserver-ca.crt").display()
        ),
    ]);
    plane.register_webhook(&ns, &webhook.url("/mutate"), &webhook.ca_pem, &policy_ns);

    // Real admission passes: the API server presents its client certificate.
    let manifest = replicaset("web", &ns).to_string();
    let placed = wait_for(
        "the API server to call the webhook",
        Duration::from_secs(60),
        || {
            let out = plane.kubectl_stdin(
                &["create", "--dry-run=server", "-o", "json", "-f", "-"],
                &manifest,
            );
            let object: Value = serde_json::from_slice(&out.stdout).ok()?;
            placement_tests::placed_clusters(&object)
        },
    );
    assert_eq!(placed, vec!["gce-europe-west1", "gce-europe-west2"]);
    let out = plane.kubectl_stdin(&["create", "-f", "-"], &manifest);
    assert!(
        out.status.success(),
        "create through the API server: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        webhook.log()
    );
    let stored: Value =
        serde_json::from_str(&plane.kubectl_ok(&["get", "rs", "web", "-n", &ns, "-o", "json"]))
            .unwrap();
    assert_eq!(
        placement_tests::placed_clusters(&stored),
        Some(vec![
            "gce-europe-west1".to_owned(),
            "gce-europe-west2".to_owned()
        ])
    );

    // An anonymous client is refused, by name; the kubelet's probes are not.
    let (status, body) = webhook
        .post("/mutate", review("anonymous", &replicaset("x", &ns)))
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("client certificate"), "{body}");
    let health = webhook
        .https_client()
        .get(webhook.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    // A certificate of another CA fails the handshake; the API server's passes.
    assert!(!answers_client_with(&webhook, &dir, "stranger").await);
    assert!(answers_client_with(&webhook, &dir, "apiserver").await);
    assert_eq!(
        webhook
            .metric(r#"placement_webhook_requests_rejected_total{reason="unauthenticated"}"#)
            .await,
        1.0,
        "only the anonymous post is refused"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn events_any_client_can_cause_are_deduplicated_and_rate_limited() {
    let plane = ControlPlane::shared();
    let ns = unique_name("events");
    plane.create_namespace(&ns);
    let webhook = WebhookProcess::start(&[
        format!("--policy-dir={}", repo_root().join("policies").display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        "--event-rate=1".to_owned(),
        "--event-burst=3".to_owned(),
        "--event-dedupe-window=1h".to_owned(),
    ]);
    let started = std::time::Instant::now();
    // Denied by the policy (an invalid PCI level), each denial an Event: 20 for
    // one object, then one for each of 20 others.
    let denied = |name: &str| {
        let mut rs = replicaset(name, &ns);
        rs["metadata"]["annotations"][PCI] = json!("high");
        rs
    };
    for i in 0..20 {
        let (status, body) = webhook
            .post("/mutate", review(&format!("same-{i}"), &denied("same")))
            .await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""allowed":false"#), "{body}");
    }
    for i in 0..20 {
        webhook
            .post(
                "/mutate",
                review(&format!("many-{i}"), &denied(&format!("rs-{i}"))),
            )
            .await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Published asynchronously: wait until the counters account for all 40.
    let mut accounted = 0.0;
    for _ in 0..300 {
        let page = webhook.metrics().await;
        let sample = |s| placement_tests::webhook::metric_value(&page, s);
        accounted = sample("placement_webhook_events_published_total")
            + sample("placement_webhook_events_failed_total")
            + sample(r#"placement_webhook_events_dropped_total{reason="duplicate"}"#)
            + sample(r#"placement_webhook_events_dropped_total{reason="rate_limited"}"#)
            + sample(r#"placement_webhook_events_dropped_total{reason="queue_full"}"#);
        if accounted >= 40.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(accounted, 40.0, "every Event published or dropped");
    let events: Value = serde_json::from_str(&plane.kubectl_ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        &ns,
        "-o",
        "json",
    ]))
    .unwrap();
    let items = events["items"].as_array().cloned().unwrap_or_default();
    let about = |name: &str| {
        items
            .iter()
            .filter(|e| e["regarding"]["name"] == name)
            .count()
    };
    let names: Vec<&str> = items
        .iter()
        .filter_map(|e| e["regarding"]["name"].as_str())
        .collect();
    assert_eq!(about("same"), 1, "Events about: {names:?}");
    // The burst of 3 and one more per second, whatever the clients send.
    let allowed = 3.0 + elapsed.ceil() + 1.0;
    assert!(
        (items.len() as f64) <= allowed,
        "{} Events in {elapsed:.1} s (at most {allowed}), about: {names:?}",
        items.len()
    );
    let page = webhook.metrics().await;
    let sample = |s| placement_tests::webhook::metric_value(&page, s);
    assert!(
        sample(r#"placement_webhook_events_dropped_total{reason="duplicate"}"#) >= 19.0,
        "{page}"
    );
    assert!(
        sample(r#"placement_webhook_events_dropped_total{reason="rate_limited"}"#) >= 1.0,
        "{page}"
    );
}

/// A Karmada ResourceBinding CREATE, as Karmada's detector posts it: its
/// template `kind` `name` of `api_version` in `ns`.
fn binding_review(uid: &str, ns: &str, api_version: &str, kind: &str, name: &str) -> Vec<u8> {
    let binding = json!({
        "apiVersion": "work.karmada.io/v1alpha2",
        "kind": "ResourceBinding",
        "metadata": {"name": format!("{name}-{}", kind.to_lowercase()), "namespace": ns},
        "spec": {
            "resource": {"apiVersion": api_version, "kind": kind, "namespace": ns, "name": name},
            "placement": {"clusterAffinity": {"clusterNames": ["member-eu-1", "member-us-1"]}}
        }
    });
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "work.karmada.io", "version": "v1alpha2", "kind": "ResourceBinding"},
            "resource": {"group": "work.karmada.io", "version": "v1alpha2", "resource": "resourcebindings"},
            "namespace": ns,
            "name": binding["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "system:admin"},
            "object": binding,
            "dryRun": false
        }
    }))
    .unwrap()
}

/// The Karmada guardrail's webhook, started with the chart's guardrail
/// flags and `--client-ca-file` (`karmada.clientCA`), refuses a binding
/// review from a caller without a client certificate before reading it
/// (issue 39): no template is read or discovered for it, no Event is
/// written; the API server's review, with its certificate, is answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_guardrail_webhook_with_a_client_ca_refuses_unauthenticated_reviews() {
    let plane = ControlPlane::shared();
    let ns = unique_name("guardrail-auth");
    plane.create_namespace(&ns);
    let dir = scratch_dir("guardrail-client-ca");
    client_pki(&dir, "front-proxy");
    // The chart's guardrail container: Karmada's API server through
    // --kubeconfig (a kube-apiserver here), the scheduler's name, the client
    // CA mounted from karmada.clientCA.
    let webhook = WebhookProcess::start(&[
        format!("--policy-dir={}", repo_root().join("policies").display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        "--karmada-scheduler-name=placement-policy".to_owned(),
        format!(
            "--client-ca-file={}",
            dir.join("front-proxy-ca.crt").display()
        ),
    ]);
    // Anyone reaching the port: refused, by name, before the review is read.
    for (i, kind) in ["Deployment", "MadeUp"].iter().enumerate() {
        let api_version = if *kind == "Deployment" {
            "apps/v1"
        } else {
            "example.com/v1"
        };
        let (status, body) = webhook
            .post(
                "/mutate",
                binding_review(&format!("anonymous-{i}"), &ns, api_version, kind, "web"),
            )
            .await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("client certificate"), "{body}");
    }
    let page = webhook.metrics().await;
    let sample = |page: &str, s: &str| placement_tests::webhook::metric_value(page, s);
    assert_eq!(
        sample(
            &page,
            r#"placement_webhook_requests_rejected_total{reason="unauthenticated"}"#
        ),
        2.0,
        "{page}"
    );
    let evaluated: f64 = ["failed_closed", "failed_open", "patched", "unchanged", "denied"]
        .iter()
        .map(|outcome| {
            sample(
                &page,
                &format!(
                    r#"placement_webhook_admission_requests_total{{operation="CREATE",outcome="{outcome}"}}"#
                ),
            )
        })
        .sum();
    assert_eq!(
        evaluated + sample(&page, "placement_webhook_events_published_total"),
        0.0,
        "nothing of the anonymous reviews evaluated or reported:\n{page}"
    );
    // Karmada's API server, presenting its front-proxy client certificate:
    // answered (its template does not exist: it fails closed iff policies
    // exist, with an Event either way).
    let answer = post_with_certificate(
        &webhook,
        &dir,
        "front-proxy",
        &binding_review("apiserver", &ns, "apps/v1", "Deployment", "web"),
    )
    .await
    .expect("an answer to the API server");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""uid":"apiserver""#), "{answer}");
    // Its Event is written: only verified callers' reviews cause one.
    wait_for("the API server's Event", Duration::from_secs(20), || {
        let events: Value = serde_json::from_str(&plane.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            &ns,
            "-o",
            "json",
        ]))
        .ok()?;
        let items = events["items"].as_array()?.clone();
        (items.len() == 1).then_some(())
    });
}
