//! Whole policy sets: never seen half loaded, surviving what users do, and
//! the shipped package kept by its owners.

use super::*;

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
