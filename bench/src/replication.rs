//! Scenarios 3 and 5: replicated ConfigMaps (about 0.5 KB each) in one
//! namespace, plus the example Cluster objects and the shipped policy in a policy
//! ConfigMap, at each size of `BENCH_OBJECTS` (10,000 and 100,000 by default),
//! with placement-sync and kube-mgmt side by side: same control plane, same
//! objects, the same OPA build started fresh for each contender, flags mapped one
//! to one, the same identity.
//!
//! 3. First sync: from starting the contender until OPA holds every object of the
//!    namespace and the policy's modules (polled every 20 ms, by a count query, the
//!    same for both); for placement-sync also until its `/readyz` answers 200.
//!    Peak resident memory (VmHWM) and CPU seconds; how long one ConfigMap update
//!    takes to show in OPA.
//! 5. Then OPA is killed and started again empty on the same port. placement-sync
//!    notices and reloads everything: measured from the new OPA listening to
//!    `/readyz` 200. kube-mgmt never notices a restart, so what OPA holds some
//!    seconds after it is shown for both, and after one ConfigMap update.
//!
//! The ConfigMaps are created once, concurrently, and grow from one size to the
//! next; every contender and run reuses them.

use std::path::Path;
use std::time::{Duration, Instant};

/// A target of scenario 3: what, the target's word for it, the figure, its unit.
type Target = (&'static str, &'static str, fn(&Sample) -> f64, &'static str);

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use placement_tests::{ControlPlane, Identity, OpaServer, POLICY_NAMESPACE};
use serde_json::{Value, json};

use crate::common::{Bins, Sidecar, cpu_seconds, http_get, median, poll, vm_kib};
use crate::kube_mgmt::KubeMgmt;
use crate::opa_probe::{count_objects, policy_ids};
use crate::report::{Report, Status, fmt_count, fmt_ms, fmt_ratio};

const NS: &str = "bench-replication";
const UPDATES_PER_RUN: usize = 5;
/// What OPA holds this long after its restart is shown for every contender.
const RECOVERY_WINDOW: Duration = Duration::from_secs(10);
/// The replicated types, given to both contenders with the same flags.
const REPLICATE: &str = "--replicate=v1/configmaps";
const REPLICATE_CLUSTER: &str = "--replicate-cluster=placement-policy.io/v1alpha1/clusters";
/// ConfigMap creates in flight at once.
const CREATE_CONCURRENCY: usize = 64;
/// Poll interval of the first sync, for every contender.
const SYNC_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    PlacementSync,
    KubeMgmt,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::PlacementSync => "placement-sync",
            Contender::KubeMgmt => "kube-mgmt",
        }
    }
}

/// A contender's process.
enum Running {
    Sync(Sidecar),
    Mgmt(KubeMgmt),
}

impl Running {
    fn pid(&self) -> u32 {
        match self {
            Running::Sync(s) => s.pid(),
            Running::Mgmt(k) => k.pid(),
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        match self {
            Running::Sync(s) => s.check_alive(),
            Running::Mgmt(k) => k.check_alive(),
        }
    }

    fn stop(self) {
        match self {
            Running::Sync(s) => s.stop(),
            Running::Mgmt(k) => k.stop(),
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Sample {
    /// Until OPA holds every object and the policy.
    first_sync_s: f64,
    /// placement-sync only: until `/readyz` 200.
    ready_s: Option<f64>,
    cpu_sync_s: f64,
    hwm_sync_mib: f64,
    hwm_mib: f64,
    rss_mib: f64,
    update_ms: Vec<f64>,
    recovery: Option<Recovery>,
}

#[derive(Debug, Default, Clone)]
struct Recovery {
    /// placement-sync only (kube-mgmt never notices).
    noticed_s: Option<f64>,
    ready_s: Option<f64>,
    resync_metric_s: Option<f64>,
    objects_at_window: usize,
    policies_at_window: usize,
    /// Objects OPA holds once one ConfigMap update is visible in it (`None`: it
    /// never became visible).
    objects_after_update: Option<usize>,
}

/// One size: when its objects were created, and every contender's samples.
struct Size {
    objects: usize,
    created_s: f64,
    samples: Vec<(Contender, Vec<Sample>)>,
}

/// What the scenario needs from the command line.
pub(crate) struct Settings<'a> {
    pub(crate) sizes: &'a [usize],
    pub(crate) runs: usize,
    pub(crate) recovery: bool,
}

pub(crate) fn run(
    bins: &Bins,
    dir: &Path,
    settings: &Settings<'_>,
    report: &mut Report,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut sizes = settings.sizes.to_vec();
    sizes.sort_unstable();
    sizes.dedup();
    let contenders: Vec<Contender> = match &bins.kube_mgmt {
        Ok(_) => vec![Contender::PlacementSync, Contender::KubeMgmt],
        Err(reason) => {
            eprintln!("scenario 3: {reason}");
            vec![Contender::PlacementSync]
        }
    };
    eprintln!("scenario 3: starting etcd and kube-apiserver");
    let plane = ControlPlane::start();
    plane.ensure_example_clusters();
    let modules = shipped_modules()?;
    policy_configmap(&plane, "placement", &modules)?;
    plane.create_namespace(NS);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let kube = rt.block_on(plane.client(Identity::Admin));
    let cms: Api<ConfigMap> = Api::namespaced(kube, NS);

    let mut created = 0usize;
    let mut update_seq = 0u64;
    let mut results = Vec::new();
    for &objects in &sizes {
        let t = Instant::now();
        rt.block_on(create_configmaps(&cms, created, objects))?;
        let created_s = t.elapsed().as_secs_f64();
        eprintln!(
            "scenario 3: created ConfigMaps {created}..{objects} in {created_s:.1} s ({:.0}/s)",
            (objects - created) as f64 / created_s
        );
        created = objects;
        let mut size = Size {
            objects,
            created_s,
            samples: contenders.iter().map(|c| (*c, Vec::new())).collect(),
        };
        for run in 1..=settings.runs {
            // Contenders alternate within a run, so that drift on the machine
            // touches both alike.
            for (contender, samples) in &mut size.samples {
                let label = format!("{}-{objects}-run{run}", contender.name());
                let mut measure = Measure {
                    bins,
                    dir,
                    plane: &plane,
                    rt: &rt,
                    cms: &cms,
                    objects,
                    policies: modules.len(),
                    update_seq: &mut update_seq,
                };
                let sample = measure.one(*contender, &label, settings.recovery)?;
                eprintln!(
                    "scenario 3 {objects} {} run {run}: first sync {:.2} s{}, CPU {:.2} s, peak RSS {:.1} MiB (at sync {:.1}), update -> OPA median {}",
                    contender.name(),
                    sample.first_sync_s,
                    sample
                        .ready_s
                        .map(|r| format!(" (/readyz {r:.2} s)"))
                        .unwrap_or_default(),
                    sample.cpu_sync_s,
                    sample.hwm_mib,
                    sample.hwm_sync_mib,
                    fmt_ms(median(&sample.update_ms))
                );
                if let Some(rec) = &sample.recovery {
                    eprintln!(
                        "scenario 5 {objects} {} run {run}: in sync {} after OPA restarted (noticed {}); {} s later OPA holds {} objects and {} policy modules; after one update {}",
                        contender.name(),
                        opt_s(rec.ready_s),
                        opt_s(rec.noticed_s),
                        RECOVERY_WINDOW.as_secs(),
                        rec.objects_at_window,
                        rec.policies_at_window,
                        rec.objects_after_update
                            .map(|n| n.to_string())
                            .unwrap_or_else(|| "not visible".into())
                    );
                }
                samples.push(sample);
            }
        }
        results.push(size);
    }

    render_replication(&results, &contenders, bins, modules.len(), report);
    if settings.recovery {
        render_recovery(&results, modules.len(), report);
    }
    Ok(())
}

/// Everything one measurement needs.
struct Measure<'a> {
    bins: &'a Bins,
    dir: &'a Path,
    plane: &'a ControlPlane,
    rt: &'a tokio::runtime::Runtime,
    cms: &'a Api<ConfigMap>,
    objects: usize,
    policies: usize,
    update_seq: &'a mut u64,
}

impl Measure<'_> {
    /// A fresh OPA and a fresh contender: first sync, updates and, with
    /// `recovery`, an OPA restart.
    fn one(&mut self, contender: Contender, label: &str, recovery: bool) -> Result<Sample> {
        let mut opa = OpaServer::start();
        let started = Instant::now();
        // As the admin: the sidecar's own service account may read ConfigMaps
        // only in the policy namespace (the chart's RBAC). kube-mgmt gets the same.
        let mut running = match contender {
            Contender::PlacementSync => Running::Sync(Sidecar::start(
                self.bins,
                self.dir,
                self.plane,
                Identity::Admin,
                &opa,
                &[
                    REPLICATE.into(),
                    REPLICATE_CLUSTER.into(),
                    "--remediation=off".into(),
                ],
                label,
            )?),
            Contender::KubeMgmt => {
                let Ok(bin) = &self.bins.kube_mgmt else {
                    bail!("kube-mgmt is not available");
                };
                Running::Mgmt(KubeMgmt::start(
                    bin,
                    self.dir,
                    self.plane,
                    Identity::Admin,
                    &opa,
                    &[REPLICATE.into(), REPLICATE_CLUSTER.into()],
                    label,
                )?)
            }
        };
        let pid = running.pid();

        let mut sample = Sample::default();
        let mut synced = false;
        let deadline = started + Duration::from_secs(900);
        loop {
            running.check_alive()?;
            if let Running::Sync(s) = &mut running
                && sample.ready_s.is_none()
                && s.ready()?
            {
                sample.ready_s = Some(started.elapsed().as_secs_f64());
            }
            if !synced && self.opa_holds_everything(&opa)? {
                sample.first_sync_s = started.elapsed().as_secs_f64();
                sample.cpu_sync_s = cpu_seconds(pid)?;
                sample.hwm_sync_mib = vm_kib(pid, "VmHWM")? as f64 / 1024.0;
                synced = true;
            }
            if synced && (contender != Contender::PlacementSync || sample.ready_s.is_some()) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not sync {} objects into OPA in {:?}",
                    contender.name(),
                    self.objects,
                    deadline - started
                );
            }
            std::thread::sleep(SYNC_POLL);
        }

        // One update at a time, to OPA.
        for _ in 0..UPDATES_PER_RUN {
            let t = Instant::now();
            self.update_one(&opa, Duration::from_secs(60))?
                .ok_or_else(|| anyhow::anyhow!("an update never showed in OPA"))?;
            sample.update_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        sample.hwm_mib = vm_kib(pid, "VmHWM")? as f64 / 1024.0;
        sample.rss_mib = vm_kib(pid, "VmRSS")? as f64 / 1024.0;

        if recovery {
            sample.recovery = Some(self.recovery(&mut running, &mut opa)?);
        }
        running.stop();
        drop(opa);
        Ok(sample)
    }

    /// OPA holds every object of the namespace and every module of the policy.
    fn opa_holds_everything(&self, opa: &OpaServer) -> Result<bool> {
        // Policies are only listed once the count is there: the listing carries
        // every module's AST, the count is one small query.
        Ok(
            count_objects(opa, "kubernetes", "configmaps", NS)? == self.objects
                && policy_ids(opa, &format!("{POLICY_NAMESPACE}/"))?.len() >= self.policies,
        )
    }

    /// Patch one ConfigMap and wait until OPA returns the new value; `None` when
    /// it did not within `timeout`.
    fn update_one(&mut self, opa: &OpaServer, timeout: Duration) -> Result<Option<()>> {
        *self.update_seq += 1;
        let seq = *self.update_seq;
        let name = configmap_name((seq as usize * 997) % self.objects);
        let value = format!("v{seq}");
        self.rt.block_on(self.cms.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"version": value}})),
        ))?;
        let path = format!("/v1/data/kubernetes/configmaps/{NS}/{name}/data/version");
        let seen = poll(
            "the update in OPA",
            timeout,
            Duration::from_millis(1),
            || {
                let (_, body) = http_get(opa.port, &path, Some(opa.token()))?;
                let doc: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                Ok((doc["result"] == value.as_str()).then_some(()))
            },
        );
        Ok(seen.ok())
    }

    /// Kill OPA, start it again empty, and see what it holds afterwards.
    fn recovery(&mut self, running: &mut Running, opa: &mut OpaServer) -> Result<Recovery> {
        let restarts = match running {
            Running::Sync(s) => s.metric("placement_sync_engine_restarts_total")?,
            Running::Mgmt(_) => 0.0,
        };
        opa.restart();
        let t = Instant::now();
        let mut rec = Recovery::default();
        if let Running::Sync(sidecar) = running {
            let noticed = poll(
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
            let ready = sidecar.wait_ready(Duration::from_secs(900), Duration::from_millis(10))?;
            rec.noticed_s = Some((noticed - t).as_secs_f64());
            rec.ready_s = Some((ready - t).as_secs_f64());
            rec.resync_metric_s = Some(sidecar.metric("placement_sync_resync_duration_seconds")?);
        }
        if let Some(rest) = RECOVERY_WINDOW.checked_sub(t.elapsed()) {
            std::thread::sleep(rest);
        }
        running.check_alive()?;
        rec.objects_at_window = count_objects(opa, "kubernetes", "configmaps", NS)?;
        rec.policies_at_window = policy_ids(opa, &format!("{POLICY_NAMESPACE}/"))?.len();
        if self.update_one(opa, Duration::from_secs(30))?.is_some() {
            rec.objects_after_update = Some(count_objects(opa, "kubernetes", "configmaps", NS)?);
        }
        if matches!(running, Running::Sync(_)) {
            ensure!(
                rec.objects_at_window == self.objects && rec.policies_at_window >= self.policies,
                "placement-sync reported ready but OPA holds {} of {} objects and {} of {} modules",
                rec.objects_at_window,
                self.objects,
                rec.policies_at_window,
                self.policies
            );
        }
        Ok(rec)
    }
}

fn opt_s(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.2} s"))
        .unwrap_or_else(|| "never".into())
}

fn med(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&samples.iter().map(f).collect::<Vec<_>>())
}

fn render_replication(
    results: &[Size],
    contenders: &[Contender],
    bins: &Bins,
    policies: usize,
    report: &mut Report,
) {
    let sizes = results
        .iter()
        .map(|s| fmt_count(s.objects))
        .collect::<Vec<_>>()
        .join(" and ");
    let created = results
        .iter()
        .map(|s| format!("{} in {:.0} s", fmt_count(s.objects), s.created_s))
        .collect::<Vec<_>>()
        .join(", then up to ");
    let runs = results.first().map_or(0, |s| s.samples[0].1.len());
    let mut md = format!(
        "## 3. Replication into OPA, beside kube-mgmt\n\n\
         {sizes} ConfigMaps (`v1/configmaps`, about 0.5 KB each, in one namespace; created beforehand with {CREATE_CONCURRENCY} creates in flight: {created}) \
         plus the example Clusters and the shipped policy ({policies} modules) in a policy ConfigMap labelled `openpolicyagent.org/policy=rego`. \
         Per run and contender a fresh OPA (the test bed's build, token authentication) and a fresh contender, as the same (admin) identity, \
         with the same flags: `{REPLICATE} {REPLICATE_CLUSTER}`; placement-sync with `--remediation=off` (kube-mgmt has no remediation) and its policy namespace, \
         kube-mgmt with `--namespaces={POLICY_NAMESPACE}` (its `--policy-namespace`), `--opa-url=<opa>/v1`, `--opa-auth-token-file`; other flags at their defaults. \
         The contenders alternate within each of the {runs} run(s); medians.\n\n\
         First sync: from starting the process until OPA holds every ConfigMap of the namespace and every module of the policy (a count query and the policy list, \
         polled every {} ms, the same for both); for placement-sync also until its `/readyz` answers 200. CPU: the process's user + system seconds at that moment. \
         Peak memory: its VmHWM, at the first sync and at the end of the run. Update: a merge patch of one ConfigMap until OPA returns the new value (polled every 1 ms), \
         {UPDATES_PER_RUN} per run.\n\n\
         | objects | contender | first sync | objects/s | `/readyz` 200 | CPU to first sync | peak RSS at sync | peak RSS (VmHWM) | RSS at end | update visible in OPA (median) | max |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        SYNC_POLL.as_millis(),
    );
    for size in results {
        for (contender, samples) in &size.samples {
            let first = med(samples, |s| s.first_sync_s);
            let updates: Vec<f64> = samples.iter().flat_map(|s| s.update_ms.clone()).collect();
            let ready: Vec<f64> = samples.iter().filter_map(|s| s.ready_s).collect();
            md.push_str(&format!(
                "| {} | {} | {first:.2} s | {:.0} | {} | {:.2} s | {:.1} MiB | {:.1} MiB | {:.1} MiB | {} | {} |\n",
                fmt_count(size.objects),
                contender.name(),
                size.objects as f64 / first,
                if ready.is_empty() {
                    "n/a".to_owned()
                } else {
                    format!("{:.2} s", median(&ready))
                },
                med(samples, |s| s.cpu_sync_s),
                med(samples, |s| s.hwm_sync_mib),
                med(samples, |s| s.hwm_mib),
                med(samples, |s| s.rss_mib),
                fmt_ms(median(&updates)),
                fmt_ms(updates.iter().copied().fold(0.0, f64::max)),
            ));
        }
    }
    if contenders.contains(&Contender::KubeMgmt) {
        md.push_str(
            "\nplacement-sync / kube-mgmt (medians; below 1 is better for placement-sync; the targets are 0.5 or less for time and peak memory):\n\n\
             | objects | first sync | peak RSS (VmHWM) | CPU to first sync | update visible in OPA |\n|---:|---:|---:|---:|---:|\n",
        );
        for size in results {
            let (ps, km) = pair(size);
            let ratio = |f: &dyn Fn(&Sample) -> f64| med(ps, f) / med(km, f);
            let upd = |s: &[Sample]| {
                median(
                    &s.iter()
                        .flat_map(|x| x.update_ms.clone())
                        .collect::<Vec<_>>(),
                )
            };
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                fmt_count(size.objects),
                fmt_ratio(ratio(&|s| s.first_sync_s), "x"),
                fmt_ratio(ratio(&|s| s.hwm_mib), "x"),
                fmt_ratio(ratio(&|s| s.cpu_sync_s), "x"),
                fmt_ratio(upd(ps) / upd(km), "x"),
            ));
        }
    }
    md.push_str("\nPer run (first sync; CPU; peak RSS at sync / at end):\n\n");
    for size in results {
        for (contender, samples) in &size.samples {
            md.push_str(&format!(
                "- {} objects, {}: {}\n",
                fmt_count(size.objects),
                contender.name(),
                samples
                    .iter()
                    .map(|s| format!(
                        "{:.2} s; {:.2} s; {:.1} / {:.1} MiB",
                        s.first_sync_s, s.cpu_sync_s, s.hwm_sync_mib, s.hwm_mib
                    ))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
    }
    md.push_str("\nMemory per replicated object (peak RSS / objects; an upper bound, the process's own baseline included): ");
    md.push_str(
        &results
            .iter()
            .flat_map(|size| {
                size.samples.iter().map(move |(c, samples)| {
                    format!(
                        "{} at {}: {:.1} KiB",
                        c.name(),
                        fmt_count(size.objects),
                        med(samples, |s| s.hwm_mib) * 1024.0 / size.objects as f64
                    )
                })
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    md.push_str(".\n");
    if let Err(reason) = &bins.kube_mgmt {
        md.push_str(&format!("\n**kube-mgmt: not measured.** {reason}.\n"));
    }
    report.section(md);

    for size in results {
        let n = fmt_count(size.objects);
        let (ps, km) = pair(size);
        let targets: [Target; 2] = [
            ("first sync", "time", |s: &Sample| s.first_sync_s, "s"),
            ("peak RSS", "peak memory", |s: &Sample| s.hwm_mib, "MiB"),
        ];
        for (what, target, f, unit) in targets {
            let mine = med(ps, f);
            let prec = if unit == "s" { 2 } else { 1 };
            let (figure, status) = match &bins.kube_mgmt {
                Ok(_) if !km.is_empty() => {
                    let theirs = med(km, f);
                    (
                        format!(
                            "{what}: placement-sync {mine:.prec$} {unit}, kube-mgmt {theirs:.prec$} {unit} ({})",
                            fmt_ratio(mine / theirs, "x")
                        ),
                        Status::from_bool(mine <= theirs / 2.0),
                    )
                }
                Ok(_) => ("kube-mgmt was not run".to_owned(), Status::Blocked),
                Err(reason) => (
                    format!("placement-sync {mine:.prec$} {unit}; kube-mgmt skipped: {reason}"),
                    Status::Blocked,
                ),
            };
            report.target(
                format!("Replication at {n} objects: at most half of kube-mgmt's {target}"),
                figure,
                status,
            );
        }
    }
}

/// placement-sync's samples and kube-mgmt's (empty when it was skipped).
fn pair(size: &Size) -> (&[Sample], &[Sample]) {
    let of = |c: Contender| {
        size.samples
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, s)| s.as_slice())
            .unwrap_or(&[])
    };
    (of(Contender::PlacementSync), of(Contender::KubeMgmt))
}

fn render_recovery(results: &[Size], policies: usize, report: &mut Report) {
    let window = RECOVERY_WINDOW.as_secs();
    let mut md = format!(
        "## 5. Recovery after an OPA restart\n\n\
         OPA killed (SIGKILL) and started again, empty, on the same port, while the contender of scenario 3 holds its ConfigMaps, the example Clusters \
         and the shipped policy; one restart per run of scenario 3. Measured from the new OPA accepting connections: until placement-sync notices \
         (`placement_sync_engine_restarts_total` grows; default `--engine-check-interval=2s`) and until its `/readyz` answers 200 (everything reloaded). \
         kube-mgmt has no such check: it never notices a restart, so for both, what OPA serves {window} s after the restart (objects of the namespace; \
         modules of the policy, of {policies}), and then after one ConfigMap update has reached OPA (kube-mgmt writes that one object into the empty OPA \
         and nothing else).\n\n\
         | objects | contender | noticed the restart | in sync (`/readyz` 200) | reload alone (`resync_duration_seconds`) | OPA holds {window} s after: objects | policy modules | after one update: objects |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n"
    );
    let mut targets = Vec::new();
    for size in results {
        for (contender, samples) in &size.samples {
            let recs: Vec<&Recovery> = samples.iter().filter_map(|s| s.recovery.as_ref()).collect();
            let m = |f: &dyn Fn(&Recovery) -> Option<f64>| {
                let v: Vec<f64> = recs.iter().filter_map(|r| f(r)).collect();
                (!v.is_empty()).then(|| median(&v))
            };
            let after: Vec<f64> = recs
                .iter()
                .filter_map(|r| r.objects_after_update.map(|n| n as f64))
                .collect();
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} of {} | {} of {policies} | {} |\n",
                fmt_count(size.objects),
                contender.name(),
                opt_s(m(&|r| r.noticed_s)),
                opt_s(m(&|r| r.ready_s)),
                m(&|r| r.resync_metric_s).map_or("n/a".into(), |s| format!("{s:.2} s")),
                fmt_count(median(
                    &recs
                        .iter()
                        .map(|r| r.objects_at_window as f64)
                        .collect::<Vec<_>>()
                ) as usize),
                fmt_count(size.objects),
                median(
                    &recs
                        .iter()
                        .map(|r| r.policies_at_window as f64)
                        .collect::<Vec<_>>()
                ),
                if after.len() == recs.len() && !after.is_empty() {
                    fmt_count(median(&after) as usize)
                } else {
                    format!(
                        "update not visible in {} of {} runs",
                        recs.len() - after.len(),
                        recs.len()
                    )
                },
            ));
            if *contender == Contender::PlacementSync {
                let ready = m(&|r| r.ready_s).unwrap_or(f64::NAN);
                targets.push((
                    format!(
                        "Recovery: in sync within 5 s at {} objects",
                        fmt_count(size.objects)
                    ),
                    format!(
                        "{ready:.2} s (of which {} to notice)",
                        opt_s(m(&|r| r.noticed_s))
                    ),
                    Status::from_bool(ready < 5.0),
                ));
            }
        }
    }
    md.push_str("\nPer run (placement-sync in sync after the restart): ");
    md.push_str(
        &results
            .iter()
            .filter_map(|size| {
                let (ps, _) = pair(size);
                (!ps.is_empty()).then(|| {
                    format!(
                        "{}: {}",
                        fmt_count(size.objects),
                        ps.iter()
                            .filter_map(|s| s.recovery.as_ref())
                            .map(|r| opt_s(r.ready_s))
                            .collect::<Vec<_>>()
                            .join(" | ")
                    )
                })
            })
            .collect::<Vec<_>>()
            .join(" — "),
    );
    md.push('\n');
    report.section(md);
    for (what, figure, status) in targets {
        report.target(what, figure, status);
    }
}

/// The shipped policy modules, as (file name, source).
pub(crate) fn shipped_modules() -> Result<Vec<(String, String)>> {
    Ok(placement_tests::shipped_policy_modules())
}

/// A policy ConfigMap in the policy namespace with one key per module, labelled
/// as kube-mgmt finds policies (placement-sync loads every ConfigMap there).
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
        "metadata": {
            "name": name,
            "namespace": POLICY_NAMESPACE,
            "labels": {"openpolicyagent.org/policy": "rego"},
        },
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

fn configmap_name(i: usize) -> String {
    format!("cm-{i:05}")
}

/// Create the ConfigMaps `from..to` (about 0.5 KB each as stored),
/// [`CREATE_CONCURRENCY`] in flight; ones left from an earlier attempt are fine.
async fn create_configmaps(api: &Api<ConfigMap>, from: usize, to: usize) -> Result<()> {
    let mut next = from;
    let mut in_flight = tokio::task::JoinSet::new();
    while next < to || !in_flight.is_empty() {
        while next < to && in_flight.len() < CREATE_CONCURRENCY {
            let api = api.clone();
            let name = configmap_name(next);
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
