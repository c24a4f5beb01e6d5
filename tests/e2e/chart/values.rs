//! The chart's values: every mode renders, lints and is hardened, and what a
//! value sets (the shipped policy, the engine, the webhook configurations,
//! who may reach the webhook) is what the manifests say.

use super::*;

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
