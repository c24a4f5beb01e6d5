//! The ownership record cannot be forged, through a real API server: a record
//! a client wrote neither hides an annotation from the policy nor makes the
//! webhook remove it; a copy of a placed object (`kubectl get -o json`,
//! renamed, `kubectl create`) is placed like any object.

use placement_tests::{
    ControlPlane, Identity, POLICY_NAMESPACE, WebhookProcess, scratch_dir, unique_name,
};
use serde_json::{Value, json};

const OWNED: &str = "placement-policy.io/policy-owned";
const PLACE: &str = "example.com/placement";
const SAW: &str = "example.com/saw-team";

/// Places everything in "eu", and says which team annotation it saw.
const POLICY: &str = r#"package io.k8s.federation.admission

annotations := {
	"example.com/placement": "eu",
	"example.com/saw-team": object.get(input.metadata, ["annotations", "team"], "none"),
}

errors := []
"#;

fn replicaset(ns: &str, name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}, "annotations": annotations},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
    })
}

fn create(plane: &ControlPlane, object: &Value) -> Value {
    let out = plane.kubectl_stdin(&["create", "-o", "json", "-f", "-"], &object.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("created JSON")
}

#[test]
fn a_forged_record_is_not_honoured_and_a_copy_is_placed() {
    let plane = ControlPlane::shared();
    let ns = unique_name("owned");
    plane.create_namespace(&ns);
    let dir = scratch_dir("ownership-policy");
    std::fs::write(dir.join("placement.rego"), POLICY).unwrap();
    let webhook = WebhookProcess::start(&[
        format!("--policy-dir={}", dir.display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
    ]);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );

    // Records claiming the policy wrote "team" (so that the developer asked
    // for none): honoured, they would hide "team" from the policy and make the
    // webhook remove it. One as records were before they were signed, one with
    // a made-up signature.
    let claim = json!({"team": {"written": policy_client::placement::digest("payments"), "requested": null}});
    let unsigned = claim.to_string();
    let badly_signed =
        json!({"owned": claim, "mac": "hmac-sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"})
            .to_string();
    for (name, forged) in [("unsigned", unsigned), ("badly-signed", badly_signed)] {
        let created = create(
            plane,
            &replicaset(&ns, name, json!({"team": "payments", OWNED: forged})),
        );
        let annotations = &created["metadata"]["annotations"];
        assert_eq!(
            annotations["team"], "payments",
            "{name}: not removed: {annotations}"
        );
        assert_eq!(
            annotations[SAW], "payments",
            "{name}: the policy saw it: {annotations}"
        );
        assert_eq!(annotations[PLACE], "eu");
    }

    // A placed object copied under another name.
    let original = create(plane, &replicaset(&ns, "original", json!({PLACE: "us"})));
    assert_eq!(original["metadata"]["annotations"][PLACE], "eu");
    assert!(
        original["metadata"]["annotations"][OWNED].is_string(),
        "the policy replaced a request"
    );
    let mut copy = original.clone();
    let meta = copy["metadata"].as_object_mut().unwrap();
    for field in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        meta.remove(field);
    }
    meta.insert("name".into(), json!("copy"));
    copy.as_object_mut().unwrap().remove("status");
    let copied = create(plane, &copy);
    assert_eq!(
        copied["metadata"]["annotations"][PLACE], "eu",
        "the copy is placed"
    );
    assert_eq!(copied["metadata"]["annotations"][SAW], "none");
    // An UPDATE of the original still sees the developer's own request ("us"),
    // restored from its genuine record.
    let out = plane.kubectl(&[
        "label",
        "rs",
        "original",
        "-n",
        &ns,
        "touched=yes",
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let updated: Value = serde_json::from_slice(&out.stdout).unwrap();
    let record = updated["metadata"]["annotations"][OWNED].as_str().unwrap();
    assert!(record.contains("\"requested\":\"us\""), "{record}");
}
