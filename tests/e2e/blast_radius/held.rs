//! Held edits: an outage re-places at once, an edit waits for one
//! confirmation (given with `kubectl placement`), a partition is held, and
//! neither a new leader nor re-signed records undo that.

use super::*;

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
