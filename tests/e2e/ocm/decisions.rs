//! The Placements placement-policy decides: onto the clusters the policy
//! allows, with reasons, explained by `kubectl placement`, published and
//! written again when someone else changes them.

use super::*;

/// An EU, PCI level 2 Deployment in a ManifestWorkReplicaSet whose Placement
/// opts in runs only on `ocm-eu-1` and `ocm-eu-2` (read from the clusters'
/// own API servers; its pod runs in `ocm-eu-1`), although the Placement
/// selects all three; not even the first decision names `ocm-us-1` (the
/// ManifestWorkReplicaSet created first, as the tour does, is read with it);
/// the decisions are written as OCM writes them (name, labels, owner
/// reference), and the Placement's status counts them.
#[test]
fn ocm_decides_an_eu_pci2_deployment_onto_the_eu_clusters_only() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-eu-pci");
    let web_eu = placement(&namespace, "web-eu", Some(&decider), json!({}));
    // Every version of every decision of the namespace, from before the
    // first.
    let watch = DecisionWatch::start(ocm, &namespace, None);
    create(ocm, &[&eu_pci2_web(&namespace, "web-eu"), &web_eu]);

    let eu = names(&["ocm-eu-1", "ocm-eu-2"]);
    wait_decided(ocm, &decider, &namespace, "web-eu", &eu);
    let versions = watch.stop();
    assert!(
        versions.iter().all(|v| !v.contains("ocm-us-1")),
        "the first decision already heeds the ManifestWorkReplicaSet created before the \
         Placement: never ocm-us-1: {versions:?}"
    );
    wait_web_running_on(ocm, &namespace, &eu);

    let stored = decisions(ocm, &namespace, "web-eu");
    assert_eq!(stored.len(), 1, "{stored:?}");
    let decision = &stored[0];
    assert_eq!(decision["metadata"]["name"], "web-eu-decision-1");
    let labels = &decision["metadata"]["labels"];
    assert_eq!(
        labels["cluster.open-cluster-management.io/decision-group-index"],
        "0"
    );
    assert_eq!(
        labels["cluster.open-cluster-management.io/decision-group-name"],
        ""
    );
    let owner = &decision["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Placement");
    assert_eq!(owner["name"], "web-eu");
    assert_eq!(owner["controller"], true);
    let placed = get_placement(ocm, &namespace, "web-eu");
    assert_eq!(owner["uid"], placed["metadata"]["uid"]);
    wait_or_explain(
        "the Placement's status to count its two decisions",
        Duration::from_secs(60),
        || {
            let status = &get_placement(ocm, &namespace, "web-eu")["status"];
            (status["numberOfSelectedClusters"] == 2
                && status["decisionGroups"][0]["decisions"] == json!(["web-eu-decision-1"]))
            .then_some(())
        },
        || format!("{}", get_placement(ocm, &namespace, "web-eu")),
    );
    let satisfied = placement_condition(ocm, &namespace, "web-eu", "PlacementSatisfied")
        .expect("PlacementSatisfied");
    assert_eq!(satisfied["status"], "True", "{satisfied}");
    let misconfigured = placement_condition(ocm, &namespace, "web-eu", "PlacementMisconfigured")
        .expect("PlacementMisconfigured");
    assert_eq!(misconfigured["status"], "False", "{misconfigured}");
}

/// The decisions' reasons are the policy's words: they name the rules that
/// allowed each cluster (EU jurisdiction, the PCI level) and the workload
/// they were given for.
#[test]
fn ocm_decision_reasons_name_the_policys_rules() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-reasons");
    let web_eu = placement(&namespace, "web-eu", Some(&decider), json!({}));
    create(ocm, &[&eu_pci2_web(&namespace, "web-eu"), &web_eu]);
    wait_decided(
        ocm,
        &decider,
        &namespace,
        "web-eu",
        &names(&["ocm-eu-1", "ocm-eu-2"]),
    );
    let reasons: Vec<(String, String)> = decisions(ocm, &namespace, "web-eu")
        .iter()
        .flat_map(|d| {
            d["status"]["decisions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|d| {
            (
                d["clusterName"].as_str().unwrap_or_default().to_owned(),
                d["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for (cluster, level) in [("ocm-eu-1", "2"), ("ocm-eu-2", "3")] {
        let (_, reason) = reasons
            .iter()
            .find(|(c, _)| c == cluster)
            .unwrap_or_else(|| panic!("no decision for {cluster}: {reasons:?}"));
        for words in [
            "in the EU (eu-jurisdiction-required)",
            &format!("PCI compliance level {level} >= 2 (pci-compliance-level)"),
            &format!("Deployment {namespace}/web"),
        ] {
            assert!(
                reason.contains(words),
                "{cluster}: {reason:?} lacks {words:?}"
            );
        }
    }
}

/// `kubectl placement explain` of an opted-in Placement on the hub: the
/// Placement and the EU, PCI-2 Deployment its ManifestWorkReplicaSet
/// delivers are asked together, as the decider asks them; the two EU
/// clusters may run it (the policy's reasons), `ocm-us-1` may not, and its
/// exclusion names the Deployment it comes from; `status` says the set is
/// in force and the decider's engine in sync.
#[test]
fn ocm_kubectl_placement_explains_a_placement_and_its_workload() {
    use placement_tests::kubectl::{explained_row, kubectl_placement};
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-explain");
    let web_eu = placement(&namespace, "web-eu", Some(&decider), json!({}));
    create(ocm, &[&eu_pci2_web(&namespace, "web-eu"), &web_eu]);
    wait_decided(
        ocm,
        &decider,
        &namespace,
        "web-eu",
        &names(&["ocm-eu-1", "ocm-eu-2"]),
    );
    let hub = ocm.hub_kubeconfig();
    let policies = format!("--policy-namespace={}", decider.policy_namespace);
    let out = kubectl_placement(
        &hub,
        &["explain", "placement/web-eu", "-n", &namespace, &policies],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |cluster: &str| explained_row(&text, cluster);
    assert!(
        line("ocm-eu-1").starts_with("ocm-eu-1 yes running, in the EU"),
        "{text}"
    );
    assert!(
        line("ocm-eu-2").starts_with("ocm-eu-2 yes running, in the EU"),
        "{text}"
    );
    assert_eq!(
        line("ocm-us-1"),
        format!("ocm-us-1 no Deployment {namespace}/web: not in the EU (eu-jurisdiction-required)"),
        "{text}"
    );
    let sync = decider.sync.as_ref().expect("the decider's placement-sync");
    let out = kubectl_placement(
        &hub,
        &[
            "status",
            &policies,
            &format!("--sync-url=http://127.0.0.1:{}", sync.port),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Policy set: loaded"), "{text}");
    assert!(text.contains("in sync"), "{text}");
}

/// `numberOfClusters: 1` picks one of the two EU clusters, and only that
/// one runs the Deployment.
#[test]
fn ocm_number_of_clusters_one_picks_one_eu_cluster() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-one");
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
        || {
            format!(
                "{:?}\n{}",
                decisions(ocm, &namespace, "web-one"),
                decider.log_tail()
            )
        },
    );
    assert!(
        chosen.is_subset(&names(&["ocm-eu-1", "ocm-eu-2"])),
        "{chosen:?}"
    );
    wait_or_explain(
        "the Deployment on exactly the chosen cluster",
        Duration::from_secs(120),
        || (clusters_running(ocm, &namespace, "web") == chosen).then_some(()),
        || format!("running on {:?}", clusters_running(ocm, &namespace, "web")),
    );
    let status = &get_placement(ocm, &namespace, "web-one")["status"];
    assert_eq!(status["numberOfSelectedClusters"], 1, "{status}");
}

/// A workload the policy forbids (PCI level 4: no cluster has it) gets no
/// decision; the Placement's `PlacementSatisfied` condition and a Warning
/// Event say why, in the policy's words.
#[test]
fn ocm_a_forbidden_workload_gets_no_decision_and_the_placement_says_why() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-forbidden");
    let vault = deployment(
        &namespace,
        "vault",
        1,
        json!({EU_KEY: "true", PCI_KEY: "4"}),
    );
    let forbidden = placement(&namespace, "vault", Some(&decider), json!({}));
    // The workload first: a Placement is decided from the workloads known
    // when it is (and a decision with errors takes no cluster away).
    create(
        ocm,
        &[
            &replica_set(&namespace, "vault", "vault", &[&vault]),
            &forbidden,
        ],
    );
    let why = "no cluster satisfies the placement requirements (eu-jurisdiction-required=true, pci-compliance-level>=4)";
    let condition = wait_or_explain(
        "the Placement's condition to say why",
        Duration::from_secs(120),
        || {
            placement_condition(ocm, &namespace, "vault", "PlacementSatisfied")
                .filter(|c| c["reason"] == "PolicyDenied")
        },
        || {
            format!(
                "{}\n{}",
                get_placement(ocm, &namespace, "vault"),
                decider.log_tail()
            )
        },
    );
    assert_eq!(condition["status"], "False", "{condition}");
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{message}");
    assert!(
        message.contains(&format!("Deployment {namespace}/vault")),
        "{message}"
    );
    wait_or_explain(
        "a PolicyDenied Event on the Placement",
        Duration::from_secs(60),
        || {
            ocm.events(&namespace, "Placement", "vault")
                .iter()
                .any(|(reason, message)| reason == "PolicyDenied" && message.contains(why))
                .then_some(())
        },
        || format!("{:?}", ocm.events(&namespace, "Placement", "vault")),
    );
    assert!(decided(ocm, &namespace, "vault").is_empty());
    assert!(clusters_running(ocm, &namespace, "vault").is_empty());
}

/// With `--sig-placement-decisions`, each decision is also published as a
/// SIG-Multicluster PlacementDecision (KEP-5313; the CRD of
/// cluster-inventory-api v0.1.0 the chart ships): the clusters as
/// ClusterProfile references with the reasons, the scheduler's name, the
/// KEP's labels, owned by the Placement.
#[test]
fn ocm_publishes_sig_multicluster_placement_decisions_with_a_flag() {
    let _serial = serial();
    let ocm = Ocm::shared();
    ocm.install_sig_placement_decisions();
    let decider = Decider::start(ocm, &["--sig-placement-decisions"]);
    let namespace = namespace(ocm, "ocm-sig");
    let web_eu = placement(&namespace, "web-eu", Some(&decider), json!({}));
    create(ocm, &[&eu_pci2_web(&namespace, "web-eu"), &web_eu]);
    wait_decided(
        ocm,
        &decider,
        &namespace,
        "web-eu",
        &names(&["ocm-eu-1", "ocm-eu-2"]),
    );
    let slice = wait_or_explain(
        "the SIG-Multicluster PlacementDecision",
        Duration::from_secs(60),
        || {
            let out = ocm.kubectl(&[
                "get",
                "placementdecisions.v1alpha1.multicluster.x-k8s.io",
                "-n",
                &namespace,
                "-l",
                "multicluster.x-k8s.io/placement-key=web-eu",
                "-o",
                "json",
            ]);
            let list: Value = serde_json::from_slice(&out.stdout).ok()?;
            list["items"].as_array()?.first().cloned()
        },
        || decider.log_tail(),
    );
    assert_eq!(slice["schedulerName"], decider.name.as_str(), "{slice}");
    let clusters: BTreeSet<String> = slice["decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["clusterProfileRef"]["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(clusters, names(&["ocm-eu-1", "ocm-eu-2"]), "{slice}");
    assert!(
        slice["decisions"][0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("eu-jurisdiction-required")),
        "{slice}"
    );
    let labels = &slice["metadata"]["labels"];
    assert_eq!(
        labels["multicluster.x-k8s.io/decision-key"], "web-eu",
        "{slice}"
    );
    assert_eq!(
        labels["multicluster.x-k8s.io/decision-index"], "0",
        "{slice}"
    );
    assert_eq!(
        slice["metadata"]["ownerReferences"][0]["name"], "web-eu",
        "{slice}"
    );
    // The ClusterProfiles it references exist in the Placement's namespace.
    for cluster in &clusters {
        ocm.kubectl_ok(&["get", "clusterprofile", cluster, "-n", &namespace]);
    }
}

/// The tour of docs/ocm.md, with its files, on what `scripts/testbed up
/// --ocm` runs (the decider and the delivery guard):
/// `examples/ocm/web-eu-pci.yaml` is decided onto the EU clusters and its
/// Deployment runs in `ocm-eu-1`; `examples/ocm/vault-forbidden.yaml`,
/// pointed at the same Placement, is refused at once in the policy's words,
/// and the Placement keeps its decisions.
#[test]
fn ocm_the_tours_examples_are_decided_as_docs_ocm_md_says() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::guarded(ocm, "placement-policy");
    let examples = placement_tests::repo_root().join("examples/ocm");
    let files: Vec<String> = ["web-eu-pci.yaml", "vault-forbidden.yaml"]
        .iter()
        .map(|f| examples.join(f).display().to_string())
        .collect();
    let eu = names(&["ocm-eu-1", "ocm-eu-2"]);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ocm.kubectl_ok(&["apply", "-f", &files[0]]);
        wait_decided(ocm, &decider, "default", "web-eu", &eu);
        let eu1 = ocm.cluster("ocm-eu-1");
        wait_or_explain(
            "the tour's Deployment to run in ocm-eu-1",
            Duration::from_secs(180),
            || {
                let text =
                    eu1.kubectl_ok(&["get", "pods", "-n", "shop", "-l", "app=web", "-o", "json"]);
                let pods: Value = serde_json::from_str(&text).expect("pod list JSON");
                pods["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|pod| pod["status"]["phase"] == "Running")
                    .then_some(())
            },
            || eu1.cluster().expect("ocm-eu-1 has a node").diagnostics(),
        );
        let out = ocm.kubectl(&["create", "-f", &files[1]]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the forbidden example was admitted");
        for words in [
            "placement-policy: ManifestWorkReplicaSet default/vault may not deliver",
            "Deployment default/vault: the placement policy reports errors for it",
            "no cluster satisfies the placement requirements (eu-jurisdiction-required=true, pci-compliance-level>=4)",
        ] {
            assert!(stderr.contains(words), "{words:?} in {stderr}");
        }
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(decided(ocm, "default", "web-eu"), eu);
        assert!(clusters_running(ocm, "default", "vault").is_empty());
    }));
    for file in files.iter().rev() {
        let _ = ocm.kubectl(&["delete", "--ignore-not-found", "-f", file]);
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Someone else's change of a Placement's decisions is undone: a decision
/// deleted, or rewritten to name `ocm-us-1`, is written again as the policy
/// decides (the decider follows the PlacementDecisions, as OCM's scheduler
/// does).
#[test]
fn ocm_decisions_changed_by_someone_else_are_written_again() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::start(ocm, &[]);
    let namespace = namespace(ocm, "ocm-tamper");
    let web_eu = placement(&namespace, "web-eu", Some(&decider), json!({}));
    create(ocm, &[&eu_pci2_web(&namespace, "web-eu"), &web_eu]);
    let eu = names(&["ocm-eu-1", "ocm-eu-2"]);
    wait_decided(ocm, &decider, &namespace, "web-eu", &eu);
    ocm.kubectl_ok(&[
        "patch",
        "placementdecision",
        "web-eu-decision-1",
        "-n",
        &namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"decisions":[{"clusterName":"ocm-us-1","reason":"someone else"}]}}"#,
    ]);
    wait_decided(ocm, &decider, &namespace, "web-eu", &eu);
    ocm.kubectl_ok(&[
        "delete",
        "placementdecision",
        "web-eu-decision-1",
        "-n",
        &namespace,
    ]);
    wait_decided(ocm, &decider, &namespace, "web-eu", &eu);
}
