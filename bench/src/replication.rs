//! Scenarios 3 and 5: 10,000 replicated objects (ConfigMaps, about 0.5 KB each)
//! in one namespace, plus the example Cluster objects and the shipped policy in a
//! policy ConfigMap.
//!
//! 3. Each run starts a fresh OPA and a fresh placement-sync and measures the
//!    time from starting the sidecar to its `/readyz` answering 200 (every type
//!    and the policies loaded into OPA; the count in OPA is checked), its peak
//!    resident memory (VmHWM), and how long one ConfigMap update takes to show in
//!    OPA with the 10k loaded.
//! 5. Then OPA is killed and started again empty on the same port; measured
//!    from the new OPA listening to the sidecar having noticed the restart and
//!    answering `/readyz` 200 again (the count in OPA is checked again).
//!
//! kube-mgmt, the comparison the issue asks for in scenario 3, cannot be built
//! here (see the report).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use placement_tests::{ControlPlane, Identity, OpaServer, POLICY_NAMESPACE};
use serde_json::{Value, json};

use crate::common::{Bins, Sidecar, http_get, median, poll, vm_kib};
use crate::report::{Report, Status, fmt_ms};

const NS: &str = "bench-replication";
const UPDATES_PER_RUN: usize = 5;

#[derive(Debug, Default, Clone)]
struct Run {
    first_sync_s: f64,
    hwm_mib_synced: f64,
    hwm_mib: f64,
    rss_mib: f64,
    update_ms: Vec<f64>,
    recovery: Option<Recovery>,
}

#[derive(Debug, Default, Clone)]
struct Recovery {
    detected_s: f64,
    ready_s: f64,
    resync_metric_s: f64,
}

pub(crate) fn run(
    bins: &Bins,
    dir: &Path,
    objects: usize,
    runs: usize,
    report: &mut Report,
    with_recovery: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    eprintln!("scenario 3: starting etcd and kube-apiserver");
    let plane = ControlPlane::start();
    plane.ensure_example_clusters();
    policy_configmap(&plane, "placement", &shipped_modules()?)?;
    plane.create_namespace(NS);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let kube = rt.block_on(plane.client(Identity::Admin));
    let cms: Api<ConfigMap> = Api::namespaced(kube, NS);
    let t = Instant::now();
    rt.block_on(create_configmaps(&cms, objects))?;
    let created_in = t.elapsed().as_secs_f64();
    eprintln!("scenario 3: created {objects} ConfigMaps in {created_in:.1} s");

    let mut results = Vec::new();
    let mut update_seq = 0u64;
    for run in 1..=runs {
        let mut opa = OpaServer::start();
        let started = Instant::now();
        // As the admin: the sidecar's own service account may read ConfigMaps
        // only in the policy namespace (the chart's RBAC).
        let mut sidecar = Sidecar::start(
            bins,
            dir,
            &plane,
            Identity::Admin,
            &opa,
            &[
                "--replicate=v1/configmaps".into(),
                "--replicate-cluster=placement-policy.io/v1alpha1/clusters".into(),
                "--remediation=off".into(),
            ],
            &format!("run{run}"),
        )?;
        let ready_at = sidecar.wait_ready(Duration::from_secs(600), Duration::from_millis(20))?;
        let mut r = Run {
            first_sync_s: (ready_at - started).as_secs_f64(),
            hwm_mib_synced: vm_kib(sidecar.pid(), "VmHWM")? as f64 / 1024.0,
            ..Run::default()
        };
        let count = opa_count(&opa)?;
        ensure!(
            count == objects,
            "OPA holds {count} of {objects} ConfigMaps after the first sync"
        );

        // One update at a time, to OPA.
        for _ in 0..UPDATES_PER_RUN {
            update_seq += 1;
            let name = format!("cm-{:05}", (update_seq as usize * 997) % objects);
            let value = format!("v{update_seq}");
            let t = Instant::now();
            rt.block_on(cms.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"version": value}})),
            ))?;
            let path = format!("/v1/data/kubernetes/configmaps/{NS}/{name}/data/version");
            poll(
                "the update in OPA",
                Duration::from_secs(60),
                Duration::from_millis(1),
                || {
                    let (_, body) = http_get(opa.port, &path, Some(opa.token()))?;
                    let doc: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    Ok((doc["result"] == value.as_str()).then_some(()))
                },
            )?;
            r.update_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        r.hwm_mib = vm_kib(sidecar.pid(), "VmHWM")? as f64 / 1024.0;
        r.rss_mib = vm_kib(sidecar.pid(), "VmRSS")? as f64 / 1024.0;
        eprintln!(
            "scenario 3 run {run}: first sync {:.2} s, peak RSS {:.1} MiB (at sync {:.1}), update -> OPA median {}",
            r.first_sync_s,
            r.hwm_mib,
            r.hwm_mib_synced,
            fmt_ms(median(&r.update_ms))
        );

        if with_recovery {
            let restarts = sidecar.metric("placement_sync_engine_restarts_total")?;
            opa.restart();
            let t = Instant::now();
            let detected = poll(
                "the sidecar to notice the OPA restart",
                Duration::from_secs(60),
                Duration::from_millis(10),
                || {
                    Ok(
                        (sidecar.metric("placement_sync_engine_restarts_total")? > restarts)
                            .then(Instant::now),
                    )
                },
            )?;
            let ready = sidecar.wait_ready(Duration::from_secs(600), Duration::from_millis(10))?;
            let rec = Recovery {
                detected_s: (detected - t).as_secs_f64(),
                ready_s: (ready - t).as_secs_f64(),
                resync_metric_s: sidecar.metric("placement_sync_resync_duration_seconds")?,
            };
            let count = opa_count(&opa)?;
            ensure!(
                count == objects,
                "OPA holds {count} of {objects} ConfigMaps after the recovery"
            );
            let policy = http_get(opa.port, "/v1/policies", Some(opa.token()))?.1;
            ensure!(
                policy.contains("package io.k8s.federation.admission"),
                "the shipped policy is not back in OPA after the recovery"
            );
            eprintln!(
                "scenario 5 run {run}: in sync {:.2} s after OPA restarted (noticed after {:.2} s; resync_duration_seconds {:.2})",
                rec.ready_s, rec.detected_s, rec.resync_metric_s
            );
            r.recovery = Some(rec);
        }
        sidecar.stop();
        drop(opa);
        results.push(r);
    }

    let med = |f: &dyn Fn(&Run) -> f64| median(&results.iter().map(f).collect::<Vec<_>>());
    let first = med(&|r| r.first_sync_s);
    let hwm = med(&|r| r.hwm_mib);
    let all_updates: Vec<f64> = results.iter().flat_map(|r| r.update_ms.clone()).collect();
    let mut md = format!(
        "## 3. Replication into OPA\n\n{objects} ConfigMaps (`--replicate=v1/configmaps`, about 0.5 KB each, created in {created_in:.0} s beforehand) plus the example Clusters \
         (`--replicate-cluster`) and the shipped policy from a policy ConfigMap; a fresh OPA (token authentication, as in the test bed) and a fresh placement-sync per run, \
         `--remediation=off`, other flags at their defaults. First sync: from starting the sidecar to `/readyz` 200 (polled every 20 ms; the {objects} objects checked in OPA). \
         Peak memory: the sidecar's VmHWM. Update: a merge patch of one ConfigMap until OPA returns the new value (polled every 1 ms), {UPDATES_PER_RUN} per run.\n\n\
         | contender | first sync of {objects} | objects/s | peak RSS (VmHWM) | RSS after | update visible in OPA (median of {n}) | max |\n|---|---:|---:|---:|---:|---:|---:|\n\
         | placement-sync | {first:.2} s | {rate:.0} | {hwm:.1} MiB | {rss:.1} MiB | {upd} | {updmax} |\n\
         | kube-mgmt | not measured (see below) | | | | | |\n\n",
        n = all_updates.len(),
        rate = objects as f64 / first,
        rss = med(&|r| r.rss_mib),
        upd = fmt_ms(median(&all_updates)),
        updmax = fmt_ms(all_updates.iter().copied().fold(0.0, f64::max)),
    );
    md.push_str(&format!(
        "Per run (first sync; peak RSS at sync / at end): {}\n\n",
        results
            .iter()
            .map(|r| format!(
                "{:.2} s; {:.1} / {:.1} MiB",
                r.first_sync_s, r.hwm_mib_synced, r.hwm_mib
            ))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    md.push_str(&format!(
        "Memory: {hwm:.1} MiB at its peak is about {:.1} KiB of the sidecar's memory per replicated object (an upper bound: the process's own \
         baseline is included), for objects of about 0.5 KB as JSON: the reflector caches (`DynamicObject`, JSON values) and the one-document first \
         write of each type dominate, and the allocator keeps the peak.\n\n",
        hwm * 1024.0 / objects as f64
    ));
    md.push_str(KUBE_MGMT);
    report.section(md);
    report.target(
        format!("Replication: first sync of {objects} objects in at most half of kube-mgmt's time"),
        format!("placement-sync {first:.2} s; kube-mgmt not buildable here"),
        Status::Blocked,
    );
    report.target(
        "Replication: at most half of kube-mgmt's peak memory",
        format!("placement-sync {hwm:.1} MiB; kube-mgmt not buildable here"),
        Status::Blocked,
    );

    if with_recovery {
        let recs: Vec<&Recovery> = results.iter().filter_map(|r| r.recovery.as_ref()).collect();
        let m =
            |f: &dyn Fn(&Recovery) -> f64| median(&recs.iter().map(|r| f(r)).collect::<Vec<_>>());
        let ready = m(&|r| r.ready_s);
        let md = format!(
            "## 5. Recovery after an OPA restart\n\nOPA killed (SIGKILL) and started again, empty, on the same port, while the sidecar of scenario 3 holds {objects} ConfigMaps, \
             the example Clusters and the shipped policy; {} restart(s), one per run of scenario 3. Measured from the new OPA accepting connections: \
             until the sidecar notices (`placement_sync_engine_restarts_total` grows; default `--engine-check-interval=2s`), and until its `/readyz` answers 200 \
             (everything reloaded; the {objects} objects and the policy checked in OPA afterwards).\n\n\
             | | noticed the restart | in sync (`/readyz` 200) | reload alone (`resync_duration_seconds`) |\n|---|---:|---:|---:|\n\
             | placement-sync | {:.2} s | {:.2} s | {:.2} s |\n\nPer run (in sync): {}\n",
            recs.len(),
            m(&|r| r.detected_s),
            ready,
            m(&|r| r.resync_metric_s),
            recs.iter()
                .map(|r| format!("{:.2} s", r.ready_s))
                .collect::<Vec<_>>()
                .join(" | "),
        );
        report.section(md);
        report.target(
            format!("Recovery: in sync within 5 s at {objects} objects"),
            format!(
                "{ready:.2} s (of which {:.2} s to notice)",
                m(&|r| r.detected_s)
            ),
            Status::from_bool(ready < 5.0),
        );
    }
    Ok(())
}

const KUBE_MGMT: &str = "**kube-mgmt: not measured.** The issue asks for kube-mgmt built from its Go module at a pinned commit. On this machine the only way to fetch Go \
source is the Go module proxy, and it answers \"This module version is not available\" for `github.com/open-policy-agent/kube-mgmt` at every version tried; no other \
source is reachable. So the kube-mgmt column, and with it the two replication targets (half of kube-mgmt's time and memory), cannot be evaluated here; \
placement-sync's own figures are above.\n";

/// The shipped policy modules, as (file name, source).
pub(crate) fn shipped_modules() -> Result<Vec<(String, String)>> {
    Ok(placement_tests::shipped_policy_modules())
}

/// A policy ConfigMap in the policy namespace with one key per module.
pub(crate) fn policy_configmap(
    plane: &ControlPlane,
    name: &str,
    modules: &[(String, String)],
) -> Result<()> {
    let data: serde_json::Map<String, Value> = modules
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": POLICY_NAMESPACE},
        "data": data,
    });
    let out = plane.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string());
    if !out.status.success() {
        bail!(
            "apply policy ConfigMap: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// How many ConfigMaps of the benchmark namespace OPA holds.
fn opa_count(opa: &OpaServer) -> Result<usize> {
    let (status, body) = http_get(
        opa.port,
        &format!("/v1/data/kubernetes/configmaps/{NS}"),
        Some(opa.token()),
    )?;
    ensure!(status == 200, "OPA: HTTP {status}: {body}");
    let doc: Value = serde_json::from_str(&body)?;
    Ok(doc["result"].as_object().map(|m| m.len()).unwrap_or(0))
}

/// Create `count` ConfigMaps `cm-NNNNN` (about 0.5 KB as stored), 32 in flight.
async fn create_configmaps(api: &Api<ConfigMap>, count: usize) -> Result<()> {
    let mut next = 0usize;
    let mut in_flight = tokio::task::JoinSet::new();
    while next < count || !in_flight.is_empty() {
        while next < count && in_flight.len() < 32 {
            let api = api.clone();
            let name = format!("cm-{next:05}");
            in_flight.spawn(async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"bench": "replication", "team": "payments"}},
                    "data": {
                        "region": "europe-west1",
                        "tier": "gold",
                        "owner": "team-a",
                        "version": "v0",
                        "settings": "{\"replicas\":3,\"maxSurge\":1,\"image\":\"registry.invalid/app:1\"}"
                    }
                }))?;
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => Ok(()),
                    // Left from an earlier attempt of this run: fine.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(anyhow::Error::from(e).context("create ConfigMap")),
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
