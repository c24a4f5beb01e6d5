//! A policy set is whole or not in force, and one edit that would re-place
//! most workloads is held until confirmed: a set that lost a module is
//! refused (its status names the missing package) and strips no placement;
//! queries never see half a set; a large re-placement by an edit is reported
//! on the policy ConfigMap and applied only once an administrator confirms
//! it (one held occurrence per confirmation), while an outage re-places what
//! it moves at once, beside a held edit too, unless it looks like a
//! partition. Packages have owners: a tenant's module or data ConfigMap
//! writing the shipped packages or the replicated clusters is refused.

use std::time::Duration;

use placement_tests::control_plane::POLICY_NAMESPACE;
use placement_tests::{
    ControlPlane, OpaServer, SidecarProcess, placed_clusters, unique_name, wait_for,
};
use serde_json::{Value, json};

const CLUSTERS: &str = "placement-policy.io/v1alpha1/clusters";
const HELD: &str = "placement-policy.io/remediation-held";
const CONFIRM: &str = "placement-policy.io/confirm-remediation";

/// The decision package and its rules in two modules, as the shipped policy
/// is: every running cluster, evenly.
const DECISION: &str = r#"package io.k8s.federation.admission

import data.test.rules

annotations := {"federation.kubernetes.io/replica-set-preferences": rules.preferences} if rules.loaded

errors := set() if rules.loaded
"#;

const RULES: &str = r#"package test.rules

loaded := true

running contains name if {
	some name, cluster in data.kubernetes.clusters
	cluster.status.phase == "running"
}

preferences := json.marshal({"clusters": {name: {"weight": 1} | some name in running}})
"#;

fn apply(plane: &ControlPlane, manifest: &Value) {
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cluster(plane: &ControlPlane, name: &str, phase: &str) {
    apply(
        plane,
        &json!({"apiVersion": "placement-policy.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name}, "spec": {"address": "https://10.0.0.1", "region": "europe-west1"}}),
    );
    plane.kubectl_ok(&[
        "patch",
        &format!("clusters.placement-policy.io/{name}"),
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({"status": {"phase": phase}}).to_string(),
    ]);
}

fn policy(plane: &ControlPlane, modules: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = modules
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    // Replace, so that a removed key is removed.
    let manifest = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "placement", "namespace": POLICY_NAMESPACE}, "data": data});
    let out = plane.kubectl_stdin(&["replace", "-f", "-"], &manifest.to_string());
    if !out.status.success() {
        apply(plane, &manifest);
    }
}

fn placements(plane: &ControlPlane, ns: &str) -> Vec<Option<Vec<String>>> {
    let list: Value =
        serde_json::from_str(&plane.kubectl_ok(&["get", "rs", "-n", ns, "-o", "json"])).unwrap();
    let items = list["items"].as_array().unwrap();
    // Checks that all are placed must not pass on none.
    assert!(!items.is_empty(), "no ReplicaSet in {ns}");
    items.iter().map(placed_clusters).collect()
}

/// The rules without cluster `b`: an edit that moves every workload.
fn rules_without_b() -> String {
    RULES.replace(
        "cluster.status.phase == \"running\"",
        "cluster.status.phase == \"running\"\n\tname != \"b\"",
    )
}

fn annotation_of(plane: &ControlPlane, ns: &str, cm: &str, key: &str) -> String {
    plane.kubectl_ok(&[
        "get",
        "cm",
        cm,
        "-n",
        ns,
        "-o",
        &format!(
            "jsonpath={{.metadata.annotations.{}}}",
            key.replace('.', "\\.")
        ),
    ])
}

/// The held change reported on the policy ConfigMap, if any.
fn held_report(plane: &ControlPlane) -> Option<Value> {
    serde_json::from_str(&annotation_of(plane, POLICY_NAMESPACE, "placement", HELD)).ok()
}

fn replicaset(plane: &ControlPlane, ns: &str, name: &str) {
    apply(
        plane,
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "x"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}},
                "template": {"metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}),
    );
}

/// The bed of the guard's tests: a runtime for their async parts, a control
/// plane of the test's own, a namespace `prefix-...` for its workloads, the
/// Clusters `clusters` running and the placement policy loaded.
fn guarded_bed(prefix: &str, clusters: &[&str]) -> (tokio::runtime::Runtime, ControlPlane, String) {
    placement_tests::install_crypto();
    let runtime = placement_tests::current_thread_runtime();
    let plane = ControlPlane::start();
    let ns = unique_name(prefix);
    plane.create_namespace(&ns);
    for name in clusters {
        cluster(&plane, name, "running");
    }
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );
    (runtime, plane, ns)
}

fn wait_placed_on(plane: &ControlPlane, ns: &str, clusters: &[&str], sidecar: &SidecarProcess) {
    let want = Some(clusters.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("every ReplicaSet placed on {clusters:?}"),
            Duration::from_secs(60),
            || {
                placements(plane, ns)
                    .iter()
                    .all(|p| *p == want)
                    .then_some(())
            },
        )
    })) {
        Ok(()) => {}
        Err(_) => panic!(
            "not every ReplicaSet placed on {clusters:?}: {:?}\nreport: {:?}\n{}",
            placements(plane, ns),
            held_report(plane),
            sidecar.log_tail()
        ),
    }
}

/// A Cluster going offline re-places every workload at
/// once, however many it moves (failover needs no one); a policy edit that
/// moves them all is held. Its confirmation names the change, not the
/// workloads: ReplicaSets deleted and created during the hold leave the id as
/// it is. A tenant's labelled policy ConfigMap elsewhere neither gets the
/// report nor confirms; one annotation in the policy namespace lets the change
/// through, once.
#[test]
fn an_outage_re_places_at_once_and_an_edit_waits_for_one_confirmation() {
    let (runtime, plane, ns) = guarded_bed("blast", &["a", "b"]);
    let opa = OpaServer::start();
    // A tenant's labelled policy ConfigMap in a namespace of its own, which
    // the sidecar loads as kube-mgmt would (and may write the status of).
    let tenant = unique_name("tenant");
    plane.create_namespace(&tenant);
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "tenant-policy", "namespace": tenant,
                "labels": {"openpolicyagent.org/policy": "rego"}},
            "data": {"tenant.rego": "package tenant.rules\n\nok := true\n"}}),
    );
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "tenant-policies", "namespace": tenant},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "verbs": ["get", "list", "watch", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "tenant-policies", "namespace": tenant},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-policies"},
                "subjects": [{"kind": "ServiceAccount", "name": "placement-policy-remediator",
                    "namespace": placement_tests::SYSTEM_NAMESPACE}]}]}),
    );
    // 14: after 2 of them are deleted, the change is still beyond
    // --remediation-hold-min.
    for n in 0..14 {
        replicaset(&plane, &ns, &format!("rs-{n}"));
    }
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=auto",
            "--remediate=apps/v1/replicasets",
            "--remediation-hold-share=0.5",
            "--remediation-hold-min=10",
            &format!("--policy-namespace={POLICY_NAMESPACE}"),
            &format!("--namespaces={tenant}"),
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    // Placing unplaced workloads is not re-placing anything: not held.
    wait_placed_on(&plane, &ns, &["a", "b"], &sidecar);

    // A policy set that lost its rules module: refused, the ConfigMap's status
    // names the missing package, the last good set stays, no placement is
    // stripped.
    policy(&plane, &[("decision.rego", DECISION)]);
    let status = wait_for(
        "the status to name the missing package",
        Duration::from_secs(30),
        || {
            let status = annotation_of(
                &plane,
                POLICY_NAMESPACE,
                "placement",
                "placement-policy.io/policy-status",
            );
            status.contains("test.rules").then_some(status)
        },
    );
    assert!(status.contains("\"error\""), "{status}");
    // The last good set is still whole in OPA: the decision has its rules.
    let decision = runtime.block_on(policy_client::engine::PolicyEngine::query(
        &opa.client(),
        "io/k8s/federation/admission",
        &json!({}),
        tokio::time::Instant::now() + Duration::from_secs(5),
    ));
    assert!(
        matches!(&decision, Ok(policy_client::engine::QueryOutcome::Defined(d)) if d.get("annotations").is_some()),
        "the last good set is in force: {decision:?}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        placements(&plane, &ns)
            .iter()
            .all(|p| *p == Some(vec!["a".to_owned(), "b".to_owned()])),
        "placements kept with a partial policy set\n{}",
        sidecar.log_tail()
    );
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );

    // Cluster b goes offline: all 14 placements change, at once.
    cluster(&plane, "b", "offline");
    wait_placed_on(&plane, &ns, &["a"], &sidecar);
    assert_eq!(held_report(&plane), None, "an outage is not held");
    cluster(&plane, "b", "running");
    wait_placed_on(&plane, &ns, &["a", "b"], &sidecar);

    // An edit of the policy moving every workload off b: held.
    policy(
        &plane,
        &[
            ("decision.rego", DECISION),
            ("rules.rego", &rules_without_b()),
        ],
    );
    let report = wait_for("the held change reported", Duration::from_secs(60), || {
        held_report(&plane)
    });
    assert_eq!(report["affected"], 14, "{report}");
    assert_eq!(report["placed"], 14, "{report}");
    assert!(
        report["cause"]
            .as_str()
            .unwrap_or_default()
            .contains("policy"),
        "{report}"
    );
    let id = report["id"].as_str().expect("change id").to_owned();
    let held = runtime
        .block_on(sidecar.metric("placement_sync_remediation_held_objects"))
        .unwrap_or(0.0);
    assert_eq!(held, 14.0);
    let events = plane.kubectl_ok(&[
        "get",
        "events",
        "-n",
        POLICY_NAMESPACE,
        "--field-selector=reason=RemediationHeld",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains("14 of 14"),
        "a Warning Event on the ConfigMap: {events}"
    );
    assert!(
        annotation_of(&plane, &tenant, "tenant-policy", HELD).is_empty(),
        "no report outside the policy namespace"
    );

    // Workloads churn while the change is held: the id stays.
    for n in 0..2 {
        plane.kubectl_ok(&["delete", "rs", &format!("rs-{n}"), "-n", &ns]);
        replicaset(&plane, &ns, &format!("new-{n}"));
    }
    let churned = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            "the report to follow the churn",
            Duration::from_secs(60),
            || held_report(&plane).filter(|r| r["affected"] == 12),
        )
    })) {
        Ok(report) => report,
        Err(_) => panic!(
            "the report did not follow the churn: {:?}\n{:?}\n{}",
            held_report(&plane),
            placements(&plane, &ns),
            sidecar.log_tail()
        ),
    };
    assert_eq!(churned["id"], id.as_str(), "{churned}");

    // A tenant's ConfigMap cannot confirm.
    plane.kubectl_ok(&[
        "annotate",
        "cm",
        "tenant-policy",
        "-n",
        &tenant,
        "--overwrite",
        &format!("{CONFIRM}={id}"),
    ]);
    std::thread::sleep(Duration::from_secs(8));
    let old: Vec<Option<Vec<String>>> = (2..14)
        .map(|n| {
            let rs: Value = serde_json::from_str(&plane.kubectl_ok(&[
                "get",
                "rs",
                &format!("rs-{n}"),
                "-n",
                &ns,
                "-o",
                "json",
            ]))
            .unwrap();
            placed_clusters(&rs)
        })
        .collect();
    assert!(
        old.iter()
            .all(|p| *p == Some(vec!["a".to_owned(), "b".to_owned()])),
        "held despite the tenant's annotation: {old:?}"
    );

    // The administrator confirms in the policy namespace: applied, once.
    plane.kubectl_ok(&[
        "annotate",
        "cm",
        "placement",
        "-n",
        POLICY_NAMESPACE,
        "--overwrite",
        &format!("{CONFIRM}={id}"),
    ]);
    wait_placed_on(&plane, &ns, &["a"], &sidecar);
    wait_for(
        "the report cleared and the confirmation used up",
        Duration::from_secs(30),
        || {
            (held_report(&plane).is_none()
                && annotation_of(&plane, POLICY_NAMESPACE, "placement", CONFIRM).is_empty())
            .then_some(())
        },
    );
}

/// Three of four clusters turning unhealthy together looks
/// like the control plane cut off from them, not an outage: held like an
/// edit, until they come back (or someone confirms). The same clusters going
/// one after another, further apart than the window, are outages: each is
/// re-placed at once.
#[test]
fn clusters_turning_unhealthy_together_are_held_as_a_partition() {
    let (runtime, plane, ns) = guarded_bed("partition", &["a", "b", "c", "d"]);
    let opa = OpaServer::start();
    for n in 0..12 {
        replicaset(&plane, &ns, &format!("rs-{n}"));
    }
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=auto",
            "--remediate=apps/v1/replicasets",
            "--remediation-partition-threshold=0.55",
            "--remediation-partition-window=10s",
            // The three changes below land in one pass.
            "--remediation-debounce=2s",
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    wait_placed_on(&plane, &ns, &["a", "b", "c", "d"], &sidecar);

    for name in ["a", "b", "c"] {
        cluster(&plane, name, "offline");
    }
    let report = wait_for("the partition held", Duration::from_secs(60), || {
        held_report(&plane)
    });
    let cause = report["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("partition"), "{report}");
    for name in ["a", "b", "c"] {
        assert!(cause.contains(&format!("clusters/{name}")), "{report}");
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        placements(&plane, &ns)
            .iter()
            .all(|p| p.as_ref().is_some_and(|c| c.len() == 4)),
        "nothing patched while held"
    );
    // They come back: nothing is left to re-place, and the hold ends.
    for name in ["a", "b", "c"] {
        cluster(&plane, name, "running");
    }
    wait_for("the report cleared", Duration::from_secs(60), || {
        held_report(&plane).is_none().then_some(())
    });
    wait_placed_on(&plane, &ns, &["a", "b", "c", "d"], &sidecar);

    // One after another, further apart than the window: three outages.
    for (down, left) in [
        ("a", &["b", "c", "d"][..]),
        ("b", &["c", "d"]),
        ("c", &["d"]),
    ] {
        std::thread::sleep(Duration::from_secs(11));
        cluster(&plane, down, "offline");
        wait_placed_on(&plane, &ns, left, &sidecar);
        assert_eq!(held_report(&plane), None, "{down} going is an outage");
    }
}

/// The modules of one change reach OPA dependencies first, and so do all
/// modules when the sidecar refills a restarted OPA: a query in between sees
/// the old set, the new set, or (OPA empty) no decision, never a decision
/// without the rules it needs.
#[test]
fn queries_never_see_half_a_policy_set() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    placement_tests::install_crypto();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let plane = ControlPlane::start();
    let mut opa = OpaServer::start();
    let decision = |field: &str| {
        format!(
            "package io.k8s.federation.admission\n\nimport data.test.rules\n\nannotations := {{\"v\": rules.{field}}} if rules.loaded\n\nerrors := set() if rules.loaded\n"
        )
    };
    let rules_v1 = "package test.rules\n\nloaded := true\n\nvalue := \"1\"\n";
    let rules_v2 = "package test.rules\n\nloaded := true\n\nvalue := \"1\"\n\nvalue2 := \"2\"\n";
    // Key order would load the decision ("a-...") before its rules ("b-...").
    policy(
        &plane,
        &[
            ("a-decision.rego", &decision("value")),
            ("b-rules.rego", rules_v1),
        ],
    );
    let sidecar = SidecarProcess::start(&plane, &opa, &["--remediation=off"]);
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));

    let client = opa.client();
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    // The answers' `v` in order, repeats left out (`None`: no decision).
    let history: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let watcher = runtime.spawn({
        let (stop, answers, seen, history) =
            (stop.clone(), answers.clone(), seen.clone(), history.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                let outcome = policy_client::engine::PolicyEngine::query(
                    &client,
                    "io/k8s/federation/admission",
                    &json!({}),
                    deadline,
                )
                .await;
                let mut v = None;
                if let Ok(policy_client::engine::QueryOutcome::Defined(result)) = outcome {
                    let whole =
                        result.get("annotations").is_some() && result.get("errors").is_some();
                    if !whole {
                        seen.lock().unwrap().push(result.to_string());
                    }
                    v = result["annotations"]["v"].as_str().map(str::to_owned);
                }
                let mut history = history.lock().unwrap();
                if history.last() != Some(&v) {
                    history.push(v);
                }
                drop(history);
                answers.fetch_add(1, Ordering::Relaxed);
            }
        }
    });

    // One change: the decision starts using a rule the same change adds.
    policy(
        &plane,
        &[
            ("a-decision.rego", &decision("value2")),
            ("b-rules.rego", rules_v2),
        ],
    );
    let ok = |plane: &ControlPlane| {
        plane
            .kubectl_ok(&[
                "get",
                "cm",
                "placement",
                "-n",
                POLICY_NAMESPACE,
                "-o",
                "jsonpath={.metadata.annotations.placement-policy\\.io/policy-status}",
            ])
            .contains("\"ok\"")
    };
    // The queries saw the change: the old set's answer, then the new one's.
    let two = Some("2".to_owned());
    wait_for(
        "queries to see the new set",
        Duration::from_secs(30),
        || history.lock().unwrap().contains(&two).then_some(()),
    );
    {
        let history = history.lock().unwrap();
        let at = |v: &Option<String>| history.iter().position(|h| h == v);
        assert!(
            matches!((at(&Some("1".to_owned())), at(&two)), (Some(old), Some(new)) if old < new),
            "answers from the old set, then the new: {history:?}"
        );
    }
    assert!(ok(&plane));
    // OPA restarts; the sidecar fills it again.
    opa.restart();
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    let answered_at = answers.load(Ordering::Relaxed);
    // The queries answer from the whole set again. (Whether one saw OPA
    // empty in between depends on timing: the client retries within a
    // query's deadline, which can bridge the whole restart.)
    wait_for(
        "queries to see the refilled OPA",
        Duration::from_secs(30),
        || {
            let answered = answers.load(Ordering::Relaxed) - answered_at;
            (answered >= 20 && history.lock().unwrap().last() == Some(&two)).then_some(())
        },
    );
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(watcher).unwrap();
    let answers = answers.load(Ordering::Relaxed);
    assert!(answers > 50, "the queries ran ({answers})");
    let seen = seen.lock().unwrap();
    assert!(seen.is_empty(), "answers from half a policy set: {seen:?}");
}

/// After a key rotation the remediator signs every record
/// again with the new key. That changes no annotation the policy owns, so it
/// is no placement change for the guard: a pass over all 12 placed workloads
/// re-signs them all, held by nothing.
#[test]
fn re_signing_records_after_a_key_rotation_is_not_held() {
    let (runtime, plane, ns) = guarded_bed("rotation", &["a", "b"]);
    let opa = OpaServer::start();
    let old_key = policy_client::ownership_keys::OwnershipKeys::generate_text().unwrap();
    let new_key = policy_client::ownership_keys::OwnershipKeys::generate_text().unwrap();
    let keys_secret = |text: &str| {
        apply(
            &plane,
            &json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "placement-policy-ownership",
                    "namespace": placement_tests::SYSTEM_NAMESPACE},
                "stringData": {"ownership.keys": text}}),
        );
    };
    keys_secret(&old_key);
    for n in 0..12 {
        replicaset(&plane, &ns, &format!("rs-{n}"));
    }
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=auto",
            "--remediate=apps/v1/replicasets",
            &format!(
                "--ownership-secret={}/placement-policy-ownership",
                placement_tests::SYSTEM_NAMESPACE
            ),
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    wait_placed_on(&plane, &ns, &["a", "b"], &sidecar);

    // The rotation: the new key signs, the old one still verifies.
    keys_secret(&format!("{new_key}{old_key}"));
    std::thread::sleep(Duration::from_secs(2));
    // An edit that moves nothing starts a pass over everything.
    plane.kubectl_ok(&[
        "label",
        "clusters.placement-policy.io",
        "a",
        "team=platform",
    ]);
    let new_only = policy_client::ownership_keys::OwnershipKeys::from_text(&new_key).unwrap();
    let list = || -> Vec<Value> {
        serde_json::from_str::<Value>(&plane.kubectl_ok(&["get", "rs", "-n", &ns, "-o", "json"]))
            .unwrap()["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            "every record signed with the new key",
            Duration::from_secs(60),
            || {
                list()
                    .iter()
                    .all(|rs| !policy_client::placement::ownership(rs, &new_only).is_empty())
                    .then_some(())
            },
        )
    })) {
        Ok(()) => {}
        Err(_) => panic!(
            "not re-signed; held: {:?}\n{}",
            held_report(&plane),
            sidecar.log_tail()
        ),
    }
    assert_eq!(held_report(&plane), None);
    wait_placed_on(&plane, &ns, &["a", "b"], &sidecar);
}

/// A second file of package `test.rules`.
const MORE_RULES: &str = "package test.rules\n\nextra := true\n";

/// The decision as OPA answers it, `None` when undefined or incomplete.
async fn decided(opa: &OpaServer) -> Option<Value> {
    use policy_client::engine::PolicyEngine;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    match opa
        .client()
        .query("io/k8s/federation/admission", &json!({}), deadline)
        .await
    {
        Ok(policy_client::engine::QueryOutcome::Defined(doc))
            if doc.get("annotations").is_some() =>
        {
            Some(doc)
        }
        _ => None,
    }
}

fn policy_status(plane: &ControlPlane) -> String {
    annotation_of(
        plane,
        POLICY_NAMESPACE,
        "placement",
        "placement-policy.io/policy-status",
    )
}

/// The policy set survives what users do. Removing the
/// decision module while its rules stay, and removing one of the two files of
/// a package, are refused whole (the ConfigMap's status says why, and the
/// last good set answers); and a sidecar restarted beside a fresh OPA while
/// the ConfigMap is in error loads the last good set kept in the cluster, not
/// nothing.
#[test]
fn the_policy_set_survives_what_users_do() {
    placement_tests::install_crypto();
    let runtime = placement_tests::current_thread_runtime();
    let plane = ControlPlane::start();
    let mut opa = OpaServer::start();
    cluster(&plane, "a", "running");
    // The chart makes the ConfigMap the last good set is kept in.
    let kept = "placement-policy-last-good-policies";
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": kept, "namespace": placement_tests::SYSTEM_NAMESPACE}}),
    );
    let whole = [
        ("decision.rego", DECISION),
        ("rules.rego", RULES),
        ("more.rego", MORE_RULES),
    ];
    policy(&plane, &whole);
    let flags = [
        format!("--replicate-cluster={CLUSTERS}"),
        "--remediation=off".to_owned(),
        format!(
            "--last-good-policies={}/{kept}",
            placement_tests::SYSTEM_NAMESPACE
        ),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let sidecar = SidecarProcess::start(&plane, &opa, &flags);
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    let good = runtime.block_on(decided(&opa)).expect("the policy decides");
    wait_for(
        "the set kept in the cluster",
        Duration::from_secs(30),
        || {
            let data = plane.kubectl_ok(&[
                "get",
                "cm",
                kept,
                "-n",
                placement_tests::SYSTEM_NAMESPACE,
                "-o",
                "jsonpath={.data.policy-set\\.json}",
            ]);
            let set: Value = serde_json::from_str(&data).ok()?;
            (set["modules"].as_object()?.len() == 3).then_some(())
        },
    );

    // The decision removed while its rules stay: refused.
    policy(&plane, &[("rules.rego", RULES), ("more.rego", MORE_RULES)]);
    let status = wait_for("the removal refused", Duration::from_secs(30), || {
        Some(policy_status(&plane)).filter(|s| s.contains("removes_decision"))
    });
    assert!(status.contains("\"error\""), "{status}");
    assert_eq!(runtime.block_on(decided(&opa)).as_ref(), Some(&good));

    // One of the two files of package test.rules removed: refused.
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );
    wait_for("the part removal refused", Duration::from_secs(30), || {
        policy_status(&plane)
            .contains("removes_part_of_package")
            .then_some(())
    });
    let modules = runtime
        .block_on(policy_client::engine::PolicyEngine::policies(&opa.client()))
        .unwrap();
    assert!(
        modules
            .keys()
            .any(|id| id.ends_with("/placement/more.rego")),
        "{:?}",
        modules.keys()
    );

    // The rules broken, then the sidecar restarted beside a fresh OPA: the
    // set kept in the cluster is loaded, not nothing.
    let broken = format!("{RULES}\nbroken :=\n");
    policy(
        &plane,
        &[
            ("decision.rego", DECISION),
            ("rules.rego", &broken),
            ("more.rego", MORE_RULES),
        ],
    );
    wait_for(
        "the compile error reported",
        Duration::from_secs(30),
        || {
            policy_status(&plane)
                .contains("rego_parse_error")
                .then_some(())
        },
    );
    sidecar.stop();
    opa.restart();
    let sidecar = SidecarProcess::start(&plane, &opa, &flags);
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    assert_eq!(
        runtime.block_on(decided(&opa)).as_ref(),
        Some(&good),
        "the last good set after a restart\n{}",
        sidecar.log_tail()
    );
    assert!(policy_status(&plane).contains("\"error\""));
}

/// A failover during an outage needs no one either. The
/// remediation leader dies (SIGKILL, its Lease runs out) as a Cluster goes
/// offline; the standby takes over and re-places all 12 workloads,
/// unconfirmed: the revision the dead leader recorded on the Lease is the
/// revision now, so only health changed.
#[test]
fn a_new_leader_re_places_an_outage_unconfirmed() {
    let (runtime, plane, ns) = guarded_bed("failover", &["a", "b"]);
    let (opa, standby_opa) = (OpaServer::start(), OpaServer::start());
    for n in 0..12 {
        replicaset(&plane, &ns, &format!("rs-{n}"));
    }
    let flags = [
        &format!("--replicate-cluster={CLUSTERS}") as &str,
        "--remediation=auto",
        "--remediate=apps/v1/replicasets",
        "--lease-duration=3s",
    ];
    let leader = SidecarProcess::start(&plane, &opa, &flags);
    runtime.block_on(leader.wait_ready(Duration::from_secs(60)));
    wait_placed_on(&plane, &ns, &["a", "b"], &leader);
    let standby = SidecarProcess::start(&plane, &standby_opa, &flags);
    runtime.block_on(standby.wait_ready(Duration::from_secs(60)));
    let recorded = plane.kubectl_ok(&[
        "get",
        "lease",
        "placement-policy-remediator",
        "-n",
        placement_tests::SYSTEM_NAMESPACE,
        "-o",
        "jsonpath={.metadata.annotations.placement-policy\\.io/applied-revision}",
    ]);
    assert!(
        !recorded.trim().is_empty(),
        "the leader records what it applied"
    );

    leader.kill();
    cluster(&plane, "b", "offline");
    wait_placed_on(&plane, &ns, &["a"], &standby);
    assert_eq!(held_report(&plane), None);
}

/// Rules placing a workload on the running clusters of its pool (label
/// `pool` of the workload, `example.com/pool-<pool>` of the cluster) that are
/// not drained (`example.com/drained`, a label an edit sets).
const POOL_RULES: &str = r#"package test.rules

loaded := true

running contains name if {
	some name, cluster in data.kubernetes.clusters
	cluster.status.phase == "running"
	not cluster.metadata.labels["example.com/drained"]
	cluster.metadata.labels[concat("", ["example.com/pool-", input.metadata.labels.pool])] == "true"
}

preferences := json.marshal({"clusters": {name: {"weight": 1} | some name in running}})
"#;

fn pooled_replicaset(plane: &ControlPlane, ns: &str, name: &str, pool: &str) {
    apply(
        plane,
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "x", "pool": pool}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}},
                "template": {"metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}),
    );
}

/// The placements of the ReplicaSets of `pool` in `ns`.
fn pool_placements(plane: &ControlPlane, ns: &str, pool: &str) -> Vec<Option<Vec<String>>> {
    let list: Value = serde_json::from_str(&plane.kubectl_ok(&[
        "get",
        "rs",
        "-n",
        ns,
        "-l",
        &format!("pool={pool}"),
        "-o",
        "json",
    ]))
    .unwrap();
    let items = list["items"].as_array().unwrap();
    assert!(!items.is_empty(), "no ReplicaSet of pool {pool} in {ns}");
    items.iter().map(placed_clusters).collect()
}

fn wait_pool_on(
    plane: &ControlPlane,
    ns: &str,
    pool: &str,
    clusters: &[&str],
    sidecar: &SidecarProcess,
) {
    let want = Some(clusters.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("pool {pool} placed on {clusters:?}"),
            Duration::from_secs(60),
            || {
                pool_placements(plane, ns, pool)
                    .iter()
                    .all(|p| *p == want)
                    .then_some(())
            },
        )
    })) {
        Ok(()) => {}
        Err(_) => panic!(
            "pool {pool} not placed on {clusters:?}: {:?}\nreport: {:?}\n{}",
            pool_placements(plane, ns, pool),
            held_report(plane),
            sidecar.log_tail()
        ),
    }
}

/// One tenant's edit cannot hold a real failover (issue 30, part 4). An
/// edit (cluster c drained) that would move all 12 workloads is held; then
/// cluster b goes offline. The causes of a pass used to accumulate, so the
/// outage's pass was guarded as the edit was, and held with it. Now the
/// outage's moves are weighed apart from the edit's: the 6 workloads on b
/// are re-placed at once; the 6 that b's outage does not move stay held.
#[test]
fn an_outage_re_places_what_it_moves_beside_a_held_edit() {
    placement_tests::install_crypto();
    let runtime = placement_tests::current_thread_runtime();
    let plane = ControlPlane::start();
    let ns = unique_name("outage-edit");
    plane.create_namespace(&ns);
    for (name, pools) in [
        ("a", &["blue", "green"][..]),
        ("b", &["blue"]),
        ("c", &["blue", "green"]),
    ] {
        cluster(&plane, name, "running");
        for pool in pools {
            plane.kubectl_ok(&[
                "label",
                "clusters.placement-policy.io",
                name,
                &format!("example.com/pool-{pool}=true"),
            ]);
        }
    }
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", POOL_RULES)],
    );
    let opa = OpaServer::start();
    for n in 0..6 {
        pooled_replicaset(&plane, &ns, &format!("blue-{n}"), "blue");
        pooled_replicaset(&plane, &ns, &format!("green-{n}"), "green");
    }
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=auto",
            "--remediate=apps/v1/replicasets",
            "--remediation-hold-share=0.3",
            "--remediation-hold-min=4",
            &format!("--policy-namespace={POLICY_NAMESPACE}"),
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    wait_pool_on(&plane, &ns, "blue", &["a", "b", "c"], &sidecar);
    wait_pool_on(&plane, &ns, "green", &["a", "c"], &sidecar);

    // The edit: c drained, all 12 would move. Held.
    plane.kubectl_ok(&[
        "label",
        "clusters.placement-policy.io",
        "c",
        "example.com/drained=true",
    ]);
    let report = wait_for("the edit held", Duration::from_secs(60), || {
        held_report(&plane)
    });
    assert_eq!(report["affected"], 12, "{report}");

    // The outage: b offline. The blue workloads are on b: re-placed at once
    // (on a: c is drained by the edit in force); the green ones stay held.
    cluster(&plane, "b", "offline");
    wait_pool_on(&plane, &ns, "blue", &["a"], &sidecar);
    let report = wait_for("the rest of the edit held", Duration::from_secs(60), || {
        held_report(&plane).filter(|r| r["affected"] == 6)
    });
    let objects = report["objects"].to_string();
    assert!(
        !objects.contains("blue-") && objects.contains("green-"),
        "{report}"
    );
    assert!(
        pool_placements(&plane, &ns, "green")
            .iter()
            .all(|p| *p == Some(vec!["a".to_owned(), "c".to_owned()])),
        "the edit's own moves stay held"
    );
}

/// A confirmation is for one held occurrence (issue 30, part 6), and it
/// survives unrelated later edits (part 4). An edit held under an id, then
/// reverted: the id's confirmation, left on the ConfigMap, used to approve
/// the same edit made again later (the id named only the revisions). Now a
/// change held again is a new occurrence with a new id; and a tenant's later
/// edits that move nothing (a label on a cluster, again and again) no longer
/// change the id, so the administrator's confirmation still applies.
#[test]
fn a_confirmation_is_for_one_held_occurrence_and_survives_unrelated_edits() {
    let (runtime, plane, ns) = guarded_bed("occurrence", &["a", "b"]);
    let opa = OpaServer::start();
    for n in 0..12 {
        replicaset(&plane, &ns, &format!("rs-{n}"));
    }
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=auto",
            "--remediate=apps/v1/replicasets",
            "--remediation-hold-share=0.5",
            "--remediation-hold-min=10",
            &format!("--policy-namespace={POLICY_NAMESPACE}"),
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    wait_placed_on(&plane, &ns, &["a", "b"], &sidecar);
    let without_b = rules_without_b();
    let edited = [
        ("decision.rego", DECISION),
        ("rules.rego", without_b.as_str()),
    ];

    // A -> B: held under an id; B -> A: nothing to hold.
    policy(&plane, &edited);
    let first = wait_for("the edit held", Duration::from_secs(60), || {
        held_report(&plane)
    });
    let first_id = first["id"].as_str().expect("an id").to_owned();
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );
    wait_for("the report cleared", Duration::from_secs(60), || {
        held_report(&plane).is_none().then_some(())
    });
    // The administrator confirms the first occurrence too late: the
    // confirmation stays on the ConfigMap.
    plane.kubectl_ok(&[
        "annotate",
        "cm",
        "placement",
        "-n",
        POLICY_NAMESPACE,
        "--overwrite",
        &format!("{CONFIRM}={first_id}"),
    ]);
    // B again: held as a new occurrence, not approved by the old one.
    policy(&plane, &edited);
    let again = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the edit held again", Duration::from_secs(60), || {
            held_report(&plane)
        })
    })) {
        Ok(report) => report,
        Err(_) => panic!(
            "the edit made again was not held: {:?}\n{}",
            placements(&plane, &ns),
            sidecar.log_tail()
        ),
    };
    let id = again["id"].as_str().expect("an id").to_owned();
    assert_ne!(id, first_id, "{again}");
    assert!(
        placements(&plane, &ns)
            .iter()
            .all(|p| *p == Some(vec!["a".to_owned(), "b".to_owned()])),
        "applied by a confirmation of another occurrence"
    );

    // A tenant's edits that move nothing: the id stays.
    for n in 0..3 {
        let passes = runtime
            .block_on(sidecar.metric("placement_sync_remediation_passes_total"))
            .unwrap_or(0.0);
        plane.kubectl_ok(&[
            "label",
            "clusters.placement-policy.io",
            "a",
            "--overwrite",
            &format!("team=t{n}"),
        ]);
        wait_for("a pass after the edit", Duration::from_secs(60), || {
            let now = runtime
                .block_on(sidecar.metric("placement_sync_remediation_passes_total"))
                .unwrap_or(0.0);
            (now > passes).then_some(())
        });
        let report = held_report(&plane).expect("still held");
        assert_eq!(report["id"], id.as_str(), "after edit {n}: {report}");
    }
    // The administrator confirms it (while the tenant goes on editing):
    // applied, once.
    plane.kubectl_ok(&[
        "annotate",
        "cm",
        "placement",
        "-n",
        POLICY_NAMESPACE,
        "--overwrite",
        &format!("{CONFIRM}={id}"),
    ]);
    plane.kubectl_ok(&[
        "label",
        "clusters.placement-policy.io",
        "a",
        "--overwrite",
        "team=last",
    ]);
    wait_placed_on(&plane, &ns, &["a"], &sidecar);
    wait_for(
        "the report cleared and the confirmation used up",
        Duration::from_secs(30),
        || {
            (held_report(&plane).is_none()
                && annotation_of(&plane, POLICY_NAMESPACE, "placement", CONFIRM).is_empty())
            .then_some(())
        },
    );
}

/// The decision for an EU Deployment: the clusters its placement names, or
/// the errors when it has any.
fn eu_placement(runtime: &tokio::runtime::Runtime, opa: &OpaServer) -> Result<Vec<String>, Value> {
    let input = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "annotations": {
            "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"}},
        "spec": {"replicas": 1}});
    let outcome = runtime.block_on(policy_client::engine::PolicyEngine::query(
        &opa.client(),
        "io/k8s/federation/admission",
        &input,
        tokio::time::Instant::now() + Duration::from_secs(5),
    ));
    match outcome {
        Ok(policy_client::engine::QueryOutcome::Defined(doc))
            if doc["errors"].as_array().is_some_and(Vec::is_empty) =>
        {
            // The preferences are an object here; the webhook serializes them.
            let clusters = &doc["annotations"][placement_tests::PREFS]["clusters"];
            Ok(clusters
                .as_object()
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default())
        }
        Ok(policy_client::engine::QueryOutcome::Defined(doc)) => Err(doc["errors"].clone()),
        other => Err(json!(format!("{other:?}"))),
    }
}

/// A labelled policy ConfigMap of `namespace` with one module.
fn labelled_policy(plane: &ControlPlane, namespace: &str, name: &str, rego: &str) {
    apply(
        plane,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace,
                "labels": {"openpolicyagent.org/policy": "rego"}},
            "data": {"main.rego": rego}}),
    );
}

/// The policy status of a ConfigMap once the sidecar wrote one.
fn written_status(plane: &ControlPlane, namespace: &str, name: &str) -> String {
    wait_for(
        &format!("the policy status of {namespace}/{name}"),
        Duration::from_secs(30),
        || {
            let status = annotation_of(plane, namespace, name, "placement-policy.io/policy-status");
            (!status.is_empty()).then_some(status)
        },
    )
}

/// Packages have owners. With policies in every namespace (the chart's
/// `policy.namespaces: ["*"]`), a tenant's labelled ConfigMap declaring the
/// shipped placement package, to open member-us-1 to EU workloads or to
/// make every decision fail with a conflicting rule, is refused: its status
/// says why and which namespaces may write the package, and the set in force
/// stays as it was (an EU decision still names member-eu-1 alone). A module
/// of the tenant's own package still loads; a namespace named with
/// `--package-owner-namespaces` may extend the package.
#[test]
fn a_tenants_module_extending_the_shipped_package_is_refused() {
    placement_tests::install_crypto();
    let runtime = placement_tests::current_thread_runtime();
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    for (name, region) in [
        ("member-eu-1", "europe-west1"),
        ("member-us-1", "us-central1"),
    ] {
        apply(
            &plane,
            &json!({"apiVersion": "placement-policy.io/v1alpha1", "kind": "Cluster",
                "metadata": {"name": name},
                "spec": {"address": "https://10.0.0.1", "region": region}}),
        );
        plane.kubectl_ok(&[
            "patch",
            &format!("clusters.placement-policy.io/{name}"),
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"running"}}"#,
        ]);
    }
    let shipped = placement_tests::shipped_policy_modules();
    let shipped: Vec<(&str, &str)> = shipped
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    policy(&plane, &shipped);
    let tenant = unique_name("tenant");
    let platform = unique_name("platform");
    for namespace in [&tenant, &platform] {
        plane.create_namespace(namespace);
    }
    // What the chart grants with policy.namespaces ["*"].
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "every-policy-configmap"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "verbs": ["get", "list", "watch", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "every-policy-configmap"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "every-policy-configmap"},
                "subjects": [{"kind": "ServiceAccount", "name": "placement-policy-remediator",
                    "namespace": placement_tests::SYSTEM_NAMESPACE}]}]}),
    );
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=off",
            &format!("--policy-namespace={POLICY_NAMESPACE}"),
            "--namespaces=*",
            &format!("--package-owner-namespaces={platform}"),
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    let eu_only = || {
        wait_for(
            "an EU decision naming member-eu-1",
            Duration::from_secs(30),
            || eu_placement(&runtime, &opa).ok().filter(|c| !c.is_empty()),
        )
    };
    assert_eq!(eu_only(), ["member-eu-1"]);

    let extend =
        "package io.k8s.federation.placement\n\njurisdiction_clusters contains \"member-us-1\"\n";
    let conflict = "package io.k8s.federation.placement\n\nallowed := set()\n";
    for (name, rego) in [("open-us", extend), ("conflict", conflict)] {
        labelled_policy(&plane, &tenant, name, rego);
        let status = written_status(&plane, &tenant, name);
        // Whatever the status says, the set in force is the owners'.
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            eu_placement(&runtime, &opa),
            Ok(vec!["member-eu-1".to_owned()]),
            "the tenant's {name} changed the decision; its status: {status}\n{}",
            sidecar.log_tail()
        );
        let parsed: Value = serde_json::from_str(&status).expect("status JSON");
        assert_eq!(parsed["status"], "error", "{status}");
        let error = &parsed["errors"][0];
        assert_eq!(error["code"], "owned_package", "{status}");
        assert_eq!(
            error["file"],
            format!("{tenant}/{name}/main.rego"),
            "{status}"
        );
        let message = error["message"].as_str().unwrap_or_default();
        for part in [
            "package io.k8s.federation.placement".to_owned(),
            format!("which namespace {tenant} does not own"),
            format!("only ConfigMaps in namespace {POLICY_NAMESPACE}, {platform} may"),
        ] {
            assert!(message.contains(&part), "{part:?} in {message}");
        }
        let kube_mgmt = annotation_of(
            &plane,
            &tenant,
            name,
            "openpolicyagent.org/kube-mgmt-status",
        );
        assert!(kube_mgmt.contains("owned_package"), "{kube_mgmt}");
    }
    let modules = runtime
        .block_on(policy_client::engine::PolicyEngine::policies(&opa.client()))
        .expect("OPA's modules");
    assert!(
        !modules
            .keys()
            .any(|id| id.starts_with(&format!("{tenant}/"))),
        "{:?}",
        modules.keys()
    );

    // Nor do a module or a data ConfigMap of a namespace named like the
    // replication root add a cluster to the ones the policy reads.
    let fake = json!({"apiVersion": "placement-policy.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "member-fake",
            "labels": {"placement-policy.io/jurisdiction": "eu"}},
        "status": {"phase": "running"}});
    labelled_policy(
        &plane,
        &tenant,
        "fake-cluster",
        &format!("package kubernetes.clusters\n\nmember_fake := {fake}\n"),
    );
    plane.create_namespace("kubernetes");
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "clusters", "namespace": "kubernetes",
                "labels": {"openpolicyagent.org/data": "opa"}},
            "data": {"member-fake": fake.to_string()}}),
    );
    for (namespace, name) in [
        (tenant.as_str(), "fake-cluster"),
        ("kubernetes", "clusters"),
    ] {
        let status = written_status(&plane, namespace, name);
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            eu_placement(&runtime, &opa),
            Ok(vec!["member-eu-1".to_owned()]),
            "{namespace}/{name} added a cluster; its status: {status}\n{}",
            sidecar.log_tail()
        );
        assert!(
            status.contains("owned_package") && status.contains("in data.kubernetes"),
            "{status}"
        );
    }

    // The tenant's own package loads.
    labelled_policy(
        &plane,
        &tenant,
        "own",
        "package tenant.rules\n\nok := true\n",
    );
    let status = written_status(&plane, &tenant, "own");
    assert_eq!(status, r#"{"status":"ok"}"#);
    let ok = runtime.block_on(policy_client::engine::PolicyEngine::query(
        &opa.client(),
        "tenant/rules/ok",
        &json!({}),
        tokio::time::Instant::now() + Duration::from_secs(5),
    ));
    assert!(
        matches!(&ok, Ok(policy_client::engine::QueryOutcome::Defined(v)) if *v == json!(true)),
        "{ok:?}"
    );

    // A named owner's namespace may extend the shipped package.
    labelled_policy(&plane, &platform, "open-us", extend);
    let status = written_status(&plane, &platform, "open-us");
    assert_eq!(status, r#"{"status":"ok"}"#);
    wait_for(
        "member-us-1 in the EU decision",
        Duration::from_secs(30),
        || {
            (eu_placement(&runtime, &opa)
                == Ok(vec!["member-eu-1".to_owned(), "member-us-1".to_owned()]))
            .then_some(())
        },
    );
}

/// `kubectl placement` on the plain bed, with the shipped policy and the
/// example clusters: `explain` says per cluster whether an EU, PCI-2
/// ReplicaSet may run there and why (the policy's reasons and exclusions);
/// `status` says the set is loaded, in force (the last good set holds the
/// ConfigMap's modules) and the engine in sync; an edit of a cluster's
/// labels that moves every workload off it is held, `held` shows the id
/// and the cluster each workload would be taken off, `confirm` of another
/// id is refused with the ids held, and `confirm` of the id lets it through.
#[test]
fn kubectl_placement_explains_checks_and_confirms_a_held_change() {
    use placement_tests::kubectl::{explained_row, kubectl_placement};
    placement_tests::install_crypto();
    let runtime = placement_tests::current_thread_runtime();
    let plane = ControlPlane::start();
    let admin = plane.kubeconfig(placement_tests::Identity::Admin);
    let ns = unique_name("plugin");
    plane.create_namespace(&ns);
    plane.ensure_example_clusters();
    placement_tests::kubectl::create_shipped_policy_configmap(&admin, POLICY_NAMESPACE);
    let last_good = format!(
        "{}/placement-policy-last-good-policies",
        placement_tests::SYSTEM_NAMESPACE
    );
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata":
            {"name": "placement-policy-last-good-policies", "namespace": placement_tests::SYSTEM_NAMESPACE}}),
    );
    let eu_pci2 = |name: &str| {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "x"},
                "annotations": {
                    "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true",
                    "policy.federation.alpha.kubernetes.io/pci-compliance-level": "2"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}},
                "template": {"metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}})
    };
    for n in 0..4 {
        apply(&plane, &eu_pci2(&format!("web-{n}")));
    }
    let opa = OpaServer::start();
    let sidecar = SidecarProcess::start(
        &plane,
        &opa,
        &[
            &format!("--replicate-cluster={CLUSTERS}"),
            "--remediation=auto",
            "--remediate=apps/v1/replicasets",
            "--remediation-hold-share=0.5",
            "--remediation-hold-min=2",
            &format!("--last-good-policies={last_good}"),
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    wait_placed_on(
        &plane,
        &ns,
        &["gce-europe-west1", "gce-europe-west2"],
        &sidecar,
    );
    let key_file = placement_tests::ownership_key_file().display().to_string();
    let keys = format!("--ownership-key-file={key_file}");
    let text = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).into_owned();

    let out = kubectl_placement(&admin, &["explain", "rs/web-0", "-n", &ns, &keys]);
    assert!(out.status.success(), "{out:?}");
    let explained = text(&out);
    let line = |cluster: &str| explained_row(&explained, cluster);
    assert!(
        line("gce-europe-west1").starts_with("gce-europe-west1 yes running, in the EU (eu-jurisdiction-required), PCI compliance level 2 >= 2"),
        "{explained}"
    );
    assert_eq!(
        line("gce-us-central1"),
        "gce-us-central1 no not in the EU (eu-jurisdiction-required)"
    );
    assert_eq!(
        line("aws-eu-central-1"),
        "aws-eu-central-1 no PCI compliance level 1 < 2 (pci-compliance-level)"
    );
    assert!(line("gce-europe-north1").contains("not running (status.phase offline)"));
    assert!(explained.contains("errors: none"), "{explained}");
    // The same offline, from the repository's files.
    let manifest = placement_tests::repo_root().join("examples/replicaset-eu-pci.yaml");
    let policies = placement_tests::repo_root().join("policies");
    let offline = kubectl_placement(
        &admin,
        &[
            "explain",
            "-f",
            &manifest.display().to_string(),
            "--policy-dir",
            &policies.display().to_string(),
        ],
    );
    assert!(offline.status.success(), "{offline:?}");
    assert!(
        text(&offline).contains("aws-eu-central-1    no"),
        "{}",
        text(&offline)
    );

    let sync_url = format!("--sync-url=http://127.0.0.1:{}", sidecar.port);
    let last_good_flag = format!("--last-good-policies={last_good}");
    let status = wait_for(
        "status to say the set is in force",
        Duration::from_secs(30),
        || {
            let out = kubectl_placement(&admin, &["status", &sync_url, &last_good_flag]);
            out.status.success().then(|| text(&out))
        },
    );
    assert!(
        status.contains("Policy set: loaded and in force"),
        "{status}"
    );
    assert!(status.contains("the ConfigMaps' modules"), "{status}");
    assert!(status.contains("Held changes: none"), "{status}");

    // gce-europe-west2 relabelled non-EU: every workload would be taken off
    // it, an edit beyond the radius: held.
    plane.kubectl_ok(&[
        "label",
        "--overwrite",
        "clusters.placement-policy.io/gce-europe-west2",
        "placement-policy.io/jurisdiction=non-eu",
    ]);
    let report = wait_for("the held change reported", Duration::from_secs(60), || {
        held_report(&plane)
    });
    let id = report["id"].as_str().expect("id").to_owned();
    let out = kubectl_placement(&admin, &["held"]);
    assert!(out.status.success(), "{out:?}");
    let held = text(&out);
    assert!(
        held.contains(&id) && held.contains("4 of 4 placed"),
        "{held}"
    );
    assert!(
        held.contains(&format!(
            "replicasets/{ns}/web-0: taken off gce-europe-west2"
        )),
        "{held}"
    );
    let out = kubectl_placement(&admin, &["status", &sync_url, &last_good_flag]);
    assert!(
        text(&out).contains(&format!("Held changes: 1 ({id}")),
        "{}",
        text(&out)
    );

    let wrong = kubectl_placement(&admin, &["confirm", "0000000000000000"]);
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains(&format!("held now: {id}")),
        "{wrong:?}"
    );
    let out = kubectl_placement(&admin, &["confirm", &id]);
    assert!(out.status.success(), "{out:?}");
    wait_placed_on(&plane, &ns, &["gce-europe-west1"], &sidecar);
    let out = kubectl_placement(&admin, &["held"]);
    assert_eq!(text(&out), "no change is held\n");
}
