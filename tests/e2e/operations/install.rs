//! Installing, upgrading and uninstalling the release with helm, with the
//! defaults, policies in every namespace, and the embedded engine.

use super::*;

/// The running pods of a component (`webhook`, `remediator`), not those
/// terminating.
/// The log of `container` in `pod` of the release's namespace, from the
/// kubelet's files (the API server cannot reach the node by name here).
fn container_log(cluster: &Cluster, pod: &str, container: &str) -> String {
    let logs = cluster.dir().join("state/pod-logs");
    let mut text = String::new();
    for entry in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{NAMESPACE}_{pod}_")) {
            continue;
        }
        for file in std::fs::read_dir(entry.path().join(container))
            .into_iter()
            .flatten()
            .flatten()
        {
            text.push_str(&std::fs::read_to_string(file.path()).unwrap_or_default());
        }
    }
    text
}

/// Case 1: `helm install` with defaults: every pod Ready, the shipped policy loaded,
/// a user's ReplicaSet and a Deployment controller's ReplicaSets placed.
#[test]
fn helm_install_with_defaults_places_user_and_controller_workloads() {
    let _serial = serial();
    let release = Release::install(&[]);
    release.wait_policy_ok();
    let cluster = release.cluster;
    let ns = workload_namespace(cluster, "install");

    let created = create(cluster, &eu_replicaset(&ns, "nginx-eu"));
    assert!(created.ok, "{}", created.stderr);
    assert_eq!(
        placed_clusters(&created.object),
        eu_pci(),
        "{}",
        created.object
    );

    let mut deployment = eu_replicaset(&ns, "web-eu");
    deployment["kind"] = json!("Deployment");
    deployment["spec"]["replicas"] = json!(1);
    let created = create(cluster, &deployment);
    assert!(created.ok, "{}", created.stderr);
    let replicaset = wait_for(
        "the Deployment's ReplicaSet",
        Duration::from_secs(60),
        || {
            let list =
                cluster.kubectl_ok(&["get", "rs", "-n", &ns, "-l", "app=web-eu", "-o", "json"]);
            serde_json::from_str::<Value>(&list).ok()?["items"]
                .as_array()?
                .first()
                .cloned()
        },
    );
    assert_eq!(placed_clusters(&replicaset), eu_pci(), "{replicaset}");
    cluster.wait_rollout(&ns, "web-eu");

    // Each webhook remembers OPA's decisions: it follows the revisions of
    // placement-sync, OPA's writer, in its own pod.
    let webhooks = running_pods(cluster, "webhook");
    assert!(!webhooks.is_empty());
    for pod in webhooks {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}:9090/proxy/metrics");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = cluster.kubectl(&["get", "--raw", &path]);
            let page = String::from_utf8_lossy(&out.stdout);
            if page
                .lines()
                .any(|l| l == "placement_webhook_decision_cache_enabled 1")
            {
                break;
            }
            if Instant::now() > deadline {
                let cache: Vec<&str> = page
                    .lines()
                    .filter(|l| l.contains("decision_cache"))
                    .collect();
                panic!(
                    "{pod} does not remember decisions after 30 s: {cache:?} {}\nits webhook container's log:\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    container_log(cluster, &pod, "webhook")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    eprintln!(
        "measured: helm install to every pod Ready: {:?}",
        release.ready_after
    );
}

/// Least privilege in the real cluster, with policies in every namespace
/// (`policy.namespaces: ["*"]`): the running pods (as admitted, not only as
/// rendered) give a service-account token to the webhook and placement-sync
/// only, never to OPA; the sidecars still write the status of a labelled
/// policy ConfigMap in a tenant's namespace, through the
/// ValidatingAdmissionPolicy that refuses their accounts any other change of
/// a ConfigMap; and workloads are placed.
#[test]
fn with_policies_in_every_namespace_only_the_status_is_written() {
    let _serial = serial();
    let release = Release::install(&["policy.namespaces={*}"]);
    release.wait_policy_ok();
    let cluster = release.cluster;
    const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    for component in ["webhook", "remediator"] {
        for pod in running_pods(cluster, component) {
            let pod = get_json(cluster, &["pod", &pod, "-n", NAMESPACE]);
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let containers = pod["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert!(!containers.is_empty(), "{name}");
            for container in containers {
                let c = container["name"].as_str().unwrap_or_default();
                let mounted = container["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["mountPath"] == TOKEN_PATH);
                assert_eq!(
                    mounted,
                    c != "opa",
                    "{name}/{c}: {}",
                    container["volumeMounts"]
                );
            }
        }
    }

    let ns = workload_namespace(cluster, "tenant");
    let configmap = |name: &str, rego: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": &*ns,
                         "labels": {"openpolicyagent.org/policy": "rego"}},
            "data": {"main.rego": rego},
        })
    };
    let status = |name: &str| {
        cluster
            .kubectl(&[
                "get",
                "configmap",
                name,
                "-n",
                &ns,
                "-o",
                "jsonpath={.metadata.annotations.placement-policy\\.io/policy-status}",
            ])
            .stdout
            .into_iter()
            .map(char::from)
            .collect::<String>()
    };
    for (name, rego, expected) in [
        (
            "tenant-ok",
            "package tenant.extra\n\nlimit := 3\n",
            "\"ok\"",
        ),
        (
            "tenant-broken",
            "package tenant.broken\n\nlimit := \n",
            "\"error\"",
        ),
    ] {
        let out = cluster.kubectl_stdin(&["apply", "-f", "-"], &configmap(name, rego).to_string());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        release.wait_for(
            &format!("the status of {ns}/{name}"),
            Duration::from_secs(120),
            || status(name).contains(expected).then_some(()),
        );
    }
    // The same accounts may change nothing else of it, nor a ConfigMap that
    // is no policy.
    let _ = cluster.kubectl(&[
        "create",
        "configmap",
        "plain",
        "-n",
        &ns,
        "--from-literal=a=b",
    ]);
    for account in ["webhook", "remediator"] {
        let who = format!("--as=system:serviceaccount:{NAMESPACE}:{RELEASE}-{account}");
        for (name, patch) in [
            ("tenant-ok", r#"{"data":{"main.rego":"package evil"}}"#),
            (
                "plain",
                r#"{"metadata":{"annotations":{"placement-policy.io/policy-status":"{}"}}}"#,
            ),
        ] {
            let out = cluster.kubectl(&[
                "patch",
                "configmap",
                name,
                "-n",
                &ns,
                "--type=merge",
                "-p",
                patch,
                &who,
            ]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains("ValidatingAdmissionPolicy"),
                "{account} patched {name}: {stderr}"
            );
        }
    }

    let workloads = workload_namespace(cluster, "everywhere");
    let created = create(cluster, &eu_replicaset(&workloads, "nginx-eu"));
    assert!(created.ok, "{}", created.stderr);
    assert_eq!(
        placed_clusters(&created.object),
        eu_pci(),
        "{}",
        created.object
    );
}

/// Case 5: `helm upgrade` to new values and a new image tag denies no write;
/// `helm uninstall` leaves nothing of the release, and writes go on.
#[test]
fn helm_upgrade_denies_nothing_and_uninstall_leaves_nothing() {
    let _serial = serial();
    let release = Release::install(&[]);
    release.wait_policy_ok();
    let cluster = release.cluster;
    let ns = workload_namespace(cluster, "upgrade");
    // A developer's request the policy rewrites: the ownership record keeps
    // it (signed with the release's key).
    let requested = r#"{"clusters":{"gce-europe-west1":{"weight":5}}}"#;
    let mut asked = eu_replicaset(&ns, "asked");
    asked["metadata"]["annotations"][placement_tests::PREFS] = json!(requested);
    let created = create(cluster, &asked);
    assert!(created.ok, "{}", created.stderr);
    let keys_before = ownership_keys(cluster).expect("the webhook made the key");
    assert_eq!(
        requested_in_record(&created.object, &keys_before).as_deref(),
        Some(requested)
    );

    let creates = CreateLoop::start(cluster, &ns);
    std::thread::sleep(Duration::from_secs(2));
    let tag = format!("{}-next", env!("CARGO_PKG_VERSION"));
    cluster.helm_ok(&[
        "upgrade",
        RELEASE,
        "charts/placement-policy",
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout=5m",
        "--set",
        &format!("image.tag={tag}"),
        "--set",
        "webhook.replicas=3",
        "--set",
        "webhook.engineDeadline=7s",
    ]);
    std::thread::sleep(Duration::from_secs(5));
    let (made, failures) = creates.finish();
    eprintln!(
        "measured: creates during helm upgrade: {made}, failed: {}",
        failures.len()
    );
    assert!(made > 10, "the loop ran ({made})");
    assert!(
        failures.is_empty(),
        "creates failed during the upgrade:\n{}",
        failures.join("\n")
    );
    for pod in release.pods("webhook") {
        let image = cluster.kubectl_ok(&[
            "get",
            "pod",
            &pod,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.containers[0].image}",
        ]);
        assert!(image.ends_with(&tag), "{pod} runs {image}");
    }
    assert_eq!(release.pods("webhook").len(), 3);

    drop(release);
    let left = cluster.kubectl_ok(&[
        "get",
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets,clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations",
        "-A",
        "-l",
        &format!("app.kubernetes.io/instance={RELEASE}"),
        "-o",
        "name",
    ]);
    // Only the ownership keys stay: the records on the workloads outlive the
    // release, and a reinstall must verify them.
    assert_eq!(
        left.trim(),
        "secret/placement-policy-ownership",
        "left after helm uninstall"
    );
    assert_eq!(
        ownership_keys(cluster).as_deref(),
        Some(keys_before.as_str())
    );
    let configurations = cluster.kubectl_ok(&[
        "get",
        "mutatingwebhookconfigurations,validatingwebhookconfigurations",
        "-o",
        "name",
    ]);
    assert!(
        configurations.trim().is_empty(),
        "no webhook configuration is left: {configurations}"
    );
    let created = create(cluster, &eu_replicaset(&ns, "after-uninstall"));
    assert!(
        created.ok,
        "writes go on after uninstall: {}",
        created.stderr
    );

    // Reinstalled, the release adopts the kept keys: the developer's request
    // is still theirs.
    let release = Release::install(&[]);
    release.wait_policy_ok();
    assert_eq!(
        ownership_keys(cluster).as_deref(),
        Some(keys_before.as_str())
    );
    let updated = placement_tests::kubectl::touch_replicaset(&cluster.kubeconfig(), &ns, "asked");
    assert_eq!(
        requested_in_record(&updated, &keys_before).as_deref(),
        Some(requested),
        "the record verifies across the reinstall: {}",
        updated["metadata"]["annotations"]
    );
    drop(release);
}

/// The key text of the release's ownership Secret.
fn ownership_keys(cluster: &Cluster) -> Option<String> {
    let out = cluster.kubectl(&[
        "get",
        "secret",
        "placement-policy-ownership",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.data.ownership\\.keys}",
    ]);
    let encoded = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).ok()?;
    String::from_utf8(bytes)
        .ok()
        .filter(|t| !t.trim().is_empty())
}

/// What the developer had asked for of the placement annotation, by the
/// object's ownership record (verified with `keys`).
fn requested_in_record(object: &Value, keys: &str) -> Option<String> {
    let keys = policy_client::ownership_keys::OwnershipKeys::from_text(keys).ok()?;
    policy_client::placement::ownership(object, &keys)
        .get(placement_tests::PREFS)?
        .requested
        .clone()
}

/// Case 7: the embedded engine (no OPA): the webhook alone evaluates the
/// shipped policy from its ConfigMap volume, with the cluster registry from a
/// ConfigMap of data, in a read-only pod.
#[test]
fn embedded_engine_install_places_workloads() {
    let _serial = serial();
    let cluster = cluster();
    // The registry as data, beside the release (pods mount only their own
    // namespace's ConfigMaps).
    let _ = cluster.kubectl(&["create", "namespace", NAMESPACE]);
    let registry = repo_root().join("policies/kubernetes/clusters/data.json");
    let _ = cluster.kubectl(&["delete", "configmap", "clusters", "-n", NAMESPACE]);
    cluster.kubectl_ok(&[
        "create",
        "configmap",
        "clusters",
        "-n",
        NAMESPACE,
        &format!("--from-file=clusters.json={}", registry.display()),
    ]);
    let release = Release::install(&[
        "engine.type=embedded",
        "engine.embedded.dataConfigMap=clusters",
        "engine.embedded.dataItems[0].key=clusters.json",
        "engine.embedded.dataItems[0].path=kubernetes/clusters/data.json",
    ]);
    let ns = workload_namespace(cluster, "embedded");
    let created = create(cluster, &eu_replicaset(&ns, "nginx-eu"));
    assert!(created.ok, "{}", created.stderr);
    assert_eq!(placed_clusters(&created.object), eu_pci(), "{created:?}");
    let mut forbidden = eu_replicaset(&ns, "forbidden");
    forbidden["metadata"]["annotations"][placement_tests::PREFS] =
        json!(r#"{"clusters":{"gce-us-central1":{"weight":1}}}"#);
    let denied = create(cluster, &forbidden);
    assert!(!denied.ok, "denied: {denied:?}");
    assert!(
        denied.stderr.contains("gce-us-central1"),
        "{}",
        denied.stderr
    );
    drop(release);
    let _ = cluster.kubectl(&["delete", "configmap", "clusters", "-n", NAMESPACE]);
}
