//! The last hop in Karmada (the `delivery` module of `karmada_composition`,
//! beside the guardrail it completes): an EU, PCI-2 workload never reaches
//! member-us-1, whatever path delivers it. Each test drives one path a
//! tenant or a controller can take and reads member-us-1's own API server
//! over a window (never there, not only gone at the end):
//!
//! 1. a binding's `spec.clusters` or `spec.requiredBy` patched by hand;
//! 2. a ResourceBinding written by hand (no PropagationPolicy), or pointed
//!    at another template;
//! 3. a Work written straight into `karmada-es-member-us-1`;
//! 4. a reschedule karmada-scheduler cannot do (a spread constraint the
//!    narrowed placement cannot meet): placement-sync takes the member out;
//! 5. a template edit that adds the requirement to a workload on the member;
//! 8. an EU StatefulSet (a kind the policy did not place before).

use std::time::{Duration, Instant};

use placement_tests::karmada::scenario::{EU_KEY, PCI_KEY, create, propagation_policy, split};
use placement_tests::karmada::{Karmada, WORKLOAD_IMAGE};
use placement_tests::{restoring, serial, wait_or_explain};
use serde_json::{Value, json};

use super::{ALLOWED, Guardrail, binding, eu_pci2};

const US: &str = "member-us-1";

/// `kind` `namespace/name` in `member`'s own API server, if it is there.
fn on_member(
    karmada: &Karmada,
    member: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Option<Value> {
    let out = karmada
        .member(member)
        .kubectl(&["get", kind, name, "-n", namespace, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("object JSON"))
}

/// Watch `member`'s API server for `window`: `kind` `namespace/name` must
/// never be there with `forbidden` true of it (any version, when `None`).
fn never_on(
    karmada: &Karmada,
    member: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    window: Duration,
    forbidden: Option<&dyn Fn(&Value) -> bool>,
) {
    let until = Instant::now() + window;
    while Instant::now() < until {
        if let Some(found) = on_member(karmada, member, kind, namespace, name) {
            let bad = forbidden.is_none_or(|f| f(&found));
            assert!(
                !bad,
                "{kind} {namespace}/{name} reached {member}: {}",
                found["metadata"]
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `kubectl` that must be refused by the delivery guard, naming `member`.
fn refused(karmada: &Karmada, args: &[&str], stdin: Option<&str>, member: &str) -> String {
    let out = match stdin {
        Some(text) => karmada.kubectl_stdin(args, text),
        None => karmada.kubectl(args),
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kubectl {args:?} was admitted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("may not deliver") && stderr.contains(member),
        "kubectl {args:?} failed otherwise: {stderr}"
    );
    stderr
}

fn names(names: &[&str]) -> Value {
    json!({"clusterAffinity": {"clusterNames": names}})
}

/// 1. A binding of an EU workload patched by hand onto member-us-1, in
///    `spec.clusters` or `spec.requiredBy`: refused, naming the member and
///    what the policy allows; member-us-1 never gets the Deployment.
#[test]
fn karmada_delivery_a_binding_patched_onto_a_forbidden_member_is_refused() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let ns = guard.namespace.clone();
    guard.propagate(karmada, "web", 2, names(&["member-eu-1"]));
    guard.wait_replicas(karmada, "web", &split(&[("member-eu-1", 2)]));
    let clusters = json!({"spec": {"clusters": [
        {"name": "member-eu-1", "replicas": 2}, {"name": US, "replicas": 2}]}});
    let stderr = refused(
        karmada,
        &[
            "patch",
            "resourcebinding",
            "web-deployment",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            &clusters.to_string(),
        ],
        None,
        US,
    );
    assert!(stderr.contains("member-eu-1, member-eu-2"), "{stderr}");
    let required = json!({"spec": {"requiredBy": [{"name": "other", "namespace": ns,
        "clusters": [{"name": US, "replicas": 1}]}]}});
    refused(
        karmada,
        &[
            "patch",
            "resourcebinding",
            "web-deployment",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            &required.to_string(),
        ],
        None,
        US,
    );
    never_on(
        karmada,
        US,
        "deployment",
        &ns,
        "web",
        Duration::from_secs(15),
        None,
    );
    let binding = binding(karmada, &ns, "web").expect("binding");
    assert_eq!(
        binding["spec"]["clusters"],
        json!([{"name": "member-eu-1", "replicas": 2}])
    );
}

/// 2. A ResourceBinding written by hand for the EU template, with
///    `spec.clusters` on member-us-1 and no PropagationPolicy (which
///    karmada-scheduler would never touch): refused. And a binding of a
///    workload that may run in the US, pointed at the EU template: refused.
#[test]
fn karmada_delivery_a_binding_written_by_hand_or_retargeted_is_refused() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let ns = guard.namespace.clone();
    create(
        karmada,
        &[
            &placement_tests::karmada::scenario::deployment(&ns, "vault", 1, eu_pci2()),
            &propagation_policy(&ns, "plain", None, names(&[US])),
            &placement_tests::karmada::scenario::deployment(&ns, "plain", 1, json!({})),
        ],
    );
    guard.wait_replicas(karmada, "plain", &split(&[(US, 1)]));
    let uid = karmada.kubectl_ok(&[
        "get",
        "deployment",
        "vault",
        "-n",
        &ns,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let resource = json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns,
                          "name": "vault", "uid": uid.trim()});
    let by_hand = json!({
        "apiVersion": "work.karmada.io/v1alpha2",
        "kind": "ResourceBinding",
        "metadata": {"name": "vault-by-hand", "namespace": ns},
        "spec": {"resource": resource, "replicas": 1,
                 "clusters": [{"name": US, "replicas": 1}]}
    });
    refused(
        karmada,
        &["create", "-f", "-"],
        Some(&by_hand.to_string()),
        US,
    );
    let retarget = json!({"spec": {"resource": resource}});
    refused(
        karmada,
        &[
            "patch",
            "resourcebinding",
            "plain-deployment",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            &retarget.to_string(),
        ],
        None,
        US,
    );
    never_on(
        karmada,
        US,
        "deployment",
        &ns,
        "vault",
        Duration::from_secs(15),
        None,
    );
}

/// 3. A Work written straight into member-us-1's execution namespace,
///    carrying the EU Deployment: refused; the same Work carrying a
///    Deployment without requirements is delivered (the check is the
///    policy's, not a blanket refusal).
#[test]
fn karmada_delivery_a_work_written_into_a_forbidden_members_namespace_is_refused() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let ns = guard.namespace.clone();
    let work = |name: &str, annotations: Value| {
        let manifest = placement_tests::karmada::scenario::deployment(&ns, name, 1, annotations);
        json!({
            "apiVersion": "work.karmada.io/v1alpha1",
            "kind": "Work",
            // Karmada's own annotation, which the test's configuration
            // selects Works by (the chart's checks every Work).
            "metadata": {"name": format!("{ns}-{name}"), "namespace": format!("karmada-es-{US}"),
                         "annotations": {"resourcebinding.karmada.io/namespace": ns}},
            "spec": {"workload": {"manifests": [manifest]}}
        })
    };
    let stderr = refused(
        karmada,
        &["create", "-f", "-"],
        Some(&work("vault", eu_pci2()).to_string()),
        US,
    );
    assert!(
        stderr.contains(&format!("Deployment {ns}/vault")),
        "{stderr}"
    );
    karmada.kubectl_stdin(&["create", "-f", "-"], &work("open", json!({})).to_string());
    wait_or_explain(
        "the Deployment without requirements on member-us-1",
        Duration::from_secs(120),
        || on_member(karmada, US, "deployment", &ns, "open").map(|_| ()),
        || karmada.diagnostics(),
    );
    never_on(
        karmada,
        US,
        "deployment",
        &ns,
        "vault",
        Duration::from_secs(10),
        None,
    );
    karmada.kubectl(&[
        "delete",
        "work",
        &format!("{ns}-open"),
        "-n",
        &format!("karmada-es-{US}"),
        "--wait=false",
    ]);
}

/// 4. A reschedule karmada-scheduler cannot do: duplicated over two
///    regions (a spread constraint), then member-eu-2 relabelled non-EU. The narrowed placement leaves one
///    region, karmada-scheduler fails ("the number of feasible region is
///    less than spreadConstraint.MinGroups") and writes nothing, so
///    `spec.clusters` keeps member-eu-2. placement-sync takes it out after
///    its grace, with the condition and the Event naming both reasons, and
///    member-eu-2's Deployment goes.
#[test]
fn karmada_delivery_a_failed_reschedule_is_repaired_by_placement_sync() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped_with(karmada, &["--karmada-reschedule-grace=3s"]);
    let ns = guard.namespace.clone();
    // Duplicated: karmada-scheduler honours spread constraints there (it
    // ignores them for a division by static weights).
    let spread = json!({
        "replicaScheduling": {"replicaSchedulingType": "Duplicated"},
        "spreadConstraints": [
            {"spreadByField": "region", "minGroups": 2, "maxGroups": 2},
            {"spreadByField": "cluster", "minGroups": 2, "maxGroups": 2}
        ]
    });
    guard.propagate(karmada, "spread", 2, spread);
    guard.wait_replicas(
        karmada,
        "spread",
        &split(&[("member-eu-1", 2), ("member-eu-2", 2)]),
    );
    restoring(
        || {
            karmada.kubectl_ok(&[
                "label",
                "clusters.cluster.karmada.io",
                "member-eu-2",
                "--overwrite",
                "placement-policy.io/jurisdiction=non-eu",
            ]);
            wait_or_explain(
                "member-eu-2 taken out of the binding and its Deployment gone",
                Duration::from_secs(120),
                || {
                    let b = binding(karmada, &ns, "spread")?;
                    let delivered: Vec<&str> = b["spec"]["clusters"]
                        .as_array()?
                        .iter()
                        .filter_map(|c| c["name"].as_str())
                        .collect();
                    (b["metadata"]["annotations"][ALLOWED] == "member-eu-1"
                        && delivered == ["member-eu-1"]
                        && on_member(karmada, "member-eu-2", "deployment", &ns, "spread").is_none())
                    .then_some(())
                },
                || {
                    format!(
                        "binding: {:?}\nmembers: {:?}\n{}",
                        binding(karmada, &ns, "spread")
                            .map(|b| (b["spec"].clone(), b["status"].clone())),
                        karmada.member_replicas(&ns, "spread"),
                        guard.log_tail()
                    )
                },
            );
            let b = binding(karmada, &ns, "spread").expect("binding");
            let condition = b["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "PlacementPolicyEnforced")
                .cloned()
                .unwrap_or_else(|| panic!("no PlacementPolicyEnforced condition: {}", b["status"]));
            let message = condition["message"].as_str().unwrap_or_default();
            assert_eq!(condition["reason"], "ForbiddenClustersRemoved");
            assert!(
                message.contains("member-eu-2") && message.contains("Scheduled="),
                "{message}"
            );
            let events = karmada.events(&ns, "ResourceBinding", "spread-deployment");
            assert!(
                events
                    .iter()
                    .any(|(reason, _)| reason == "ForbiddenClustersRemoved"),
                "{events:?}"
            );
            never_on(
                karmada,
                US,
                "deployment",
                &ns,
                "spread",
                Duration::from_secs(5),
                None,
            );
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

/// 5. A template edit: a Deployment without requirements runs on
///    member-eu-1 and member-us-1; the template gains the EU requirement.
///    The detector's rewrite is narrowed again (its template changed), so
///    karmada-scheduler moves it off member-us-1; meanwhile the Work of
///    member-us-1 is refused the EU version: member-us-1 never runs it.
#[test]
fn karmada_delivery_a_template_gaining_the_eu_requirement_never_reaches_the_us() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let ns = guard.namespace.clone();
    create(
        karmada,
        &[
            &propagation_policy(&ns, "web", None, names(&["member-eu-1", US])),
            &placement_tests::karmada::scenario::deployment(&ns, "web", 1, json!({})),
        ],
    );
    guard.wait_replicas(karmada, "web", &split(&[("member-eu-1", 1), (US, 1)]));
    karmada.kubectl_ok(&[
        "annotate",
        "deployment",
        "web",
        "-n",
        &ns,
        &format!("{EU_KEY}=true"),
    ]);
    let eu = |d: &Value| d["metadata"]["annotations"][EU_KEY] == "true";
    let started = Instant::now();
    wait_or_explain(
        "the Deployment gone from member-us-1 (and never there in its EU version)",
        Duration::from_secs(120),
        || {
            if let Some(found) = on_member(karmada, US, "deployment", &ns, "web") {
                assert!(
                    !eu(&found),
                    "the EU version reached {US}: {}",
                    found["metadata"]
                );
                return None;
            }
            Some(())
        },
        || {
            format!(
                "binding: {:?}",
                binding(karmada, &ns, "web").map(|b| b["spec"].clone())
            )
        },
    );
    never_on(
        karmada,
        US,
        "deployment",
        &ns,
        "web",
        Duration::from_secs(20)
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(5)),
        Some(&eu),
    );
    guard.wait_replicas(karmada, "web", &split(&[("member-eu-1", 1)]));
}

/// 8. An EU StatefulSet propagated by karmada-scheduler with member-us-1
///    among its names: the policy bounds it like a Deployment (the allowed
///    clusters alone, no replicas to divide); it runs in the EU only.
#[test]
fn karmada_delivery_an_eu_statefulset_is_bounded_like_a_deployment() {
    let _serial = serial();
    let karmada = Karmada::shared();
    let guard = Guardrail::shipped(karmada);
    let ns = guard.namespace.clone();
    let set = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": ns, "annotations": {EU_KEY: "true", PCI_KEY: "2"}},
        "spec": {
            "replicas": 1,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": WORKLOAD_IMAGE}]}
            }
        }
    });
    let mut policy = propagation_policy(&ns, "db", None, names(&["member-eu-1", US]));
    policy["spec"]["resourceSelectors"] =
        json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}]);
    create(karmada, &[&policy, &set]);
    wait_or_explain(
        "the StatefulSet on member-eu-1",
        Duration::from_secs(120),
        || on_member(karmada, "member-eu-1", "statefulset", &ns, "db").map(|_| ()),
        || {
            format!(
                "binding: {:?}\n{}",
                karmada
                    .resource_binding(&ns, "StatefulSet", "db")
                    .map(|b| b["spec"].clone()),
                guard.log_tail()
            )
        },
    );
    let binding = karmada
        .resource_binding(&ns, "StatefulSet", "db")
        .expect("binding");
    assert_eq!(
        binding["metadata"]["annotations"][ALLOWED], "member-eu-1,member-eu-2",
        "{}",
        binding["metadata"]
    );
    never_on(
        karmada,
        US,
        "statefulset",
        &ns,
        "db",
        Duration::from_secs(15),
        None,
    );
}
