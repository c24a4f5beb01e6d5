//! Workloads of one pool: an outage re-places what it moves beside a held
//! edit, and a confirmation is for one held occurrence.

use super::*;

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
