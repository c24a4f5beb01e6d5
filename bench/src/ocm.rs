//! Scenario 9: deciding Open Cluster Management Placements. A real OCM hub
//! (the test bed's: registration, placement and work controllers, three
//! managed clusters joined by their agents); N Placements created on the hub
//! twice, decided once by OCM's own placement controller (label predicates:
//! PCI level 3) and once by placement-policy (opted in, annotated PCI level 3,
//! decided by the shipped policy, which selects the same two clusters).
//! Measured for each: the time from the first create until every Placement
//! has its PlacementDecision naming both clusters, and the CPU the decider
//! used meanwhile (OCM's placement controller; placement-sync and its OPA).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::watcher;
use placement_tests::karmada::{COMPONENT_QPS, PCI_LABEL};
use placement_tests::ocm::{CLUSTER_SET, Ocm, decider_args};
use placement_tests::{Identity, OpaServer};
use serde_json::{Value, json};

use crate::common::{Bins, Contending, CpuSince, Sidecar, poll};
use crate::report::{Report, Status};

const PCI_KEY: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";
const POLICY_NAMESPACE: &str = "bench-ocm-policy";
const NATIVE: &str = "bench-ocm-native";
const OURS: &str = "bench-ocm-placement-policy";
const SCHEDULER_NAME: &str = "placement-policy";
/// What both deciders decide every Placement onto (PCI level 3).
const DECIDED: [&str; 2] = ["ocm-eu-2", "ocm-us-1"];

pub(crate) struct Settings {
    pub(crate) placements: usize,
    /// Runs of both contenders, each in namespaces of its own.
    pub(crate) runs: usize,
}

pub(crate) fn run(bins: &Bins, dir: &Path, settings: &Settings, report: &mut Report) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let ocm = std::panic::catch_unwind(Ocm::start)
        .map_err(|_| anyhow!("the OCM test bed did not start (see the output above)"))?;
    let bed_ready = started.elapsed().as_secs_f64();
    let controller_pid = ocm
        .component_pid("ocm-placement-controller")
        .context("OCM's placement controller is not running")?;

    ocm.create_policy_namespace(POLICY_NAMESPACE);
    placement_tests::kubectl::create_shipped_policy_configmap(
        &ocm.hub_kubeconfig(),
        POLICY_NAMESPACE,
    );
    let opa = OpaServer::start();
    let mut args = decider_args(POLICY_NAMESPACE);
    args.extend([
        format!("--scheduler-name={SCHEDULER_NAME}"),
        "--lease-namespace=placement-system".to_owned(),
        "--identity=bench".to_owned(),
    ]);
    let mut sync = Sidecar::start(bins, dir, ocm.hub(), Identity::Admin, &opa, &args, "ocm")?;
    sync.wait_ready(Duration::from_secs(60), Duration::from_millis(100))?;
    let ours_pids = vec![sync.pid(), opa.pid().context("OPA is not running")?];

    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(ocm.client(Identity::Admin));
    let counted = |sync: &Sidecar| -> Result<[f64; 2]> {
        Ok([
            sync.metric("placement_sync_remediation_queries_total")?,
            sync.metric("placement_sync_remediation_passes_total")?,
        ])
    };
    // A run's Placements stay beside those of the runs before it, so the
    // order alternates, as in scenario 8.
    let (mut natives, mut ourses) = (Vec::new(), Vec::new());
    let (mut queries, mut passes) = (0.0, 0.0);
    for run in 0..settings.runs {
        let native_first = run % 2 == 0;
        for native in [native_first, !native_first] {
            if native {
                natives.push(decide_all(
                    &runtime,
                    &client,
                    &ocm,
                    &format!("{NATIVE}-{run}"),
                    native_placement,
                    settings,
                    &[controller_pid],
                )?);
            } else {
                let before = counted(&sync)?;
                ourses.push(decide_all(
                    &runtime,
                    &client,
                    &ocm,
                    &format!("{OURS}-{run}"),
                    opted_in_placement,
                    settings,
                    &ours_pids,
                )?);
                let after = counted(&sync)?;
                queries += after[0] - before[0];
                passes += after[1] - before[1];
            }
        }
    }
    sync.check_alive()?;
    let runs = settings.runs as f64;
    let (queries, passes) = (queries / runs, passes / runs);
    let native = Contending::median(&natives);
    let ours = Contending::median(&ourses);
    let n = settings.placements;
    let mut section = format!(
        "## 9. Deciding Open Cluster Management Placements ({n} Placements)\n\n\
         A real OCM hub (the test bed's: registration, placement and work controllers of OCM v1.3.1 on the bed's \
         kube-apiserver, three managed clusters joined by their own agents; ready in {bed_ready:.0} s). OCM's placement \
         controller decides Placements that select by a label predicate (`{PCI_LABEL} in (3)`); placement-policy decides \
         Placements that opt in (`experimental-scheduling-disable: \"true\"`, `placement-policy.io/scheduler-name`) and are \
         annotated with PCI level 3, by the shipped policy (which selects the same two clusters, {}). Every Placement of the \
         bed's cluster set, in a namespace with it bound. Time: from the first create until every Placement has a \
         PlacementDecision naming both clusters. CPU: the decider's processes meanwhile (OCM's placement controller; \
         placement-sync and its OPA), from `/proc/<pid>/stat`. Medians of {runs} runs, each contender in a namespace of its \
         own per run; a run's Placements stay, so the order alternates (OCM's controller first in even runs). OCM's \
         placement controller runs with `--kube-api-qps={qps} --kube-api-burst={burst}` (its default 50 would pace it); \
         placement-sync's client has no throttle, its writes are paced by `--remediation-rate` (200 a second).\n\n\
         | decider | time to every decision | CPU | time ratio | CPU ratio |\n|---|---|---|---|---|\n",
        DECIDED.join(" and "),
        runs = settings.runs,
        qps = COMPONENT_QPS,
        burst = 2 * COMPONENT_QPS,
    );
    section.push_str(&format!(
        "| OCM's placement controller | {:.2} s | {:.2} s | 1.00 | 1.00 |\n",
        native.seconds, native.cpu
    ));
    let time_ratio = ours.seconds / native.seconds;
    let cpu_ratio = ours.cpu / native.cpu.max(0.001);
    section.push_str(&format!(
        "| placement-policy | {:.2} s | {:.2} s | {time_ratio:.2} | {cpu_ratio:.2} |\n",
        ours.seconds, ours.cpu
    ));
    section.push_str(&format!(
        "\nplacement-policy's CPU: placement-sync {:.2} s, OPA {:.2} s; {queries:.0} decision queries and {passes:.0} \
         reconciler passes per run (means over runs; one query per Placement, which has no workloads; binding the cluster \
         set to the run's namespace is a change of the world, so a pass over everything asks again about the Placements \
         of the earlier runs too).\n",
        ours.parts[0], ours.parts[1]
    ));
    report.section(section);
    report.target(
        format!(
            "OCM: time until every one of {n} Placements is decided, at most OCM's placement controller's"
        ),
        format!(
            "{:.2} s vs {:.2} s ({time_ratio:.2}x)",
            ours.seconds, native.seconds
        ),
        Status::from_bool(time_ratio <= 1.0),
    );
    report.target(
        format!("OCM: decider CPU for {n} Placements, at most OCM's placement controller's"),
        format!("{:.2} s vs {:.2} s ({cpu_ratio:.2}x)", ours.cpu, native.cpu),
        Status::from_bool(cpu_ratio <= 1.0),
    );
    drop(sync);
    drop(opa);
    drop(ocm);
    Ok(())
}

/// Scenario 9 without OCM: said in the report, never counted as met.
pub(crate) fn skipped(reason: &str, report: &mut Report) {
    report.section(format!(
        "## 9. Deciding Open Cluster Management Placements\n\nNot run: {reason}\n"
    ));
    report.target(
        "OCM: deciding Placements beside OCM's placement controller",
        format!("not run: {reason}"),
        Status::Blocked,
    );
}

/// A Placement OCM's controller decides: the clusters of PCI level 3.
fn native_placement(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterSets": [CLUSTER_SET],
            "predicates": [{"requiredClusterSelector": {"labelSelector": {"matchExpressions": [
                {"key": PCI_LABEL, "operator": "In", "values": ["3"]}]}}}],
        }
    })
}

/// A Placement placement-policy decides, asking for PCI level 3.
fn opted_in_placement(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": namespace, "annotations": {
            "cluster.open-cluster-management.io/experimental-scheduling-disable": "true",
            "placement-policy.io/scheduler-name": SCHEDULER_NAME,
            PCI_KEY: "3",
        }},
        "spec": {"clusterSets": [CLUSTER_SET]},
    })
}

/// Create every Placement in `namespace` and wait until each is decided
/// onto [`DECIDED`].
fn decide_all(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    ocm: &Ocm,
    namespace: &str,
    placement: fn(&str, &str) -> Value,
    settings: &Settings,
    pids: &[u32],
) -> Result<Contending> {
    ocm.bind_cluster_set(namespace);
    let decided = DecisionCount::start(runtime, client, namespace);
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.open-cluster-management.io",
        "v1beta1",
        "Placement",
    ));
    let cpu = CpuSince::start(pids)?;
    let started = Instant::now();
    runtime.block_on(async {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let creates = futures::stream::iter(0..settings.placements).map(|i| {
            let api = api.clone();
            async move {
                let object: DynamicObject =
                    serde_json::from_value(placement(namespace, &format!("p{i:05}")))?;
                api.create(&PostParams::default(), &object).await?;
                Ok::<_, anyhow::Error>(())
            }
        });
        let results: Vec<_> = creates.buffer_unordered(16).collect().await;
        results.into_iter().collect::<Result<Vec<_>>>()
    })?;
    poll(
        &format!("{} Placements of {namespace} decided", settings.placements),
        Duration::from_secs(900),
        Duration::from_millis(100),
        || {
            ocm.check_components();
            Ok((decided.count() >= settings.placements).then_some(()))
        },
    )?;
    let run = cpu.contending(started.elapsed().as_secs_f64())?;
    if decided.wrong() > 0 {
        bail!(
            "{namespace}: {} Placements were decided onto other clusters than {DECIDED:?}",
            decided.wrong()
        );
    }
    eprintln!(
        "{namespace}: {} Placements decided after {:.2} s, CPU {:.2} s ({:.2?})",
        settings.placements, run.seconds, run.cpu, run.parts
    );
    Ok(run)
}

/// The Placements of one namespace whose PlacementDecisions name exactly
/// [`DECIDED`], counted by a watch (a poll listing them would load the API
/// server both contenders share).
struct DecisionCount {
    /// By Placement: the clusters its decisions name.
    seen: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DecisionCount {
    fn start(runtime: &tokio::runtime::Runtime, client: &kube::Client, namespace: &str) -> Self {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.open-cluster-management.io",
            "v1beta1",
            "PlacementDecision",
        ));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let task = {
            let seen = seen.clone();
            runtime.spawn(async move {
                let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { continue };
                    let (watcher::Event::Apply(decision) | watcher::Event::InitApply(decision)) =
                        event
                    else {
                        continue;
                    };
                    let Some(placement) = decision
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("cluster.open-cluster-management.io/placement"))
                    else {
                        continue;
                    };
                    let clusters: BTreeSet<String> = decision
                        .data
                        .pointer("/status/decisions")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|d| d["clusterName"].as_str().map(str::to_owned))
                        .collect();
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(placement.clone(), clusters);
                }
            })
        };
        DecisionCount { seen, task }
    }

    fn expected() -> BTreeSet<String> {
        DECIDED.iter().map(|c| (*c).to_owned()).collect()
    }

    /// Placements decided onto [`DECIDED`].
    fn count(&self) -> usize {
        let expected = Self::expected();
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|c| **c == expected)
            .count()
    }

    /// Placements decided onto other clusters (none, or some).
    fn wrong(&self) -> usize {
        let expected = Self::expected();
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|c| !c.is_empty() && **c != expected)
            .count()
    }
}

impl Drop for DecisionCount {
    fn drop(&mut self) {
        self.task.abort();
    }
}
