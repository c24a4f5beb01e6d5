//! A policy set is whole or not in force, and one change that would re-place
//! most workloads is held until confirmed: a set that lost a module is
//! refused (its status names the missing package) and strips no placement;
//! queries never see half a set; a large re-placement is reported on the
//! policy ConfigMap and applied only once an administrator confirms it.

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

#[test]
fn a_change_beyond_the_blast_radius_is_held_until_confirmed() {
    placement_tests::install_crypto();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plane = ControlPlane::start();
    let opa = OpaServer::start();
    let ns = unique_name("blast");
    plane.create_namespace(&ns);
    cluster(&plane, "a", "running");
    cluster(&plane, "b", "running");
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );
    for n in 0..12 {
        apply(
            &plane,
            &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": format!("rs-{n}"), "namespace": ns, "labels": {"app": "x"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}},
                    "template": {"metadata": {"labels": {"app": "x"}},
                        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}),
        );
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
        ],
    );
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    let both = Some(vec!["a".to_owned(), "b".to_owned()]);
    // Placing unplaced workloads is not re-placing anything: not held.
    wait_for(
        "every ReplicaSet placed on a and b",
        Duration::from_secs(60),
        || {
            placements(&plane, &ns)
                .iter()
                .all(|p| *p == both)
                .then_some(())
        },
    );

    // A policy set that lost its rules module: refused, the ConfigMap's status
    // names the missing package, the last good set stays, no placement is
    // stripped.
    policy(&plane, &[("decision.rego", DECISION)]);
    let status = wait_for(
        "the status to name the missing package",
        Duration::from_secs(30),
        || {
            let status = plane.kubectl_ok(&[
                "get",
                "cm",
                "placement",
                "-n",
                POLICY_NAMESPACE,
                "-o",
                "jsonpath={.metadata.annotations.placement-policy\\.io/policy-status}",
            ]);
            status.contains("test.rules").then_some(status)
        },
    );
    assert!(status.contains("\"error\""), "{status}");
    // The last good set is still whole in OPA: the decision has its rules.
    let decision = runtime.block_on(policy_client::PolicyEngine::query(
        &opa.client(),
        "io/k8s/federation/admission",
        &json!({}),
        tokio::time::Instant::now() + Duration::from_secs(5),
    ));
    assert!(
        matches!(&decision, Ok(policy_client::QueryOutcome::Defined(d)) if d.get("annotations").is_some()),
        "the last good set is in force: {decision:?}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        placements(&plane, &ns).iter().all(|p| *p == both),
        "placements kept with a partial policy set\n{}",
        sidecar.log_tail()
    );
    policy(
        &plane,
        &[("decision.rego", DECISION), ("rules.rego", RULES)],
    );

    // Cluster b goes offline: all 12 placements would change. Held.
    cluster(&plane, "b", "offline");
    let report: Value = wait_for("the held change reported", Duration::from_secs(60), || {
        let text = plane.kubectl_ok(&[
            "get",
            "cm",
            "placement",
            "-n",
            POLICY_NAMESPACE,
            "-o",
            &format!(
                "jsonpath={{.metadata.annotations.{}}}",
                HELD.replace('.', "\\.")
            ),
        ]);
        serde_json::from_str(&text).ok()
    });
    assert_eq!(report["affected"], 12, "{report}");
    assert_eq!(report["placed"], 12, "{report}");
    assert_eq!(report["objects"].as_array().map(Vec::len), Some(12));
    let held = runtime
        .block_on(sidecar.metric("placement_sync_remediation_held_objects"))
        .unwrap_or(0.0);
    assert_eq!(held, 12.0);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        placements(&plane, &ns).iter().all(|p| *p == both),
        "nothing patched while held"
    );
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
        events.contains("12 of 12"),
        "a Warning Event on the ConfigMap: {events}"
    );

    // The administrator confirms exactly this change.
    let id = report["id"].as_str().expect("change id");
    plane.kubectl_ok(&[
        "annotate",
        "cm",
        "placement",
        "-n",
        POLICY_NAMESPACE,
        "--overwrite",
        &format!("{CONFIRM}={id}"),
    ]);
    let only_a = Some(vec!["a".to_owned()]);
    wait_for(
        "every ReplicaSet re-placed on a",
        Duration::from_secs(60),
        || {
            placements(&plane, &ns)
                .iter()
                .all(|p| *p == only_a)
                .then_some(())
        },
    );
    let text = plane.kubectl_ok(&[
        "get",
        "cm",
        "placement",
        "-n",
        POLICY_NAMESPACE,
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    assert!(!text.contains(HELD), "the report is cleared: {text}");
}

/// The modules of one change reach OPA dependencies first, and so do all
/// modules when the sidecar refills a restarted OPA: a query in between sees
/// the old set, the new set, or (OPA empty) no decision, never a decision
/// without the rules it needs.
#[test]
fn queries_never_see_half_a_policy_set() {
    use std::sync::atomic::{AtomicBool, Ordering};
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
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    // The answers' `v` in order, repeats left out (`None`: no decision).
    let history: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let watcher = runtime.spawn({
        let (stop, seen, history) = (stop.clone(), seen.clone(), history.clone());
        async move {
            let mut answers = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                let outcome = policy_client::PolicyEngine::query(
                    &client,
                    "io/k8s/federation/admission",
                    &json!({}),
                    deadline,
                )
                .await;
                answers += 1;
                let mut v = None;
                if let Ok(policy_client::QueryOutcome::Defined(result)) = outcome {
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
            }
            answers
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
    let restarted_at = history.lock().unwrap().len();
    opa.restart();
    runtime.block_on(sidecar.wait_ready(Duration::from_secs(60)));
    // The queries saw OPA without the set, then with the whole set again.
    wait_for(
        "queries to see the refilled OPA",
        Duration::from_secs(30),
        || {
            let history = history.lock().unwrap();
            let after = &history[restarted_at..];
            (after.contains(&None) && after.last() == Some(&two)).then_some(())
        },
    );
    stop.store(true, Ordering::Relaxed);
    let answers = runtime.block_on(watcher).unwrap();
    assert!(answers > 50, "the queries ran ({answers})");
    let seen = seen.lock().unwrap();
    assert!(seen.is_empty(), "answers from half a policy set: {seen:?}");
}
