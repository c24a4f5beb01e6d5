//! Admission follows the policies kube-mgmt's selection loads.

use super::*;

// ---- the webhook beside a kube-mgmt selection -----------------------------

/// An AdmissionReview for a ReplicaSet in the release namespace.
fn review() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b6c8f1e-5d0a-4f44-9d36-3d7f3b2f9a01",
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "namespace": RELEASE_NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "developer"},
            "object": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": "web", "namespace": RELEASE_NAMESPACE},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
                    },
                },
            },
        },
    })
}

async fn admitted(webhook: &placement_tests::WebhookProcess) -> bool {
    let body = serde_json::to_vec(&review()).unwrap();
    let (status, text) = webhook.post("/mutate", body).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).expect("AdmissionReview");
    answer["response"]["allowed"] == json!(true)
}

async fn wait_admission(webhook: &placement_tests::WebhookProcess, want: bool, step: &str) {
    let deadline = Instant::now() + PATIENCE;
    while admitted(webhook).await != want {
        assert!(
            Instant::now() < deadline,
            "{step}: allowed is still {}\n{}",
            !want,
            webhook.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Fail closed iff policies exist, where "policies" are what the sidecar
/// loads with kube-mgmt's flags: labelled ConfigMaps of `--namespaces`. OPA
/// is down throughout, so an admission is allowed only while none exists.
#[test]
fn webhook_policies_exist_follows_the_kube_mgmt_selection() {
    run(async {
        let plane = ControlPlane::start();
        // The chart grants the webhook what it grants the sidecar: reading
        // ConfigMaps of the selected namespaces.
        let grant = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "webhook-policies", "namespace": RELEASE_NAMESPACE},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "webhook-policies", "namespace": RELEASE_NAMESPACE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "webhook-policies"},
             "subjects": [{"kind": "ServiceAccount", "name": "placement-policy-webhook",
                           "namespace": placement_tests::SYSTEM_NAMESPACE}]},
        ]});
        let out = plane.kubectl_stdin(&["apply", "-f", "-"], &grant.to_string());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dead_opa = free_port();
        let webhook = placement_tests::WebhookProcess::start(&[
            format!(
                "--kubeconfig={}",
                plane.kubeconfig(Identity::Webhook).display()
            ),
            format!("--opa-url=http://127.0.0.1:{dead_opa}/v1"),
            format!("--namespaces={RELEASE_NAMESPACE}"),
            "--engine-deadline=1s".into(),
        ]);
        wait_admission(&webhook, true, "no policy ConfigMap: fail open").await;
        // kube-mgmt's fixture: a policy labelled `qwerty`, a labelless one, data.
        plane.kubectl_ok(&[
            "apply",
            "-f",
            &fixture("fixture.yaml").display().to_string(),
        ]);
        plane.kubectl_ok(&["delete", "cm", "policy-include"]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            admitted(&webhook).await,
            "ConfigMaps without the policy label are not policies"
        );
        plane.kubectl_ok(&[
            "label",
            "--overwrite",
            "cm",
            "policy-labeless",
            "openpolicyagent.org/policy=rego",
        ]);
        wait_admission(&webhook, false, "a labelled policy: fail closed").await;
        plane.kubectl_ok(&[
            "label",
            "cm",
            "policy-labeless",
            "openpolicyagent.org/policy-",
        ]);
        wait_admission(&webhook, true, "the label removed: fail open again").await;
    });
}
