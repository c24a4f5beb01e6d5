//! A real Open Cluster Management hub (built from `../shared/peers/ocm`)
//! with three managed clusters registered by their own agents, driven as an
//! OCM user drives it; then placement-policy deciding the Placements that
//! opt in.
//!
//! Every test name starts with `ocm_`: where OCM's source is absent (and
//! `PLACEMENT_OCM_BIN` unset), `scripts/test` runs this binary with
//! `--skip ocm_` and says so; run anyway, the tests fail and say why.

use std::collections::BTreeSet;
use std::time::Duration;

use placement_tests::karmada::{MemberKind, PCI_LABEL, WORKLOAD_IMAGE};
use placement_tests::ocm::{
    CLAIM_REGION, CLUSTER_SET, DeliveryGuard, JURISDICTION_LABEL, MANAGED_CLUSTERS, REGION_LABEL,
    available, claim, condition_true,
};
use placement_tests::{Ocm, OpaServer, SidecarProcess, serial, unique_name, wait_for};
use serde_json::{Value, json};

#[path = "ocm_delivery.rs"]
mod delivery;

/// [`wait_for`], failing with `context()` (the state of the bed) added.
fn wait_or_explain<T>(
    what: &str,
    timeout: Duration,
    check: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, timeout, check)
    })) {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        ),
    }
}

/// Create `objects` on the hub as a user does (`kubectl create -f -`).
fn create(ocm: &Ocm, objects: &[&Value]) {
    for object in objects {
        let out = ocm.kubectl_stdin(&["create", "-f", "-"], &object.to_string());
        assert!(
            out.status.success(),
            "create {} {}: {}",
            object["kind"],
            object["metadata"]["name"],
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A namespace of the hub for one test, with the bed's cluster set bound.
fn namespace(ocm: &Ocm, prefix: &str) -> String {
    let namespace = unique_name(prefix);
    ocm.bind_cluster_set(&namespace);
    namespace
}

/// A Deployment of `replicas` pods of the workload image, with `annotations`.
fn deployment(namespace: &str, name: &str, replicas: u32, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": WORKLOAD_IMAGE}]}
            }
        }
    })
}

/// A ManifestWorkReplicaSet in `namespace` delivering the namespace itself
/// (OCM creates none on the managed clusters) and `manifests` to the
/// clusters of Placement `placement`.
fn replica_set(namespace: &str, name: &str, placement: &str, manifests: &[&Value]) -> Value {
    let mut manifests: Vec<Value> = manifests.iter().map(|m| (*m).clone()).collect();
    manifests.insert(
        0,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
    );
    json!({
        "apiVersion": "work.open-cluster-management.io/v1alpha1",
        "kind": "ManifestWorkReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "placementRefs": [{"name": placement}],
            "manifestWorkTemplate": {"workload": {"manifests": manifests}},
        }
    })
}

/// The clusters whose own API servers have Deployment `namespace/name`.
fn clusters_running(ocm: &Ocm, namespace: &str, name: &str) -> BTreeSet<String> {
    ocm.clusters()
        .iter()
        .filter(|cluster| {
            cluster
                .kubectl(&["get", "deployment", name, "-n", namespace])
                .status
                .success()
        })
        .map(|cluster| cluster.name().to_owned())
        .collect()
}

/// Wait until Deployment `web` of `namespace` is on exactly `clusters` (read
/// from their API servers) and its pod runs in ocm-eu-1, the cluster whose
/// node runs pods.
fn wait_web_running_on(ocm: &Ocm, namespace: &str, clusters: &BTreeSet<String>) {
    wait_or_explain(
        &format!("the Deployment on exactly {clusters:?} (their API servers)"),
        Duration::from_secs(120),
        || (clusters_running(ocm, namespace, "web") == *clusters).then_some(()),
        || {
            format!(
                "running on {:?}\n{}",
                clusters_running(ocm, namespace, "web"),
                ocm.diagnostics()
            )
        },
    );
    let eu1 = ocm.cluster("ocm-eu-1");
    wait_or_explain(
        "the Deployment's pod to run in ocm-eu-1",
        Duration::from_secs(180),
        || {
            let text = eu1.kubectl_ok(&[
                "get", "pods", "-n", namespace, "-l", "app=web", "-o", "json",
            ]);
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
}

/// The clusters named by the PlacementDecisions of `namespace/placement`
/// (found by the label every OCM consumer reads).
fn decided(ocm: &Ocm, namespace: &str, placement: &str) -> BTreeSet<String> {
    decisions(ocm, namespace, placement)
        .iter()
        .flat_map(|d| {
            d["status"]["decisions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d["clusterName"].as_str().map(str::to_owned))
        .filter(|name| !name.is_empty())
        .collect()
}

fn decisions(ocm: &Ocm, namespace: &str, placement: &str) -> Vec<Value> {
    let selector = format!("cluster.open-cluster-management.io/placement={placement}");
    let text = ocm.kubectl_ok(&[
        "get",
        "placementdecisions",
        "-n",
        namespace,
        "-l",
        &selector,
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&text).expect("PlacementDecision list JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

// ---------------------------------------------------------------------------
// The test bed itself, with OCM's own placement controller
// ---------------------------------------------------------------------------

/// The three clusters joined the hub through their own agents (CSR signed by
/// the hub's kube-controller-manager), are available, carry the bed's labels
/// and their agent-reported region claim; ClusterProfiles of them exist in
/// a namespace the cluster set is bound to, with the claim as a property.
#[test]
fn ocm_registers_the_three_clusters_with_agents_labels_claims_and_profiles() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let clusters = ocm.managed_clusters();
    let found: BTreeSet<&str> = clusters
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        found,
        ["ocm-eu-1", "ocm-eu-2", "ocm-us-1"].into_iter().collect()
    );
    for spec in MANAGED_CLUSTERS {
        let cluster = clusters
            .iter()
            .find(|c| c["metadata"]["name"] == spec.name)
            .expect("registered");
        assert!(condition_true(cluster, "ManagedClusterJoined"), "{cluster}");
        assert!(available(cluster), "{cluster}");
        assert_eq!(cluster["spec"]["hubAcceptsClient"], true, "{cluster}");
        let labels = &cluster["metadata"]["labels"];
        assert_eq!(labels[PCI_LABEL], spec.pci_level, "{cluster}");
        assert_eq!(labels[REGION_LABEL], spec.region, "{cluster}");
        let jurisdiction = if spec.region.starts_with("europe-") {
            "eu"
        } else {
            "non-eu"
        };
        assert_eq!(labels[JURISDICTION_LABEL], jurisdiction, "{cluster}");
        assert_eq!(
            labels["cluster.open-cluster-management.io/clusterset"], CLUSTER_SET,
            "{cluster}"
        );
        assert_eq!(claim(cluster, CLAIM_REGION), Some(spec.region), "{cluster}");
        // The agent reports what the cluster's nodes have.
        if let MemberKind::Plain { cpu, .. } = spec.kind {
            assert_eq!(cluster["status"]["allocatable"]["cpu"], cpu, "{cluster}");
        }
        // The agent's certificate came from a CSR the hub signed.
        assert_eq!(
            cluster["spec"]["managedClusterClientConfigs"][0]["url"],
            ocm.cluster(spec.name).server_url(),
            "{cluster}"
        );
    }

    let namespace = namespace(ocm, "ocm-profiles");
    let profiles = wait_or_explain(
        "a ClusterProfile of each cluster in a bound namespace",
        Duration::from_secs(60),
        || {
            let text = ocm.kubectl_ok(&["get", "clusterprofiles", "-n", &namespace, "-o", "json"]);
            let list: Value = serde_json::from_str(&text).expect("ClusterProfile list JSON");
            let items = list["items"].as_array().cloned().unwrap_or_default();
            (items.len() == MANAGED_CLUSTERS.len()).then_some(items)
        },
        || ocm.diagnostics(),
    );
    for spec in MANAGED_CLUSTERS {
        let profile = profiles
            .iter()
            .find(|p| p["metadata"]["name"] == spec.name)
            .unwrap_or_else(|| panic!("no ClusterProfile {}: {profiles:?}", spec.name));
        let properties = profile["status"]["properties"].as_array();
        assert!(
            properties
                .into_iter()
                .flatten()
                .any(|p| { p["name"] == CLAIM_REGION && p["value"] == spec.region }),
            "{profile}"
        );
    }
}

/// OCM's own placement controller decides a Placement by a label predicate
/// (jurisdiction `eu`); ManifestWorkReplicaSet delivers a Deployment to
/// exactly the decided clusters (their own API servers have it, the US
/// cluster's does not), and its pods run in `ocm-eu-1`.
#[test]
fn ocm_places_a_deployment_by_label_predicates_with_its_own_scheduler() {
    let _serial = serial();
    let ocm = Ocm::shared();
    let namespace = namespace(ocm, "ocm-native");
    let placement = json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
        "kind": "Placement",
        "metadata": {"name": "eu", "namespace": namespace},
        "spec": {
            "clusterSets": [CLUSTER_SET],
            "predicates": [{"requiredClusterSelector": {"labelSelector": {
                "matchLabels": {JURISDICTION_LABEL: "eu"}
            }}}],
        }
    });
    let web = deployment(&namespace, "web", 1, json!({}));
    let set = replica_set(&namespace, "web", "eu", &[&web]);
    create(ocm, &[&placement, &set]);

    let eu = names(&["ocm-eu-1", "ocm-eu-2"]);
    wait_or_explain(
        "OCM's scheduler to decide the EU clusters",
        Duration::from_secs(60),
        || (decided(ocm, &namespace, "eu") == eu).then_some(()),
        || {
            format!(
                "{:?}\n{}",
                decisions(ocm, &namespace, "eu"),
                ocm.diagnostics()
            )
        },
    );
    wait_web_running_on(ocm, &namespace, &eu);
}

// ---------------------------------------------------------------------------
// placement-policy deciding the Placements that opt in
// ---------------------------------------------------------------------------

const EU_KEY: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";
const PCI_KEY: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";
const DISABLE: &str = "cluster.open-cluster-management.io/experimental-scheduling-disable";
const SCHEDULER: &str = "placement-policy.io/scheduler-name";

/// OPA and placement-sync deciding the Placements that name `name`, with the
/// shipped policy in a policy namespace of their own; with the delivery
/// guard (the webhook registered with the hub for ManifestWorks and
/// ManifestWorkReplicaSets) when started [`Decider::guarded`].
struct Decider {
    name: String,
    policy_namespace: String,
    /// Unregistered (then stopped) before OPA stops.
    guard: Option<DeliveryGuard>,
    /// Kept running while the decider is.
    _opa: OpaServer,
    sync: Option<SidecarProcess>,
}

impl Decider {
    fn start(ocm: &Ocm, extra: &[&str]) -> Decider {
        Decider::named(ocm, &unique_name("pp-decider"), extra)
    }

    /// Deciding the Placements that name `name` (the examples' name the
    /// default, `placement-policy`; the tests run one at a time).
    fn named(ocm: &Ocm, name: &str, extra: &[&str]) -> Decider {
        Decider::with(ocm, name, extra, false)
    }

    /// A decider and the delivery guard, as `scripts/testbed up --ocm` runs
    /// them.
    fn guarded(ocm: &Ocm, name: &str) -> Decider {
        Decider::with(ocm, name, &[], true)
    }

    fn with(ocm: &Ocm, name: &str, extra: &[&str], guarded: bool) -> Decider {
        let name = name.to_owned();
        let policy_namespace = unique_name("ocm-policy");
        ocm.create_policy_namespace(&policy_namespace);
        placement_tests::kubectl::create_shipped_policy_configmap(
            &ocm.hub_kubeconfig(),
            &policy_namespace,
        );
        let opa = OpaServer::start();
        let mut args = vec![format!("--scheduler-name={name}")];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sync = ocm.start_placement_sync(&opa, &policy_namespace, &args);
        let guard = guarded.then(|| {
            ocm.start_delivery_guard(&opa, &policy_namespace, &unique_name("pp-delivery"))
        });
        Decider {
            name,
            policy_namespace,
            guard,
            _opa: opa,
            sync: Some(sync),
        }
    }

    fn log_tail(&self) -> String {
        let mut text = self
            .sync
            .as_ref()
            .map(SidecarProcess::log_tail)
            .unwrap_or_default();
        if let Some(guard) = &self.guard {
            let log = guard.webhook().log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            text.push_str("\nplacement-webhook:\n");
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for Decider {
    fn drop(&mut self) {
        self.guard.take();
        if let Some(sync) = self.sync.take() {
            sync.stop();
        }
    }
}

/// A Placement of the bed's cluster set, opted in to `decider` when given
/// (OCM's scheduler disabled for it, the decider named), with `spec` added.
fn placement(namespace: &str, name: &str, decider: Option<&Decider>, spec: Value) -> Value {
    let mut placement = json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterSets": [CLUSTER_SET]},
    });
    if let Some(decider) = decider {
        placement["metadata"]["annotations"] = json!({DISABLE: "true", SCHEDULER: decider.name});
    }
    if let (Some(target), Some(extra)) = (placement["spec"].as_object_mut(), spec.as_object()) {
        target.extend(extra.clone());
    }
    placement
}

/// The Placement `namespace/name` as stored.
fn get_placement(ocm: &Ocm, namespace: &str, name: &str) -> Value {
    let text = ocm.kubectl_ok(&["get", "placement", name, "-n", namespace, "-o", "json"]);
    serde_json::from_str(&text).expect("Placement JSON")
}

/// The Placement's condition `type_`, if it has it.
fn placement_condition(ocm: &Ocm, namespace: &str, name: &str, type_: &str) -> Option<Value> {
    get_placement(ocm, namespace, name)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// The EU, PCI level 2 Deployment `web` delivered to the clusters of
/// Placement `placement` by a ManifestWorkReplicaSet.
fn eu_pci2_web(namespace: &str, placement: &str) -> Value {
    let web = deployment(namespace, "web", 1, json!({EU_KEY: "true", PCI_KEY: "2"}));
    replica_set(namespace, "web", placement, &[&web])
}

/// Wait until the decisions of `namespace/placement` are `want`; the state of
/// the bed and the decider's log when they never are.
fn wait_decided(
    ocm: &Ocm,
    decider: &Decider,
    namespace: &str,
    placement: &str,
    want: &BTreeSet<String>,
) {
    wait_or_explain(
        &format!("the decisions of {placement} to be {want:?}"),
        Duration::from_secs(120),
        || (decided(ocm, namespace, placement) == *want).then_some(()),
        || {
            format!(
                "decisions: {:?}\nPlacement: {}\n{}\nplacement-sync:\n{}",
                decisions(ocm, namespace, placement),
                get_placement(ocm, namespace, placement)["status"],
                ocm.diagnostics(),
                decider.log_tail()
            )
        },
    );
}

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

/// A `kubectl get --watch` of one PlacementDecision (or, with no `name`, of
/// every one in `namespace`): every version of its decided clusters, in order.
struct DecisionWatch {
    child: std::process::Child,
    reader: std::thread::JoinHandle<Vec<BTreeSet<String>>>,
}

impl DecisionWatch {
    fn start(ocm: &Ocm, namespace: &str, name: Option<&str>) -> DecisionWatch {
        let mut child = std::process::Command::new("kubectl")
            .args([
                "--kubeconfig",
                &ocm.hub_kubeconfig().display().to_string(),
                "get",
                "placementdecision",
            ])
            .args(name)
            .args(["-n", namespace, "--watch", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run kubectl get --watch");
        let stdout = child.stdout.take().expect("kubectl's stdout");
        let reader = std::thread::spawn(move || {
            serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
                .into_iter::<Value>()
                .map_while(Result::ok)
                .map(|object| {
                    object["status"]["decisions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|d| d["clusterName"].as_str().map(str::to_owned))
                        .collect()
                })
                .collect()
        });
        // The watch has begun once it printed the current version; a moment
        // is enough on loopback (the assertions on its first version say if
        // it was not).
        std::thread::sleep(Duration::from_secs(1));
        DecisionWatch { child, reader }
    }

    fn stop(mut self) -> Vec<BTreeSet<String>> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reader.join().expect("the watch reader")
    }
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
