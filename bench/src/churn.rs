//! Scenario 7: churn. 10,000 ReplicaSets, placed at creation by placement-webhook,
//! replicated (`--replicate=apps/v1/replicasets`) and remediated (`--remediation=auto`,
//! the default `--remediate` types, leader through the Lease) by a placement-sync
//! of their own, as the chart's remediator Deployment runs it: its own OPA, which
//! nothing else talks to, so that OPA's `POST /v1/data` counter is exactly the
//! sidecar's decision queries. The webhook has its OPA and a replicating
//! placement-sync of its own (`--remediation=off`), as in a webhook pod.
//!
//! Per run:
//! 1. Idle: nothing changes for a few seconds (the baseline of queries and CPU).
//! 2. Churn: status updates (`status.replicas` and the counts beside it, through the
//!    status subresource, which the webhook does not see and no policy reads) at
//!    `BENCH_CHURN_RATE` per second for `BENCH_CHURN_SECONDS`, round robin over the
//!    workloads: the decision queries the sidecar issues (target 0) and its CPU
//!    seconds, until it is quiet again.
//! 3. Offline: one Cluster (`gce-us-central1`) goes `offline` (status.phase). Half
//!    of the workloads (no EU jurisdiction, PCI level 0: placed on every running
//!    cluster) lose it; the other half (EU, PCI level 2: gce-europe-west1 and
//!    gce-europe-west2) is not affected. Time from the status patch until a watch
//!    has seen the last affected workload re-placed, and the PATCHes the sidecar
//!    sent (`placement_sync_remediation_patches_total`; target: exactly the
//!    affected ones).
//! 4. The Cluster goes back to `running` and the same half is re-placed again (the
//!    same measurement), so that the next run starts where this one did.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher;
use placement_tests::{ControlPlane, Identity, OpaServer, SYSTEM_NAMESPACE, placed_clusters};
use serde_json::json;

use crate::common::{Bins, Sidecar, cpu_seconds, median, poll, start_registered_webhook};
use crate::opa_probe::decision_queries;
use crate::remediation::settle;
use crate::replication::{policy_configmap, shipped_modules};
use crate::report::{Report, Status, fmt_count};
use crate::review::replicaset;

const NS: &str = "bench-churn";
/// The Cluster that goes offline: every workload without EU jurisdiction is
/// placed on it, no EU workload is.
const OFFLINE_CLUSTER: &str = "gce-us-central1";
/// What the EU half is placed on (and stays on).
const EU_PLACEMENT: [&str; 2] = ["gce-europe-west1", "gce-europe-west2"];
/// Status updates in flight at once (they are sent on a schedule, not one
/// after the other).
const STATUS_IN_FLIGHT: usize = 64;
/// ReplicaSet creates in flight at once (each passes through the webhook).
const CREATE_CONCURRENCY: usize = 32;
/// The idle baseline before each churn window.
const IDLE: Duration = Duration::from_secs(10);
/// The sidecar is quiet when its query and pass counters stay put this long.
const QUIET: Duration = Duration::from_secs(3);
const REPLICATE: &str = "--replicate=apps/v1/replicasets";
const REPLICATE_CLUSTER: &str = "--replicate-cluster=placement-policy.io/v1alpha1/clusters";

/// What the command line sets.
pub(crate) struct Settings {
    pub(crate) workloads: usize,
    pub(crate) rate: f64,
    pub(crate) seconds: f64,
    pub(crate) runs: usize,
}

/// The two halves of the workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// EU jurisdiction, PCI level 2: never on the Cluster that goes offline.
    Eu,
    /// No requirement: on every running cluster, so affected.
    Anywhere,
}

fn class_of(index: usize) -> Class {
    if index.is_multiple_of(2) {
        Class::Eu
    } else {
        Class::Anywhere
    }
}

fn workload_name(index: usize) -> String {
    format!("rs-{index:05}")
}

/// What the watch on the workloads has seen.
#[derive(Default)]
struct Seen {
    clusters: HashMap<String, Vec<String>>,
    versions: HashMap<String, String>,
    /// The phase being waited for: affected workloads count as re-placed when
    /// their placement names the Cluster (`true`) or does not (`false`).
    want_offline_cluster: Option<bool>,
    replaced_at: HashMap<String, Instant>,
    modified_affected: u64,
    modified_other: u64,
}

/// Counters of the remediating sidecar and its OPA at one moment.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    at: Instant,
    queries: f64,
    cpu_s: f64,
    passes: f64,
    patches_ok: f64,
    patches_err: f64,
    replicated_writes: f64,
}

impl Snapshot {
    fn take(sidecar: &Sidecar, opa: &OpaServer) -> Result<Snapshot> {
        let page = sidecar.metrics()?;
        let m = |name: &str, labels: &[&str]| crate::common::metric_sum(&page, name, labels);
        Ok(Snapshot {
            at: Instant::now(),
            queries: decision_queries(opa)?,
            cpu_s: cpu_seconds(sidecar.pid())?,
            passes: m("placement_sync_remediation_passes_total", &[]),
            patches_ok: m(
                "placement_sync_remediation_patches_total",
                &[r#"result="ok""#],
            ),
            patches_err: m(
                "placement_sync_remediation_patches_total",
                &[r#"result="error""#],
            ),
            replicated_writes: m(
                "placement_sync_engine_writes_total",
                &[r#"resource="replicasets""#],
            ),
        })
    }

    fn delta(&self, before: &Snapshot) -> Delta {
        Delta {
            seconds: (self.at - before.at).as_secs_f64(),
            queries: self.queries - before.queries,
            cpu_s: self.cpu_s - before.cpu_s,
            passes: self.passes - before.passes,
            patches: (self.patches_ok - before.patches_ok)
                + (self.patches_err - before.patches_err),
            patch_errors: self.patches_err - before.patches_err,
            replicated_writes: self.replicated_writes - before.replicated_writes,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Delta {
    seconds: f64,
    queries: f64,
    cpu_s: f64,
    passes: f64,
    patches: f64,
    patch_errors: f64,
    replicated_writes: f64,
}

#[derive(Debug, Clone, Default)]
struct ChurnRun {
    idle: Delta,
    /// The updates' own window.
    window: Delta,
    /// From the window's start until the sidecar was quiet again.
    total: Delta,
    sent: u64,
    failed: u64,
    send_s: f64,
    pass_ms: Vec<f64>,
}

#[derive(Debug, Clone, Default)]
struct Replacement {
    last_s: f64,
    affected: usize,
    delta: Delta,
    modified_affected: u64,
    modified_other: u64,
    pass_ms: Vec<f64>,
}

#[derive(Debug, Clone, Default)]
struct RunResult {
    churn: ChurnRun,
    offline: Replacement,
    online: Replacement,
}

pub(crate) fn run(bins: &Bins, dir: &Path, settings: &Settings, report: &mut Report) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let workloads = settings.workloads;
    let affected = (0..workloads)
        .filter(|i| class_of(*i) == Class::Anywhere)
        .count();
    eprintln!("scenario 7: starting etcd and kube-apiserver");
    let plane = ControlPlane::start();
    plane.ensure_example_clusters();
    policy_configmap(&plane, "placement", &shipped_modules()?)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = rt.block_on(plane.client(Identity::Admin));

    // The webhook's side: its OPA, kept in sync by a sidecar that only replicates.
    let opa_webhook = OpaServer::start();
    let mut sync_webhook = Sidecar::start(
        bins,
        dir,
        &plane,
        Identity::Sidecar,
        &opa_webhook,
        &[REPLICATE_CLUSTER.into(), "--remediation=off".into()],
        "webhook-pod",
    )?;
    sync_webhook.wait_ready(Duration::from_secs(120), Duration::from_millis(50))?;
    let webhook = start_registered_webhook(bins, dir, &plane, &opa_webhook, NS)?;

    let api: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let t = Instant::now();
    rt.block_on(create_workloads(&api, workloads))?;
    let created_s = t.elapsed().as_secs_f64();
    eprintln!(
        "scenario 7: created {workloads} ReplicaSets through the webhook in {created_s:.1} s"
    );
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watch_task = rt.spawn(watch(api.clone(), Arc::clone(&seen)));
    poll(
        "the watch to list every workload, placed",
        Duration::from_secs(300),
        Duration::from_millis(100),
        || {
            let s = seen.lock().expect("seen");
            if s.clusters.len() < workloads {
                return Ok(None);
            }
            let wrong: Vec<String> = (0..workloads)
                .filter(|i| {
                    let clusters = s.clusters.get(&workload_name(*i));
                    match class_of(*i) {
                        Class::Eu => !clusters.is_some_and(|c| c.iter().eq(EU_PLACEMENT.iter())),
                        Class::Anywhere => {
                            !clusters.is_some_and(|c| c.iter().any(|n| n == OFFLINE_CLUSTER))
                        }
                    }
                })
                .map(workload_name)
                .take(3)
                .collect();
            if !wrong.is_empty() {
                bail!("not placed as expected by the webhook at creation: {wrong:?} ...");
            }
            Ok(Some(()))
        },
    )?;

    // The remediator: its own OPA, nothing else talks to it.
    let opa = OpaServer::start();
    let t = Instant::now();
    let mut sidecar = Sidecar::start(
        bins,
        dir,
        &plane,
        Identity::Sidecar,
        &opa,
        &[
            REPLICATE.into(),
            REPLICATE_CLUSTER.into(),
            "--remediation=auto".into(),
            format!("--lease-namespace={SYSTEM_NAMESPACE}"),
            "--identity=bench-churn-remediator".into(),
        ],
        "remediator",
    )?;
    sidecar.wait_ready(Duration::from_secs(600), Duration::from_millis(50))?;
    let ready_s = t.elapsed().as_secs_f64();
    poll(
        "the sidecar to lead",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok((sidecar.metric("placement_sync_leader")? >= 1.0).then_some(())),
    )?;
    // Its first pass over everything (nothing stale: the webhook placed them),
    // and until its queries stay put: a pass ends its count only when done.
    settle(&sidecar, 0.0)?;
    wait_quiet(&mut sidecar, &opa)?;
    let start = Snapshot::take(&sidecar, &opa)?;
    ensure!(
        start.patches_ok + start.patches_err == 0.0,
        "the remediator patched {} workloads the webhook had placed",
        start.patches_ok + start.patches_err
    );
    eprintln!(
        "scenario 7: remediator ready after {ready_s:.1} s; quiet after {} passes ({} decision queries)",
        start.passes, start.queries
    );

    let mut seq = 0u64;
    let names: Arc<Vec<String>> = Arc::new((0..workloads).map(workload_name).collect());
    let clusters = cluster_api(&client);
    let mut results = Vec::new();
    for run in 1..=settings.runs {
        let mut result = RunResult::default();
        let before = Snapshot::take(&sidecar, &opa)?;
        std::thread::sleep(IDLE);
        let idle_end = Snapshot::take(&sidecar, &opa)?;
        result.churn.idle = idle_end.delta(&before);

        let log_mark = sidecar_log_len(&sidecar);
        let (sent, failed, send_s) = rt.block_on(status_updates(
            api.clone(),
            Arc::clone(&names),
            &mut seq,
            settings.rate,
            Duration::from_secs_f64(settings.seconds),
        ));
        let window_end = Snapshot::take(&sidecar, &opa)?;
        wait_quiet(&mut sidecar, &opa)?;
        let total_end = Snapshot::take(&sidecar, &opa)?;
        result.churn.sent = sent;
        result.churn.failed = failed;
        result.churn.send_s = send_s;
        result.churn.window = window_end.delta(&idle_end);
        result.churn.total = total_end.delta(&idle_end);
        result.churn.pass_ms = pass_durations(&sidecar, log_mark);
        eprintln!(
            "scenario 7 run {run}: {sent} status updates ({failed} failed) in {send_s:.1} s; decision queries {} in the window, {} until quiet; sidecar CPU {:.2} s; {} passes",
            result.churn.window.queries,
            result.churn.total.queries,
            result.churn.total.cpu_s,
            result.churn.total.passes
        );

        for offline in [true, false] {
            let r = replace(&rt, &clusters, &mut sidecar, &opa, &seen, offline, affected)?;
            eprintln!(
                "scenario 7 run {run}: {OFFLINE_CLUSTER} {}: last of {} affected re-placed after {:.2} s; {} PATCHes; {} decision queries; {} other workloads modified",
                if offline { "offline" } else { "running again" },
                r.affected,
                r.last_s,
                r.delta.patches,
                r.delta.queries,
                r.modified_other
            );
            if offline {
                result.offline = r;
            } else {
                result.online = r;
            }
        }
        results.push(result);
    }
    watch_task.abort();
    sidecar.stop();
    sync_webhook.stop();
    drop(webhook);

    render(
        &results,
        settings,
        workloads,
        affected,
        created_s,
        ready_s,
        (start.passes, start.queries),
        report,
    );
    Ok(())
}

/// Wait until the sidecar's decision queries and passes stay put for [`QUIET`].
fn wait_quiet(sidecar: &mut Sidecar, opa: &OpaServer) -> Result<()> {
    let mut last = (
        decision_queries(opa)?,
        sidecar.metric("placement_sync_remediation_passes_total")?,
    );
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(900);
    while since.elapsed() < QUIET {
        sidecar.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "the remediator did not become quiet:\n{}",
                sidecar.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        let now = (
            decision_queries(opa)?,
            sidecar.metric("placement_sync_remediation_passes_total")?,
        );
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    Ok(())
}

/// Set the phase of the Cluster and wait until every affected workload is
/// re-placed and the remediator has settled.
fn replace(
    rt: &tokio::runtime::Runtime,
    clusters: &Api<DynamicObject>,
    sidecar: &mut Sidecar,
    opa: &OpaServer,
    seen: &Arc<Mutex<Seen>>,
    offline: bool,
    affected: usize,
) -> Result<Replacement> {
    {
        let mut s = seen.lock().expect("seen");
        s.want_offline_cluster = Some(!offline);
        s.replaced_at.clear();
        s.modified_affected = 0;
        s.modified_other = 0;
    }
    let log_mark = sidecar_log_len(sidecar);
    let before = Snapshot::take(sidecar, opa)?;
    let phase = if offline { "offline" } else { "running" };
    let t0 = Instant::now();
    rt.block_on(clusters.patch_status(
        OFFLINE_CLUSTER,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    ))?;
    let last = poll(
        "every affected workload re-placed",
        Duration::from_secs(1800),
        Duration::from_millis(50),
        || {
            sidecar.check_alive()?;
            let s = seen.lock().expect("seen");
            Ok((s.replaced_at.len() >= affected)
                .then(|| s.replaced_at.values().max().copied())
                .flatten())
        },
    )?;
    settle(sidecar, before.passes)?;
    let after = Snapshot::take(sidecar, opa)?;
    let s = seen.lock().expect("seen");
    Ok(Replacement {
        last_s: (last - t0).as_secs_f64(),
        affected: s.replaced_at.len(),
        delta: after.delta(&before),
        modified_affected: s.modified_affected,
        modified_other: s.modified_other,
        pass_ms: pass_durations(sidecar, log_mark),
    })
}

fn cluster_api(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("placement-policy.io", "v1alpha1", "Cluster"),
        "clusters",
    );
    Api::all_with(client.clone(), &resource)
}

fn sidecar_log_len(sidecar: &Sidecar) -> usize {
    sidecar.log().len()
}

/// The `took_ms` of every remediation pass the sidecar logged after `from`.
fn pass_durations(sidecar: &Sidecar, from: usize) -> Vec<f64> {
    let log = sidecar.log();
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("remediation pass"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("took_ms="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

/// Send status updates at `rate` per second for `length`, round robin over
/// `names`, continuing the sequence `seq`: (sent, failed, seconds taken).
async fn status_updates(
    api: Api<ReplicaSet>,
    names: Arc<Vec<String>>,
    seq: &mut u64,
    rate: f64,
    length: Duration,
) -> (u64, u64, f64) {
    let total = (rate * length.as_secs_f64()).round() as u64;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut failed = 0u64;
    let started = Instant::now();
    for _ in 0..total {
        ticks.tick().await;
        while in_flight.len() >= STATUS_IN_FLIGHT {
            if let Some(Ok(false) | Err(_)) = in_flight.join_next().await {
                failed += 1;
            }
        }
        let n = names.len() as u64;
        let name = names[(*seq % n) as usize].clone();
        // Each visit of a workload sets counts other than its last ones, so every
        // update is a real write (an unchanged status would not be written).
        let replicas = (*seq / n) % 4 + 1;
        *seq += 1;
        let api = api.clone();
        in_flight.spawn(async move {
            let status = json!({"status": {
                "replicas": replicas,
                "fullyLabeledReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "observedGeneration": 1,
            }});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .is_ok()
        });
    }
    while let Some(done) = in_flight.join_next().await {
        if !matches!(done, Ok(true)) {
            failed += 1;
        }
    }
    (total, failed, started.elapsed().as_secs_f64())
}

async fn watch(api: Api<ReplicaSet>, seen: Arc<Mutex<Seen>>) {
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let rs = match event {
            watcher::Event::Apply(rs) | watcher::Event::InitApply(rs) => rs,
            _ => continue,
        };
        let now = Instant::now();
        let name = rs.metadata.name.clone().unwrap_or_default();
        let index: Option<usize> = name.strip_prefix("rs-").and_then(|i| i.parse().ok());
        let clusters = serde_json::to_value(&rs)
            .ok()
            .and_then(|v| placed_clusters(&v))
            .unwrap_or_default();
        let version = rs.metadata.resource_version.clone().unwrap_or_default();
        let mut s = seen.lock().expect("seen");
        let is_affected = index.map(class_of) == Some(Class::Anywhere);
        if let Some(old) = s.versions.insert(name.clone(), version.clone())
            && old != version
        {
            if is_affected {
                s.modified_affected += 1;
            } else {
                s.modified_other += 1;
            }
        }
        if let Some(want) = s.want_offline_cluster
            && is_affected
            && !clusters.is_empty()
            && clusters.iter().any(|c| c == OFFLINE_CLUSTER) == want
            && !s.replaced_at.contains_key(&name)
        {
            s.replaced_at.insert(name.clone(), now);
        }
        s.clusters.insert(name, clusters);
    }
}

/// Create the workloads `rs-NNNNN`, alternating the two classes, through the
/// webhook ([`CREATE_CONCURRENCY`] in flight).
async fn create_workloads(api: &Api<ReplicaSet>, count: usize) -> Result<()> {
    let template = replicaset("x", NS)?;
    let mut next = 0usize;
    let mut in_flight = tokio::task::JoinSet::new();
    while next < count || !in_flight.is_empty() {
        while next < count && in_flight.len() < CREATE_CONCURRENCY {
            let api = api.clone();
            let name = workload_name(next);
            let mut object = template.clone();
            object["metadata"]["name"] = json!(name);
            object["metadata"]["labels"]["app"] = json!(name);
            object["spec"]["selector"]["matchLabels"]["app"] = json!(name);
            object["spec"]["template"]["metadata"]["labels"]["app"] = json!(name);
            if class_of(next) == Class::Anywhere {
                let annotations = &mut object["metadata"]["annotations"];
                annotations["policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"] =
                    json!("false");
                annotations["policy.federation.alpha.kubernetes.io/pci-compliance-level"] =
                    json!("0");
                annotations["description"] = json!("Catalogue front end; no requirements");
            }
            let rs: ReplicaSet = serde_json::from_value(object)?;
            in_flight.spawn(async move {
                match api.create(&PostParams::default(), &rs).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(anyhow::Error::from(e).context("create ReplicaSet")),
                }
            });
            next += 1;
        }
        if let Some(done) = in_flight.join_next().await {
            done??;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn render(
    results: &[RunResult],
    settings: &Settings,
    workloads: usize,
    affected: usize,
    created_s: f64,
    ready_s: f64,
    startup: (f64, f64),
    report: &mut Report,
) {
    let med = |f: &dyn Fn(&RunResult) -> f64| median(&results.iter().map(f).collect::<Vec<_>>());
    let n = fmt_count(workloads);
    let half = fmt_count(affected);
    let updates = (settings.rate * settings.seconds).round() as usize;
    let mut md = format!(
        "## 7. Churn: status updates, then one Cluster offline\n\n\
         {n} ReplicaSets (the 4 KB workload of scenario 2; created through placement-webhook in {created_s:.0} s, {CREATE_CONCURRENCY} in flight, and placed by it), \
         half of them EU with PCI level 2 (placed on {}), half without requirements (placed on every running cluster, {OFFLINE_CLUSTER} among them). \
         They are replicated and remediated by a placement-sync of their own (`{REPLICATE} {REPLICATE_CLUSTER} --remediation=auto`, the default `--remediate` \
         types, leader through the Lease; its service account), against an OPA that nothing else talks to, so that OPA's `POST /v1/data` request counter \
         is the sidecar's decision queries (replication writes are `PUT`/`PATCH`/`DELETE`). The webhook has its own OPA and a replicating placement-sync \
         (`--remediation=off`), as in a webhook pod. The sidecar was ready {ready_s:.1} s after its start; until it was quiet it made {:.0} remediation pass(es) over everything, \
         asked {:.0} decisions and patched nothing. {} run(s), medians.\n\n\
         ### Status updates no policy reads\n\n\
         {} updates per second for {} s ({} updates, round robin: status.replicas and the counts beside it, through the status subresource, \
         which the webhook does not see; the shipped policy reads the workload's kind and annotations and the Clusters). Counted from the start of \
         the updates until the sidecar's query and pass counters stayed put for {} s; the idle row is {} s with nothing changing, just before.\n\n\
         | | length | decision queries | sidecar CPU | CPU share of one core | remediation passes | replicated writes (ReplicaSets) | PATCHes |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        EU_PLACEMENT.join(" and "),
        startup.0,
        startup.1,
        results.len(),
        settings.rate,
        settings.seconds,
        fmt_count(updates),
        QUIET.as_secs(),
        IDLE.as_secs(),
    );
    let row = |label: &str, d: &dyn Fn(&RunResult) -> Delta| {
        let m = |f: &dyn Fn(&Delta) -> f64| med(&|r| f(&d(r)));
        format!(
            "| {label} | {:.1} s | {} | {:.2} s | {:.0}% | {:.0} | {} | {:.0} |\n",
            m(&|d| d.seconds),
            fmt_count(m(&|d| d.queries) as usize),
            m(&|d| d.cpu_s),
            m(&|d| d.cpu_s / d.seconds) * 100.0,
            m(&|d| d.passes),
            fmt_count(m(&|d| d.replicated_writes) as usize),
            m(&|d| d.patches),
        )
    };
    md.push_str(&row("idle (nothing changes)", &|r| r.churn.idle));
    md.push_str(&row("during the updates", &|r| r.churn.window));
    md.push_str(&row("updates until quiet", &|r| r.churn.total));
    let pass_ms: Vec<f64> = results
        .iter()
        .flat_map(|r| r.churn.pass_ms.clone())
        .collect();
    md.push_str(&format!(
        "\nPer run (updates sent, failed, seconds to send; decision queries until quiet; CPU): {}\n",
        results
            .iter()
            .map(|r| format!(
                "{}, {}, {:.1} s; {}; {:.2} s",
                r.churn.sent,
                r.churn.failed,
                r.churn.send_s,
                fmt_count(r.churn.total.queries as usize),
                r.churn.total.cpu_s
            ))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    let queries = med(&|r| r.churn.total.queries);
    let passes = med(&|r| r.churn.total.passes);
    if queries > 0.0 {
        md.push_str(&format!(
            "\nWhere the queries come from: {passes:.0} remediation passes over all {n} workloads (each pass asks one decision per workload: \
             {:.0} queries per pass), started by the replicated status writes; a pass took {} ms (median of {} passes, the sidecar's own \
             `took_ms`), and the next one starts {} after the first write that follows.\n",
            queries / passes.max(1.0),
            if pass_ms.is_empty() {
                "n/a".to_owned()
            } else {
                format!("{:.0}", median(&pass_ms))
            },
            pass_ms.len(),
            "`--remediation-debounce` (500 ms)"
        ));
    }

    md.push_str(&format!(
        "\n### One Cluster offline\n\n\
         `{OFFLINE_CLUSTER}`'s status.phase patched to `offline`: the {half} workloads without requirements lose it, the other {half} are not affected. \
         Time: from the status patch until a watch on the workloads has seen the last affected one re-placed. PATCHes: the sidecar's \
         `placement_sync_remediation_patches_total`; decision queries: its OPA's counter; other workloads modified: resourceVersion changes the watch saw \
         on the unaffected half. Then back to `running`, the same measurement (the same half is re-placed).\n\n\
         | event | affected | last affected re-placed | PATCHes (failed) | affected workloads modified | unaffected workloads modified | decision queries | remediation passes | sidecar CPU |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    ));
    for (label, pick) in [
        (
            format!("`{OFFLINE_CLUSTER}` offline"),
            (|r: &RunResult| &r.offline) as fn(&RunResult) -> &Replacement,
        ),
        (
            format!("`{OFFLINE_CLUSTER}` running again"),
            |r: &RunResult| &r.online,
        ),
    ] {
        md.push_str(&format!(
            "| {label} | {} | {:.2} s | {} ({:.0}) | {} | {:.0} | {} | {:.0} | {:.2} s |\n",
            half,
            med(&|r| pick(r).last_s),
            fmt_count(med(&|r| pick(r).delta.patches) as usize),
            med(&|r| pick(r).delta.patch_errors),
            fmt_count(med(&|r| pick(r).modified_affected as f64) as usize),
            med(&|r| pick(r).modified_other as f64),
            fmt_count(med(&|r| pick(r).delta.queries) as usize),
            med(&|r| pick(r).delta.passes),
            med(&|r| pick(r).delta.cpu_s),
        ));
    }
    md.push_str(&format!(
        "\nPer run (offline: time; PATCHes; passes' took_ms): {}\n",
        results
            .iter()
            .map(|r| format!(
                "{:.2} s; {:.0}; {}",
                r.offline.last_s,
                r.offline.delta.patches,
                r.offline
                    .pass_ms
                    .iter()
                    .map(|ms| format!("{ms:.0}"))
                    .collect::<Vec<_>>()
                    .join("+")
            ))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    report.section(md);

    let max_queries = results
        .iter()
        .map(|r| r.churn.total.queries)
        .fold(0.0, f64::max);
    report.target(
        format!(
            "Churn: decision queries the sidecar issues for {} status updates no policy reads ({} ReplicaSets) is 0",
            fmt_count(updates),
            n
        ),
        format!(
            "{} queries (median; most {}), {} passes; sidecar CPU {:.2} s",
            fmt_count(queries as usize),
            fmt_count(max_queries as usize),
            passes,
            med(&|r| r.churn.total.cpu_s)
        ),
        Status::from_bool(max_queries == 0.0),
    );
    let exact = results
        .iter()
        .all(|r| r.offline.delta.patches == affected as f64 && r.offline.modified_other == 0);
    report.target(
        format!("Churn: one Cluster offline: PATCHes exactly the {half} affected workloads"),
        format!(
            "{} PATCHes, {:.0} unaffected workloads modified (medians); last re-placed after {:.2} s",
            fmt_count(med(&|r| r.offline.delta.patches) as usize),
            med(&|r| r.offline.modified_other as f64),
            med(&|r| r.offline.last_s)
        ),
        Status::from_bool(exact),
    );
}
