//! What the webhook's own account may change, checked against a real API
//! server: the caBundle of its configurations, and its own Secrets.

use super::*;

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
