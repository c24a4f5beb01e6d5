//! The webhook and the remediator build the policy input with one function: a
//! policy that reads the request metadata (`input._admission`) gives both the
//! same answer, and remediation converges instead of looping on PATCHes.

use std::time::Duration;

use placement_tests::control_plane::POLICY_NAMESPACE;
use placement_tests::{
    ControlPlane, Identity, OpaServer, SidecarProcess, WebhookProcess, unique_name, wait_for,
};
use serde_json::{Value, json};

const ASKED_BY: &str = "example.com/asked-by";

/// Says who asked, and how: the request's operation and user.
fn policy(version: u32) -> String {
    format!(
        r#"package io.k8s.federation.admission

# version {version}
annotations := {{"{ASKED_BY}": sprintf("%s %s", [input._admission.operation, input._admission.userInfo.username])}} if {{
	input.kind == "ReplicaSet"
}} else := {{}}

errors := []
"#
    )
}

fn policy_configmap(plane: &ControlPlane, version: u32) {
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "placement", "namespace": POLICY_NAMESPACE},
        "data": {"placement.rego": policy(version)},
    });
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn asked_by(plane: &ControlPlane, ns: &str) -> (Option<String>, String) {
    let rs: Value = serde_json::from_str(&plane.kubectl_ok(&[
        "get",
        "replicaset",
        "-n",
        ns,
        "asker",
        "-o",
        "json",
    ]))
    .expect("ReplicaSet JSON");
    (
        rs["metadata"]["annotations"][ASKED_BY]
            .as_str()
            .map(str::to_owned),
        rs["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[test]
fn a_policy_reading_the_request_gives_webhook_and_remediator_one_answer() {
    placement_tests::install_crypto();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // A control plane of its own: the remediator acts on every namespace.
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name("input");
    plane.create_namespace(&ns);
    policy_configmap(&plane, 1);
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &["--remediation=auto", "--remediate=apps/v1/replicasets"],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", opa.url()),
        format!("--opa-token-file={}", opa.token_file().display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        format!("--policy-namespace={POLICY_NAMESPACE}"),
    ]);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );

    let rs = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "asker", "namespace": ns, "labels": {"app": "asker"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "asker"}},
            "template": {"metadata": {"labels": {"app": "asker"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
        }
    });
    // The webhook answers the developer's CREATE as the developer's.
    let out = plane.kubectl_stdin(&["create", "-o", "json", "-f", "-"], &rs.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).expect("created JSON");
    assert_eq!(created["metadata"]["annotations"][ASKED_BY], "CREATE admin");

    // The remediator re-asks (on its own, or after a policy edit); its answer
    // is the webhook's for the PATCH it sends: an UPDATE by the remediator.
    policy_configmap(&plane, 2);
    let remediator = "UPDATE system:serviceaccount:placement-system:placement-policy-remediator";
    let placed_at = wait_for("the remediator's answer", Duration::from_secs(60), || {
        let (value, version) = asked_by(&plane, &ns);
        (value.as_deref() == Some(remediator)).then_some(version)
    });

    // Further passes change nothing: no loop between remediator and webhook.
    // A pass has run after the edit: the remediator asked again.
    let at_rest = || {
        runtime.block_on(
            sidecar.remediation_at_rest(Duration::from_millis(300), Duration::from_secs(60)),
        )
    };
    let (_, queries) = at_rest();
    policy_configmap(&plane, 3);
    wait_for(
        "a remediation pass after the policy edit",
        Duration::from_secs(60),
        || (at_rest().1 > queries).then_some(()),
    );
    let (value, version) = asked_by(&plane, &ns);
    assert_eq!(value.as_deref(), Some(remediator));
    assert_eq!(version, placed_at, "the object was not written again");
    let patches = runtime
        .block_on(sidecar.metric("placement_sync_remediation_patches_total{result=\"ok\"}"))
        .unwrap_or(0.0);
    assert_eq!(
        patches,
        1.0,
        "one remediation PATCH, then agreement\n{}",
        sidecar.log_tail()
    );
}
