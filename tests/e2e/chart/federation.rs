//! The chart on a federation's hub: the guardrail and the scheduler in
//! Karmada's API server, the decider and the delivery guard on an Open
//! Cluster Management hub.

use super::*;

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
    // The chart's conditions are those the Karmada beds and the bench
    // register: status updates that keep annotations, and binding updates
    // the webhook admits unevaluated, are not sent.
    assert_eq!(
        hook["matchConditions"],
        placement_tests::karmada::guardrail_match_conditions()
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
    let harness = placement_tests::karmada::delivery_configuration(
        "d",
        "https://d/validate",
        "",
        json!({}),
        true,
        None,
    );
    assert_eq!(
        hooks[1]["matchConditions"], harness["webhooks"][1]["matchConditions"],
        "a binding's delivery is sent as the beds send it: only when it delivers to a member"
    );
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
