//! Decisions as the clusters change: a cluster relabelled or whose agent
//! stops loses its share; a Placement not opted in stays with OCM's
//! scheduler.

use super::*;

/// With `numberOfClusters: 1`, relabelling the decided EU cluster `non-eu`
/// moves the Deployment to the other EU cluster, never to `ocm-us-1`; the
/// new cluster is added before the old one is removed (the decisions are
/// never empty on the way).
#[test]
fn ocm_a_cluster_relabelled_non_eu_loses_the_workload_to_the_other_eu_cluster() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-relabel");
    let one = placement(
        &namespace,
        "web-one",
        Some(&decider),
        json!({"numberOfClusters": 1}),
    );
    create(ocm, &[&eu_pci2_web(&namespace, "web-one"), &one]);
    let chosen = wait_or_explain(
        "one EU cluster decided",
        Duration::from_secs(120),
        || {
            let now = decided(ocm, &namespace, "web-one");
            (now.len() == 1).then_some(now)
        },
        || decider.log_tail(),
    );
    let from = chosen.iter().next().expect("one").clone();
    let to = if from == "ocm-eu-1" {
        "ocm-eu-2"
    } else {
        "ocm-eu-1"
    };
    let relabel = |jurisdiction: &str| {
        ocm.kubectl_ok(&[
            "label",
            "managedcluster",
            &from,
            &format!("{JURISDICTION_LABEL}={jurisdiction}"),
            "--overwrite",
        ]);
    };
    // Every version of the decision, as a watch delivers them.
    let watch = DecisionWatch::start(ocm, &namespace, Some("web-one-decision-1"));
    relabel("non-eu");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_or_explain(
            &format!("the decision to move from {from} to {to}"),
            Duration::from_secs(120),
            || (decided(ocm, &namespace, "web-one") == names(&[to])).then_some(()),
            || {
                format!(
                    "{:?}\n{}",
                    decisions(ocm, &namespace, "web-one"),
                    decider.log_tail()
                )
            },
        );
        wait_or_explain(
            &format!("the Deployment on {to} only"),
            Duration::from_secs(120),
            || (clusters_running(ocm, &namespace, "web") == names(&[to])).then_some(()),
            || format!("running on {:?}", clusters_running(ocm, &namespace, "web")),
        );
    }));
    relabel("eu");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    let versions = watch.stop();
    let first = versions.first().cloned().unwrap_or_default();
    assert_eq!(
        first,
        names(&[&from]),
        "the watch began at {from}: {versions:?}"
    );
    assert_eq!(
        versions.last().cloned().unwrap_or_default(),
        names(&[to]),
        "{versions:?}"
    );
    assert!(
        versions
            .iter()
            .all(|v| !v.is_empty() && !v.contains("ocm-us-1")),
        "never empty, never ocm-us-1: {versions:?}"
    );
    // Added before removed: the new cluster beside the old one before the
    // old one went.
    let both = names(&[&from, to]);
    let union = versions.iter().position(|v| *v == both);
    let alone = versions.iter().position(|v| *v == names(&[to]));
    assert!(
        union.is_some() && union < alone,
        "{to} added before {from} removed: {versions:?}"
    );
}

/// A cluster whose agent stops (its lease runs out: the hub sets
/// `ManagedClusterConditionAvailable` Unknown) is left: with
/// `numberOfClusters: 1` on `ocm-eu-2`, the decision moves to `ocm-eu-1`,
/// although the Placement tolerates the taints the hub puts on an
/// unavailable cluster (the policy takes only running clusters); the agent
/// started again brings the cluster back.
#[test]
fn ocm_a_cluster_whose_agent_stops_is_left_and_its_share_moves() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-agent");
    // On ocm-eu-2 first: the policy's selection of EU clusters, narrowed to
    // it by a predicate the test then widens.
    let only_eu2 = json!({"numberOfClusters": 1, "predicates": [{"requiredClusterSelector": {
        "labelSelector": {"matchExpressions": [{"key": REGION_LABEL, "operator": "In",
                                                "values": ["europe-west2"]}]}}}],
        "tolerations": [
            {"key": "cluster.open-cluster-management.io/unreachable", "operator": "Exists"},
            {"key": "cluster.open-cluster-management.io/unavailable", "operator": "Exists"}]});
    let one = placement(&namespace, "web-one", Some(&decider), only_eu2);
    create(ocm, &[&eu_pci2_web(&namespace, "web-one"), &one]);
    wait_decided(ocm, &decider, &namespace, "web-one", &names(&["ocm-eu-2"]));
    ocm.kubectl_ok(&[
        "patch",
        "placement",
        "web-one",
        "-n",
        &namespace,
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/spec/predicates"}]"#,
    ]);
    // Steady: it stays where it is while ocm-eu-2 is available.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(decided(ocm, &namespace, "web-one"), names(&["ocm-eu-2"]));

    let eu2 = ocm.cluster("ocm-eu-2");
    eu2.stop_agents();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_or_explain(
            "the hub to see ocm-eu-2 unavailable",
            Duration::from_secs(120),
            || {
                ocm.managed_clusters()
                    .iter()
                    .find(|c| c["metadata"]["name"] == "ocm-eu-2")
                    .is_some_and(|c| !available(c))
                    .then_some(())
            },
            || ocm.diagnostics(),
        );
        wait_decided(ocm, &decider, &namespace, "web-one", &names(&["ocm-eu-1"]));
        wait_or_explain(
            "the Deployment on ocm-eu-1",
            Duration::from_secs(120),
            || {
                clusters_running(ocm, &namespace, "web")
                    .contains("ocm-eu-1")
                    .then_some(())
            },
            || format!("running on {:?}", clusters_running(ocm, &namespace, "web")),
        );
    }));
    eu2.start_agents();
    ocm.wait_clusters_available();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A Placement that does not opt in stays with OCM's scheduler: it decides
/// the EU, PCI level 2 Deployment onto all three clusters (the policy
/// would not), and nothing of placement-sync writes to its decisions or
/// status, although a decider runs (one named on a Placement that does not
/// disable OCM's scheduler is not ours either).
#[test]
fn ocm_a_placement_not_opted_in_stays_with_ocms_scheduler() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-native-kept");
    let mut named_only = placement(&namespace, "named", None, json!({}));
    named_only["metadata"]["annotations"] = json!({SCHEDULER: decider.name});
    let plain = placement(&namespace, "plain", None, json!({}));
    create(
        ocm,
        &[&plain, &named_only, &eu_pci2_web(&namespace, "plain")],
    );
    let all = names(&["ocm-eu-1", "ocm-eu-2", "ocm-us-1"]);
    for name in ["plain", "named"] {
        wait_or_explain(
            &format!("OCM's scheduler to decide {name} onto all three clusters"),
            Duration::from_secs(60),
            || (decided(ocm, &namespace, name) == all).then_some(()),
            || format!("{:?}", decisions(ocm, &namespace, name)),
        );
    }
    wait_or_explain(
        "the Deployment on all three clusters",
        Duration::from_secs(120),
        || (clusters_running(ocm, &namespace, "web") == all).then_some(()),
        || format!("running on {:?}", clusters_running(ocm, &namespace, "web")),
    );
    // A pass over everything happens meanwhile (the decider started).
    std::thread::sleep(Duration::from_secs(3));
    for name in ["plain", "named"] {
        let mut managers: Vec<String> = Vec::new();
        for object in decisions(ocm, &namespace, name)
            .into_iter()
            .chain([get_placement(ocm, &namespace, name)])
        {
            let text = ocm.kubectl_ok(&[
                "get",
                &format!(
                    "{}/{}",
                    object["kind"].as_str().unwrap_or_default().to_lowercase(),
                    object["metadata"]["name"].as_str().unwrap_or_default()
                ),
                "-n",
                &namespace,
                "--show-managed-fields",
                "-o",
                "jsonpath={.metadata.managedFields[*].manager}",
            ]);
            managers.extend(text.split_whitespace().map(str::to_owned));
        }
        assert!(
            !managers.iter().any(|m| m.starts_with("placement-sync")),
            "{name}: {managers:?}"
        );
        assert!(
            ocm.events(&namespace, "Placement", name)
                .iter()
                .all(|(reason, _)| reason != "PolicyDenied" && !reason.is_empty())
        );
    }
}
