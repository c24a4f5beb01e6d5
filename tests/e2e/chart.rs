//! The Helm chart, rendered by the real helm (built by the test bed) and
//! checked against a real API server: what every install gets, whatever the
//! values.

use placement_tests::{ControlPlane, cluster, repo_root};
use serde_json::{Value, json};

/// `helm template` of the chart with `values` (`--set` arguments), as JSON
/// documents.
fn render(values: &[&str]) -> Vec<Value> {
    render_release("placement-policy", "placement-system", values)
}

/// `helm template` of release `release` in `namespace`.
fn render_release(release: &str, namespace: &str, values: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        release,
        "charts/placement-policy",
        "-n",
        namespace,
        "--include-crds",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    let out = std::process::Command::new(cluster::cluster_assets().join("helm"))
        .args(&args)
        .current_dir(repo_root())
        .output()
        .expect("run helm template");
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_serde::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|document| serde::Deserialize::deserialize(document).expect("rendered YAML"))
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

/// `helm template` with `value` set fails, naming the problem with `message`.
fn refused(value: &str, message: &str) {
    let out = std::process::Command::new(cluster::cluster_assets().join("helm"))
        .args(["template", "x", "charts/placement-policy", "--set", value])
        .current_dir(repo_root())
        .output()
        .expect("run helm template");
    assert!(!out.status.success(), "{value} rendered");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(message), "{value}: {stderr}");
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// A Deployment's containers; it has one at least, so that checks of each
/// cannot pass on none.
fn containers(deployment: &Value) -> Vec<&Value> {
    let containers: Vec<&Value> = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .collect();
    assert!(
        !containers.is_empty(),
        "{} renders no containers",
        deployment["metadata"]["name"]
    );
    containers
}

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn chart_lints_and_deploy_is_its_rendering() {
    let helm = cluster::cluster_assets().join("helm");
    let out = std::process::Command::new(&helm)
        .args(["lint", "--strict", "charts/placement-policy"])
        .current_dir(repo_root())
        .output()
        .expect("run helm lint");
    assert!(
        out.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(repo_root().join("scripts/render-deploy"))
        .arg("--check")
        .env("HELM", &helm)
        .output()
        .expect("run scripts/render-deploy --check");
    assert!(
        out.status.success(),
        "deploy/ is not the chart's rendering: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every pod of every mode: non-root, read-only root filesystem, no
/// capabilities, RuntimeDefault seccomp, requests and limits; bound
/// service-account tokens only.
#[test]
fn every_pod_is_hardened_in_every_mode() {
    for values in [
        &[][..],
        &["engine.type=embedded"][..],
        &["webhook.certificates.mode=cert-manager"][..],
        &["remediator.mode=report", "webhook.replicas=3"][..],
        &["karmada.enabled=true"][..],
        &[
            "karmada.enabled=true",
            "karmada.guardrail=false",
            "karmada.webhookKeys=true",
        ][..],
        &["ocm.enabled=true", "ocm.sigPlacementDecisions=true"][..],
    ] {
        let docs = render(values);
        let deployments = of_kind(&docs, "Deployment");
        assert!(!deployments.is_empty(), "{values:?}");
        for deployment in deployments {
            let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
            let pod = &deployment["spec"]["template"]["spec"];
            assert_eq!(
                pod["securityContext"]["runAsNonRoot"], true,
                "{name} {values:?}"
            );
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{name} {values:?}"
            );
            assert!(
                pod["serviceAccountName"].is_string(),
                "{name} runs under its own service account"
            );
            for container in containers(deployment) {
                let c = container["name"].as_str().unwrap_or_default();
                let security = &container["securityContext"];
                assert_eq!(security["readOnlyRootFilesystem"], true, "{name}/{c}");
                assert_eq!(security["allowPrivilegeEscalation"], false, "{name}/{c}");
                assert_eq!(security["capabilities"]["drop"][0], "ALL", "{name}/{c}");
                assert!(
                    container["resources"]["requests"]["memory"].is_string()
                        && container["resources"]["limits"]["memory"].is_string(),
                    "{name}/{c} has requests and limits"
                );
                assert!(container["livenessProbe"].is_object(), "{name}/{c} probe");
            }
        }
        for secret in of_kind(&docs, "Secret") {
            assert_ne!(
                secret["type"], "kubernetes.io/service-account-token",
                "no long-lived token Secrets ({values:?})"
            );
        }
    }
}

/// `karmada.enabled` adds placement-policy in Karmada: OPA and placement-sync
/// working in Karmada's API server through the kubeconfig Secret, replicating
/// Karmada's Clusters and scheduling the bindings that name
/// `karmada.schedulerName`, with no token of this cluster; nothing of it by
/// default. With `karmada.guardrail` (the default) each pod also runs the
/// webhook against Karmada's API server, which keeps its keys and
/// certificates there and registers the configuration this release renders
/// (templates and bindings, reached through the release's Service), and
/// placement-sync guards karmada-scheduler's bindings with the same keys.
#[test]
fn values_run_the_guardrail_and_a_scheduler_in_the_api_server_of_karmada() {
    let name = "placement-policy-karmada-scheduler";
    let defaults = render(&[]);
    assert!(
        !defaults
            .iter()
            .any(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name),
        "no Karmada scheduler by default"
    );
    let docs = render(&[
        "karmada.enabled=true",
        "karmada.schedulerName=rego",
        "karmada.kubeconfigSecret=karmada-config",
    ]);
    let deployment = named(&docs, "Deployment", name);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false, "{pod}");
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "karmada-kubeconfig")
        .expect("the kubeconfig volume");
    assert_eq!(volume["secret"]["secretName"], "karmada-config", "{volume}");
    let container = |docs: &[Value], c: &str| {
        containers(named(docs, "Deployment", name))
            .into_iter()
            .find(|x| x["name"] == c)
            .cloned()
    };
    let sync = container(&docs, "placement-sync").expect("placement-sync container");
    let flags = args(&sync);
    let keys = "--ownership-secret=karmada-system/placement-policy-karmada-ownership";
    for flag in [
        "--kubeconfig=/etc/karmada/kubeconfig",
        "--schedule-karmada-bindings",
        "--guard-karmada-bindings",
        "--scheduler-name=rego",
        "--replicate-cluster=cluster.karmada.io/v1alpha1/clusters",
        "--lease-namespace=karmada-system",
        "--remediation=off",
        keys,
    ] {
        assert!(flags.contains(&flag.to_owned()), "{flag} in {flags:?}");
    }
    let webhook = container(&docs, "webhook").expect("the guardrail's webhook");
    let flags = args(&webhook);
    let host = "placement-policy-karmada-webhook.placement-system.svc";
    for flag in [
        "--kubeconfig=/etc/karmada/kubeconfig".to_owned(),
        "--opa-url=http://127.0.0.1:8181".to_owned(),
        "--karmada-scheduler-name=rego".to_owned(),
        keys.to_owned(),
        "--tls-secret=karmada-system/placement-policy-karmada-webhook-tls".to_owned(),
        format!("--tls-dns-name={host}"),
        "--register-configuration=/etc/placement/karmada-webhook/configuration.yaml".to_owned(),
        "--register-configuration=/etc/placement/karmada-webhook/delivery.yaml".to_owned(),
    ] {
        assert!(flags.contains(&flag), "{flag} in {flags:?}");
    }
    let service = named(&docs, "Service", "placement-policy-karmada-webhook");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let configmap = named(
        &docs,
        "ConfigMap",
        "placement-policy-karmada-webhook-configuration",
    );
    let configuration: Value =
        yaml_serde::from_str(configmap["data"]["configuration.yaml"].as_str().unwrap())
            .expect("the configuration parses");
    let hook = &configuration["webhooks"][0];
    assert_eq!(
        hook["clientConfig"]["url"],
        format!("https://{host}:443/mutate")
    );
    let resources: Vec<&str> = hook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["resources"][0].as_str())
        .collect();
    assert_eq!(
        resources,
        [
            "replicasets",
            "deployments",
            "resourcebindings",
            "clusterresourcebindings"
        ]
    );
    // Their status updates too, those that change annotations (issue 30,
    // part 3): the webhook keeps the stored annotations, and a binding's
    // placement.
    for rule in hook["rules"].as_array().into_iter().flatten() {
        let main = rule["resources"][0].as_str().unwrap_or_default();
        assert_eq!(rule["resources"][1], format!("{main}/status"), "{rule}");
    }
    assert!(
        hook["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["name"] == "status-only-when-it-changes-annotations"),
        "{}",
        hook["matchConditions"]
    );
    let excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"].clone();
    assert_eq!(
        excluded,
        json!([
            "karmada-system",
            "karmada-cluster",
            "kube-federation-scheduling-policy",
            "kube-system",
            "kube-public",
            "kube-node-lease"
        ]),
        "Karmada's and the policy's namespaces, not this cluster's release namespace"
    );
    let sync_scope = format!(
        "--scope-exclude-namespaces={}",
        excluded
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(
        args(&sync).contains(&sync_scope),
        "placement-sync guards what the webhook sees: {sync_scope}"
    );
    // A configuration Karmada's API server (a kube-apiserver) accepts.
    let plane = ControlPlane::shared();
    let accepted = plane.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        &configuration.to_string(),
    );
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    // The last hop (issue 38), validated once every mutation is done:
    // Works in the execution namespaces, and what a binding write delivers.
    let delivery: Value =
        yaml_serde::from_str(configmap["data"]["delivery.yaml"].as_str().unwrap())
            .expect("the delivery configuration parses");
    assert_eq!(delivery["kind"], "ValidatingWebhookConfiguration");
    let hooks = delivery["webhooks"].as_array().expect("webhooks");
    let works = &hooks[0];
    assert_eq!(works["rules"][0]["resources"], json!(["works"]));
    assert_eq!(
        works["clientConfig"]["url"],
        format!("https://{host}:443/validate")
    );
    assert!(
        works["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["expression"] == "request.namespace.startsWith('karmada-es-')"),
        "{}",
        works["matchConditions"]
    );
    let bindings: Vec<&str> = hooks[1]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["resources"][0].as_str())
        .collect();
    assert_eq!(bindings, ["resourcebindings", "clusterresourcebindings"]);
    assert_eq!(hooks[1]["namespaceSelector"], hook["namespaceSelector"]);
    let accepted = plane.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        &delivery.to_string(),
    );
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );

    // Without the guardrail: the scheduler alone, no webhook, no keys unless
    // a hand-registered webhook's are mounted.
    let alone = render(&["karmada.enabled=true", "karmada.guardrail=false"]);
    assert!(container(&alone, "webhook").is_none());
    let flags = args(&container(&alone, "placement-sync").expect("placement-sync"));
    assert!(!flags.contains(&"--guard-karmada-bindings".to_owned()));
    assert!(
        !flags.iter().any(|f| f.starts_with("--ownership-")),
        "without a webhook in Karmada, no keys: {flags:?}"
    );
    let with_keys = render(&[
        "karmada.enabled=true",
        "karmada.guardrail=false",
        "karmada.webhookKeys=true",
    ]);
    let sync = container(&with_keys, "placement-sync").expect("placement-sync container");
    assert!(
        args(&sync)
            .contains(&"--ownership-key-file=/etc/placement/ownership/ownership.keys".to_owned()),
        "{:?}",
        args(&sync)
    );
    refused(
        "karmada.enabled=true,karmada.webhookKeys=true",
        "karmada.webhookKeys is for a webhook registered with Karmada's API server by hand",
    );
}

/// `ocm.enabled` adds placement-policy deciding OCM Placements: OPA and
/// placement-sync working on the hub through the kubeconfig Secret,
/// replicating the ManagedClusters and deciding the Placements that name
/// `ocm.schedulerName`, with no token of this cluster; with
/// `ocm.sigPlacementDecisions` it also publishes SIG-Multicluster decisions
/// and installs their CRD; nothing of it by default.
#[test]
fn values_run_a_decider_on_the_hub_of_open_cluster_management() {
    let name = "placement-policy-ocm-decider";
    let sig_crd = "placementdecisions.multicluster.x-k8s.io";
    let defaults = render(&[]);
    assert!(
        !defaults.iter().any(
            |d| (d["kind"] == "Deployment" && d["metadata"]["name"] == name)
                || d["metadata"]["name"] == sig_crd
        ),
        "no OCM decider by default"
    );
    let docs = render(&[
        "ocm.enabled=true",
        "ocm.schedulerName=rego",
        "ocm.kubeconfigSecret=hub-config",
    ]);
    let deployment = named(&docs, "Deployment", name);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false, "{pod}");
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "ocm-kubeconfig")
        .expect("the kubeconfig volume");
    assert_eq!(volume["secret"]["secretName"], "hub-config", "{volume}");
    let sync = containers(deployment)
        .into_iter()
        .find(|c| c["name"] == "placement-sync")
        .expect("placement-sync container");
    let flags = args(sync);
    for flag in [
        "--kubeconfig=/etc/ocm/kubeconfig",
        "--decide-ocm-placements",
        "--scheduler-name=rego",
        "--replicate-cluster=cluster.open-cluster-management.io/v1/managedclusters",
        "--lease-namespace=open-cluster-management-hub",
        "--remediation=off",
    ] {
        assert!(flags.contains(&flag.to_owned()), "{flag} in {flags:?}");
    }
    assert!(
        !flags.contains(&"--sig-placement-decisions".to_owned()),
        "{flags:?}"
    );
    assert!(!docs.iter().any(|d| d["metadata"]["name"] == sig_crd));
    let sig = render(&["ocm.enabled=true", "ocm.sigPlacementDecisions=true"]);
    let sync = containers(named(&sig, "Deployment", name))
        .into_iter()
        .find(|c| c["name"] == "placement-sync")
        .cloned()
        .expect("placement-sync container");
    assert!(args(&sync).contains(&"--sig-placement-decisions".to_owned()));
    let crd = named(&sig, "CustomResourceDefinition", sig_crd);
    assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1", "{crd}");
}

/// With `ocm.deliveryGuard` (the default) each OCM decider pod also runs the
/// webhook against the hub, which keeps its keys and certificates there (in
/// `ocm.namespace`, shared with placement-sync) and registers the delivery
/// guard this release renders: the same webhooks the OCM test bed registers
/// (ManifestWorks and ManifestWorkReplicaSets, spec changes only, never an
/// object being deleted), reached through the release's Service or
/// `ocm.webhookHost`, accepted by a real API server. The hub permissions
/// file grants what it needs there. Without it, neither webhook nor keys.
#[test]
fn values_run_the_delivery_guard_on_the_hub_of_open_cluster_management() {
    let name = "placement-policy-ocm-decider";
    let container = |docs: &[Value], c: &str| {
        containers(named(docs, "Deployment", name))
            .into_iter()
            .find(|x| x["name"] == c)
            .cloned()
    };
    let docs = render(&["ocm.enabled=true"]);
    let webhook = container(&docs, "webhook").expect("the delivery guard's webhook");
    let host = "placement-policy-ocm-webhook.placement-system.svc";
    let keys = "--ownership-secret=open-cluster-management-hub/placement-policy-ocm-ownership";
    let flags = args(&webhook);
    for flag in [
        "--kubeconfig=/etc/ocm/kubeconfig".to_owned(),
        "--opa-url=http://127.0.0.1:8181".to_owned(),
        "--policy-namespace=kube-federation-scheduling-policy".to_owned(),
        keys.to_owned(),
        "--tls-secret=open-cluster-management-hub/placement-policy-ocm-webhook-tls".to_owned(),
        format!("--tls-dns-name={host}"),
        "--register-configuration=/etc/placement/ocm-webhook/delivery.yaml".to_owned(),
    ] {
        assert!(flags.contains(&flag), "{flag} in {flags:?}");
    }
    let sync = container(&docs, "placement-sync").expect("placement-sync container");
    assert!(args(&sync).contains(&keys.to_owned()), "{:?}", args(&sync));
    let deployment = named(&docs, "Deployment", name);
    let service = named(&docs, "Service", "placement-policy-ocm-webhook");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let configmap = named(
        &docs,
        "ConfigMap",
        "placement-policy-ocm-webhook-configuration",
    );
    let configuration: Value =
        yaml_serde::from_str(configmap["data"]["delivery.yaml"].as_str().unwrap())
            .expect("the configuration parses");
    assert_eq!(configuration["kind"], "ValidatingWebhookConfiguration");
    assert_eq!(
        configuration["metadata"]["name"],
        "placement-policy-ocm-delivery"
    );
    let without_client = |configuration: &Value| -> Vec<Value> {
        configuration["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|hook| {
                let mut hook = hook.clone();
                hook.as_object_mut().map(|h| h.remove("clientConfig"));
                hook
            })
            .collect()
    };
    let bed = placement_tests::ocm::delivery::delivery_configuration(
        "bed",
        "https://127.0.0.1:1/validate",
        placement_certs::Ca::generate("bed").unwrap().cert_pem(),
    );
    assert_eq!(
        without_client(&configuration),
        without_client(&bed),
        "the chart registers what the OCM test bed tests"
    );
    for hook in configuration["webhooks"].as_array().into_iter().flatten() {
        assert_eq!(
            hook["clientConfig"]["url"],
            format!("https://{host}:443/validate")
        );
    }
    // A configuration the hub's API server (a kube-apiserver) accepts.
    let plane = ControlPlane::shared();
    let accepted = plane.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        &configuration.to_string(),
    );
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    let elsewhere = render(&["ocm.enabled=true", "ocm.webhookHost=guard.hub.example"]);
    let flags = args(&container(&elsewhere, "webhook").expect("webhook"));
    assert!(flags.contains(&"--tls-dns-name=guard.hub.example".to_owned()));

    // The hub's permissions: its configuration, the decisions its warnings
    // read, its Secrets in ocm.namespace.
    let text = std::fs::read_to_string(
        placement_tests::repo_root().join("charts/placement-policy/files/ocm-hub-clusterrole.yaml"),
    )
    .expect("read the hub permissions");
    let roles = placement_tests::kubectl::yaml_documents(&text);
    let grants = |kind: &str, resource: &str, verb: &str| {
        roles.iter().filter(|r| r["kind"] == kind).any(|r| {
            r["rules"].as_array().into_iter().flatten().any(|rule| {
                rule["resources"]
                    .as_array()
                    .is_some_and(|x| x.contains(&json!(resource)))
                    && rule["verbs"]
                        .as_array()
                        .is_some_and(|x| x.contains(&json!(verb)))
            })
        })
    };
    assert!(grants(
        "ClusterRole",
        "validatingwebhookconfigurations",
        "patch"
    ));
    assert!(grants("ClusterRole", "placementdecisions", "list"));
    assert!(grants("ClusterRole", "events", "create"));
    assert!(grants("Role", "secrets", "create"));
    assert!(grants("Role", "leases", "update"));
    assert!(roles.iter().any(
        |r| r["kind"] == "Role" && r["metadata"]["namespace"] == "open-cluster-management-hub"
    ));

    let off = render(&["ocm.enabled=true", "ocm.deliveryGuard=false"]);
    assert!(container(&off, "webhook").is_none());
    assert!(
        !off.iter()
            .any(|d| d["kind"] == "Service"
                && d["metadata"]["name"] == "placement-policy-ocm-webhook")
    );
    let flags = args(&container(&off, "placement-sync").expect("placement-sync"));
    assert!(
        !flags.iter().any(|f| f.starts_with("--ownership-")),
        "without the guard, no keys: {flags:?}"
    );
}

/// `policy.weighting` fills the shipped policy's settings module; anything
/// but `even` or `least-loaded` fails the render.
#[test]
fn the_shipped_policys_weighting_is_a_value() {
    let settings = |values: &[&str]| {
        let docs = render(values);
        named(&docs, "ConfigMap", "placement")["data"]["placement_settings.rego"]
            .as_str()
            .expect("the settings module")
            .to_owned()
    };
    assert!(settings(&[]).contains("weighting := \"even\""));
    assert!(settings(&["policy.weighting=least-loaded"]).contains("weighting := \"least-loaded\""));
    refused(
        "policy.weighting=cheapest",
        "policy.weighting must be even or least-loaded",
    );
}

/// `policy.trustClusterClaims` makes the shipped settings trust clusters' own
/// region claims (off by default); `policy.ownerNamespaces` and
/// `policy.ownedPackages` reach every placement-sync as the owners' flags.
#[test]
fn the_shipped_policys_trust_and_package_owners_are_values() {
    let settings = |values: &[&str]| {
        let docs = render(values);
        named(&docs, "ConfigMap", "placement")["data"]["placement_settings.rego"]
            .as_str()
            .expect("the settings module")
            .to_owned()
    };
    assert!(settings(&[]).contains("\ntrust_cluster_claims := false\n"));
    assert!(
        settings(&["policy.trustClusterClaims=true"]).contains("\ntrust_cluster_claims := true\n")
    );
    let sync_flags = |docs: &[Value]| -> Vec<Vec<String>> {
        docs.iter()
            .filter(|d| d["kind"] == "Deployment")
            .flat_map(containers)
            .filter(|c| c["name"] == "placement-sync")
            .map(args)
            .collect()
    };
    let plain = sync_flags(&render(&[]));
    assert_eq!(
        plain.len(),
        2,
        "the webhook's and the remediator's: {plain:?}"
    );
    assert!(
        plain
            .iter()
            .flatten()
            .all(|f| !f.starts_with("--package-owner-namespaces")
                && !f.starts_with("--owned-packages")),
        "{plain:?}"
    );
    let owned = sync_flags(&render(&[
        "policy.ownerNamespaces={platform,security}",
        "policy.ownedPackages={acme.rules}",
    ]));
    assert_eq!(owned.len(), 2, "{owned:?}");
    for flags in &owned {
        assert!(
            flags.contains(&"--package-owner-namespaces=platform,security".to_owned())
                && flags.contains(&"--owned-packages=acme.rules".to_owned()),
            "{flags:?}"
        );
    }
}

/// The webhook's pod is gated only on the webhook: neither OPA being empty nor
/// the sidecar being out of sync makes the Service lose its endpoints (which,
/// with `failurePolicy: Fail`, would deny every write with or without
/// policies).
#[test]
fn webhook_readiness_never_waits_for_the_engine() {
    let docs = render(&[]);
    let webhook = named(&docs, "Deployment", "placement-policy-webhook");
    let names: Vec<&str> = containers(webhook)
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["webhook", "opa", "placement-sync"],
        "the webhook's pod, whose readiness is checked"
    );
    for container in containers(webhook) {
        let probe = &container["readinessProbe"];
        match container["name"].as_str() {
            Some("webhook") => assert_eq!(probe["httpGet"]["path"], "/readyz"),
            // A hung OPA is restarted, never taken out of the Service.
            Some("opa") => {
                assert!(probe.is_null(), "OPA gates nothing: {probe}");
                assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/health");
                // ... and outlives the webhook when the pod terminates.
                let outlives = container["lifecycle"]["preStop"]["sleep"]["seconds"]
                    .as_u64()
                    .unwrap_or(0);
                assert!(outlives >= 10, "OPA stays {outlives}s after SIGTERM");
            }
            Some("placement-sync") => {
                assert!(probe.is_null(), "the sidecar gates nothing: {probe}");
                assert!(args(container).contains(&"--remediation=off".to_owned()));
            }
            other => panic!("unexpected container {other:?}"),
        }
    }
}

/// Both webhook configurations say the same thing: what is evaluated, that
/// objects being deleted never are, and that Events are the only side effect.
#[test]
fn webhook_configurations_tell_the_truth_and_skip_deletions() {
    let docs = render(&["scope.excludedNamespaces={kube-system,team-x}"]);
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let configuration = named(&docs, kind, "placement-policy");
        let hook = &configuration["webhooks"][0];
        assert_eq!(hook["sideEffects"], "NoneOnDryRun", "{kind}");
        assert_eq!(hook["failurePolicy"], "Fail", "{kind}");
        assert_eq!(
            hook["matchConditions"][0]["expression"], "!has(object.metadata.deletionTimestamp)",
            "{kind}"
        );
        let excluded = &hook["namespaceSelector"]["matchExpressions"][0]["values"];
        for ns in [
            "placement-system",
            "kube-federation-scheduling-policy",
            "kube-system",
            "team-x",
        ] {
            assert!(
                excluded.as_array().unwrap().iter().any(|v| v == ns),
                "{kind} excludes {ns}: {excluded}"
            );
        }
        assert!(
            hook["clientConfig"].get("caBundle").is_none(),
            "{kind}: the webhook writes its own caBundle"
        );
    }
    let webhook = named(&docs, "Deployment", "placement-policy-webhook");
    let flags = args(containers(webhook)[0]);
    assert!(
        flags.contains(
            &"--inject-ca-into=mutatingwebhookconfigurations/placement-policy".to_owned()
        )
    );
    assert!(
        flags.contains(
            &"--inject-ca-into=validatingwebhookconfigurations/placement-policy".to_owned()
        )
    );
    assert!(
        flags.contains(&"--tls-secret=placement-system/placement-policy-webhook-tls".to_owned())
    );
}

/// Least privilege: fixed objects are named; the webhook may not touch
/// workloads; only the remediator may patch them.
#[test]
fn rbac_names_fixed_objects_and_splits_the_webhook_from_the_remediator() {
    let docs = render(&[]);
    // A role without rules grants nothing, and each check of its rules would
    // pass on none: every role checked here has rules.
    let rules = |kind: &str, name: &str| -> Vec<Value> {
        let rules = named(&docs, kind, name)["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(!rules.is_empty(), "{kind} {name} renders no rules");
        rules
    };
    for (role, object) in [
        (
            "placement-policy-webhook-tls",
            "placement-policy-webhook-tls",
        ),
        (
            "placement-policy-remediator-lease",
            "placement-policy-remediator",
        ),
        ("placement-policy-ownership", "placement-policy-ownership"),
        (
            "placement-policy-remediator-ownership",
            "placement-policy-ownership",
        ),
    ] {
        for rule in rules("Role", role) {
            // Recreating the Secret when it was deleted: the API server
            // cannot limit a create to one name.
            if rule["verbs"] == json!(["create"]) {
                assert_eq!(
                    role, "placement-policy-ownership",
                    "only the webhook creates it"
                );
                continue;
            }
            assert_eq!(
                rule["resourceNames"],
                serde_json::json!([object]),
                "{role} names {object} alone: {rule}"
            );
        }
    }
    let remediator_reads: Vec<Value> = rules("Role", "placement-policy-remediator-ownership");
    assert!(
        !remediator_reads[0]["verbs"].to_string().contains("update"),
        "the remediator only reads the ownership keys"
    );
    for rule in rules("ClusterRole", "placement-policy-webhook") {
        let verbs = rule["verbs"].to_string();
        assert!(
            !verbs.contains("patch")
                || rule["resourceNames"].is_array()
                || rule["resources"][0] == "events",
            "the webhook patches only named objects and Events: {rule}"
        );
        assert!(
            !rule["resources"].to_string().contains("replicasets"),
            "{rule}"
        );
    }
    let remediator = rules("ClusterRole", "placement-policy-remediator");
    assert!(
        remediator.iter().any(|r| r["resources"][0] == "replicasets"
            && r["verbs"].as_array().unwrap().iter().any(|v| v == "patch")),
        "{remediator:?}"
    );

    // The last good policy set has one writer (issue 30, part 6): the
    // remediator; the webhook pods read it. Without a remediator the webhook
    // pod's placement-sync is the writer.
    let last_good = "placement-policy-last-good-policies";
    let subjects = |docs: &[Value], binding: &str| -> Vec<String> {
        named(docs, "RoleBinding", binding)["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(
        subjects(&docs, last_good),
        ["placement-policy-remediator"],
        "who writes the last good set"
    );
    assert_eq!(
        rules("Role", last_good)[0]["verbs"],
        json!(["get", "patch"])
    );
    assert_eq!(
        subjects(&docs, "placement-policy-last-good-policies-read"),
        ["placement-policy-webhook"]
    );
    let read = rules("Role", "placement-policy-last-good-policies-read");
    assert_eq!(read[0]["verbs"], json!(["get"]));
    assert_eq!(read[0]["resourceNames"], json!([last_good]));
    let sync_args = |docs: &[Value]| {
        let webhook = named(docs, "Deployment", "placement-policy-webhook");
        let sync = containers(webhook)
            .into_iter()
            .find(|c| c["name"] == "placement-sync")
            .expect("the webhook pod's placement-sync");
        args(sync)
    };
    assert!(
        sync_args(&docs).contains(&"--last-good-policies-read-only".to_owned()),
        "{:?}",
        sync_args(&docs)
    );
    let alone = render(&["remediator.enabled=false"]);
    assert_eq!(
        subjects(&alone, last_good),
        ["placement-policy-webhook"],
        "without a remediator the webhook pods keep it"
    );
    assert!(!sync_args(&alone).contains(&"--last-good-policies-read-only".to_owned()));
    assert!(
        alone
            .iter()
            .all(|d| d["metadata"]["name"] != "placement-policy-last-good-policies-read")
    );
}

#[test]
fn cert_manager_mode_uses_a_certificate_and_ca_injection() {
    let docs = render(&["webhook.certificates.mode=cert-manager"]);
    let certificate = named(&docs, "Certificate", "placement-policy-webhook");
    assert_eq!(
        certificate["spec"]["secretName"],
        "placement-policy-webhook-tls"
    );
    assert_eq!(
        certificate["spec"]["dnsNames"][0],
        "placement-policy-webhook.placement-system.svc"
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(
            named(&docs, kind, "placement-policy")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "placement-system/placement-policy-webhook"
        );
    }
    let webhook = named(&docs, "Deployment", "placement-policy-webhook");
    let flags = args(containers(webhook)[0]);
    assert!(flags.contains(&"--tls-cert=/etc/placement/tls/tls.crt".to_owned()));
    assert!(!flags.iter().any(|f| f.starts_with("--tls-secret")));
    let secrets: Vec<&str> = of_kind(&docs, "Secret")
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    // The serving certificate's Secret is cert-manager's; the chart only
    // keeps the (empty, webhook-filled) ownership-key Secret.
    assert_eq!(
        secrets,
        ["placement-policy-ownership"],
        "cert-manager makes the TLS Secret"
    );
}

#[test]
fn the_blast_radius_guard_is_configured_from_values() {
    let remediator_flags = |docs: &[Value]| {
        let remediator = named(docs, "Deployment", "placement-policy-remediator");
        let sync = containers(remediator)
            .into_iter()
            .find(|c| c["name"] == "placement-sync")
            .expect("placement-sync container");
        args(sync)
    };
    let defaults = remediator_flags(&render(&[]));
    assert!(
        defaults.contains(&"--remediation-hold-share=0.5".to_owned()),
        "{defaults:?}"
    );
    assert!(
        defaults.contains(&"--remediation-hold-min=10".to_owned()),
        "{defaults:?}"
    );
    for flag in [
        "--remediation-partition-threshold=0.55",
        "--remediation-partition-window=60s",
    ] {
        assert!(defaults.contains(&flag.to_owned()), "{defaults:?}");
    }
    let set = remediator_flags(&render(&[
        "remediator.holdShare=1",
        "remediator.holdMin=3",
        "remediator.partitionThreshold=0.8",
        "remediator.partitionWindow=2m",
    ]));
    for flag in [
        "--remediation-partition-threshold=0.8",
        "--remediation-partition-window=2m",
    ] {
        assert!(set.contains(&flag.to_owned()), "{set:?}");
    }
    assert!(
        set.contains(&"--remediation-hold-share=1".to_owned()),
        "{set:?}"
    );
    assert!(
        set.contains(&"--remediation-hold-min=3".to_owned()),
        "{set:?}"
    );
}

#[test]
fn embedded_engine_mode_runs_the_webhook_alone_on_the_shipped_policy() {
    let docs = render(&["engine.type=embedded"]);
    let webhook = named(&docs, "Deployment", "placement-policy-webhook");
    let names: Vec<_> = containers(webhook)
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, ["webhook"]);
    assert!(
        args(containers(webhook)[0]).contains(&"--policy-dir=/etc/placement/policies".to_owned())
    );
    let policy = named(&docs, "ConfigMap", "placement-policy-embedded-policy");
    assert!(policy["data"]["placement.rego"].is_string());
    assert!(
        !docs
            .iter()
            .any(|d| d["metadata"]["name"] == "placement-policy-remediator"),
        "no remediator without OPA"
    );
}

#[test]
fn bad_values_are_named_errors() {
    refused("engine.type=wasm", "engine.type must be opa or embedded");
}

/// What `kubectl apply -f deploy/` sends is accepted by a real API server
/// (schema, defaults, admission), checked with a server-side dry run.
#[test]
fn deploy_is_accepted_by_the_api_server() {
    let plane = ControlPlane::shared();
    let deploy = repo_root().join("deploy/placement-policy.yaml");
    let out = plane.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        &deploy.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "deploy/placement-policy.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created = String::from_utf8_lossy(&out.stdout);
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
        "deployment.apps/placement-policy-webhook",
        "deployment.apps/placement-policy-remediator",
        "poddisruptionbudget",
    ] {
        assert!(created.contains(kind), "{kind} in {created}");
    }
}

/// The webhook and the remediator act on one set of objects: what the webhook
/// configurations select is what the remediator is told to remediate.
#[test]
fn webhook_and_remediator_act_on_the_same_set() {
    let docs = render(&[
        "scope.excludedNamespaces={team-x}",
        "scope.namespaceSelector.matchLabels.placement=enabled",
        "scope.objectSelector.matchLabels.tier=web",
        "scope.resources={apps/v1/replicasets}",
    ]);
    let remediator = named(&docs, "Deployment", "placement-policy-remediator");
    let sync = containers(remediator)
        .into_iter()
        .find(|c| c["name"] == "placement-sync")
        .expect("the remediator's sidecar");
    let flags = args(sync);
    for flag in [
        "--scope-exclude-namespaces=placement-system,kube-federation-scheduling-policy,team-x",
        "--scope-namespace-selector=placement=enabled",
        "--scope-object-selector=tier=web",
        "--remediate=apps/v1/replicasets",
    ] {
        assert!(flags.contains(&flag.to_owned()), "{flag} in {flags:?}");
    }
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let hook = &named(&docs, kind, "placement-policy")["webhooks"][0];
        assert_eq!(
            hook["namespaceSelector"]["matchLabels"]["placement"], "enabled",
            "{kind}"
        );
        assert_eq!(
            hook["objectSelector"]["matchLabels"]["tier"], "web",
            "{kind}"
        );
        assert_eq!(
            hook["namespaceSelector"]["matchExpressions"][0]["values"],
            serde_json::json!([
                "placement-system",
                "kube-federation-scheduling-policy",
                "team-x"
            ]),
            "{kind}"
        );
        assert_eq!(hook["rules"].as_array().map(Vec::len), Some(1), "{kind}");
        assert_eq!(hook["rules"][0]["resources"][0], "replicasets", "{kind}");
    }
    let role = named(&docs, "ClusterRole", "placement-policy-remediator");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"][0] == "namespaces"),
        "the remediator may see the namespaces the selector admits"
    );
}

/// Who may talk to the webhook: with `webhook.clientCA` it requires a client
/// certificate of that CA (mounted from the ConfigMap); with `networkPolicy`
/// only the named sources reach its ports; both are off by default, and a
/// NetworkPolicy naming no source of the API server's calls is refused.
#[test]
fn who_may_reach_the_webhook_is_a_value() {
    let webhook = |docs: &[Value]| named(docs, "Deployment", "placement-policy-webhook").clone();
    let defaults = render(&[]);
    assert!(of_kind(&defaults, "NetworkPolicy").is_empty());
    let container = containers(&webhook(&defaults))[0].clone();
    assert!(
        !args(&container)
            .iter()
            .any(|a| a.starts_with("--client-ca-file")),
        "{container}"
    );

    let docs = render(&[
        "webhook.clientCA.configMap=apiserver-client-ca",
        "networkPolicy.enabled=true",
        "networkPolicy.admissionFrom[0].ipBlock.cidr=10.0.0.0/24",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
    ]);
    let deployment = webhook(&docs);
    let container = containers(&deployment)[0].clone();
    assert!(
        args(&container).contains(&"--client-ca-file=/etc/placement/client-ca/ca.crt".to_owned()),
        "{container}"
    );
    let mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["name"] == "client-ca" && m["mountPath"] == "/etc/placement/client-ca");
    assert!(mounted, "{container}");
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "client-ca")
        .cloned();
    assert_eq!(
        volume.map(|v| v["configMap"]["name"].clone()),
        Some(json!("apiserver-client-ca"))
    );

    let policy = named(&docs, "NetworkPolicy", "placement-policy-webhook");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
        "the NetworkPolicy selects exactly the webhook's pods"
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"port": 8443, "protocol": "TCP"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}], "ports": [{"port": 9090, "protocol": "TCP"}]}
        ])
    );

    // A NetworkPolicy the API server accepts (in a namespace of its own).
    let plane = ControlPlane::shared();
    // Another test may have made it already.
    let _ = plane.kubectl(&["create", "namespace", "placement-system"]);
    let accepted = plane.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        &policy.to_string(),
    );
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );

    refused(
        "networkPolicy.enabled=true",
        "networkPolicy.enabled needs networkPolicy.admissionFrom",
    );
}

/// The Karmada guardrail's pods verify Karmada's API server (issue 39): with
/// `karmada.clientCA` the webhook container gets `--client-ca-file` of the
/// CA's key alone (from a ConfigMap, or from a Secret without its other
/// keys), and with `networkPolicy` a NetworkPolicy of their own selects
/// them, letting only `karmadaAdmissionFrom` reach the guardrail's port;
/// neither by default, and a NetworkPolicy naming no source of Karmada's
/// API server is refused.
#[test]
fn the_guardrail_verifies_karmadas_api_server() {
    let scheduler =
        |docs: &[Value]| named(docs, "Deployment", "placement-policy-karmada-scheduler").clone();
    let webhook_container = |deployment: &Value| {
        containers(deployment)
            .into_iter()
            .find(|c| c["name"] == "webhook")
            .expect("the guardrail's webhook container")
            .clone()
    };
    let client_ca_volume = |deployment: &Value| {
        deployment["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "karmada-client-ca")
            .cloned()
    };
    let defaults = render(&["karmada.enabled=true"]);
    let container = webhook_container(&scheduler(&defaults));
    assert!(
        !args(&container)
            .iter()
            .any(|a| a.starts_with("--client-ca-file")),
        "{container}"
    );

    let docs = render(&[
        "karmada.enabled=true",
        "karmada.clientCA.configMap=karmada-front-proxy-ca",
        "networkPolicy.enabled=true",
        "networkPolicy.admissionFrom[0].ipBlock.cidr=10.0.0.0/24",
        "networkPolicy.karmadaAdmissionFrom[0].podSelector.matchLabels.app=karmada-apiserver",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
    ]);
    let deployment = scheduler(&docs);
    let container = webhook_container(&deployment);
    assert!(
        args(&container)
            .contains(&"--client-ca-file=/etc/placement/karmada-client-ca/ca.crt".to_owned()),
        "{container}"
    );
    let mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| {
            m["name"] == "karmada-client-ca" && m["mountPath"] == "/etc/placement/karmada-client-ca"
        });
    assert!(mounted, "{container}");
    assert_eq!(
        client_ca_volume(&deployment),
        Some(json!({
            "name": "karmada-client-ca",
            "configMap": {"name": "karmada-front-proxy-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
        }))
    );
    // From a Secret of Karmada's certificates: its CA's key alone.
    let from_secret = render(&[
        "karmada.enabled=true",
        "karmada.clientCA.secret=karmada-cert",
        "karmada.clientCA.key=front-proxy-ca.crt",
    ]);
    assert_eq!(
        client_ca_volume(&scheduler(&from_secret)),
        Some(json!({
            "name": "karmada-client-ca",
            "secret": {"secretName": "karmada-cert", "items": [{"key": "front-proxy-ca.crt", "path": "ca.crt"}]}
        }))
    );

    let policy = named(&docs, "NetworkPolicy", "placement-policy-karmada");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
        "the NetworkPolicy selects exactly the Karmada pods"
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            {"from": [{"podSelector": {"matchLabels": {"app": "karmada-apiserver"}}}], "ports": [{"port": 8443, "protocol": "TCP"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}], "ports": [{"port": 9090, "protocol": "TCP"}, {"port": 8182, "protocol": "TCP"}]}
        ])
    );
    // The webhook pods' own NetworkPolicy is unchanged beside it.
    let webhook_policy = named(&docs, "NetworkPolicy", "placement-policy-webhook");
    assert_ne!(
        webhook_policy["spec"]["podSelector"],
        policy["spec"]["podSelector"]
    );
    // Both accepted by the API server (in a namespace of its own).
    let plane = ControlPlane::shared();
    // Another test may have made it already.
    let _ = plane.kubectl(&["create", "namespace", "placement-system"]);
    for object in [policy, &deployment] {
        let accepted = plane.kubectl_stdin(
            &["apply", "--dry-run=server", "-f", "-"],
            &object.to_string(),
        );
        assert!(
            accepted.status.success(),
            "{}",
            String::from_utf8_lossy(&accepted.stderr)
        );
    }

    refused(
        "karmada.enabled=true,networkPolicy.enabled=true,networkPolicy.admissionFrom[0].ipBlock.cidr=10.0.0.0/24",
        "networkPolicy.enabled with karmada.guardrail needs networkPolicy.karmadaAdmissionFrom",
    );
    refused(
        "karmada.enabled=true,karmada.clientCA.configMap=a,karmada.clientCA.secret=b",
        "karmada.clientCA names a ConfigMap or a Secret",
    );
    refused(
        "karmada.enabled=true,karmada.guardrail=false,karmada.clientCA.configMap=a",
        "karmada.clientCA is the CA of the client certificate Karmada's API server presents",
    );
}

/// Where the kubelet and client libraries put a pod's API credentials.
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Whether `container` of `deployment` gets a service-account token: a mount
/// at the token path, or of a volume with a service-account token in it.
fn gets_a_token(deployment: &Value, container: &Value) -> bool {
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let has_token = |name: &Value| {
        volumes.iter().any(|v| {
            v["name"] == *name
                && (v["secret"].is_object()
                    && v["secret"]["secretName"]
                        .as_str()
                        .is_some_and(|s| s.contains("token"))
                    || v["projected"]["sources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| s["serviceAccountToken"].is_object()))
        })
    };
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["mountPath"].as_str() == Some(TOKEN_PATH) || has_token(&m["name"]))
}

/// Tokens per container: no pod automounts its account's token (which every
/// container would get); the containers that call the API server (the
/// webhook, placement-sync) mount a bound token with the cluster's CA and the
/// namespace at the usual path, and OPA, which evaluates what tenants write,
/// gets none. The accounts themselves do not automount either.
#[test]
fn only_the_containers_that_call_the_api_get_a_token() {
    for values in [
        &[][..],
        &["policy.namespaces={*}"][..],
        &["engine.type=embedded"][..],
        &[
            "webhook.certificates.mode=cert-manager",
            "webhook.clientCA.configMap=apiserver-client-ca",
        ][..],
        &["karmada.enabled=true"][..],
        &["ocm.enabled=true"][..],
    ] {
        let docs = render(values);
        for account in of_kind(&docs, "ServiceAccount") {
            assert_eq!(
                account["automountServiceAccountToken"], false,
                "{values:?}: {account}"
            );
        }
        let deployments = of_kind(&docs, "Deployment");
        assert!(!deployments.is_empty(), "{values:?}");
        let mut with_token = 0;
        for deployment in deployments {
            let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
            let pod = &deployment["spec"]["template"]["spec"];
            assert_eq!(
                pod["automountServiceAccountToken"], false,
                "{name} {values:?}: the pod automounts no token"
            );
            for container in containers(deployment) {
                let c = container["name"].as_str().unwrap_or_default();
                let expected = match (name, c) {
                    (_, "opa") => false,
                    // Karmada's API server, through the kubeconfig Secret.
                    ("placement-policy-karmada-scheduler", _) => false,
                    // The OCM hub, through the kubeconfig Secret.
                    ("placement-policy-ocm-decider", _) => false,
                    (_, "webhook" | "placement-sync") => true,
                    other => panic!("unexpected container {other:?}"),
                };
                assert_eq!(
                    gets_a_token(deployment, container),
                    expected,
                    "{name}/{c} {values:?}: {container}"
                );
                if expected {
                    with_token += 1;
                    let mount = container["volumeMounts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|m| m["mountPath"] == TOKEN_PATH)
                        .unwrap_or_else(|| panic!("{name}/{c}: no mount at {TOKEN_PATH}"));
                    assert_eq!(mount["readOnly"], true, "{name}/{c}");
                    let volume = pod["volumes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|v| v["name"] == mount["name"])
                        .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
                    let sources = &volume["projected"]["sources"];
                    let token = &sources[0]["serviceAccountToken"];
                    assert_eq!(token["path"], "token", "{volume}");
                    assert!(
                        token["expirationSeconds"].as_u64().unwrap_or(u64::MAX) <= 3607,
                        "a short-lived token: {volume}"
                    );
                    assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
                    assert_eq!(sources[1]["configMap"]["items"][0]["path"], "ca.crt");
                    assert_eq!(
                        sources[2]["downwardAPI"]["items"][0],
                        json!({"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}})
                    );
                }
            }
        }
        assert!(with_token > 0, "{values:?}: some container calls the API");
    }
}

/// The accounts (as API users) that a ClusterRoleBinding of `docs` lets
/// write ConfigMaps in every namespace.
fn cluster_configmap_writers(docs: &[Value], namespace: &str) -> Vec<String> {
    let writes = |rule: &Value| {
        let any = |field: &str, values: &[&str]| {
            rule[field]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| values.iter().any(|w| v == w))
        };
        any("apiGroups", &["", "*"])
            && any("resources", &["configmaps", "*"])
            && any("verbs", &["patch", "update", "create", "delete", "*"])
            && rule["resourceNames"].is_null()
    };
    let mut writers: Vec<String> = Vec::new();
    for binding in of_kind(docs, "ClusterRoleBinding") {
        let role = named(
            docs,
            "ClusterRole",
            binding["roleRef"]["name"].as_str().unwrap_or_default(),
        );
        if role["rules"].as_array().into_iter().flatten().any(writes) {
            for subject in binding["subjects"].as_array().into_iter().flatten() {
                assert_eq!(subject["kind"], "ServiceAccount", "{binding}");
                writers.push(format!(
                    "system:serviceaccount:{namespace}:{}",
                    subject["name"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    writers.sort();
    writers
}

/// ConfigMaps in every namespace (`policy.namespaces: ["*"]`), least
/// privilege: RBAC cannot limit the status writes of placement-sync to
/// labelled ConfigMaps or to their status annotations, so every account of
/// the release that may write ConfigMaps cluster-wide is held by a
/// ValidatingAdmissionPolicy; the real API server then lets it change the
/// status annotations of policy and data ConfigMaps (and the last good set),
/// and refuses any other change, of a labelled ConfigMap or not.
#[test]
fn with_every_namespace_configmap_writes_are_bounded_by_the_api_server() {
    let (release, namespace, policies, tenant) = (
        "pp-bounds",
        "pp-bounds",
        "pp-bounds-policies",
        "pp-bounds-tenant",
    );
    let docs = render_release(
        release,
        namespace,
        &[
            "policy.namespaces={*}",
            &format!("policy.namespace={policies}"),
        ],
    );
    let account = |name: &str| format!("system:serviceaccount:{namespace}:{name}");

    // Who may write ConfigMaps cluster-wide: with the embedded engine
    // nobody (the webhook only watches them).
    let embedded = render_release(
        release,
        namespace,
        &["policy.namespaces={*}", "engine.type=embedded"],
    );
    assert_eq!(
        cluster_configmap_writers(&embedded, namespace),
        Vec::<String>::new()
    );
    let cluster_writers = cluster_configmap_writers(&docs, namespace);
    // Both placement-sync sidecars write the status, so both accounts patch
    // ConfigMaps cluster-wide: what is bounded below.
    assert_eq!(
        cluster_writers,
        [
            account("pp-bounds-remediator"),
            account("pp-bounds-webhook")
        ],
        "who may write ConfigMaps in every namespace"
    );
    let vap = named(
        &docs,
        "ValidatingAdmissionPolicy",
        "pp-bounds-configmap-writes",
    );
    assert_eq!(vap["spec"]["failurePolicy"], "Fail", "{vap}");
    let rule = &vap["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["resources"], json!(["configmaps"]), "{vap}");
    assert_eq!(
        rule["operations"],
        json!(["CREATE", "UPDATE", "DELETE"]),
        "{vap}"
    );
    let conditions = vap["spec"]["matchConditions"].to_string();
    for writer in &cluster_writers {
        assert!(
            conditions.contains(writer.as_str()),
            "{writer}: {conditions}"
        );
    }
    let binding = named(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "pp-bounds-configmap-writes",
    );
    assert_eq!(binding["spec"]["policyName"], "pp-bounds-configmap-writes");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(
        binding["spec"]["matchResources"].is_null(),
        "every namespace: {binding}"
    );

    // The real API server: the release's accounts, roles and policy (not its
    // workloads or webhook configurations), and ConfigMaps to write.
    let plane = ControlPlane::shared();
    plane.create_namespace(namespace);
    plane.create_namespace(tenant);
    let objects: Vec<Value> = docs
        .iter()
        .filter(|d| {
            [
                "Namespace",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "ConfigMap",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .iter()
            .any(|k| d["kind"] == *k)
        })
        .cloned()
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
    assert!(
        out.status.success(),
        "apply the release's RBAC: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let configmap = |ns: &str, name: &str, labels: Value| {
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                         "annotations": {"team": "a"}},
            "data": {"main.rego": "package a"},
        });
        let out = plane.kubectl_stdin(&["apply", "-f", "-"], &cm.to_string());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    configmap(
        tenant,
        "policy",
        json!({"openpolicyagent.org/policy": "rego"}),
    );
    configmap(tenant, "data", json!({"openpolicyagent.org/data": "opa"}));
    configmap(tenant, "plain", json!({}));
    configmap(
        tenant,
        "wrong-value",
        json!({"openpolicyagent.org/policy": "yaml"}),
    );
    configmap(policies, "unlabelled-policy", json!({}));

    let status = |n: u32| json!({"metadata": {"annotations": {"placement-policy.io/policy-status": format!("{{\"status\":\"ok\",\"n\":{n}}}")}}});
    let patch = |who: &str, ns: &str, name: &str, patch: &Value| {
        let mut args = vec!["patch", "configmap", name, "-n", ns, "--type=merge", "-p"];
        let patch = patch.to_string();
        args.push(&patch);
        let who = who.to_owned();
        let mut args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        if !who.is_empty() {
            args.push(format!("--as={who}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        plane.kubectl(&args)
    };
    let webhook = account("pp-bounds-webhook");
    let remediator = account("pp-bounds-remediator");
    // RBAC lets both patch any ConfigMap anywhere: each refusal below is the
    // policy's, not RBAC's.
    for who in [&webhook, &remediator] {
        for ns in [tenant, policies, "default"] {
            let out = plane.kubectl(&[
                "auth",
                "can-i",
                "patch",
                "configmaps",
                "-n",
                ns,
                &format!("--as={who}"),
            ]);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "yes",
                "{who} in {ns}"
            );
        }
    }
    let refused_by_policy = |out: &std::process::Output, what: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} was allowed");
        assert!(
            stderr.contains("ValidatingAdmissionPolicy")
                && stderr.contains("pp-bounds-configmap-writes"),
            "{what}: refused, but not by the policy: {stderr}"
        );
    };
    // The policy is in force once the API server has loaded it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = patch(&webhook, tenant, "plain", &json!({"data": {"x": "y"}}));
        if !out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the policy was not in force after 30 s: the webhook's account changed an unlabelled ConfigMap"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    let mut n = 0;
    for who in [&webhook, &remediator] {
        // Refused: anything but the status annotations, and anything of a
        // ConfigMap that is no policy or data.
        for (ns, name, body, what) in [
            (
                tenant,
                "plain",
                status(0),
                "the status of an unlabelled ConfigMap",
            ),
            (
                tenant,
                "plain",
                json!({"data": {"x": "y"}}),
                "the data of an unlabelled ConfigMap",
            ),
            (
                tenant,
                "wrong-value",
                status(0),
                "the status of a ConfigMap labelled with another value",
            ),
            (
                tenant,
                "policy",
                json!({"data": {"main.rego": "package evil"}}),
                "a policy's Rego",
            ),
            (
                tenant,
                "policy",
                json!({"data": {"more.rego": "package evil"}}),
                "a module added to a policy",
            ),
            (
                tenant,
                "data",
                json!({"data": {"x": "y"}}),
                "a data ConfigMap's data",
            ),
            (
                tenant,
                "policy",
                json!({"metadata": {"labels": {"openpolicyagent.org/policy": null}}}),
                "a policy's label",
            ),
            (
                tenant,
                "policy",
                json!({"metadata": {"labels": {"extra": "x"}}}),
                "a label added to a policy",
            ),
            (
                tenant,
                "policy",
                json!({"metadata": {"annotations": {"team": "b"}}}),
                "another annotation",
            ),
            (
                tenant,
                "policy",
                json!({"metadata": {"annotations": {"team": null}}}),
                "another annotation removed",
            ),
            (
                tenant,
                "policy",
                json!({"metadata": {"annotations": {"placement-policy.io/confirm-remediation": "x"}}}),
                "a confirmation",
            ),
            (
                tenant,
                "policy",
                json!({"metadata": {"finalizers": ["example.com/hold"]}}),
                "a finalizer",
            ),
            (tenant, "policy", json!({"immutable": true}), "immutable"),
            (
                tenant,
                "policy",
                json!({"binaryData": {"b": "eA=="}}),
                "binary data",
            ),
            (
                policies,
                "unlabelled-policy",
                json!({"data": {"main.rego": "package evil"}}),
                "a policy's Rego in the policy namespace",
            ),
        ] {
            let out = patch(who, ns, name, &body);
            refused_by_policy(&out, &format!("{who}: {what} ({ns}/{name}, {body})"));
        }
        // Allowed: the status annotations (ours and kube-mgmt's) of policy and
        // data ConfigMaps, the held-change report and removing a used
        // confirmation.
        for (ns, name, body) in [
            (tenant, "policy", status(n)),
            (tenant, "data", status(n)),
            (policies, "unlabelled-policy", status(n)),
            (
                tenant,
                "policy",
                json!({"metadata": {"annotations": {
                    "openpolicyagent.org/kube-mgmt-status": format!("{{\"status\":\"ok\",\"n\":{n}}}"),
                    "openpolicyagent.org/kube-mgmt-retries": "0",
                }}}),
            ),
            (
                policies,
                "unlabelled-policy",
                json!({"metadata": {"annotations": {"placement-policy.io/remediation-held": format!("{{\"n\":{n}}}")}}}),
            ),
        ] {
            let out = patch(who, ns, name, &body);
            assert!(
                out.status.success(),
                "{who}: {ns}/{name} {body}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
        // A confirmation an administrator wrote is removed once used.
        let out = patch(
            "",
            policies,
            "unlabelled-policy",
            &json!({"metadata": {"annotations": {"placement-policy.io/confirm-remediation": "c1"}}}),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = patch(
            who,
            policies,
            "unlabelled-policy",
            &json!({"metadata": {"annotations": {"placement-policy.io/confirm-remediation": null}}}),
        );
        assert!(
            out.status.success(),
            "{who}: removing a confirmation: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Creating and deleting: RBAC grants neither, nor does the policy.
        let out = plane.kubectl(&[
            "delete",
            "configmap",
            "policy",
            "-n",
            tenant,
            &format!("--as={who}"),
        ]);
        assert!(!out.status.success(), "{who} deleted a policy");
    }
    // The last good policy set has one writer, the remediator: the webhook's
    // account (which the webhook's own container holds too) cannot put a
    // policy set in force.
    let kept = json!({"data": {"policy-set.json": "{\"n\":1}"}});
    let out = patch(
        &remediator,
        namespace,
        "pp-bounds-last-good-policies",
        &kept,
    );
    assert!(
        out.status.success(),
        "the remediator keeps the last good set: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = patch(&webhook, namespace, "pp-bounds-last-good-policies", &kept);
    refused_by_policy(&out, "the webhook's account: the last good policy set");
    // The policy holds the release's accounts only: an administrator still
    // edits any ConfigMap.
    let out = patch("", tenant, "plain", &json!({"data": {"x": "y"}}));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The webhook's account writes its CA into the release's webhook
/// configurations (RBAC: patch, by name); the real API server refuses it any
/// other change of them (another endpoint, wider rules or selectors, another
/// failure policy, a webhook added or removed, labels or annotations), which
/// would hand every write in the cluster to whoever holds its token. With
/// cert-manager the account has no right on them at all.
#[test]
fn the_webhooks_account_changes_only_the_ca_bundle_of_its_configurations() {
    let (release, namespace) = ("pp-cab", "pp-cab");
    let cert_manager = render_release(
        release,
        namespace,
        &["webhook.certificates.mode=cert-manager"],
    );
    assert!(
        !named(&cert_manager, "ClusterRole", "pp-cab-webhook")["rules"]
            .to_string()
            .contains("webhookconfigurations"),
        "with cert-manager the webhook writes no configuration"
    );
    let docs = render_release(release, namespace, &[]);
    let vap = named(
        &docs,
        "ValidatingAdmissionPolicy",
        "pp-cab-webhook-configuration-writes",
    );
    assert_eq!(vap["spec"]["failurePolicy"], "Fail", "{vap}");
    let binding = named(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "pp-cab-webhook-configuration-writes",
    );
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));

    let plane = ControlPlane::shared();
    plane.create_namespace(namespace);
    let objects: Vec<Value> = docs
        .iter()
        .filter(|d| {
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
                "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration",
            ]
            .iter()
            .any(|k| d["kind"] == *k)
        })
        .cloned()
        .map(|mut d| {
            // No request of another test may reach these (their Service does
            // not exist): they select no object.
            if d["kind"]
                .as_str()
                .unwrap_or_default()
                .ends_with("WebhookConfiguration")
            {
                d["webhooks"][0]["objectSelector"] =
                    json!({"matchLabels": {"pp-cab-selects": "nothing"}});
            }
            d
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let webhook = format!("--as=system:serviceaccount:{namespace}:pp-cab-webhook");
    let patch = |kind: &str, patch_type: &str, body: &Value, who: &str| {
        let body = body.to_string();
        let mut args = vec!["patch", kind, release, "--type", patch_type, "-p", &body];
        if !who.is_empty() {
            args.push(who);
        }
        plane.kubectl(&args)
    };
    let name = "placement.placement-policy.io";
    let ca =
        |n: u32| json!({"webhooks": [{"name": name, "clientConfig": {"caBundle": base64_pem(n)}}]});
    for kind in [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ] {
        let out = plane.kubectl(&[
            "auth",
            "can-i",
            "patch",
            &format!("{kind}/{release}"),
            &webhook,
        ]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes", "{kind}");
        // In force once the API server has loaded it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let evil =
            json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]);
        while patch(kind, "json", &evil, &webhook).status.success() {
            assert!(
                std::time::Instant::now() < deadline,
                "{kind}: the policy was not in force after 30 s"
            );
            // Undo, as the administrator.
            let undo =
                json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}]);
            assert!(patch(kind, "json", &undo, "").status.success());
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let pods = json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "secrets"], "operations": ["CREATE", "UPDATE"], "scope": "*"}]);
        let mut refused = vec![
            (
                "strategic",
                json!({"webhooks": [{"name": name, "clientConfig": {"service": {"name": "evil"}}}]}),
                "another Service",
            ),
            (
                "strategic",
                json!({"webhooks": [{"name": name, "clientConfig": {"service": null, "url": "https://evil.example/"}}]}),
                "a URL",
            ),
            (
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/rules", "value": pods}]),
                "wider rules",
            ),
            (
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]),
                "another failure policy",
            ),
            (
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {}}]),
                "every namespace",
            ),
            (
                "json",
                json!([{"op": "remove", "path": "/webhooks/0/objectSelector"}]),
                "every object",
            ),
            (
                "json",
                json!([{"op": "remove", "path": "/webhooks/0/matchConditions"}]),
                "no match conditions",
            ),
            (
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 30}]),
                "another timeout",
            ),
            (
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/sideEffects", "value": "None"}]),
                "other side effects",
            ),
            (
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/matchPolicy", "value": "Exact"}]),
                "another match policy",
            ),
            (
                "json",
                json!([{"op": "add", "path": "/webhooks/-", "value": {"name": "more.placement-policy.io", "admissionReviewVersions": ["v1"], "sideEffects": "None", "clientConfig": {"url": "https://evil.example/"}, "rules": pods}}]),
                "a webhook added",
            ),
            (
                "json",
                json!([{"op": "remove", "path": "/webhooks/0"}]),
                "the webhook removed",
            ),
            (
                "merge",
                json!({"metadata": {"labels": {"extra": "x"}}}),
                "a label",
            ),
            (
                "merge",
                json!({"metadata": {"annotations": {"cert-manager.io/inject-ca-from": "elsewhere/ca"}}}),
                "an annotation",
            ),
            (
                "merge",
                json!({"metadata": {"finalizers": ["example.com/hold"]}}),
                "a finalizer",
            ),
        ];
        if kind == "mutatingwebhookconfigurations" {
            refused.push((
                "json",
                json!([{"op": "replace", "path": "/webhooks/0/reinvocationPolicy", "value": "Never"}]),
                "another reinvocation policy",
            ));
        }
        for (patch_type, body, what) in refused {
            let out = patch(kind, patch_type, &body, &webhook);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{kind}: {what} was allowed");
            assert!(
                stderr.contains("ValidatingAdmissionPolicy")
                    && stderr.contains("pp-cab-webhook-configuration-writes"),
                "{kind}: {what}: refused, but not by the policy: {stderr}"
            );
        }
        // The caBundle, as the webhook writes it (a strategic merge patch
        // keyed by webhook name).
        for n in 0..2 {
            let out = patch(kind, "strategic", &ca(n), &webhook);
            assert!(
                out.status.success(),
                "{kind}: the caBundle: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // An administrator is not held.
        let out = patch(
            kind,
            "merge",
            &json!({"metadata": {"labels": {"extra": "x"}}}),
            "",
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A caBundle value (base64 of a PEM block; its content does not matter
/// to the API server).
fn base64_pem(n: u32) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!(
        "-----BEGIN CERTIFICATE-----\nMIIB{n}\n-----END CERTIFICATE-----\n"
    ))
}

/// The webhook's account recreates its own Secrets when they are deleted,
/// and RBAC cannot limit a create to a name: the real API server lets it
/// create those (type Opaque) and refuses any other Secret, a token Secret of
/// another account above all.
#[test]
fn the_webhooks_account_creates_only_its_own_secrets() {
    let (release, namespace) = ("pp-sec", "pp-sec");
    let docs = render_release(release, namespace, &[]);
    let plane = ControlPlane::shared();
    plane.create_namespace(namespace);
    // Its roles and policy, not the Secrets (created below as the webhook).
    let objects: Vec<Value> = docs
        .iter()
        .filter(|d| {
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .iter()
            .any(|k| d["kind"] == *k)
                && d["metadata"]["namespace"]
                    .as_str()
                    .is_none_or(|ns| ns == namespace)
        })
        .cloned()
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let webhook = format!("system:serviceaccount:{namespace}:pp-sec-webhook");
    let out = plane.kubectl(&[
        "auth",
        "can-i",
        "create",
        "secrets",
        "-n",
        namespace,
        &format!("--as={webhook}"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
    let create = |name: &str, kind: &str, annotations: Value| {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret", "type": kind,
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        });
        kubectl_stdin_as(plane, &webhook, &secret)
    };
    let refused = |out: &std::process::Output, what: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} was created");
        assert!(
            stderr.contains("ValidatingAdmissionPolicy")
                && stderr.contains("pp-sec-secret-creates"),
            "{what}: refused, but not by the policy: {stderr}"
        );
    };
    // In force once the API server has loaded it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut n = 0;
    loop {
        let name = format!("other-{n}");
        let out = create(&name, "Opaque", json!({}));
        if !out.status.success() {
            refused(&out, "another Secret");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the policy was not in force after 30 s"
        );
        plane.kubectl_ok(&["delete", "secret", &name, "-n", namespace]);
        n += 1;
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    refused(
        &create(
            "pp-sec-ownership",
            "kubernetes.io/service-account-token",
            json!({"kubernetes.io/service-account.name": "pp-sec-remediator"}),
        ),
        "a token Secret of another account under its own name",
    );
    refused(
        &create(
            "remediator-token",
            "kubernetes.io/service-account-token",
            json!({"kubernetes.io/service-account.name": "pp-sec-remediator"}),
        ),
        "a token Secret of another account",
    );
    for name in ["pp-sec-ownership", "pp-sec-webhook-tls"] {
        let out = create(name, "Opaque", json!({}));
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `kubectl create -f -` of `object` as `who`.
fn kubectl_stdin_as(plane: &ControlPlane, who: &str, object: &Value) -> std::process::Output {
    plane.kubectl_stdin(
        &["create", "-f", "-", &format!("--as={who}")],
        &object.to_string(),
    )
}

/// The metric names a Prometheus query names: `placement_webhook_*` and
/// `placement_sync_*`, as their families are named (no `_total`,
/// `_bucket`, `_sum`, `_count`).
fn queried_metrics(expr: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("placement_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if name.starts_with("placement_webhook_") || name.starts_with("placement_sync_") {
            let family = ["_bucket", "_sum", "_count", "_total", "_created"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            names.insert(family.to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The metric families a `/metrics` page exports (its `# TYPE` lines).
fn exported_metrics(page: &str) -> std::collections::BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The dashboard is off by default; on, it is a ConfigMap labelled for
/// Grafana's dashboard sidecar, with its rows, and every metric its queries
/// name is one a running placement-webhook or placement-sync exports
/// (scraped from both on the test bed: the embedded engine's webhook, for
/// its decision memory, and placement-sync beside OPA).
#[test]
fn the_dashboard_queries_only_metrics_the_binaries_export() {
    assert!(
        of_kind(&render(&[]), "ConfigMap")
            .iter()
            .all(|cm| cm["metadata"]["name"] != "placement-policy-dashboard"),
        "the dashboard is off by default"
    );
    let docs = render(&[
        "dashboard.enabled=true",
        "dashboard.annotations.grafana_folder=placement-policy",
    ]);
    let cm = named(&docs, "ConfigMap", "placement-policy-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1", "{cm}");
    assert_eq!(
        cm["metadata"]["annotations"]["grafana_folder"],
        "placement-policy"
    );
    let dashboard: Value = serde_json::from_str(
        cm["data"]["placement-policy.json"]
            .as_str()
            .expect("the dashboard's JSON"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Admissions",
            "Decision memory",
            "Engine sync and policy status",
            "Held changes",
            "Reconcile passes and writes",
            "Karmada and Open Cluster Management",
        ]
    );
    let queried: std::collections::BTreeSet<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(queried_metrics))
        .flatten()
        .collect();
    assert!(queried.len() > 20, "{queried:?}");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    placement_tests::install_crypto();
    let plane = ControlPlane::start();
    let opa = placement_tests::OpaServer::start();
    plane.ensure_example_clusters();
    let sidecar = placement_tests::SidecarProcess::start(
        &plane,
        &opa,
        &["--replicate-cluster=placement-policy.io/v1alpha1/clusters"],
    );
    // The embedded engine's webhook (its decision memory), refusing a review
    // too large; and one whose engine cannot be reached (its engine errors).
    let webhook = placement_tests::WebhookProcess::start(&[
        format!("--policy-dir={}", repo_root().join("policies").display()),
        "--max-request-bytes=64Ki".to_owned(),
    ]);
    let unreachable = placement_tests::WebhookProcess::start(&[
        "--opa-url=http://127.0.0.1:9".to_owned(),
        "--engine-deadline=1s".to_owned(),
    ]);
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "dashboard", "operation": "CREATE", "namespace": "default", "name": "web",
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "userInfo": {"username": "dashboard-test"}, "dryRun": true,
            "object": {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": "web", "namespace": "default", "annotations": {
                    "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"}},
                "spec": {"replicas": 1}},
        }
    });
    let (exported, webhook_page) = runtime.block_on(async {
        sidecar.wait_ready(std::time::Duration::from_secs(60)).await;
        for target in [&webhook, &unreachable] {
            let answer = target
                .https_client()
                .post(target.url("/mutate"))
                .json(&review)
                .send()
                .await
                .expect("a review");
            assert!(answer.status().is_success(), "{answer:?}");
        }
        let too_large = webhook
            .https_client()
            .post(webhook.url("/mutate"))
            .header("content-type", "application/json")
            .body(vec![b' '; 128 * 1024])
            .send()
            .await
            .expect("a review too large");
        assert_eq!(too_large.status().as_u16(), 413);
        let (_, sync_page) = sidecar.get("/metrics").await;
        let mut pages = vec![sync_page];
        for target in [&webhook, &unreachable] {
            pages.push(
                reqwest::get(format!("http://{}/metrics", target.metrics_addr))
                    .await
                    .expect("the webhook's metrics")
                    .text()
                    .await
                    .unwrap(),
            );
        }
        (
            pages
                .iter()
                .flat_map(|page| exported_metrics(page))
                .collect::<std::collections::BTreeSet<_>>(),
            pages[1].clone(),
        )
    });
    assert!(
        exported.contains("placement_webhook_decision_cache_hits")
            && exported.contains("placement_sync_binding_schedules"),
        "{exported:?}\n{webhook_page}"
    );
    // The check itself tells a name that is not exported.
    assert!(!exported.contains("placement_sync_no_such_metric"));
    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no binary exports: {missing:?}"
    );
}
