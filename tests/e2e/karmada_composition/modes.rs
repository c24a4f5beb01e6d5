//! The user's placement in both modes: the guardrail bounds what
//! karmada-scheduler chooses (as the tour documents), and the scheduler mode
//! honours it or says it cannot.

use super::*;

const NO_CLUSTER: &str = "placement-policy.io/no-cluster-allowed";

fn static_weights(weights: &[(&str, i64)]) -> Value {
    let list: Vec<Value> = weights
        .iter()
        .map(|(c, w)| json!({"targetCluster": {"clusterNames": [c]}, "weight": w}))
        .collect();
    json!({"replicaScheduling": {
        "replicaSchedulingType": "Divided",
        "replicaDivisionPreference": "Weighted",
        "weightPreference": {"staticWeightList": list}
    }})
}

/// The placements of the issue's table, with the replicas each member should
/// hold: as the user expects them (the policy allows the two EU members).
fn table() -> Vec<(&'static str, i64, Value, BTreeMap<String, i64>)> {
    vec![
        (
            "names-eu-2",
            4,
            divided(json!({"clusterAffinity": {"clusterNames": ["member-eu-2"]}})),
            split(&[("member-eu-2", 4)]),
        ),
        (
            "weights-2-1",
            6,
            static_weights(&[("member-eu-1", 2), ("member-eu-2", 1)]),
            split(&[("member-eu-1", 4), ("member-eu-2", 2)]),
        ),
        (
            "names-eu-2-us-1",
            3,
            divided(json!({"clusterAffinity": {"clusterNames": ["member-eu-2", "member-us-1"]}})),
            split(&[("member-eu-2", 3)]),
        ),
        (
            "primary-us-backup-eu",
            2,
            divided(json!({"clusterAffinities": [
                {"affinityName": "primary", "clusterNames": ["member-us-1"]},
                {"affinityName": "backup", "clusterNames": ["member-eu-1"]}
            ]})),
            split(&[("member-eu-1", 2)]),
        ),
    ]
}

/// Every cluster name of a binding's placement (its affinity, each term's).
fn placement_names(binding: &Value) -> Vec<String> {
    let placement = &binding["spec"]["placement"];
    let mut affinities = vec![&placement["clusterAffinity"]];
    if let Some(terms) = placement["clusterAffinities"].as_array() {
        affinities.extend(terms);
    }
    affinities
        .into_iter()
        .flat_map(|a| a["clusterNames"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect()
}

/// The table in guardrail mode: each placement karmada-scheduler schedules
/// gives what the user expects, never a replica in the US: a named member
/// the policy allows; static weights 2:1; names with a forbidden member
/// narrowed to the allowed one; a fall-back group taken because the
/// primary's only member is forbidden. Each binding's placement names only
/// allowed members (or none) and records what the policy allows.
#[test]
fn karmada_guardrail_bounds_what_karmada_scheduler_chooses_to_what_the_policy_allows() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    for (name, replicas, placement, _) in table() {
        guard.propagate(karmada, name, replicas, placement);
    }
    for (name, _, _, expected) in table() {
        guard.wait_replicas(karmada, name, &expected);
        let binding = binding(karmada, &guard.namespace, name).expect("binding");
        assert_eq!(binding["spec"]["schedulerName"], "default-scheduler");
        assert_eq!(
            binding["metadata"]["annotations"][ALLOWED], "member-eu-1,member-eu-2",
            "{name}: {}",
            binding["metadata"]
        );
        for cluster in placement_names(&binding) {
            assert!(
                ["member-eu-1", "member-eu-2", NO_CLUSTER].contains(&cluster.as_str()),
                "{name}: {cluster} in {}",
                binding["spec"]["placement"]
            );
        }
    }
    let primary = binding(karmada, &guard.namespace, "primary-us-backup-eu").expect("binding");
    assert_eq!(
        primary["spec"]["placement"]["clusterAffinities"][0]["clusterNames"],
        json!([NO_CLUSTER]),
        "the primary group has no allowed member: it selects none (not any)"
    );
    assert_eq!(
        primary["status"]["schedulerObservingAffinityName"],
        "backup"
    );
}

/// The writes the webhook would admit unevaluated are not sent to it (the
/// chart's conditions, registered as the beds register them): the
/// detector's CREATE of a binding that delivers to no member yet (to
/// `/validate`), and karmada-scheduler's result, which keeps the binding's
/// placement, template and record (to `/mutate`). Every review the webhook
/// receives for a propagation is one it evaluates.
#[test]
fn karmada_guardrail_writes_it_would_admit_unevaluated_are_not_sent() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let placement = json!({"clusterAffinity": {"clusterNames": ["member-eu-1"]}});
    guard.propagate(karmada, "web", 2, placement);
    guard.wait_replicas(karmada, "web", &split(&[("member-eu-1", 2)]));
    let page = current_thread_runtime().block_on(guard.webhook.metrics());
    let count = |operation: &str, outcome: &str| {
        placement_tests::webhook::metric_value(
            &page,
            &format!(
                r#"placement_webhook_admission_requests_total{{operation="{operation}",outcome="{outcome}"}}"#
            ),
        )
    };
    let skipped = count("CREATE", "skipped") + count("UPDATE", "skipped");
    let evaluated = count("CREATE", "patched") + count("CREATE", "unchanged");
    assert!(
        evaluated >= 3.0,
        "the template, its binding and its Work: {page}"
    );
    assert_eq!(
        skipped, 0.0,
        "reviews admitted unevaluated were sent: {page}"
    );
}

/// The tour of docs/karmada.md, with its files: karmada-scheduler's static
/// weights 2:1:1 over member-eu-1, member-eu-2 and member-us-1 give an EU
/// workload 4 and 2 on the EU members, none in the US; member-eu-2
/// relabelled non-EU gives all 6 to member-eu-1.
#[test]
fn karmada_guardrail_tour_as_documented() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::of(karmada, "default", &shipped_policy_modules());
    for example in ["propagationpolicy.yaml", "deployment-eu-pci.yaml"] {
        let path = placement_tests::repo_root()
            .join("examples/karmada/guardrail")
            .join(example);
        karmada.kubectl_ok(&["apply", "-f", &path.display().to_string()]);
    }
    guard.wait_replicas(
        karmada,
        "web-eu",
        &split(&[("member-eu-1", 4), ("member-eu-2", 2)]),
    );
    let binding = binding(karmada, "default", "web-eu").expect("binding");
    assert_eq!(
        binding["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1", "member-eu-2"])
    );
    restoring(
        || {
            karmada.kubectl_ok(&[
                "label",
                "clusters.cluster.karmada.io",
                "member-eu-2",
                "placement-policy.io/jurisdiction=non-eu",
            ]);
            guard.wait_replicas(karmada, "web-eu", &split(&[("member-eu-1", 6)]));
        },
        || {
            karmada.kubectl(&[
                "label",
                "clusters.cluster.karmada.io",
                "member-eu-2",
                "placement-policy.io/jurisdiction-",
            ]);
        },
    );
}

/// The table in scheduler mode: placement-sync schedules the same
/// placements as the user expects them (cluster names within the policy's
/// answer, the user's static weights over the shipped policy's even ones,
/// the first affinity term with an allowed member, observed as
/// karmada-scheduler observes it); spread constraints, which it does not
/// implement, give `Scheduled=False` naming them and pointing to the
/// guardrail, and no Work.
#[test]
fn karmada_scheduler_mode_honours_the_users_placement_or_says_it_cannot() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let scheduler = unique_name("pp-sched");
    let policy_namespace = karmada.policy_namespace_with(&shipped_policy_modules());
    let opa = OpaServer::start();
    let sync = karmada.start_placement_sync(
        &opa,
        &policy_namespace,
        &[&format!("--scheduler-name={scheduler}")],
    );
    let namespace = unique_name("karmada-sched-table");
    karmada.create_namespace(&namespace);
    for (name, replicas, placement, _) in table() {
        create(
            karmada,
            &[
                &propagation_policy(&namespace, name, Some(&scheduler), placement),
                &deployment(&namespace, name, replicas, eu_pci2()),
            ],
        );
    }
    let spread = divided(json!({"spreadConstraints": [
        {"spreadByField": "region", "minGroups": 2, "maxGroups": 2},
        {"spreadByField": "cluster", "minGroups": 2, "maxGroups": 2}
    ]}));
    create(
        karmada,
        &[
            &propagation_policy(&namespace, "spread", Some(&scheduler), spread),
            &deployment(&namespace, "spread", 4, eu_pci2()),
        ],
    );
    for (name, _, _, expected) in table() {
        karmada.wait_member_replicas(&namespace, name, &expected);
        let binding = binding(karmada, &namespace, name).expect("binding");
        assert_eq!(binding_clusters(&binding), expected, "{name}");
    }
    let primary = binding(karmada, &namespace, "primary-us-backup-eu").expect("binding");
    assert_eq!(
        primary["status"]["schedulerObservingAffinityName"],
        "backup"
    );
    let refused = wait_or_explain(
        "the spread-constrained binding refused with a reason",
        Duration::from_secs(120),
        || {
            let binding = binding(karmada, &namespace, "spread")?;
            let condition = binding["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Scheduled")?
                .clone();
            (condition["status"] == "False").then_some(condition)
        },
        || format!("{}\n{}", sync.log_tail(), karmada.diagnostics()),
    );
    let message = refused["message"].as_str().unwrap_or_default();
    assert_eq!(refused["reason"], "SchedulerError", "{refused}");
    assert!(message.contains("spreadConstraints"), "{message}");
    assert!(message.contains("guardrail"), "{message}");
    assert!(karmada.deployment_works(&namespace, "spread").is_empty());
    sync.stop();
}

/// Spread over regions, two groups: karmada-scheduler, bounded by the
/// guardrail, spreads over both EU members (two regions of Europe); the US
/// region is never a group.
#[test]
fn karmada_guardrail_spread_over_two_regions_uses_both_eu_members() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let spread = divided(json!({"spreadConstraints": [
        {"spreadByField": "region", "minGroups": 2, "maxGroups": 2},
        {"spreadByField": "cluster", "minGroups": 2, "maxGroups": 2}
    ]}));
    guard.propagate(karmada, "spread", 4, spread);
    guard.wait_replicas(
        karmada,
        "spread",
        &split(&[("member-eu-1", 2), ("member-eu-2", 2)]),
    );
}
