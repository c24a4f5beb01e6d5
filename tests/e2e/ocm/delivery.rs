//! The last hop in Open Cluster Management (the `delivery` module of `ocm`,
//! in the `ocm` test binary): an EU, PCI-2 workload never reaches `ocm-us-1`, whatever
//! delivers it. The delivery guard (the webhook registered with the hub for
//! ManifestWorks and ManifestWorkReplicaSets, as `scripts/testbed up --ocm`
//! and the chart register it) runs beside the decider; each test reads
//! `ocm-us-1`'s own API server over a window (never there, not only gone at
//! the end):
//!
//! 6. a ManifestWork written straight into the cluster namespace `ocm-us-1`;
//! 7. a ManifestWorkReplicaSet created after its Placement was decided, on a
//!    Placement shared with another workload; and one naming a second
//!    Placement that is not opted in (OCM's scheduler decides it);
//! 8. an EU StatefulSet (a kind the policy did not place before);
//!
//! and a shared Placement one of whose workloads gets errors: left out, the
//! others keep deciding it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use placement_tests::restoring;
use placement_tests::{Ocm, serial, unique_name};
use serde_json::{Value, json};

use super::{
    Decider, EU_KEY, PCI_KEY, clusters_running, create, decided, decisions, deployment,
    get_placement, names, namespace, placement, placement_condition, replica_set, wait_decided,
    wait_or_explain,
};

const US: &str = "ocm-us-1";

fn eu_pci(level: &str) -> Value {
    json!({EU_KEY: "true", PCI_KEY: level})
}

/// `kind` `namespace/name` in `cluster`'s own API server, if it is there.
fn on_cluster(ocm: &Ocm, cluster: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
    let out = ocm
        .cluster(cluster)
        .kubectl(&["get", kind, name, "-n", namespace, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("object JSON"))
}

/// Watch `cluster`'s API server for `window`: `kind` `namespace/name` must
/// never be there.
fn never_on(ocm: &Ocm, cluster: &str, kind: &str, namespace: &str, name: &str, window: Duration) {
    let until = Instant::now() + window;
    while Instant::now() < until {
        if let Some(found) = on_cluster(ocm, cluster, kind, namespace, name) {
            panic!(
                "{kind} {namespace}/{name} reached {cluster}: {}",
                found["metadata"]
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `kubectl` (with `stdin`) on the hub that the delivery guard must refuse,
/// naming `member` when given; its stderr.
fn refused(ocm: &Ocm, args: &[&str], stdin: Option<&str>, member: Option<&str>) -> String {
    let out = match stdin {
        Some(text) => ocm.kubectl_stdin(args, text),
        None => ocm.kubectl(args),
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kubectl {args:?} was admitted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("may not deliver") && member.is_none_or(|m| stderr.contains(m)),
        "kubectl {args:?} failed otherwise: {stderr}"
    );
    stderr
}

/// A ManifestWork `name` in the cluster namespace `cluster`, delivering the
/// Namespace `namespace` and `manifests`.
fn manifest_work(cluster: &str, name: &str, namespace: &str, manifests: &[&Value]) -> Value {
    let mut all =
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})];
    all.extend(manifests.iter().map(|m| (*m).clone()));
    json!({
        "apiVersion": "work.open-cluster-management.io/v1",
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": cluster},
        "spec": {"workload": {"manifests": all}}
    })
}

/// The ManifestWorks of ManifestWorkReplicaSet `namespace/name` in the
/// cluster namespace `cluster` (by OCM's label).
fn works_of(ocm: &Ocm, cluster: &str, namespace: &str, name: &str) -> Vec<Value> {
    let text = ocm.kubectl_ok(&[
        "get",
        "manifestworks",
        "-n",
        cluster,
        "-l",
        &format!("work.open-cluster-management.io/manifestworkreplicaset={namespace}.{name}"),
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&text).expect("ManifestWork list JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn get(ocm: &Ocm, kind: &str, namespace: &str, name: &str) -> Value {
    let text = ocm.kubectl_ok(&["get", kind, name, "-n", namespace, "-o", "json"]);
    serde_json::from_str(&text).expect("object JSON")
}

/// Wait until Deployment `name` of `namespace` is on exactly `clusters`.
fn wait_running_on(ocm: &Ocm, decider: &Decider, namespace: &str, name: &str, clusters: &[&str]) {
    let want = names(clusters);
    wait_or_explain(
        &format!("Deployment {name} on exactly {want:?} (their API servers)"),
        Duration::from_secs(120),
        || (clusters_running(ocm, namespace, name) == want).then_some(()),
        || {
            format!(
                "running on {:?}\n{}\n{}",
                clusters_running(ocm, namespace, name),
                ocm.diagnostics(),
                decider.log_tail()
            )
        },
    );
}

/// 6. A ManifestWork written straight into the cluster namespace
///    `ocm-us-1` carrying the EU Deployment: refused, naming the cluster and
///    what the policy allows; a change that adds the requirement to a
///    ManifestWork there is refused too. The same ManifestWork without
///    requirements is delivered (the check is the policy's, not a blanket
///    refusal), OCM's work agent updates its status and finalizers through
///    the guard, and its deletion passes.
#[test]
fn ocm_delivery_a_manifestwork_written_into_a_forbidden_clusters_namespace_is_refused() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::guarded(ocm, &unique_name("pp-decider"));
    let ns = unique_name("ocm-mw");
    let vault = deployment(&ns, "vault", 1, eu_pci("2"));
    let work = manifest_work(US, &format!("{ns}-vault"), &ns, &[&vault]);
    let stderr = refused(
        ocm,
        &["create", "-f", "-"],
        Some(&work.to_string()),
        Some(US),
    );
    assert!(
        stderr.contains(&format!("Deployment {ns}/vault may not run on {US}"))
            && stderr.contains("ocm-eu-1, ocm-eu-2"),
        "{stderr}"
    );

    // The control: no requirement, delivered; the agent's writes pass.
    let plain = deployment(&ns, "plain", 1, json!({}));
    let control = format!("{ns}-plain");
    create(ocm, &[&manifest_work(US, &control, &ns, &[&plain])]);
    wait_or_explain(
        "the plain Deployment on ocm-us-1, its ManifestWork Applied",
        Duration::from_secs(120),
        || {
            let work = get(ocm, "manifestwork", US, &control);
            let applied = work["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Applied" && c["status"] == "True");
            let finalized = work["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            (applied && finalized && on_cluster(ocm, US, "deployment", &ns, "plain").is_some())
                .then_some(())
        },
        || {
            format!(
                "{}\n{}",
                get(ocm, "manifestwork", US, &control),
                decider.log_tail()
            )
        },
    );
    // A change that makes it an EU workload.
    let annotate = json!([{"op": "add", "path": "/spec/workload/manifests/1/metadata/annotations",
                           "value": eu_pci("2")}]);
    refused(
        ocm,
        &[
            "patch",
            "manifestwork",
            &control,
            "-n",
            US,
            "--type=json",
            "-p",
            &annotate.to_string(),
        ],
        None,
        Some(US),
    );
    never_on(ocm, US, "deployment", &ns, "vault", Duration::from_secs(15));
    let kept = on_cluster(ocm, US, "deployment", &ns, "plain").expect("still there");
    assert!(
        kept["metadata"]["annotations"].get(EU_KEY).is_none(),
        "{}",
        kept["metadata"]
    );
    // Deletion always passes; the agent removes what it delivered.
    ocm.kubectl_ok(&["delete", "manifestwork", &control, "-n", US, "--wait=false"]);
    wait_or_explain(
        "the plain Deployment gone from ocm-us-1",
        Duration::from_secs(120),
        || {
            on_cluster(ocm, US, "deployment", &ns, "plain")
                .is_none()
                .then_some(())
        },
        || decider.log_tail(),
    );
}

/// 7. A ManifestWorkReplicaSet of the EU Deployment created after its
///    Placement was decided onto all three clusters, a Placement it shares
///    with a workload that may run anywhere: it is admitted with a warning
///    that names `ocm-us-1`, never reaches it (OCM tries its ManifestWork
///    there first; the guard refuses it), runs on the EU clusters, and the
///    shared Placement is narrowed to them.
#[test]
fn ocm_delivery_a_late_replica_set_on_a_shared_placement_never_reaches_a_forbidden_cluster() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::guarded(ocm, &unique_name("pp-decider"));
    let ns = namespace(ocm, "ocm-late");
    let shared = placement(&ns, "shared", Some(&decider), json!({}));
    let anywhere = deployment(&ns, "anywhere", 1, json!({}));
    create(
        ocm,
        &[
            &replica_set(&ns, "anywhere", "shared", &[&anywhere]),
            &shared,
        ],
    );
    wait_decided(
        ocm,
        &decider,
        &ns,
        "shared",
        &names(&["ocm-eu-1", "ocm-eu-2", US]),
    );

    let web = deployment(&ns, "web", 1, eu_pci("2"));
    let late = replica_set(&ns, "web", "shared", &[&web]);
    let out = ocm.kubectl_stdin(&["create", "-f", "-"], &late.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    never_on(ocm, US, "deployment", &ns, "web", Duration::from_secs(20));
    assert!(
        stderr.contains("Warning: placement-policy: Placement shared decides ocm-us-1")
            && stderr.contains(&format!("Deployment {ns}/web may not run"))
            && stderr.contains("its ManifestWorks there will be refused"),
        "the warning at create: {stderr}"
    );
    wait_decided(
        ocm,
        &decider,
        &ns,
        "shared",
        &names(&["ocm-eu-1", "ocm-eu-2"]),
    );
    wait_running_on(ocm, &decider, &ns, "web", &["ocm-eu-1", "ocm-eu-2"]);
    assert!(works_of(ocm, US, &ns, "web").is_empty());
    // What the tenant sees on the ManifestWorkReplicaSet (printed for the
    // docs), and the refusal as an Event there when OCM tried.
    let status = &get(ocm, "manifestworkreplicaset", &ns, "web")["status"];
    eprintln!("ManifestWorkReplicaSet status: {status}");
    eprintln!(
        "Events: {:?}",
        ocm.events(&ns, "ManifestWorkReplicaSet", "web")
    );
    never_on(ocm, US, "deployment", &ns, "web", Duration::from_secs(5));
}

/// 7. A ManifestWorkReplicaSet of the EU Deployment on the opted-in
///    Placement, given a second one that is not opted in (OCM's scheduler
///    decides it onto `ocm-us-1`, by a label predicate): the change is admitted with a
///    warning naming `ocm-us-1`; its ManifestWork there is refused on every
///    try and never stored, the tenant sees a `DeliveryDenied` Event on the
///    ManifestWorkReplicaSet naming the cluster and the policy's reason, and
///    the Deployment runs on the EU clusters only.
#[test]
fn ocm_delivery_a_second_placement_not_opted_in_delivers_nowhere_forbidden() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::guarded(ocm, &unique_name("pp-decider"));
    let ns = namespace(ocm, "ocm-second-ref");
    let eu = placement(&ns, "eu", Some(&decider), json!({}));
    // Where the other one does not decide (two Placements deciding one
    // cluster give it two ManifestWorks of the set, which OCM's agent then
    // applies in turn).
    let native = placement(
        &ns,
        "native",
        None,
        json!({"predicates": [{"requiredClusterSelector": {"labelSelector": {
            "matchLabels": {super::JURISDICTION_LABEL: "non-eu"}}}}]}),
    );
    let web = deployment(&ns, "web", 1, eu_pci("2"));
    create(
        ocm,
        &[&replica_set(&ns, "web", "eu", &[&web]), &eu, &native],
    );
    wait_running_on(ocm, &decider, &ns, "web", &["ocm-eu-1", "ocm-eu-2"]);
    let us = names(&[US]);
    wait_or_explain(
        "OCM's scheduler to decide native onto ocm-us-1",
        Duration::from_secs(60),
        || (decided(ocm, &ns, "native") == us).then_some(()),
        || format!("{:?}", decisions(ocm, &ns, "native")),
    );
    let refs = json!({"spec": {"placementRefs": [{"name": "eu"}, {"name": "native"}]}});
    let out = ocm.kubectl(&[
        "patch",
        "manifestworkreplicaset",
        "web",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        &refs.to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    never_on(ocm, US, "deployment", &ns, "web", Duration::from_secs(30));
    assert!(
        stderr.contains("Placement native decides ocm-us-1")
            && stderr.contains(&format!("Deployment {ns}/web may not run")),
        "the warning at the change: {stderr}"
    );
    assert_eq!(
        clusters_running(ocm, &ns, "web"),
        names(&["ocm-eu-1", "ocm-eu-2"])
    );
    assert!(works_of(ocm, US, &ns, "web").is_empty());
    let events = wait_or_explain(
        "a DeliveryDenied Event on the ManifestWorkReplicaSet",
        Duration::from_secs(60),
        || {
            let events = ocm.events(&ns, "ManifestWorkReplicaSet", "web");
            events
                .iter()
                .any(|(reason, message)| {
                    reason == "DeliveryDenied"
                        && message.contains(&format!(
                            "(of ManifestWorkReplicaSet {ns}/web) may not deliver to {US}"
                        ))
                        && message.contains("the placement policy allows it ocm-eu-1, ocm-eu-2")
                })
                .then_some(events)
        },
        || {
            format!(
                "{:?}\n{}",
                ocm.events(&ns, "ManifestWorkReplicaSet", "web"),
                decider.log_tail()
            )
        },
    );
    let status = &get(ocm, "manifestworkreplicaset", &ns, "web")["status"];
    eprintln!("ManifestWorkReplicaSet status: {status}\nEvents: {events:?}");
    never_on(ocm, US, "deployment", &ns, "web", Duration::from_secs(5));
}

/// A Placement shared by two workloads, one of which gets errors (its PCI
/// level 3 is met by no EU cluster once `ocm-eu-2` is relabelled level 2):
/// it is left out, and the Placement follows the other (its decisions grow
/// to both EU clusters, never frozen at the old ones); `PlacementSatisfied`
/// says `PolicyDenied` and names what was left out; the workload with errors
/// reaches no new cluster (the guard refuses its ManifestWorks).
#[test]
fn ocm_delivery_a_workload_with_errors_is_left_out_of_a_shared_placement() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::guarded(ocm, &unique_name("pp-decider"));
    let ns = namespace(ocm, "ocm-shared-errors");
    let shared = placement(&ns, "shared", Some(&decider), json!({}));
    let web = deployment(&ns, "web", 1, eu_pci("2"));
    let vault = deployment(&ns, "vault", 1, eu_pci("3"));
    create(
        ocm,
        &[
            &replica_set(&ns, "web", "shared", &[&web]),
            &replica_set(&ns, "vault", "shared", &[&vault]),
            &shared,
        ],
    );
    // Both: the EU cluster of PCI level 3.
    wait_decided(ocm, &decider, &ns, "shared", &names(&["ocm-eu-2"]));
    wait_running_on(ocm, &decider, &ns, "vault", &["ocm-eu-2"]);
    let relabel = |level: &str| {
        ocm.kubectl_ok(&[
            "label",
            "managedcluster",
            "ocm-eu-2",
            &format!("{}={level}", placement_tests::karmada::PCI_LABEL),
            "--overwrite",
        ]);
    };
    restoring(
        || {
            relabel("2");
            wait_decided(
                ocm,
                &decider,
                &ns,
                "shared",
                &names(&["ocm-eu-1", "ocm-eu-2"]),
            );
            let condition = wait_or_explain(
                "PlacementSatisfied to name the workload left out",
                Duration::from_secs(60),
                || {
                    placement_condition(ocm, &ns, "shared", "PlacementSatisfied")
                        .filter(|c| c["reason"] == "PolicyDenied")
                },
                || format!("{}", get_placement(ocm, &ns, "shared")),
            );
            assert_eq!(condition["status"], "False", "{condition}");
            let message = condition["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("left out")
                    && message.contains(&format!(
                        "ManifestWorkReplicaSet {ns}/vault: Deployment {ns}/vault: no cluster satisfies"
                    )),
                "{message}"
            );
            wait_running_on(ocm, &decider, &ns, "web", &["ocm-eu-1", "ocm-eu-2"]);
            // The workload with errors stays where it ran, reaches nothing
            // new.
            never_on(
                ocm,
                "ocm-eu-1",
                "deployment",
                &ns,
                "vault",
                Duration::from_secs(10),
            );
            never_on(ocm, US, "deployment", &ns, "vault", Duration::from_secs(5));
            assert_eq!(clusters_running(ocm, &ns, "vault"), names(&["ocm-eu-2"]));
        },
        || relabel("3"),
    );
}

/// 8. An EU, PCI-2 StatefulSet (no replicas to divide: the allowed clusters
///    alone) delivered by a ManifestWorkReplicaSet lands on the EU clusters
///    only, never on `ocm-us-1`.
#[test]
fn ocm_delivery_an_eu_statefulset_lands_only_on_eu_clusters() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let decider = Decider::guarded(ocm, &unique_name("pp-decider"));
    let ns = namespace(ocm, "ocm-sts");
    let statefulset = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": ns, "annotations": eu_pci("2")},
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": placement_tests::karmada::WORKLOAD_IMAGE}]}
            }
        }
    });
    let web_eu = placement(&ns, "db", Some(&decider), json!({}));
    create(
        ocm,
        &[&replica_set(&ns, "db", "db", &[&statefulset]), &web_eu],
    );
    wait_decided(ocm, &decider, &ns, "db", &names(&["ocm-eu-1", "ocm-eu-2"]));
    let want: BTreeSet<String> = names(&["ocm-eu-1", "ocm-eu-2"]);
    wait_or_explain(
        "the StatefulSet on the EU clusters",
        Duration::from_secs(120),
        || {
            let on: BTreeSet<String> = ocm
                .clusters()
                .iter()
                .filter(|c| on_cluster(ocm, c.name(), "statefulset", &ns, "db").is_some())
                .map(|c| c.name().to_owned())
                .collect();
            (on == want).then_some(())
        },
        || decider.log_tail(),
    );
    never_on(ocm, US, "statefulset", &ns, "db", Duration::from_secs(15));
}
