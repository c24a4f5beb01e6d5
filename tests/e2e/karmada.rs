//! The Karmada test bed itself: a real Karmada control plane (built from
//! `../shared/peers/karmada`) with three members registered in Push mode,
//! driven as a Karmada user drives it, with Karmada's own scheduler.
//!
//! Every test name starts with `karmada_`: where Karmada's source is absent (and
//! `PLACEMENT_KARMADA_BIN` unset), `scripts/test` runs this binary with
//! `--skip karmada_` and says so; run anyway, the tests fail and say why.

use std::collections::BTreeMap;
use std::time::Duration;

use placement_tests::karmada::scenario::{
    EU_KEY, PCI_KEY, binding_clusters, create, deployment, propagation_policy, split,
};
use placement_tests::karmada::{MEMBERS, MemberKind, PCI_LABEL, WORKLOAD_IMAGE, cluster_ready};
use placement_tests::{
    Karmada, OpaServer, SidecarProcess, WebhookProcess, repo_root, restoring,
    shipped_policy_modules, unique_name, wait_for, wait_or_explain,
};
use serde_json::{Value, json};

// One test at a time: they share one federation, and one stops a member.
use placement_tests::serial;

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

// ---------------------------------------------------------------------------
// placement-policy as Karmada's scheduler
// ---------------------------------------------------------------------------

/// OPA and placement-sync scheduling the bindings named `scheduler_name`,
/// with `modules` (file name, Rego) as the policy ConfigMap of a policy
/// namespace of their own.
struct Scheduler {
    name: String,
    policy_namespace: String,
    opa: OpaServer,
    sync: Option<SidecarProcess>,
}

impl Scheduler {
    fn start(karmada: &Karmada, modules: &[(String, String)]) -> Scheduler {
        Scheduler::named(karmada, modules, &unique_name("pp-sched"))
    }

    /// Scheduling the bindings named `name` (the examples' use the default,
    /// `placement-policy`; the tests run one at a time).
    fn named(karmada: &Karmada, modules: &[(String, String)], name: &str) -> Scheduler {
        let name = name.to_owned();
        let policy_namespace = karmada.policy_namespace_with(modules);
        let opa = OpaServer::start();
        let sync = karmada.start_placement_sync(
            &opa,
            &policy_namespace,
            &[&format!("--scheduler-name={name}")],
        );
        Scheduler {
            name,
            policy_namespace,
            opa,
            sync: Some(sync),
        }
    }

    fn shipped(karmada: &Karmada) -> Scheduler {
        Scheduler::start(karmada, &shipped_policy_modules())
    }

    fn log_tail(&self) -> String {
        self.sync
            .as_ref()
            .map(SidecarProcess::log_tail)
            .unwrap_or_default()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if let Some(sync) = self.sync.take() {
            sync.stop();
        }
    }
}

/// A PropagationPolicy handing Deployment `name` to `scheduler`, its replicas
/// divided (by the policy's weights).
fn handed_to(namespace: &str, name: &str, scheduler: &str) -> Value {
    propagation_policy(
        namespace,
        name,
        Some(scheduler),
        json!({"replicaScheduling": {
            "replicaSchedulingType": "Divided",
            "replicaDivisionPreference": "Weighted"
        }}),
    )
}

/// The ResourceBinding of Deployment `namespace/name`, when it exists.
fn binding(karmada: &Karmada, namespace: &str, name: &str) -> Option<Value> {
    karmada.resource_binding(namespace, "Deployment", name)
}

fn scheduled_condition(binding: &Value) -> Option<&Value> {
    binding["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Scheduled")
}

/// Wait until the binding of `namespace/name` is `Scheduled=True` for its
/// current generation with `expected` clusters, and its Works say the same.
fn wait_scheduled(
    karmada: &Karmada,
    scheduler: &Scheduler,
    namespace: &str,
    name: &str,
    expected: &BTreeMap<String, i64>,
) -> Value {
    wait_or_explain(
        &format!("{namespace}/{name} scheduled onto {expected:?}, its Works alike"),
        Duration::from_secs(120),
        || {
            karmada.check_components();
            let binding = binding(karmada, namespace, name)?;
            let condition = scheduled_condition(&binding)?;
            let current = condition["status"] == "True"
                && binding["status"]["schedulerObservedGeneration"]
                    == binding["metadata"]["generation"]
                && binding_clusters(&binding) == *expected
                && karmada.deployment_works(namespace, name) == *expected;
            current.then_some(binding)
        },
        || {
            format!(
                "binding: {}\nWorks: {:?}\nplacement-sync:\n{}\n{}",
                binding(karmada, namespace, name)
                    .map(
                        |b| serde_json::to_string_pretty(&b["spec"]["clusters"]).unwrap()
                            + &serde_json::to_string_pretty(&b["status"]).unwrap()
                    )
                    .unwrap_or_else(|| "none".into()),
                karmada.deployment_works(namespace, name),
                scheduler.log_tail(),
                karmada.diagnostics()
            )
        },
    )
}

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

/// Admission in Karmada's API server: the webhook registered there (on the
/// scheduler's OPA) denies a workload the policy cannot place before any
/// binding exists, and places one it can (the template carries the
/// placement, and the scheduler follows it).
#[test]
fn karmada_the_webhook_denies_an_unplaceable_workload_in_karmadas_api_server() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-admission");
    karmada.create_namespace(&namespace);
    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", scheduler.opa.url()),
        format!("--opa-token-file={}", scheduler.opa.token_file().display()),
        format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
        format!("--policy-namespace={}", scheduler.policy_namespace),
    ]);
    karmada.register_webhook(
        &namespace,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        &scheduler.policy_namespace,
    );
    let vault = deployment(
        &namespace,
        "vault",
        2,
        json!({EU_KEY: "true", PCI_KEY: "5"}),
    );
    create(karmada, &[&handed_to(&namespace, "vault", &scheduler.name)]);
    let out = wait_for(
        "the webhook to answer in Karmada's API server",
        Duration::from_secs(60),
        || {
            let out = karmada.kubectl_stdin(&["create", "-f", "-"], &vault.to_string());
            String::from_utf8_lossy(&out.stderr)
                .contains("no cluster satisfies")
                .then_some(out)
        },
    );
    assert!(
        !out.status.success(),
        "the forbidden Deployment was created"
    );
    assert!(binding(karmada, &namespace, "vault").is_none());

    let web = deployment(&namespace, "web", 4, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[&handed_to(&namespace, "web", &scheduler.name), &web],
    );
    let stored: Value = serde_json::from_str(&karmada.kubectl_ok(&[
        "get",
        "deployment",
        "web",
        "-n",
        &namespace,
        "-o",
        "json",
    ]))
    .expect("deployment JSON");
    assert_eq!(
        placement_tests::placed_clusters(&stored),
        Some(vec!["member-eu-1".to_owned(), "member-eu-2".to_owned()]),
        "the webhook placed the template"
    );
    wait_scheduled(
        karmada,
        &scheduler,
        &namespace,
        "web",
        &split(&[("member-eu-1", 2), ("member-eu-2", 2)]),
    );
}

/// A placement cannot be changed past the webhook in Karmada's API server
/// either (issue 30, part 3): `deployments/status` of a placed template
/// used to store `member-us-1` in its replica-set preferences with no
/// admission call, and its binding then stayed on "requested
/// replica-set-preferences includes invalid clusters: member-us-1" until
/// someone repaired the annotation. The webhook keeps the template's
/// annotations as stored; the binding stays scheduled where it was.
#[test]
fn karmada_a_templates_placement_cannot_be_changed_through_its_status() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = Scheduler::shipped(karmada);
    let namespace = unique_name("karmada-status");
    karmada.create_namespace(&namespace);
    let webhook = WebhookProcess::start(&[
        format!("--opa-url={}", scheduler.opa.url()),
        format!("--opa-token-file={}", scheduler.opa.token_file().display()),
        format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
        format!("--policy-namespace={}", scheduler.policy_namespace),
    ]);
    karmada.register_webhook(
        &namespace,
        &webhook.url("/mutate"),
        &webhook.ca_pem,
        &scheduler.policy_namespace,
    );
    let web = deployment(&namespace, "web", 4, json!({EU_KEY: "true", PCI_KEY: "2"}));
    create(
        karmada,
        &[&handed_to(&namespace, "web", &scheduler.name), &web],
    );
    let even = split(&[("member-eu-1", 2), ("member-eu-2", 2)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &even);
    let get = || -> Value {
        serde_json::from_str(&karmada.kubectl_ok(&[
            "get",
            "deployment",
            "web",
            "-n",
            &namespace,
            "-o",
            "json",
        ]))
        .expect("deployment JSON")
    };
    let stored = get();
    let forged = json!({"metadata": {"annotations": {
        "federation.kubernetes.io/replica-set-preferences":
            r#"{"clusters":{"member-us-1":{"weight":1}}}"#
    }}});
    karmada.kubectl_ok(&[
        "patch",
        "deployment",
        "web",
        "-n",
        &namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        &forged.to_string(),
    ]);
    let after = get();
    assert_eq!(
        after["metadata"]["annotations"], stored["metadata"]["annotations"],
        "the template's annotations changed through status"
    );
    // A later change of the template re-places it as the policy says, not
    // as the forged value would have.
    karmada.kubectl_ok(&[
        "scale",
        "deployment",
        "web",
        "-n",
        &namespace,
        "--replicas=6",
    ]);
    let six = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    wait_scheduled(karmada, &scheduler, &namespace, "web", &six);
    let binding = binding(karmada, &namespace, "web").expect("the binding");
    let condition = scheduled_condition(&binding).expect("condition");
    assert_eq!(condition["status"], "True", "{condition}");
}
