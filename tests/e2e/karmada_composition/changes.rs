//! The guardrail as things change: members relabelled, joining, failing;
//! a policy edit held until confirmed; a user's forbidden edit narrowed.

use super::*;

const HELD: &str = "placement-policy.io/remediation-held";

const CONFIRM: &str = "placement-policy.io/confirm-remediation";

/// Wait for `done` while watching that Deployment `name` never reaches
/// member-us-1 (neither a Work nor the member's API server).
fn never_in_the_us(
    karmada: &Karmada,
    guard: &Guardrail,
    name: &str,
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    wait_or_explain(
        what,
        Duration::from_secs(180),
        || {
            let works = karmada.deployment_works(&guard.namespace, name);
            assert!(
                !works.contains_key("member-us-1"),
                "{name} reached member-us-1: {works:?}\n{}",
                guard.log_tail()
            );
            done().then_some(())
        },
        || {
            format!(
                "binding: {:?}\nmembers: {:?}\n{}\n{}",
                binding(karmada, &guard.namespace, name).map(|b| b["spec"].clone()),
                karmada.member_replicas(&guard.namespace, name),
                guard.log_tail(),
                karmada.diagnostics()
            )
        },
    );
}

/// A member relabelled non-EU: placement-sync admits the binding again
/// narrowed to the other EU member, and karmada-scheduler moves every
/// replica there, none ever to member-us-1 (watched all along). Labelled
/// back, the binding is widened again and both EU members share.
#[test]
fn karmada_guardrail_a_member_relabelled_non_eu_moves_its_replicas_to_the_other_eu_member() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    guard.propagate(karmada, "web", 6, divided(json!({})));
    let even = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    guard.wait_replicas(karmada, "web", &even);
    let label = |value: &str| {
        karmada.kubectl_ok(&[
            "label",
            "clusters.cluster.karmada.io",
            "member-eu-2",
            "--overwrite",
            &format!("placement-policy.io/jurisdiction={value}"),
        ]);
    };
    restoring(
        || {
            label("non-eu");
            never_in_the_us(
                karmada,
                &guard,
                "web",
                "every replica on member-eu-1",
                || {
                    karmada.member_replicas(&guard.namespace, "web")
                        == BTreeMap::from([
                            ("member-eu-1".to_owned(), Some(6)),
                            ("member-eu-2".to_owned(), None),
                            ("member-us-1".to_owned(), None),
                        ])
                },
            );
            let binding = binding(karmada, &guard.namespace, "web").expect("binding");
            assert_eq!(binding["metadata"]["annotations"][ALLOWED], "member-eu-1");
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
    never_in_the_us(karmada, &guard, "web", "both EU members again", || {
        binding(karmada, &guard.namespace, "web")
            .is_some_and(|b| b["metadata"]["annotations"][ALLOWED] == "member-eu-1,member-eu-2")
    });
    guard.wait_replicas(karmada, "web", &even);
}

/// A fourth member, not in the EU, joins after the workloads were placed:
/// it is never a candidate (the binding's placement lists the allowed
/// members, not the forbidden ones): scaled after the join, and a new
/// workload created after it, place on the EU members only.
#[test]
fn karmada_guardrail_a_non_eu_member_joining_later_is_never_chosen() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    guard.propagate(
        karmada,
        "before",
        4,
        json!({"replicaScheduling": {"replicaSchedulingType": "Duplicated"}}),
    );
    let both = split(&[("member-eu-1", 4), ("member-eu-2", 4)]);
    guard.wait_replicas(karmada, "before", &both);
    let joined = karmada.join(MemberSpec {
        name: "member-us-2",
        region: "us-east1",
        pci_level: "3",
        kind: MemberKind::Plain {
            cpu: "64",
            memory: "256Gi",
        },
    });
    karmada.kubectl_ok(&[
        "scale",
        "deployment",
        "before",
        "-n",
        &guard.namespace,
        "--replicas=5",
    ]);
    guard.propagate(
        karmada,
        "after",
        2,
        json!({"replicaScheduling": {"replicaSchedulingType": "Duplicated"}}),
    );
    guard.wait_replicas(
        karmada,
        "before",
        &split(&[("member-eu-1", 5), ("member-eu-2", 5)]),
    );
    guard.wait_replicas(
        karmada,
        "after",
        &split(&[("member-eu-1", 2), ("member-eu-2", 2)]),
    );
    for name in ["before", "after"] {
        let works = karmada.deployment_works(&guard.namespace, name);
        assert!(!works.contains_key("member-us-2"), "{name}: {works:?}");
        let out = joined.kubectl(&["get", "deployment", name, "-n", &guard.namespace]);
        assert!(!out.status.success(), "{name} reached member-us-2");
    }
}

/// Karmada's own failover: member-eu-2's API server killed (Failover gate,
/// a NoExecute ClusterTaintPolicy on not-ready members). Its replicas move
/// to member-eu-1 only, never to member-us-1; back again, both EU members
/// share once more.
#[test]
fn karmada_guardrail_failover_moves_replicas_to_the_other_eu_member_only() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let taint_policy = json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "ClusterTaintPolicy",
        "metadata": {"name": guard.namespace},
        "spec": {
            "targetClusters": {"clusterNames": ["member-eu-2"]},
            "addOnConditions": [{"conditionType": "Ready", "operator": "NotIn", "statusValues": ["True"]}],
            "removeOnConditions": [{"conditionType": "Ready", "operator": "In", "statusValues": ["True"]}],
            "taints": [{"key": "placement-test/not-ready", "effect": "NoExecute"}]
        }
    });
    create(karmada, &[&taint_policy]);
    guard.propagate(karmada, "web", 6, divided(json!({})));
    let even = split(&[("member-eu-1", 3), ("member-eu-2", 3)]);
    guard.wait_replicas(karmada, "web", &even);
    let member = karmada.member("member-eu-2");
    restoring(
        || {
            restoring(
                || {
                    member.stop_apiserver();
                    never_in_the_us(
                        karmada,
                        &guard,
                        "web",
                        "every replica on member-eu-1",
                        || {
                            binding(karmada, &guard.namespace, "web").is_some_and(|b| {
                                binding_clusters(&b) == split(&[("member-eu-1", 6)])
                            })
                        },
                    );
                },
                || member.start_apiserver(),
            );
            karmada.wait_members_ready();
            never_in_the_us(karmada, &guard, "web", "both EU members again", || {
                binding(karmada, &guard.namespace, "web")
                    .is_some_and(|b| binding_clusters(&b) == even)
            });
            guard.wait_replicas(karmada, "web", &even);
        },
        || {
            karmada.kubectl(&["delete", "clustertaintpolicy", &guard.namespace]);
        },
    );
}

/// A policy edit that would move more than the blast radius (every one of
/// 12 workloads off member-eu-2) is held: reported on the policy ConfigMap,
/// no binding narrowed, until an administrator confirms; then every binding
/// is admitted again and karmada-scheduler moves the replicas.
#[test]
fn karmada_guardrail_a_policy_edit_beyond_the_blast_radius_is_held_until_confirmed() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let names: Vec<String> = (0..12).map(|i| format!("web-{i}")).collect();
    for name in &names {
        guard.propagate(karmada, name, 2, divided(json!({})));
    }
    let even = split(&[("member-eu-1", 1), ("member-eu-2", 1)]);
    for name in &names {
        guard.wait_replicas(karmada, name, &even);
    }
    // The edit: member-eu-2 no longer allowed, for everything.
    let modules: Vec<(String, String)> = shipped_policy_modules()
        .into_iter()
        .map(|(file, source)| {
            let source = source.replace(
                "allowed := (running_clusters & jurisdiction_clusters) & pci_clusters",
                "allowed := ((running_clusters & jurisdiction_clusters) & pci_clusters) - {\"member-eu-2\"}",
            );
            (file, source)
        })
        .collect();
    assert!(
        modules
            .iter()
            .any(|(_, s)| s.contains("- {\"member-eu-2\"}")),
        "the shipped rules changed: the edit no longer applies"
    );
    let dir = placement_tests::scratch_dir("karmada-edit");
    let mut args = vec![
        "create".to_owned(),
        "configmap".to_owned(),
        "placement".to_owned(),
        "-n".to_owned(),
        guard.policy_namespace.clone(),
        "--dry-run=client".to_owned(),
        "-o".to_owned(),
        "yaml".to_owned(),
    ];
    for (file, source) in &modules {
        let path = dir.join(file);
        std::fs::write(&path, source).expect("write module");
        args.push(format!("--from-file={}", path.display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let manifest = karmada.kubectl_ok(&args);
    let out = karmada.kubectl_stdin(&["apply", "-f", "-"], &manifest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held_report = || -> Option<Value> {
        let text = karmada.kubectl_ok(&[
            "get",
            "cm",
            "placement",
            "-n",
            &guard.policy_namespace,
            "-o",
            &format!(
                "jsonpath={{.metadata.annotations.{}}}",
                HELD.replace('.', "\\.")
            ),
        ]);
        serde_json::from_str(&text).ok()
    };
    let report = wait_or_explain(
        "the edit held and reported",
        Duration::from_secs(120),
        held_report,
        || guard.log_tail(),
    );
    assert_eq!(report["affected"], 12, "{report}");
    for name in &names {
        let binding = binding(karmada, &guard.namespace, name).expect("binding");
        assert_eq!(
            binding["metadata"]["annotations"][ALLOWED], "member-eu-1,member-eu-2",
            "{name} narrowed while held"
        );
    }
    let id = report["id"].as_str().expect("a change id").to_owned();
    karmada.kubectl_ok(&[
        "annotate",
        "cm",
        "placement",
        "-n",
        &guard.policy_namespace,
        "--overwrite",
        &format!("{CONFIRM}={id}"),
    ]);
    for name in &names {
        guard.wait_replicas(karmada, name, &split(&[("member-eu-1", 2)]));
    }
}

/// A user adding member-us-1 to a guarded binding's cluster names (and
/// writing the guardrail's record to match) is narrowed again in admission,
/// and the same edit through `resourcebindings/status` changes neither:
/// the stored placement and the record stay the policy's, and no replica
/// reaches member-us-1.
#[test]
fn karmada_guardrail_a_users_edit_adding_a_forbidden_member_is_narrowed_again() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    guard.propagate(
        karmada,
        "web",
        2,
        divided(json!({"clusterAffinity": {"clusterNames": ["member-eu-2"]}})),
    );
    guard.wait_replicas(karmada, "web", &split(&[("member-eu-2", 2)]));
    let rb = binding(karmada, &guard.namespace, "web").expect("binding");
    let rb_name = rb["metadata"]["name"].as_str().expect("name").to_owned();
    let edit = json!({
        "metadata": {"annotations": {ALLOWED: "member-eu-2,member-us-1"}},
        "spec": {"placement": {"clusterAffinity": {"clusterNames": ["member-eu-2", "member-us-1"]}}}
    });
    karmada.kubectl_ok(&[
        "patch",
        "resourcebinding",
        &rb_name,
        "-n",
        &guard.namespace,
        "--type=merge",
        "-p",
        &edit.to_string(),
    ]);
    let through_status = [
        "patch",
        "resourcebinding",
        &rb_name,
        "-n",
        &guard.namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        &edit.to_string(),
    ];
    for (how, patch) in [
        ("an edit", None),
        ("an edit through status", Some(through_status)),
    ] {
        if let Some(patch) = patch {
            karmada.kubectl_ok(&patch);
        }
        let stored = binding(karmada, &guard.namespace, "web").expect("binding");
        assert_eq!(
            stored["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["member-eu-2"]),
            "after {how}: {}",
            stored["spec"]["placement"]
        );
        assert_eq!(
            stored["metadata"]["annotations"][ALLOWED], "member-eu-1,member-eu-2",
            "after {how}"
        );
    }
    never_in_the_us(
        karmada,
        &guard,
        "web",
        "the binding still on member-eu-2",
        || {
            binding(karmada, &guard.namespace, "web")
                .is_some_and(|b| binding_clusters(&b) == split(&[("member-eu-2", 2)]))
        },
    );
}
