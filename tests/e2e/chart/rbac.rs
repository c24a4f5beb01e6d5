//! The chart's RBAC, checked against a real API server: fixed object names,
//! tokens only where the API is called, and ConfigMap writes bounded.

use super::*;

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
