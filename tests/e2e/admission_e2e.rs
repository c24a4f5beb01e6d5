//! End-to-end admission through a real kube-apiserver (with etcd) and a real OPA:
//! the webhook is registered with a MutatingWebhookConfiguration whose caBundle
//! is its test CA, and the tests drive it with kubectl like a user.

use std::time::Duration;

use placement_tests::{
    ControlPlane, FaultProxy, Identity, OpaServer, WebhookProcess, repo_root, unique_name, wait_for,
};
use policy_client::engine::PolicyEngine;
use serde_json::{Value, json};

use placement_tests::PREFS;
const EU: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";
const PCI: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";

/// One test's world: its namespace, its policy namespace, its OPA and webhook.
struct Env {
    plane: &'static ControlPlane,
    ns: String,
    policy_ns: String,
    opa: OpaServer,
    webhook: WebhookProcess,
}

impl Env {
    /// Start OPA (at `opa_url_override` if given, e.g. a fault proxy) with the
    /// shipped policy and the example clusters read from the API, a webhook, and
    /// register it for a fresh namespace.
    async fn start(
        prefix: &str,
        webhook_args: &[String],
        opa: OpaServer,
        load_policy: bool,
    ) -> Env {
        let plane = ControlPlane::shared();
        plane.ensure_example_clusters();
        let ns = unique_name(prefix);
        let policy_ns = format!("{ns}-policy");
        plane.create_namespace(&ns);
        plane.create_policy_namespace(&policy_ns);
        if load_policy {
            load_policy_and_clusters(plane, &opa, "placement-policy.io/example=true").await;
        }
        let defaults = [
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!(
                "--kubeconfig={}",
                plane.kubeconfig(Identity::Webhook).display()
            ),
            format!("--policy-namespace={policy_ns}"),
            "--engine-deadline=5s".to_owned(),
            "--engine-timeout=1s".to_owned(),
        ];
        let flag = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
        let mut args: Vec<String> = defaults
            .into_iter()
            .filter(|d| !webhook_args.iter().any(|a| flag(a) == flag(d)))
            .collect();
        args.extend(webhook_args.iter().cloned());
        let webhook = WebhookProcess::start(&args);
        plane.register_webhook(&ns, &webhook.url("/mutate"), &webhook.ca_pem, &policy_ns);
        let env = Env {
            plane,
            ns,
            policy_ns,
            opa,
            webhook,
        };
        env.wait_until_webhook_is_called();
        env
    }

    /// The API server picks up new webhook configurations asynchronously; wait
    /// until a dry-run create reaches this webhook.
    fn wait_until_webhook_is_called(&self) {
        let probe = replicaset_manifest("probe", &[(EU, "true")]);
        wait_for(
            "the API server to call the webhook",
            Duration::from_secs(30),
            || {
                let out = self.plane.kubectl_stdin(
                    &[
                        "create",
                        "-n",
                        &self.ns,
                        "--dry-run=server",
                        "-o",
                        "json",
                        "-f",
                        "-",
                    ],
                    &probe,
                );
                let text = String::from_utf8_lossy(&out.stdout);
                let called = text.contains(PREFS)
                    || String::from_utf8_lossy(&out.stderr).contains("placement");
                called.then_some(())
            },
        );
    }

    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        let mut full = vec!["-n", self.ns.as_str()];
        full.extend_from_slice(args);
        self.plane.kubectl(&full)
    }

    /// `kubectl create -f -` into the test namespace (a namespace in the manifest,
    /// as in the shipped examples, is replaced).
    fn create(&self, manifest: &str) -> std::process::Output {
        let mut doc: Value = yaml_serde::from_str(manifest).expect("manifest is YAML");
        if let Some(meta) = doc["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        self.plane
            .kubectl_stdin(&["create", "-n", &self.ns, "-f", "-"], &doc.to_string())
    }

    fn get(&self, kind: &str, name: &str) -> Option<Value> {
        let out = self.kubectl(&["get", kind, name, "-o", "json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("object JSON"))
    }

    /// Events (events.k8s.io) about `name` in the test namespace.
    fn events_for(&self, name: &str) -> Vec<Value> {
        let out = self.kubectl(&["get", "events.events.k8s.io", "-o", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).expect("event list");
        list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["regarding"]["name"] == name)
            .collect()
    }

    /// The shipped policy as a ConfigMap in this test's policy namespace (the
    /// webhook only counts it; the test loads OPA itself).
    fn create_policy_configmap(&self) {
        let policies = repo_root().join("policies");
        let out = self.plane.kubectl(&[
            "create",
            "configmap",
            "placement",
            "-n",
            &self.policy_ns,
            &format!("--from-file={}", policies.join("placement.rego").display()),
            &format!(
                "--from-file={}",
                policies.join("placement_rules.rego").display()
            ),
            &format!(
                "--from-file={}",
                policies.join("placement_settings.rego").display()
            ),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn delete_policy_configmap(&self) {
        let out = self
            .plane
            .kubectl(&["delete", "configmap", "placement", "-n", &self.policy_ns]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Load the shipped policy and the Cluster objects matching `selector` into OPA,
/// the way the sync sidecar will.
async fn load_policy_and_clusters(plane: &ControlPlane, opa: &OpaServer, selector: &str) {
    opa.load_shipped_policies(false).await;
    let client = opa.client();
    let clusters: serde_json::Map<String, Value> = plane
        .clusters(selector)
        .into_iter()
        .map(|c| (c["metadata"]["name"].as_str().expect("name").to_owned(), c))
        .collect();
    client
        .put_data("kubernetes/clusters", &Value::Object(clusters))
        .await
        .expect("clusters into OPA");
}

fn replicaset_manifest(name: &str, annotations: &[(&str, &str)]) -> String {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
            }
        }
    })
    .to_string()
}

fn placed_clusters(object: &Value) -> Vec<String> {
    placement_tests::placed_clusters(object)
        .unwrap_or_else(|| panic!("no placement annotation on {object}"))
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn create_places_and_denies_through_the_api_server() {
    let env = Env::start("create", &[], OpaServer::start(), true).await;

    // The shipped example: EU, PCI >= 2.
    let example =
        std::fs::read_to_string(repo_root().join("examples/replicaset-eu-pci.yaml")).unwrap();
    let out = env.create(&example);
    assert!(out.status.success(), "{}", stderr(&out));
    let stored = env.get("replicaset", "nginx-eu").expect("stored");
    assert_eq!(
        placed_clusters(&stored),
        vec!["gce-europe-west1", "gce-europe-west2"]
    );
    let annotations = &stored["metadata"]["annotations"];
    assert_eq!(annotations[EU], "true", "developer annotations are kept");
    assert_eq!(annotations[PCI], "2");
    assert!(
        annotations["placement-policy.io/policy-owned"].is_string(),
        "ownership recorded"
    );

    // Clusters the policy forbids: denied with the policy's message.
    let forbidden =
        std::fs::read_to_string(repo_root().join("examples/replicaset-forbidden.yaml")).unwrap();
    let out = env.create(&forbidden);
    assert!(!out.status.success(), "must be denied");
    let message = stderr(&out);
    assert!(
        message.contains(
            "requested replica-set-preferences includes invalid clusters: gce-us-central1"
        ),
        "{message}"
    );
    let name = forbidden_name(&forbidden);
    assert!(env.get("replicaset", &name).is_none(), "nothing stored");
    // A denial leaves an Event a developer can find.
    wait_for(
        "an Event for the denied ReplicaSet",
        Duration::from_secs(10),
        || {
            env.events_for(&name)
                .into_iter()
                .find(|e| e["reason"] == "PlacementDenied")
        },
    );
    let metrics = env.webhook.metrics().await;
    assert!(
        metrics.contains(r#"operation="CREATE",outcome="patched""#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"operation="CREATE",outcome="denied""#),
        "{metrics}"
    );
}

fn forbidden_name(manifest: &str) -> String {
    let doc: Value = yaml_serde::from_str(manifest).expect("manifest YAML");
    doc["metadata"]["name"].as_str().expect("name").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_update_is_re_evaluated() {
    let env = Env::start("update", &[], OpaServer::start(), true).await;
    let first = replicaset_manifest("web", &[("team", "shop")]);
    let out = env
        .plane
        .kubectl_stdin(&["apply", "-n", &env.ns, "-f", "-"], &first);
    assert!(out.status.success(), "{}", stderr(&out));
    let stored = env.get("replicaset", "web").unwrap();
    // No requirement: every running cluster.
    assert_eq!(
        placed_clusters(&stored),
        vec![
            "aws-eu-central-1",
            "gce-europe-west1",
            "gce-europe-west2",
            "gce-us-central1"
        ]
    );
    // The developer adds requirements: the UPDATE is placed again.
    let second = replicaset_manifest("web", &[("team", "shop"), (EU, "true"), (PCI, "3")]);
    let out = env
        .plane
        .kubectl_stdin(&["apply", "-n", &env.ns, "-f", "-"], &second);
    assert!(out.status.success(), "{}", stderr(&out));
    let stored = env.get("replicaset", "web").unwrap();
    assert_eq!(placed_clusters(&stored), vec!["gce-europe-west2"]);
    assert_eq!(stored["metadata"]["annotations"]["team"], "shop");
    // An unrelated change (scale) keeps the placement and is not mistaken for a
    // developer request of the policy's own value.
    let out = env.kubectl(&["scale", "replicaset/web", "--replicas=1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stored = env.get("replicaset", "web").unwrap();
    assert_eq!(placed_clusters(&stored), vec!["gce-europe-west2"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_dry_run_mutates_but_stores_nothing_and_emits_no_event() {
    let env = Env::start("dryrun", &[], OpaServer::start(), true).await;
    let manifest = replicaset_manifest("dry", &[(EU, "true"), (PCI, "2")]);
    let out = env.plane.kubectl_stdin(
        &[
            "create",
            "-n",
            &env.ns,
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
        ],
        &manifest,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let answered: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        placed_clusters(&answered),
        vec!["gce-europe-west1", "gce-europe-west2"]
    );
    assert!(
        env.get("replicaset", "dry").is_none(),
        "dry run stores nothing"
    );

    // A dry-run denial must not leave an Event either (side effects: NoneOnDryRun),
    // while the same denial for real does.
    let bad = replicaset_manifest(
        "dry-bad",
        &[
            (EU, "true"),
            (PREFS, r#"{"clusters":{"gce-us-central1":{}}}"#),
        ],
    );
    let out = env.plane.kubectl_stdin(
        &["create", "-n", &env.ns, "--dry-run=server", "-f", "-"],
        &bad,
    );
    assert!(!out.status.success());
    let real = replicaset_manifest(
        "real-bad",
        &[
            (EU, "true"),
            (PREFS, r#"{"clusters":{"gce-us-central1":{}}}"#),
        ],
    );
    let out = env.create(&real);
    assert!(!out.status.success());
    wait_for(
        "an Event for the real denial",
        Duration::from_secs(10),
        || (!env.events_for("real-bad").is_empty()).then_some(()),
    );
    assert!(
        env.events_for("dry-bad").is_empty(),
        "no Event for a dry run"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_closed_iff_policies_exist() {
    let mut env = Env::start("failmode", &[], OpaServer::start(), true).await;

    // OPA down, no policy ConfigMap: admitted unchanged.
    env.opa.kill();
    let out = env.create(&replicaset_manifest("open", &[(EU, "true")]));
    assert!(out.status.success(), "fail open: {}", stderr(&out));
    assert!(
        stderr(&out).contains("admitted unchanged"),
        "a warning tells the user: {}",
        stderr(&out)
    );
    let stored = env.get("replicaset", "open").unwrap();
    assert!(
        stored["metadata"]["annotations"].get(PREFS).is_none(),
        "unchanged: {stored}"
    );

    // A policy ConfigMap appears: within seconds the same request is denied.
    env.create_policy_configmap();
    let name = "closed";
    let denial = wait_for(
        "the webhook to fail closed",
        Duration::from_secs(15),
        || {
            let out = env.create(&replicaset_manifest(name, &[(EU, "true")]));
            (!out.status.success()).then(|| stderr(&out))
        },
    );
    assert!(
        denial.contains("the policy engine is unavailable"),
        "{denial}"
    );
    wait_for(
        "an Event for the denied object",
        Duration::from_secs(10),
        || {
            env.events_for(name)
                .into_iter()
                .find(|e| e["reason"] == "PolicyEngineUnavailable")
        },
    );

    // OPA up but without any policy: the decision is undefined, never "no annotations".
    env.opa.restart();
    let out = env.create(&replicaset_manifest("undefined", &[(EU, "true")]));
    assert!(
        !out.status.success(),
        "undefined must deny while policies exist"
    );
    assert!(stderr(&out).contains("no decision"), "{}", stderr(&out));
    // ... and says where to look.
    assert!(
        stderr(&out).contains("placement-policy.io/policy-status")
            && stderr(&out).contains("/readyz"),
        "the undefined denial names the status annotation and placement-sync's /readyz: {}",
        stderr(&out)
    );

    // The ConfigMap goes away: within seconds requests are admitted again.
    env.delete_policy_configmap();
    wait_for(
        "the webhook to fail open again",
        Duration::from_secs(15),
        || {
            let out = env.create(&replicaset_manifest(
                &unique_name("reopen"),
                &[(EU, "true")],
            ));
            out.status.success().then_some(())
        },
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retries_ride_out_503s_and_slow_engines_fail_closed_in_time() {
    let opa = OpaServer::start();
    let proxy = FaultProxy::start(opa.url()).await;
    let env = Env::start(
        "retry",
        &[
            format!("--opa-url={}", proxy.url()),
            "--engine-deadline=4s".to_owned(),
        ],
        opa,
        true,
    )
    .await;
    env.create_policy_configmap();

    // 503 twice, then OPA answers: the create succeeds with the right placement.
    let before = proxy.requests_seen();
    proxy.fail_next(2);
    let out = env.create(&replicaset_manifest("flaky", &[(EU, "true"), (PCI, "3")]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        proxy.requests_seen() - before >= 3,
        "retried: {} requests",
        proxy.requests_seen() - before
    );
    assert_eq!(
        placed_clusters(&env.get("replicaset", "flaky").unwrap()),
        vec!["gce-europe-west2"]
    );

    // OPA slower than the deadline: the webhook answers (deny, policies exist)
    // inside the API server's timeout, with a message naming the problem.
    proxy.delay(Duration::from_secs(6));
    let started = std::time::Instant::now();
    let out = env.create(&replicaset_manifest("slow", &[(EU, "true")]));
    let elapsed = started.elapsed();
    assert!(!out.status.success());
    let message = stderr(&out);
    assert!(
        message.contains("the policy engine is unavailable"),
        "{message}"
    );
    assert!(
        message.contains("did not answer within") || message.contains("gave up"),
        "{message}"
    );
    assert!(
        elapsed < Duration::from_secs(10),
        "answered before the webhook timeout ({elapsed:?})"
    );
    proxy.delay(Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_registry_drives_placement() {
    let plane = ControlPlane::shared();
    let set = unique_name("registry");
    // Clusters of this test only, labelled with its own set.
    for (name, region, pci, phase) in [
        ("eu-a", "europe-west3", "2", "running"),
        ("eu-b", "eu-west-1", "2", "running"),
        ("eu-c", "europe-west4", "2", "offline"),
        ("us-a", "us-east-2", "3", "running"),
    ] {
        let cluster = json!({
            "apiVersion": "placement-policy.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": format!("{set}-{name}"), "labels": {"set": set, "placement-policy.io/pci-compliance-level": pci}},
            "spec": {"address": format!("https://{name}.example.invalid"), "region": region, "zones": [format!("{region}-a")]},
        });
        let out = plane.kubectl_stdin(&["apply", "-f", "-"], &cluster.to_string());
        assert!(out.status.success(), "{}", stderr(&out));
        plane.kubectl_ok(&[
            "patch",
            &format!("clusters.placement-policy.io/{set}-{name}"),
            "--subresource=status",
            "--type=merge",
            "-p",
            &json!({"status": {"phase": phase, "capacity": {"cpu": "32"}}}).to_string(),
        ]);
    }
    let out = plane.kubectl(&[
        "get",
        "clusters.placement-policy.io",
        "-l",
        &format!("set={set}"),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("offline"),
        "phase column shows status"
    );

    let opa = OpaServer::start();
    load_policy_and_clusters(plane, &opa, &format!("set={set}")).await;
    let env = Env::start("registry", &[], opa, false).await;
    let out = env.create(&replicaset_manifest("eu-app", &[(EU, "true"), (PCI, "2")]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        placed_clusters(&env.get("replicaset", "eu-app").unwrap()),
        vec![format!("{set}-eu-a"), format!("{set}-eu-b")]
    );

    // eu-b goes offline in the registry; the data pushed to OPA follows, and the
    // next workload is placed without it.
    plane.kubectl_ok(&[
        "patch",
        &format!("clusters.placement-policy.io/{set}-eu-b"),
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"offline"}}"#,
    ]);
    load_policy_and_clusters(plane, &env.opa, &format!("set={set}")).await;
    let out = env.create(&replicaset_manifest(
        "eu-app-2",
        &[(EU, "true"), (PCI, "2")],
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        placed_clusters(&env.get("replicaset", "eu-app-2").unwrap()),
        vec![format!("{set}-eu-a")]
    );
}

/// A decision with errors never removes or replaces a
/// placement. The example EU/PCI ReplicaSet is placed on the two EU clusters;
/// both go offline (in the data OPA holds); then
/// - `kubectl label` is admitted with a warning, and the stored object keeps
///   its placement and its ownership record, which still verifies;
/// - a PUT of the developer's own manifest (without the policy's values) is
///   admitted with the stored placement put back;
/// - an UPDATE that changes the developer's request is judged on the new
///   object alone: denied, although the errors are those the object had.
#[tokio::test(flavor = "multi_thread")]
async fn an_update_under_existing_violations_keeps_the_stored_placement() {
    let key_file = placement_tests::ownership_key_file();
    let env = Env::start(
        "keep",
        &[format!("--ownership-key-file={}", key_file.display())],
        OpaServer::start(),
        true,
    )
    .await;
    let keys = policy_client::ownership_keys::OwnershipKeys::from_text(
        &std::fs::read_to_string(key_file).unwrap(),
    )
    .unwrap();
    let example =
        std::fs::read_to_string(repo_root().join("examples/replicaset-eu-pci.yaml")).unwrap();
    let out = env.create(&example);
    assert!(out.status.success(), "{}", stderr(&out));
    let placed = env.get("replicaset", "nginx-eu").expect("stored");
    assert_eq!(
        placed_clusters(&placed),
        vec!["gce-europe-west1", "gce-europe-west2"]
    );
    let owned = policy_client::placement::ownership(&placed, &keys);
    assert!(owned.contains_key(PREFS), "the policy owns the placement");

    // Both EU clusters of PCI level >= 2 go offline.
    let clusters: serde_json::Map<String, Value> = env
        .plane
        .clusters("placement-policy.io/example=true")
        .into_iter()
        .map(|mut c| {
            let name = c["metadata"]["name"].as_str().expect("name").to_owned();
            if name.starts_with("gce-europe-west") {
                c["status"]["phase"] = json!("offline");
            }
            (name, c)
        })
        .collect();
    env.opa
        .client()
        .put_data("kubernetes/clusters", &Value::Object(clusters))
        .await
        .expect("clusters into OPA");
    let kept = |what: &str| {
        let stored = env.get("replicaset", "nginx-eu").expect("stored");
        let annotations = &stored["metadata"]["annotations"];
        assert_eq!(
            annotations[PREFS], placed["metadata"]["annotations"][PREFS],
            "{what}: the placement is kept: {stored}"
        );
        assert_eq!(
            annotations["placement-policy.io/policy-owned"],
            placed["metadata"]["annotations"]["placement-policy.io/policy-owned"],
            "{what}: the ownership record is kept: {stored}"
        );
        assert_eq!(
            policy_client::placement::ownership(&stored, &keys),
            owned,
            "{what}: the record verifies"
        );
        stored
    };

    let out = env.kubectl(&["label", "rs", "nginx-eu", "a=b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no cluster satisfies the placement requirements"),
        "warned about the existing violation: {}",
        stderr(&out)
    );
    let labelled = kept("kubectl label");
    assert_eq!(labelled["metadata"]["labels"]["a"], "b");

    // The developer's manifest PUT again, without the policy's values.
    let mut manifest = labelled.clone();
    let annotations = manifest["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.remove(PREFS);
    annotations.remove("placement-policy.io/policy-owned");
    manifest["spec"]["replicas"] = json!(2);
    let out = env.plane.kubectl_stdin(
        &["replace", "-n", &env.ns, "-f", "-"],
        &manifest.to_string(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let replaced = kept("a PUT without the policy's values");
    assert_eq!(replaced["spec"]["replicas"], 2);

    // A changed request is judged on the new object: the same errors deny.
    let out = env.kubectl(&["annotate", "rs", "nginx-eu", "team=payments"]);
    assert!(
        !out.status.success(),
        "a changed request under an existing violation is denied"
    );
    assert!(
        stderr(&out).contains("no cluster satisfies the placement requirements"),
        "{}",
        stderr(&out)
    );
    let stored = kept("a denied request change");
    assert!(stored["metadata"]["annotations"].get("team").is_none());
}

/// An API server Helm does not reach (Karmada's) gets its webhook
/// configuration from the webhook itself: with self-managed certificates and
/// `--register-configuration`, the configuration appears with the CA bundle
/// of the Secret the webhook keeps, and the API server then calls it (a
/// ReplicaSet created through it is placed).
#[test]
fn a_self_managed_webhook_registers_its_configuration_with_its_ca_bundle() {
    let plane = ControlPlane::shared();
    let ns = unique_name("register");
    plane.create_namespace(&ns);
    let port = placement_tests::free_port();
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": ns},
        "webhooks": [{
            "name": "placement.placement-policy.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://localhost:{port}/mutate")},
            "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                       "operations": ["CREATE", "UPDATE"], "resources": ["replicasets"],
                       "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"placement-test": ns}},
            "sideEffects": "None",
            "timeoutSeconds": 10,
            "failurePolicy": "Fail"
        }]
    });
    let file = placement_tests::scratch_dir("register").join("configuration.yaml");
    std::fs::write(&file, configuration.to_string()).expect("write the configuration");
    let _webhook = WebhookProcess::start(&[
        format!("--listen=127.0.0.1:{port}"),
        format!("--tls-secret={ns}/webhook-tls"),
        "--tls-dns-name=localhost".to_owned(),
        format!("--register-configuration={}", file.display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Admin).display()
        ),
        format!("--policy-dir={}", repo_root().join("policies").display()),
    ]);
    let secret_ca = plane.kubectl_ok(&[
        "get",
        "secret",
        "webhook-tls",
        "-n",
        &ns,
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]);
    let bundle = wait_for(
        "the configuration registered with a CA bundle",
        Duration::from_secs(60),
        || {
            let out = plane.kubectl(&[
                "get",
                "mutatingwebhookconfiguration",
                &ns,
                "-o",
                "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ]);
            let bundle = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            (out.status.success() && !bundle.is_empty()).then_some(bundle)
        },
    );
    let decode = |b64: &str| {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .expect("base64");
        String::from_utf8(bytes).expect("PEM")
    };
    assert!(
        placement_certs::rotation::bundle_trusts(&decode(&bundle), &decode(&secret_ca)),
        "the configuration trusts the Secret's CA"
    );
    let placed = wait_for(
        "a ReplicaSet placed through the registered configuration",
        Duration::from_secs(60),
        || {
            let name = unique_name("rs");
            let out = plane.kubectl_stdin(
                &["create", "-n", &ns, "-o", "json", "-f", "-"],
                &replicaset_manifest(&name, &[(EU, "true")]),
            );
            let created: Value = serde_json::from_slice(&out.stdout).ok()?;
            let placed = created["metadata"]["annotations"].get(PREFS).is_some();
            placed.then_some(created)
        },
    );
    assert!(!placed_clusters(&placed).is_empty());
}
