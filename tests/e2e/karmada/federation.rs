//! The federation itself: members registered, a Deployment propagated by
//! static weights, a member's API server killed and back.

use super::*;

/// A Deployment of 3 replicas propagated by a native PropagationPolicy
/// (karmada-scheduler, static weights 2:1 over the two EU members) is split
/// 2 + 1 into Works for exactly those members; each member's own API server
/// has the Deployment with its share; its pods run in `member-eu-1`.
#[test]
fn karmada_propagates_a_deployment_by_static_weights_onto_the_eu_members() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let namespace = unique_name("karmada-native");
    karmada.create_namespace(&namespace);

    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": WORKLOAD_IMAGE}]}
            }
        }
    });
    let policy = json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "PropagationPolicy",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
            "placement": {
                "clusterAffinity": {"clusterNames": ["member-eu-1", "member-eu-2"]},
                "replicaScheduling": {
                    "replicaSchedulingType": "Divided",
                    "replicaDivisionPreference": "Weighted",
                    "weightPreference": {"staticWeightList": [
                        {"targetCluster": {"clusterNames": ["member-eu-1"]}, "weight": 2},
                        {"targetCluster": {"clusterNames": ["member-eu-2"]}, "weight": 1}
                    ]}
                }
            }
        }
    });
    for object in [&policy, &deployment] {
        let out = karmada.kubectl_stdin(&["create", "-f", "-"], &object.to_string());
        assert!(
            out.status.success(),
            "create {}: {}",
            object["kind"],
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // karmada-webhook defaulted the policy as it does for users.
    let stored = karmada.kubectl_ok(&[
        "get",
        "propagationpolicy",
        "web",
        "-n",
        &namespace,
        "-o",
        "jsonpath={.metadata.labels.propagationpolicy\\.karmada\\.io/permanent-id}",
    ]);
    assert!(
        !stored.trim().is_empty(),
        "karmada-webhook did not label the PropagationPolicy"
    );

    let expected: BTreeMap<String, i64> =
        [("member-eu-1".to_owned(), 2), ("member-eu-2".to_owned(), 1)].into();
    wait_or_explain(
        "Works of the Deployment for both EU members",
        Duration::from_secs(120),
        || {
            karmada.check_components();
            (karmada.deployment_works(&namespace, "web") == expected).then_some(())
        },
        || {
            format!(
                "Works by member: {:?}, expected {expected:?}\n{}",
                karmada.deployment_works(&namespace, "web"),
                karmada.diagnostics()
            )
        },
    );

    // karmada-scheduler placed the binding; the Works follow its clusters.
    let binding = karmada
        .resource_binding(&namespace, "Deployment", "web")
        .expect("the Deployment's ResourceBinding");
    assert_eq!(binding["spec"]["schedulerName"], "default-scheduler");
    let scheduled: BTreeMap<String, i64> = binding["spec"]["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or_default().to_owned();
            (name, c["replicas"].as_i64().unwrap_or(-1))
        })
        .collect();
    assert_eq!(scheduled, expected, "the binding: {binding}");

    for member in karmada.members() {
        let want = expected.get(member.name());
        let found = wait_for(
            "each member's API server to have its share (or nothing)",
            Duration::from_secs(60),
            || {
                let out = member.kubectl(&[
                    "get",
                    "deployment",
                    "web",
                    "-n",
                    &namespace,
                    "-o",
                    "jsonpath={.spec.replicas}",
                ]);
                let replicas = out
                    .status
                    .success()
                    .then(|| {
                        String::from_utf8_lossy(&out.stdout)
                            .trim()
                            .parse::<i64>()
                            .ok()
                    })
                    .flatten();
                (replicas.as_ref() == want).then_some(replicas)
            },
        );
        assert_eq!(found.as_ref(), want, "{}", member.name());
    }

    let eu1 = karmada.member("member-eu-1");
    let running = wait_or_explain(
        "the Deployment's pods to run in member-eu-1",
        Duration::from_secs(180),
        || {
            let text = eu1.kubectl_ok(&[
                "get", "pods", "-n", &namespace, "-l", "app=web", "-o", "json",
            ]);
            let pods: Value = serde_json::from_str(&text).expect("pod list JSON");
            let running: Vec<String> = pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|pod| pod["status"]["phase"] == "Running")
                .filter_map(|pod| pod["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            (running.len() == 2).then_some(running)
        },
        || eu1.cluster().expect("member-eu-1 has a node").diagnostics(),
    );
    assert_eq!(running.len(), 2, "{running:?}");
}

/// The members are registered as the Karmada tests expect: Push mode, the
/// region and PCI label of each, Ready, and a resource summary that adds up
/// the member's Nodes.
#[test]
fn karmada_registers_the_three_members_with_their_regions_labels_and_capacity() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let clusters = karmada.clusters();
    let names: Vec<&str> = clusters
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["member-eu-1", "member-eu-2", "member-us-1"]);
    for spec in MEMBERS {
        let cluster = clusters
            .iter()
            .find(|c| c["metadata"]["name"] == spec.name)
            .expect("registered");
        assert_eq!(cluster["spec"]["syncMode"], "Push", "{cluster}");
        assert_eq!(cluster["spec"]["region"], spec.region, "{cluster}");
        assert_eq!(
            cluster["metadata"]["labels"][PCI_LABEL], spec.pci_level,
            "{cluster}"
        );
        assert!(cluster_ready(cluster), "{cluster}");
        let allocatable = &cluster["status"]["resourceSummary"]["allocatable"];
        match spec.kind {
            MemberKind::Plain { cpu, memory } => {
                assert_eq!(allocatable["cpu"], cpu, "{cluster}");
                assert_eq!(allocatable["memory"], memory, "{cluster}");
            }
            MemberKind::Node => {
                // The real node's allocatable, as its kubelet reports it.
                let node = karmada.member(spec.name).kubectl_ok(&[
                    "get",
                    "nodes",
                    "-o",
                    "jsonpath={.items[0].status.allocatable.cpu}",
                ]);
                assert_eq!(allocatable["cpu"], node.trim(), "{cluster}");
            }
            MemberKind::Light => unreachable!("MEMBERS has no light member"),
        }
    }
}

/// Killing a member's API server makes Karmada report the member not Ready;
/// starting it again makes it Ready again (the failover tests' lever). Tried
/// on `member-eu-1`, whose API server runs in the node's namespaces.
#[test]
fn karmada_sees_a_member_api_server_killed_and_back() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let member = karmada.member("member-eu-1");
    member.stop_apiserver();
    let ready = |karmada: &Karmada| {
        karmada
            .clusters()
            .iter()
            .find(|c| c["metadata"]["name"] == member.name())
            .is_some_and(cluster_ready)
    };
    restoring(
        || {
            wait_or_explain(
                "Karmada to see member-eu-1 not Ready with its API server down",
                Duration::from_secs(120),
                || (!ready(karmada)).then_some(()),
                || karmada.diagnostics(),
            )
        },
        || member.start_apiserver(),
    );
    karmada.wait_members_ready();
    assert!(ready(karmada));
}
