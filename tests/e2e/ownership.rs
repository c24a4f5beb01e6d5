//! The ownership record cannot be forged, through a real API server: a record
//! a client wrote neither hides an annotation from the policy nor makes the
//! webhook remove it; a copy of a placed object (`kubectl get -o json`,
//! renamed, `kubectl create`) is placed like any object; a placement cannot
//! be changed through the status subresource.

use std::time::Duration;

use placement_tests::{
    ControlPlane, Identity, POLICY_NAMESPACE, SYSTEM_NAMESPACE, WebhookProcess, scratch_dir,
    unique_name, wait_for,
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
    let updated = placement_tests::kubectl::touch_replicaset(
        &plane.kubeconfig(Identity::Admin),
        &ns,
        "original",
    );
    let record = updated["metadata"]["annotations"][OWNED].as_str().unwrap();
    assert!(record.contains("\"requested\":\"us\""), "{record}");
}

const KEY_SECRET: &str = "placement-policy-ownership";

/// The key text in the ownership Secret, `None` when the Secret is gone.
fn secret_keys(plane: &ControlPlane) -> Option<String> {
    let out = plane.kubectl(&[
        "get",
        "secret",
        KEY_SECRET,
        "-n",
        SYSTEM_NAMESPACE,
        "-o",
        "jsonpath={.data.ownership\\.keys}",
    ]);
    if !out.status.success() {
        return None;
    }
    let encoded = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).ok()?;
    Some(String::from_utf8(bytes).ok()?).filter(|t| !t.trim().is_empty())
}

fn set_secret_keys(plane: &ControlPlane, text: Option<&str>) {
    let _ = plane.kubectl(&["delete", "secret", KEY_SECRET, "-n", SYSTEM_NAMESPACE]);
    let mut secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": KEY_SECRET, "namespace": SYSTEM_NAMESPACE}});
    if let Some(text) = text {
        secret["stringData"] = json!({"ownership.keys": text});
    }
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &secret.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ownership keys outlive what users do to their
/// Secret. A running webhook puts its key back when the Secret is deleted,
/// or recreated empty, so records keep verifying; a webhook that starts while
/// the keys cannot be loaded listens at once and fails closed, and places
/// again once they are back.
#[test]
fn the_ownership_keys_outlive_their_secret() {
    let plane = ControlPlane::start();
    let ns = unique_name("keys");
    plane.create_namespace(&ns);
    let dir = scratch_dir("ownership-keys-policy");
    std::fs::write(dir.join("placement.rego"), POLICY).unwrap();
    let args = vec![
        format!("--policy-dir={}", dir.display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        format!("--ownership-secret={SYSTEM_NAMESPACE}/{KEY_SECRET}"),
    ];
    // The chart makes the Secret empty; the webhook fills it.
    set_secret_keys(&plane, None);
    let webhook = WebhookProcess::start(&args);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );
    let original = wait_for("the webhook to place", Duration::from_secs(30), || {
        let out = plane.kubectl_stdin(
            &["create", "-o", "json", "-f", "-"],
            &replicaset(&ns, "original", json!({PLACE: "us"})).to_string(),
        );
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
    });
    let key = secret_keys(&plane).expect("the webhook filled the Secret");
    let verifies = |object: &Value, text: &str| {
        let keys = policy_client::ownership_keys::OwnershipKeys::from_text(text).unwrap();
        policy_client::placement::ownership(object, &keys)
            .get(PLACE)
            .and_then(|owned| owned.requested.clone())
    };
    assert_eq!(verifies(&original, &key).as_deref(), Some("us"));

    // Deleted, then recreated empty, while the webhook runs: its key is put
    // back each time.
    plane.kubectl_ok(&["delete", "secret", KEY_SECRET, "-n", SYSTEM_NAMESPACE]);
    wait_for("the key put back", Duration::from_secs(30), || {
        (secret_keys(&plane).as_deref() == Some(key.as_str())).then_some(())
    });
    set_secret_keys(&plane, None);
    wait_for(
        "the key put back into the empty Secret",
        Duration::from_secs(30),
        || (secret_keys(&plane).as_deref() == Some(key.as_str())).then_some(()),
    );
    drop(webhook);

    // A webhook starting while its keys do not load listens at once and
    // fails closed (a policy exists), naming why.
    set_secret_keys(&plane, Some("not base64!\n"));
    let webhook = WebhookProcess::start(&args);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );
    let denial = wait_for("a denial naming the keys", Duration::from_secs(30), || {
        let out = plane.kubectl_stdin(
            &["create", "-f", "-"],
            &replicaset(&ns, "waiting", json!({})).to_string(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (!out.status.success() && stderr.contains("keys are not loaded")).then_some(stderr)
    });
    assert!(
        denial.contains("OwnershipKeysUnavailable") || denial.contains("denied"),
        "{denial}"
    );
    // The keys come back: it places, and the record still verifies.
    set_secret_keys(&plane, Some(&key));
    wait_for(
        "the webhook to place again",
        Duration::from_secs(30),
        || {
            let out = plane.kubectl_stdin(
                &["create", "-f", "-"],
                &replicaset(&ns, "after", json!({})).to_string(),
            );
            out.status.success().then_some(())
        },
    );
    let updated = placement_tests::kubectl::touch_replicaset(
        &plane.kubeconfig(Identity::Admin),
        &ns,
        "original",
    );
    assert_eq!(
        verifies(&updated, &key).as_deref(),
        Some("us"),
        "the developer's request survived: {}",
        updated["metadata"]["annotations"]
    );
}

/// A placement cannot be changed past the webhook (issue 30, part 3): a
/// status update keeps metadata changes, so `kubectl patch
/// --subresource=status` of an annotation used to change a placement (or
/// the developer's request) with no admission call, and the remediator then
/// took the new value for the developer's. The webhook sees `*/status` and
/// keeps the annotations as stored, of ReplicaSets and Deployments alike;
/// status itself still changes.
#[test]
fn a_placement_cannot_be_changed_through_the_status_subresource() {
    let plane = ControlPlane::shared();
    let ns = unique_name("status-sub");
    plane.create_namespace(&ns);
    let dir = scratch_dir("status-subresource-policy");
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
    let placed = create(plane, &replicaset(&ns, "placed", json!({PLACE: "us"})));
    let mut deployment = replicaset(&ns, "web", json!({}));
    deployment["kind"] = json!("Deployment");
    let deployed = create(plane, &deployment);
    for (resource, stored) in [("rs", &placed), ("deployment", &deployed)] {
        let name = stored["metadata"]["name"].as_str().unwrap();
        assert_eq!(stored["metadata"]["annotations"][PLACE], "eu", "{stored}");
        // The placement, its record and the developer's request, all
        // through the status subresource, beside a status change.
        let forged = json!({
            "metadata": {"annotations": {PLACE: "us-1", OWNED: null, "team": "payments"}},
            "status": {"observedGeneration": 7},
        });
        let out = plane.kubectl(&[
            "patch",
            resource,
            name,
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &forged.to_string(),
            "-o",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{resource}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            after["metadata"]["annotations"], stored["metadata"]["annotations"],
            "{resource}: the annotations changed through status"
        );
        assert_eq!(
            after["status"]["observedGeneration"], 7,
            "{resource}: the status changed: {after}"
        );
    }
}

/// A key revoked by deleting the Secret and creating it again with a new
/// key stays revoked (issue 30, part 6): a running webhook used to put the
/// keys it held back into the Secret (or append them to the new one), so the
/// revoked key came back from its memory. Now the Secret as its writer made
/// it holds: the new key alone signs and verifies.
#[test]
fn a_key_revoked_by_recreating_the_secret_stays_revoked() {
    let plane = ControlPlane::start();
    let ns = unique_name("revoked");
    plane.create_namespace(&ns);
    let dir = scratch_dir("revoked-key-policy");
    std::fs::write(dir.join("placement.rego"), POLICY).unwrap();
    set_secret_keys(&plane, None);
    let webhook = WebhookProcess::start(&[
        format!("--policy-dir={}", dir.display()),
        format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        format!("--ownership-secret={SYSTEM_NAMESPACE}/{KEY_SECRET}"),
    ]);
    plane.register_webhook(
        &ns,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        POLICY_NAMESPACE,
    );
    let create_placed = |name: &str| {
        wait_for("the webhook to place", Duration::from_secs(30), || {
            let out = plane.kubectl_stdin(
                &["create", "-o", "json", "-f", "-"],
                &replicaset(&ns, name, json!({PLACE: "us"})).to_string(),
            );
            out.status
                .success()
                .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
        })
    };
    let original = create_placed("original");
    let revoked = secret_keys(&plane).expect("the webhook filled the Secret");
    let requested = |object: &Value, text: &str| {
        let keys = policy_client::ownership_keys::OwnershipKeys::from_text(text).unwrap();
        policy_client::placement::ownership(object, &keys)
            .get(PLACE)
            .and_then(|owned| owned.requested.clone())
    };
    assert_eq!(requested(&original, &revoked).as_deref(), Some("us"));

    // Revoked: the Secret deleted and created again with a new key, in one
    // command.
    let new_key = policy_client::ownership_keys::OwnershipKeys::generate_text().unwrap();
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": KEY_SECRET, "namespace": SYSTEM_NAMESPACE},
        "stringData": {"ownership.keys": new_key}});
    let _ = plane.kubectl_stdin(&["replace", "--force", "-f", "-"], &secret.to_string());
    // The webhook signs with the new key...
    let mut n = 0;
    wait_for(
        "records signed with the new key",
        Duration::from_secs(30),
        || {
            n += 1;
            let placed = create_placed(&format!("after-{n}"));
            requested(&placed, &new_key).map(|_| ())
        },
    );
    // ... and the Secret holds it alone, past the time the webhook waits
    // before putting back the keys of a Secret deleted and not made again.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        secret_keys(&plane).as_deref(),
        Some(new_key.as_str()),
        "the revoked key came back\n{}",
        webhook.log()
    );
    // A record signed with the revoked key no longer verifies: the next
    // update sees the placement as the developer's request, and the record
    // goes.
    placement_tests::kubectl::touch_replicaset(&plane.kubeconfig(Identity::Admin), &ns, "original");
    let updated: Value = serde_json::from_str(
        &plane.kubectl_ok(&["get", "rs", "original", "-n", &ns, "-o", "json"]),
    )
    .unwrap();
    let annotations = &updated["metadata"]["annotations"];
    assert!(annotations.get(OWNED).is_none(), "{annotations}");
    assert_eq!(annotations[PLACE], "eu", "{annotations}");
}

/// Long enough after a placed object's creation that a record made at that
/// creation (before the object had a uid) no longer verifies on any other
/// object created since: the webhook's window (30 s) and clock margin (5 s).
const PAST_THE_CREATION_WINDOW: Duration = Duration::from_secs(37);

/// The record belongs to one object (issue 30, part 6): its subject was
/// kind, namespace and name (or generateName), so a record copied onto the
/// object recreated under the same name, or onto a sibling of the same
/// generateName, verified there and passed the policy's old value for the
/// developer's request. Now a record is bound to the object's uid (or, made
/// at its creation, to its creation time): the copies are the developer's
/// request as they read.
#[test]
fn a_record_does_not_replay_onto_a_recreated_object_or_a_sibling() {
    let plane = ControlPlane::shared();
    let ns = unique_name("replay");
    plane.create_namespace(&ns);
    let dir = scratch_dir("replay-policy");
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
    let original = create(plane, &replicaset(&ns, "original", json!({PLACE: "us"})));
    let mut generated = replicaset(&ns, "unused", json!({PLACE: "us"}));
    let meta = generated["metadata"].as_object_mut().unwrap();
    meta.remove("name");
    meta.insert("generateName".into(), json!("gen-"));
    let first_sibling = create(plane, &generated);
    for placed in [&original, &first_sibling] {
        let record = placed["metadata"]["annotations"][OWNED].as_str().unwrap();
        assert!(record.contains("\"requested\":\"us\""), "{record}");
    }
    // Later on (a replay within the creation window is not what this
    // checks), the copies.
    std::thread::sleep(PAST_THE_CREATION_WINDOW);
    plane.kubectl_ok(&["delete", "rs", "original", "-n", &ns]);
    let copy_of = |placed: &Value| {
        let mut copy = placed.clone();
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
        copy.as_object_mut().unwrap().remove("status");
        copy
    };
    let recreated = create(plane, &copy_of(&original));
    let mut sibling = copy_of(&first_sibling);
    sibling["metadata"].as_object_mut().unwrap().remove("name");
    let second_sibling = create(plane, &sibling);
    for (what, copy) in [
        ("the recreated object", &recreated),
        ("the generateName sibling", &second_sibling),
    ] {
        let annotations = &copy["metadata"]["annotations"];
        assert_eq!(annotations[PLACE], "eu", "{what}: {annotations}");
        let record = annotations[OWNED].as_str().unwrap_or_default();
        assert!(
            !record.contains("\"requested\":\"us\""),
            "{what}: the copied record was honoured: {annotations}"
        );
    }
}
