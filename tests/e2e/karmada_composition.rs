//! Karmada users keep Karmada: the placements Karmada users write, on the
//! real federation with karmada-scheduler running, in both of
//! placement-policy's modes.
//!
//! - **Guardrail** (karmada-scheduler decides): the webhook, registered with
//!   Karmada's API server for templates and ResourceBindings, narrows every
//!   binding write to the clusters the policy allows; placement-sync
//!   (`--guard-karmada-bindings`) admits bindings again when the answer
//!   changes. karmada-scheduler keeps cluster names, weights, fall-back
//!   groups, spread constraints and failover.
//! - **Scheduler** (`schedulerName: <placement-policy's>`): placement-sync
//!   honours the user's cluster affinity, affinity terms and static weights
//!   within the policy's answer, and names what it does not implement.
//!
//! Every Deployment asks for EU jurisdiction and PCI level 2 (the shipped
//! policy then allows `member-eu-1` and `member-eu-2`, never `member-us-1`);
//! replicas are read from each member's own API server. Every test name
//! starts with `karmada_` (skipped by name where Karmada's source is absent).

use std::collections::BTreeMap;
use std::time::Duration;

use placement_tests::karmada::scenario::{
    EU_KEY, PCI_KEY, binding_clusters, create, deployment, propagation_policy, split,
};
use placement_tests::karmada::{MemberKind, MemberSpec, delivery_configuration, guardrail_rules};
use placement_tests::{
    Karmada, OpaServer, SidecarProcess, WebhookProcess, current_thread_runtime, restoring, serial,
    shipped_policy_modules, unique_name, wait_or_explain,
};
use serde_json::{Value, json};

#[path = "karmada_delivery.rs"]
mod delivery;

const ALLOWED: &str = "placement-policy.io/allowed-clusters";
const NO_CLUSTER: &str = "placement-policy.io/no-cluster-allowed";
const HELD: &str = "placement-policy.io/remediation-held";
const CONFIRM: &str = "placement-policy.io/confirm-remediation";

/// OPA, placement-sync and the webhook as the guardrail of one namespace of
/// their own (the webhook registered for its templates and bindings,
/// placement-sync scoped to it), with `modules` as the policy.
struct Guardrail {
    karmada: &'static Karmada,
    namespace: String,
    policy_namespace: String,
    sync: Option<SidecarProcess>,
    _webhook: WebhookProcess,
    _opa: OpaServer,
}

impl Guardrail {
    fn start(karmada: &Karmada, modules: &[(String, String)]) -> Guardrail {
        Guardrail::of(karmada, &unique_name("karmada-guard"), modules)
    }

    /// The guardrail of `namespace` (labelled `placement-test=<namespace>`).
    fn of(karmada: &Karmada, namespace: &str, modules: &[(String, String)]) -> Guardrail {
        Guardrail::of_with(karmada, namespace, modules, &[])
    }

    /// [`Guardrail::of`], placement-sync with `extra` flags.
    fn of_with(
        karmada: &Karmada,
        namespace: &str,
        modules: &[(String, String)],
        extra: &[&str],
    ) -> Guardrail {
        let namespace = namespace.to_owned();
        karmada.create_namespace(&namespace);
        let policy_namespace = karmada.policy_namespace_with(modules);
        let opa = OpaServer::start();
        let scope = format!("--scope-namespace-selector=placement-test={namespace}");
        let mut args = vec![scope.as_str()];
        args.extend_from_slice(extra);
        let sync = karmada.start_guardrail_sync(&opa, &policy_namespace, &args);
        current_thread_runtime().block_on(sync.wait_ready(Duration::from_secs(60)));
        let webhook = WebhookProcess::start(&[
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
            format!("--policy-namespace={policy_namespace}"),
        ]);
        karmada.register_webhook_for(
            &namespace,
            &webhook.url("/mutate"),
            &webhook.ca_pem,
            &policy_namespace,
            guardrail_rules(),
        );
        let delivery = delivery_configuration(
            &format!("{namespace}-delivery"),
            &webhook.url("/validate"),
            &webhook.ca_pem,
            json!({"matchLabels": {"placement-test": namespace}}),
            false,
            Some(&namespace),
        );
        let out = karmada.kubectl_stdin(&["apply", "-f", "-"], &delivery.to_string());
        assert!(
            out.status.success(),
            "register the delivery guard: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Guardrail {
            karmada: Karmada::shared(),
            namespace,
            policy_namespace,
            sync: Some(sync),
            _webhook: webhook,
            _opa: opa,
        }
    }

    fn shipped(karmada: &Karmada) -> Guardrail {
        Guardrail::start(karmada, &shipped_policy_modules())
    }

    /// The shipped policy's guardrail, placement-sync with `extra` flags.
    fn shipped_with(karmada: &Karmada, extra: &[&str]) -> Guardrail {
        Guardrail::of_with(
            karmada,
            &unique_name("karmada-guard"),
            &shipped_policy_modules(),
            extra,
        )
    }

    fn log_tail(&self) -> String {
        self.sync
            .as_ref()
            .map(SidecarProcess::log_tail)
            .unwrap_or_default()
    }

    /// A Deployment of `replicas` asking for EU and PCI 2, propagated by a
    /// PropagationPolicy of `placement` for karmada-scheduler.
    fn propagate(&self, karmada: &Karmada, name: &str, replicas: i64, placement: Value) {
        let ns = &self.namespace;
        create(
            karmada,
            &[
                &propagation_policy(ns, name, None, placement),
                &deployment(ns, name, replicas, eu_pci2()),
            ],
        );
    }

    /// Wait until each member holds `expected` of Deployment `name` (and
    /// the others none), saying what placement-sync did when it does not.
    fn wait_replicas(&self, karmada: &Karmada, name: &str, expected: &BTreeMap<String, i64>) {
        let want: BTreeMap<String, Option<i64>> = karmada
            .members()
            .iter()
            .map(|m| (m.name().to_owned(), expected.get(m.name()).copied()))
            .collect();
        wait_or_explain(
            &format!("the members to hold {expected:?} of {name}"),
            Duration::from_secs(180),
            || (karmada.member_replicas(&self.namespace, name) == want).then_some(()),
            || {
                format!(
                    "members: {:?}\nbinding: {:?}\nplacement-sync:\n{}\n{}",
                    karmada.member_replicas(&self.namespace, name),
                    binding(karmada, &self.namespace, name).map(|b| b["spec"].clone()),
                    self.log_tail(),
                    karmada.diagnostics()
                )
            },
        );
    }
}

impl Drop for Guardrail {
    fn drop(&mut self) {
        // Its webhook stops with it: a configuration left behind would fail
        // every later binding write of the namespace.
        self.karmada.kubectl(&[
            "delete",
            "mutatingwebhookconfiguration",
            &self.namespace,
            "--ignore-not-found",
        ]);
        self.karmada.kubectl(&[
            "delete",
            "validatingwebhookconfiguration",
            &format!("{}-delivery", self.namespace),
            "--ignore-not-found",
        ]);
        if let Some(sync) = self.sync.take() {
            sync.stop();
        }
    }
}

fn eu_pci2() -> Value {
    json!({EU_KEY: "true", PCI_KEY: "2"})
}

fn divided(extra: Value) -> Value {
    let mut placement = json!({"replicaScheduling": {
        "replicaSchedulingType": "Divided",
        "replicaDivisionPreference": "Weighted"
    }});
    for (k, v) in extra.as_object().expect("an object") {
        placement[k] = v.clone();
    }
    placement
}

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

/// The placements of the table, with the replicas each member should
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

fn binding(karmada: &Karmada, namespace: &str, name: &str) -> Option<Value> {
    karmada.resource_binding(namespace, "Deployment", name)
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
