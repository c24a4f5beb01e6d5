//! placement-policy as Karmada's scheduler: EU placements, explained,
//! refused with a reason, re-placed on scaling, relabelling and failover,
//! and the same replicas as karmada-scheduler for the same weights.

use super::*;

/// The first scenario of scheduling by policy: a Deployment of 6 replicas with EU
/// jurisdiction and PCI 2, handed to placement-policy, gets Works only for
/// the two EU members, 3 + 3 by the policy's even weights, read back from
/// each member's own API server; the binding is `Scheduled=True` for its
/// generation; its pods run in member-eu-1.
#[test]
fn karmada_placement_policy_schedules_an_eu_pci_deployment_onto_the_eu_members() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::named(karmada, &shipped_policy_modules(), "placement-policy");
    // The tour's own files (docs/karmada.md), as a user applies them.
    let namespace = "default";
    for example in ["propagationpolicy.yaml", "deployment-eu-pci.yaml"] {
        let path = repo_root().join("examples/karmada").join(example);
        karmada.kubectl_ok(&["apply", "-f", &path.display().to_string()]);
    }
    let web = "nginx-eu";

    let expected = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    let binding = wait_scheduled(karmada, &scheduler, namespace, web, &expected);
    let condition = scheduled_condition(&binding).expect("condition");
    assert_eq!(condition["reason"], "Success", "{condition}");
    assert!(
        binding["metadata"]["annotations"]["policy.karmada.io/applied-placement"].is_string(),
        "{binding}"
    );
    assert!(
        binding["status"]["lastScheduledTime"].is_string(),
        "{binding}"
    );
    karmada.wait_member_replicas(namespace, web, &expected);

    let eu1 = karmada.member("member-eu-1");
    wait_or_explain(
        "the Deployment's 3 pods to run in member-eu-1",
        Duration::from_secs(180),
        || {
            let text = eu1.kubectl_ok(&[
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                "app=nginx-eu",
                "-o",
                "json",
            ]);
            let pods: Value = serde_json::from_str(&text).expect("pod list JSON");
            let running = pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|pod| pod["status"]["phase"] == "Running")
                .count();
            (running == 3).then_some(())
        },
        || eu1.cluster().expect("member-eu-1 has a node").diagnostics(),
    );
}

/// `kubectl placement` against Karmada's API server: `explain` of an EU,
/// PCI-2 Deployment (its template) and of its ResourceBinding says, per
/// member, that the two EU members may run it and why, and that member-us-1
/// is not in the EU, from the policy set and Karmada's Clusters read there;
/// `status` says the set is in force and the scheduler's engine in sync.
#[test]
fn karmada_kubectl_placement_explains_an_eu_deployment_per_member() {
    use placement_tests::kubectl::{explained_row, kubectl_placement};
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-explain");
    karmada.create_namespace(&namespace);
    let web = deployment(&namespace, "web", 4, json!({EU_KEY: "true", PCI_KEY: "2"}));
    let policy = handed_to(&namespace, "web", &scheduler.name);
    create(karmada, &[&policy, &web]);
    let expected = split(&[("member-eu-1", 2), ("member-eu-2", 2)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &expected);

    let kubeconfig = karmada.karmada_kubeconfig();
    let policies = format!("--policy-namespace={}", scheduler.policy_namespace);
    for object in ["deployment/web", "resourcebinding/web-deployment"] {
        let out = kubectl_placement(
            &kubeconfig,
            &["explain", object, "-n", &namespace, &policies],
        );
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = |member: &str| explained_row(&text, member);
        assert!(
            line("member-eu-1").starts_with("member-eu-1 yes running, in the EU (eu-jurisdiction-required), PCI compliance level 2 >= 2"),
            "{text}"
        );
        assert!(
            line("member-eu-2").starts_with("member-eu-2 yes running"),
            "{text}"
        );
        assert_eq!(
            line("member-us-1"),
            "member-us-1 no not in the EU (eu-jurisdiction-required)",
            "{text}"
        );
        assert!(
            text.contains("cluster.karmada.io/v1alpha1/clusters at data.kubernetes.clusters"),
            "the members are read from Karmada's API server: {text}"
        );
    }
    let sync = scheduler
        .sync
        .as_ref()
        .expect("the scheduler's placement-sync");
    let out = kubectl_placement(
        &kubeconfig,
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

/// A workload the policy forbids (PCI level 5: no member has it) is not
/// scheduled: `Scheduled=False` with the policy's message, a Warning Event on
/// the Deployment, no Work anywhere.
#[test]
fn karmada_a_forbidden_workload_is_not_scheduled_and_says_why() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::named(karmada, &shipped_policy_modules(), "placement-policy");
    // The tour's forbidden Deployment (docs/karmada.md), without the webhook.
    let namespace = "default";
    for example in ["propagationpolicy.yaml", "deployment-forbidden.yaml"] {
        let path = repo_root().join("examples/karmada").join(example);
        karmada.kubectl_ok(&["apply", "-f", &path.display().to_string()]);
    }
    let message = "no cluster satisfies the placement requirements (eu-jurisdiction-required=true, pci-compliance-level>=5)";
    let binding = wait_or_explain(
        "the binding Scheduled=False with the policy's message",
        Duration::from_secs(120),
        || {
            let binding = binding(karmada, namespace, "vault")?;
            let condition = scheduled_condition(&binding)?;
            (condition["status"] == "False").then_some(binding)
        },
        || format!("{}\n{}", scheduler.log_tail(), karmada.diagnostics()),
    );
    let condition = scheduled_condition(&binding).expect("condition");
    assert_eq!(condition["reason"], "NoClusterFit", "{condition}");
    assert_eq!(condition["message"], message, "{condition}");
    assert!(binding_clusters(&binding).is_empty(), "{binding}");
    wait_or_explain(
        "a Warning Event on the Deployment",
        Duration::from_secs(30),
        || {
            karmada
                .events(namespace, "Deployment", "vault")
                .iter()
                .any(|(reason, text)| reason == "ScheduleBindingFailed" && text == message)
                .then_some(())
        },
        || format!("{:?}", karmada.events(namespace, "Deployment", "vault")),
    );
    assert!(karmada.deployment_works(namespace, "vault").is_empty());
    assert!(
        karmada
            .member_replicas(namespace, "vault")
            .values()
            .all(Option::is_none)
    );
}

/// Scaling to 9 gives the new split (Karmada's remainder rule); an edit of
/// the template's annotations (PCI 3: member-eu-1 no longer qualifies)
/// re-places every replica on member-eu-2.
#[test]
fn karmada_scaling_and_an_annotation_edit_re_place_the_deployment() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-scale");
    karmada.create_namespace(&namespace);
    let web = deployment(&namespace, "web", 6, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[&handed_to(&namespace, "web", &scheduler.name), &web],
    );
    let even = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &even);

    karmada.kubectl_ok(&[
        "scale",
        "deployment",
        "web",
        "-n",
        &namespace,
        "--replicas=9",
    ]);
    // 9 over two equal weights is 5 + 4; which member gets the fifth is
    // Karmada's tie-breaker over the template's UID.
    let uid = karmada.kubectl_ok(&[
        "get",
        "deployment",
        "web",
        "-n",
        &namespace,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let (first, second) = if fnv1a_is_odd(uid.trim()) {
        (4, 5)
    } else {
        (5, 4)
    };
    let scaled = split(&[("member-eu-1", first), ("member-eu-2", second)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &scaled);
    karmada.wait_member_replicas(&namespace, "web", &scaled);

    karmada.kubectl_ok(&[
        "annotate",
        "deployment",
        "web",
        "-n",
        &namespace,
        "--overwrite",
        &format!("{PCI_KEY}=3"),
    ]);
    let pci3 = split(&[("member-eu-2", 9)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &pci3);
    karmada.wait_member_replicas(&namespace, "web", &pci3);
}

/// Karmada's tie-breaker direction (`tieBreakerByUID`): FNV-1a of the UID.
fn fnv1a_is_odd(uid: &str) -> bool {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in uid.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash & 1 == 1
}

/// A member labelled non-EU loses every EU replica to the remaining EU
/// member, and none ever goes to member-us-1 (watched all along).
#[test]
fn karmada_a_member_labelled_non_eu_gives_its_replicas_to_the_other_eu_member() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-relabel");
    karmada.create_namespace(&namespace);
    let web = deployment(&namespace, "web", 6, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[&handed_to(&namespace, "web", &scheduler.name), &web],
    );
    wait_scheduled(
        karmada,
        &scheduler,
        &namespace,
        "web",
        &split(&[("member-eu-1", 3), ("member-eu-2", 3)]),
    );
    let label = "placement-policy.io/jurisdiction";
    karmada.kubectl_ok(&[
        "label",
        "clusters.cluster.karmada.io",
        "member-eu-2",
        "--overwrite",
        &format!("{label}=non-eu"),
    ]);
    restoring(
        || {
            let expected = split(&[("member-eu-1", 6)]);
            let mut seen_us = false;
            wait_or_explain(
                "every replica on member-eu-1",
                Duration::from_secs(120),
                || {
                    let works = karmada.deployment_works(&namespace, "web");
                    seen_us |= works.contains_key("member-us-1");
                    let binding = binding(karmada, &namespace, "web")?;
                    seen_us |= binding_clusters(&binding).contains_key("member-us-1");
                    (binding_clusters(&binding) == expected && works == expected).then_some(())
                },
                || format!("{}\n{}", scheduler.log_tail(), karmada.diagnostics()),
            );
            assert!(!seen_us, "a replica went to member-us-1");
            karmada.wait_member_replicas(&namespace, "web", &expected);
        },
        || {
            karmada.kubectl_ok(&[
                "label",
                "clusters.cluster.karmada.io",
                "member-eu-2",
                &format!("{label}-"),
            ]);
        },
    );
}

/// Failover: member-eu-2's API server killed (Karmada's Failover gate and a
/// NoExecute ClusterTaintPolicy on not-ready members): its replicas go to
/// member-eu-1; back again, the policy spreads them over both once more and
/// member-eu-2's copy holds its new share.
#[test]
fn karmada_failover_re_places_a_dead_members_replicas_and_rebalances_when_it_returns() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-failover");
    karmada.create_namespace(&namespace);
    let taint_policy = json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "ClusterTaintPolicy",
        "metadata": {"name": namespace},
        "spec": {
            "targetClusters": {"clusterNames": ["member-eu-2"]},
            "addOnConditions": [{"conditionType": "Ready", "operator": "NotIn", "statusValues": ["True"]}],
            "removeOnConditions": [{"conditionType": "Ready", "operator": "In", "statusValues": ["True"]}],
            "taints": [{"key": "placement-test/not-ready", "effect": "NoExecute"}]
        }
    });
    let web = deployment(&namespace, "web", 6, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[
            &taint_policy,
            &handed_to(&namespace, "web", &scheduler.name),
            &web,
        ],
    );
    let even = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &even);
    karmada.wait_member_replicas(&namespace, "web", &even);

    let member = karmada.member("member-eu-2");
    member.stop_apiserver();
    restoring(
        || {
            restoring(
                || {
                    wait_or_explain(
                        "member-eu-2's replicas re-placed on member-eu-1",
                        Duration::from_secs(180),
                        || {
                            let binding = binding(karmada, &namespace, "web")?;
                            (binding_clusters(&binding) == split(&[("member-eu-1", 6)]))
                                .then_some(())
                        },
                        || format!("{}\n{}", scheduler.log_tail(), karmada.diagnostics()),
                    );
                },
                || member.start_apiserver(),
            );
            karmada.wait_members_ready();
            wait_scheduled(karmada, &scheduler, &namespace, "web", &even);
            karmada.wait_member_replicas(&namespace, "web", &even);
        },
        || {
            karmada.kubectl(&["delete", "clustertaintpolicy", &namespace]);
        },
    );
}

/// A binding changed under placement-sync's write (here by the test; in a
/// failover by Karmada's taint manager, evicting from the dead member beside
/// our moves) is evaluated again on its new version at once and written: not
/// a failed write left for a later pass (a failover's pass is thousands of
/// writes long; stop 47's bench saw moves wait six minutes so). Two bindings
/// wait when placement-sync starts, its writes one every 10 s: as the first
/// is scheduled the test labels the second, whose write its first pass
/// planned from the version before.
#[test]
fn karmada_a_binding_changed_under_its_write_is_written_again_at_once() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let namespace = unique_name("karmada-conflict");
    karmada.create_namespace(&namespace);
    let name = unique_name("pp-sched");
    for web in ["web-a", "web-b"] {
        let template = deployment(&namespace, web, 2, json!({EU_KEY: "true", PCI_KEY: "2"}));
        create(karmada, &[&handed_to(&namespace, web, &name), &template]);
    }
    wait_or_explain(
        "both bindings created, before their scheduler starts",
        Duration::from_secs(60),
        || {
            Some((
                binding(karmada, &namespace, "web-a")?,
                binding(karmada, &namespace, "web-b")?,
            ))
        },
        || karmada.diagnostics(),
    );
    let scheduler = Scheduler::with_flags(
        karmada,
        &shipped_policy_modules(),
        &name,
        &["--remediation-rate=0.1"],
    );
    let placed = |web: &str| {
        binding(karmada, &namespace, web).is_some_and(|b| !binding_clusters(&b).is_empty())
    };
    // `None`: both were scheduled before the test saw one (the rate limit
    // did not hold the second write back).
    let second = wait_or_explain(
        "one binding scheduled",
        Duration::from_secs(120),
        || match (placed("web-a"), placed("web-b")) {
            (true, true) => Some(None),
            (true, false) => Some(Some("web-b")),
            (false, true) => Some(Some("web-a")),
            (false, false) => None,
        },
        || scheduler.log_tail(),
    )
    .unwrap_or_else(|| {
        panic!(
            "both bindings scheduled before the test changed one: the rate limit did not hold the second write 10 s\n{}",
            scheduler.log_tail()
        )
    });
    karmada.kubectl_ok(&[
        "label",
        "resourcebinding",
        "-n",
        &namespace,
        &format!("{second}-deployment"),
        "placement-test/touched=true",
    ]);
    let even = split(&[("member-eu-1", 1), ("member-eu-2", 1)]);
    for web in ["web-a", "web-b"] {
        wait_scheduled(karmada, &scheduler, &namespace, web, &even);
    }
    let sync = scheduler.sync.as_ref().expect("placement-sync runs");
    let errors = current_thread_runtime()
        .block_on(sync.metric(r#"placement_sync_binding_schedules_total{result="error"}"#));
    assert_eq!(
        errors.unwrap_or(0.0),
        0.0,
        "a write counted failed:\n{}",
        sync.log_tail()
    );
    let log = std::fs::read_to_string(sync.log_path()).expect("placement-sync's log");
    assert!(
        log.contains("the write met a newer version of its object"),
        "the second write was not planned from the version before the label:\n{}",
        sync.log_tail()
    );
}

/// Side by side with karmada-scheduler: a policy answering the same static
/// weights as a native PropagationPolicy gives the same replicas per member,
/// remainders and ties included. Each Deployment is scheduled by
/// karmada-scheduler first, then handed to placement-policy (the same
/// template, so the same tie-breaker): placement-policy schedules it
/// (`Scheduled` for the new generation, written by placement-sync) and
/// moves no replica.
#[test]
fn karmada_the_same_static_weights_give_the_same_replicas_as_karmada_scheduler() {
    let _serial = serial();
    let karmada = Karmada::shared();
    // Weights 1:2 for "weighted", 1:1 (ties) for "even".
    let policy = r#"package io.k8s.federation.admission

weights := {"member-eu-1": 1, "member-eu-2": 2} if input.metadata.name == "weighted"
else := {"member-eu-1": 1, "member-eu-2": 1}

annotations := {"federation.kubernetes.io/replica-set-preferences": {"clusters": {name: {"weight": w} | some name, w in weights}}}

errors := set()
"#;
    let scheduler = Scheduler::start(karmada, &[("static.rego".to_owned(), policy.to_owned())]);
    let namespace = unique_name("karmada-static");
    karmada.create_namespace(&namespace);
    for (name, replicas, weights) in [
        ("weighted", 7, (1, 2)),
        ("even", 5, (1, 1)),
        ("even-big", 9, (1, 1)),
    ] {
        let native = json!({
            "apiVersion": "policy.karmada.io/v1alpha1",
            "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name}],
                "placement": {
                    "clusterAffinity": {"clusterNames": ["member-eu-1", "member-eu-2"]},
                    "replicaScheduling": {
                        "replicaSchedulingType": "Divided",
                        "replicaDivisionPreference": "Weighted",
                        "weightPreference": {"staticWeightList": [
                            {"targetCluster": {"clusterNames": ["member-eu-1"]}, "weight": weights.0},
                            {"targetCluster": {"clusterNames": ["member-eu-2"]}, "weight": weights.1}
                        ]}
                    }
                }
            }
        });
        let object = deployment(&namespace, name, replicas, json!({}));
        create(karmada, &[&native, &object]);
        let native_split = wait_or_explain(
            "karmada-scheduler to schedule it",
            Duration::from_secs(120),
            || {
                let binding = binding(karmada, &namespace, name)?;
                let done = scheduled_condition(&binding)?["status"] == "True"
                    && binding["status"]["schedulerObservedGeneration"]
                        == binding["metadata"]["generation"];
                done.then(|| binding_clusters(&binding))
            },
            || karmada.diagnostics(),
        );
        assert_eq!(
            native_split.values().sum::<i64>(),
            replicas,
            "{native_split:?}"
        );
        // A PropagationPolicy's schedulerName cannot change: the native
        // policy goes, and one handing the template to placement-policy
        // claims its binding (the detector keeps the binding's clusters).
        karmada.kubectl_ok(&["delete", "propagationpolicy", name, "-n", &namespace]);
        create(karmada, &[&handed_to(&namespace, name, &scheduler.name)]);
        let ours = wait_or_explain(
            "placement-policy to schedule the handed-over binding",
            Duration::from_secs(120),
            || {
                let binding = binding(karmada, &namespace, name)?;
                let handed = binding["spec"]["schedulerName"] == scheduler.name.as_str();
                let done = handed
                    && binding["status"]["schedulerObservedGeneration"]
                        == binding["metadata"]["generation"]
                    && status_written_by(karmada, &namespace, name, "placement-sync");
                done.then_some(binding)
            },
            || {
                format!(
                    "binding: {}\n{}\n{}",
                    binding(karmada, &namespace, name)
                        .map(|b| serde_json::to_string_pretty(&b).unwrap_or_default())
                        .unwrap_or_default(),
                    scheduler.log_tail(),
                    karmada.diagnostics()
                )
            },
        );
        assert_eq!(
            binding_clusters(&ours),
            native_split,
            "{name}: replicas per member"
        );
    }
}

/// Whether `manager` wrote the status of Deployment `namespace/name`'s
/// binding (its managed fields, which `kubectl get` leaves out by default).
fn status_written_by(karmada: &Karmada, namespace: &str, name: &str, manager: &str) -> bool {
    let text = karmada.kubectl_ok(&[
        "get",
        "resourcebindings.work.karmada.io",
        &format!("{name}-deployment"),
        "-n",
        namespace,
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields}",
    ]);
    let fields: Value = serde_json::from_str(&text).unwrap_or_default();
    fields
        .as_array()
        .into_iter()
        .flatten()
        .any(|f| f["manager"] == manager && f["subresource"] == "status")
}
