//! Scenario 8: scheduling through Karmada. A real Karmada federation (the
//! test bed's: control plane and three Push members); N Deployments created
//! through Karmada's API server twice, scheduled once by karmada-scheduler
//! (a native PropagationPolicy with static weights 1:1 over member-eu-2 and
//! member-us-1) and once by placement-policy (a PropagationPolicy with
//! `schedulerName: placement-policy` and the shipped policy, which for PCI
//! level 3 without EU jurisdiction selects the same two members, evenly).
//! Measured for each: the time from the first create until every Work exists
//! (two per Deployment), and the CPU the scheduler used meanwhile
//! (karmada-scheduler; placement-sync and its OPA). Then failover: a NoExecute
//! ClusterTaintPolicy on member-us-1 and its API server killed; the time from
//! the kill until the last binding of each kind is placed on member-eu-2
//! alone. The bed's memory is reported.
//!
//! A third contender is karmada-scheduler with placement-policy's guardrail:
//! the same native PropagationPolicy, the webhook registered with Karmada's
//! API server for the Deployments and their ResourceBindings of its
//! namespaces (narrowing each binding to the members the policy allows, here
//! the same two), placement-sync guarding them. Also measured: the latency a
//! binding write's admission adds (the median of writes the guardrail
//! evaluates, against the same writes where no webhook is registered).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use placement_tests::karmada::{
    Karmada, delivery_configuration, guardrail_match_conditions, guardrail_rules, scheduler_args,
};
use placement_tests::{Identity, OpaServer};
use serde_json::{Value, json};

use crate::common::{
    Bins, Contending, CpuSince, Sidecar, median, metric_sum, poll, start_webhook, vm_kib,
};
use crate::report::{Report, Status};

const PCI_KEY: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";
const POLICY_NAMESPACE: &str = "bench-karmada-policy";
const NATIVE: &str = "bench-native";
const OURS: &str = "bench-placement-policy";
const GUARDED: &str = "bench-guardrail";
/// The label of the namespaces the guardrail's webhook and placement-sync act on.
pub(crate) const GUARD_LABEL: &str = "bench-guardrail";
const DEAD: &str = "member-us-1";
const LEFT: &str = "member-eu-2";
const SCHEDULER_NAME: &str = "placement-policy";

pub(crate) struct Settings {
    pub(crate) deployments: usize,
    pub(crate) replicas: i32,
    /// Runs of both contenders, each in namespaces of its own.
    pub(crate) runs: usize,
}

fn run_namespace(contender: &str, run: usize) -> String {
    format!("{contender}-{run}")
}

pub(crate) fn run(bins: &Bins, dir: &Path, settings: &Settings, report: &mut Report) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let karmada = std::panic::catch_unwind(Karmada::start)
        .map_err(|_| anyhow!("the Karmada test bed did not start (see the output above)"))?;
    let bed_ready = started.elapsed().as_secs_f64();
    let mut contenders = Contenders::start(bins, dir, &karmada, GUARDED)?;
    let (sync, webhook_metrics) = (&contenders.sync, contenders.webhook_metrics);
    let ours_pids = contenders.ours_pids();
    let guarded_pids = contenders.guarded_pids();

    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(karmada.client(Identity::Admin));
    let counted = |sync: &Sidecar| -> Result<[f64; 2]> {
        Ok([
            sync.metric("placement_sync_remediation_queries_total")?,
            sync.metric("placement_sync_remediation_passes_total")?,
        ])
    };
    // Each run creates its Deployments beside those of the runs before it
    // (this bed has no garbage collector to delete them), so the contender
    // second in a run works in a fuller plane: the order alternates.
    let (mut natives, mut ourses, mut guardeds) = (Vec::new(), Vec::new(), Vec::new());
    let (mut queries, mut passes) = (0.0, 0.0);
    let mut remembered = Remembered::default();
    for run in 0..settings.runs {
        let mut order = [NATIVE, OURS, GUARDED];
        order.rotate_left(run % 3);
        for contender in order {
            let namespace = run_namespace(contender, run);
            match contender {
                NATIVE => natives.push(schedule_all(
                    &runtime,
                    &client,
                    &karmada,
                    &namespace,
                    native_policy(),
                    settings,
                    &[contenders.scheduler_pid],
                )?),
                GUARDED => {
                    karmada.create_namespace(&namespace);
                    karmada.kubectl_ok(&[
                        "label",
                        "namespace",
                        &namespace,
                        &format!("{GUARD_LABEL}=true"),
                    ]);
                    let before = Remembered::read(webhook_metrics, sync)?;
                    guardeds.push(schedule_all(
                        &runtime,
                        &client,
                        &karmada,
                        &namespace,
                        native_policy(),
                        settings,
                        &guarded_pids,
                    )?);
                    let during = Remembered::read(webhook_metrics, sync)?.since(&before);
                    eprintln!("{namespace}: {during}");
                    remembered.add(&during);
                }
                _ => {
                    let before = counted(sync)?;
                    ourses.push(schedule_all(
                        &runtime,
                        &client,
                        &karmada,
                        &namespace,
                        handed_policy(),
                        settings,
                        &ours_pids,
                    )?);
                    let after = counted(sync)?;
                    queries += after[0] - before[0];
                    passes += after[1] - before[1];
                }
            }
        }
    }
    let guarded = Contending::median(&guardeds);
    let latency = binding_admission_latency(
        &runtime,
        &client,
        &contenders,
        &run_namespace(GUARDED, 0),
        &run_namespace(NATIVE, 0),
    )?;
    let work_latency = work_admission_latency(
        &runtime,
        &client,
        &contenders,
        &run_namespace(GUARDED, 0),
        &run_namespace(NATIVE, 0),
    )?;
    let runs = settings.runs as f64;
    let (queries, passes) = (queries / runs, passes / runs);
    remembered.scale(1.0 / runs);
    let native = Contending::median(&natives);
    let ours = Contending::median(&ourses);
    let memory = bed_memory(&[std::process::id()]);
    let namespaces = |contender: &str| -> Vec<String> {
        (0..settings.runs)
            .map(|run| run_namespace(contender, run))
            .collect()
    };
    let failover = runtime.block_on(failover(
        &client,
        &karmada,
        settings,
        [namespaces(NATIVE), namespaces(OURS)],
    ))?;
    contenders.sync.check_alive()?;

    let n = settings.deployments;
    let mut section = format!(
        "## 8. Scheduling through Karmada ({n} Deployments of {} replicas)\n\n\
         A real Karmada federation (the test bed's: control plane and three Push members; ready in {bed_ready:.0} s), \
         every Deployment created through Karmada's API server with PCI level 3. karmada-scheduler schedules them by a native \
         PropagationPolicy (static weights 1:1 over {LEFT} and {DEAD}); placement-policy by a PropagationPolicy with \
         `schedulerName: placement-policy` and the shipped policy (which selects the same two members, evenly). \
         Time: from the first create until every Work exists ({} Works). CPU: the scheduler's processes meanwhile \
         (karmada-scheduler; placement-sync and its OPA), from `/proc/<pid>/stat`. Medians of {runs} runs, each contender \
         in namespaces of its own per run; a run's Deployments stay (the bed has no garbage collector), so the order \
         alternates (karmada-scheduler first in even runs). karmada-controller-manager and karmada-scheduler run with \
         `--kube-api-qps={qps} --kube-api-burst={burst}`: at Karmada's default 40 the controller manager's client throttle \
         paces every run at about four Deployments a second whichever scheduler places them (both took about 250 s \
         for 1,000 then); placement-sync's client has no throttle, its writes are paced by `--remediation-rate`, set to the \
         same {qps} a second (its default is 200).\n\n\
         | scheduler | time to every Work | CPU | time ratio | CPU ratio |\n|---|---|---|---|---|\n",
        settings.replicas,
        2 * n,
        runs = settings.runs,
        qps = placement_tests::karmada::COMPONENT_QPS,
        burst = 2 * placement_tests::karmada::COMPONENT_QPS,
    );
    section.push_str(&format!(
        "| karmada-scheduler | {:.2} s | {:.2} s | 1.00 | 1.00 |\n",
        native.seconds, native.cpu
    ));
    let time_ratio = ours.seconds / native.seconds;
    let cpu_ratio = ours.cpu / native.cpu.max(0.001);
    section.push_str(&format!(
        "| placement-policy | {:.2} s | {:.2} s | {time_ratio:.2} | {cpu_ratio:.2} |\n",
        ours.seconds, ours.cpu
    ));
    let guard_time_ratio = guarded.seconds / native.seconds;
    let guard_cpu_ratio = guarded.cpu / native.cpu.max(0.001);
    section.push_str(&format!(
        "| karmada-scheduler with the guardrail | {:.2} s | {:.2} s | {guard_time_ratio:.2} | {guard_cpu_ratio:.2} |\n",
        guarded.seconds, guarded.cpu
    ));
    section.push_str(&format!(
        "\nThe whole machine's CPU over a run (every process of the bed, Karmada's API server calling the webhooks \
         included, and the bench's client): karmada-scheduler {:.2} s, placement-policy {:.2} s, karmada-scheduler with \
         the guardrail {:.2} s (medians).\n",
        native.machine, ours.machine, guarded.machine
    ));
    section.push_str(&format!(
        "\nplacement-policy's CPU: placement-sync {:.2} s, OPA {:.2} s; {queries:.0} decision queries and {passes:.0} \
         reconciler passes for {n} bindings (means over runs). The guardrail's CPU beside karmada-scheduler's {:.2} s: \
         the webhook {:.2} s, placement-sync {:.2} s, OPA {:.2} s (the webhook registered with Karmada's API server for \
         the Deployments and ResourceBindings of the guarded namespaces, and for the last hop (their bindings' writes and \
         their Works validated), remembering decisions while placement-sync announces OPA's writes, as in the chart's \
         pod; placement-sync guarding their bindings). Per guarded run (means): {remembered}.\n\n\
         A binding write's admission through Karmada's API server (a write of a ResourceBinding whose placement the \
         guardrail narrows: the detector's rewrite with the PropagationPolicy's placement): {latency}.\n\n\
         A Work's admission (the last hop: every manifest it changes checked against its member, the Works of the \
         guarded namespaces only; a write of a Work changing its manifest, against a Work of karmada-scheduler's \
         namespaces): {work_latency}.\n",
        ours.parts[0], ours.parts[1],
        guarded.parts[0], guarded.parts[1], guarded.parts[2], guarded.parts[3],
    ));
    section.push_str(&format!(
        "\nFailover: a NoExecute ClusterTaintPolicy on {DEAD} while not Ready, and its API server killed. Karmada marked it \
         not Ready (and tainted it `cluster.karmada.io/not-ready:NoSchedule`, then the policy's NoExecute) {:.1} s after the kill. \
         From the kill until the last of the {} bindings of each scheduler (every run's) is on {LEFT} alone: karmada-scheduler {} \
         (the taint manager evicts, then it re-schedules), placement-policy {} (it re-places on the member's \
         health, its Ready condition and taints, without waiting for an eviction).\n\n\
         Memory of the whole bed at the end (RSS of every process of this run, members and both schedulers included; \
         {} Deployments in the plane): {:.0} MiB.\n",
        failover.taint_after_kill,
        n * settings.runs,
        shown(failover.native),
        shown(failover.ours),
        2 * n * settings.runs,
        memory as f64 / 1024.0,
    ));
    report.section(section);
    report.target(
        format!(
            "Karmada: time until every Work of {n} Deployments exists, at most karmada-scheduler's"
        ),
        format!(
            "{:.2} s vs {:.2} s ({time_ratio:.2}x)",
            ours.seconds, native.seconds
        ),
        Status::from_bool(time_ratio <= 1.0),
    );
    report.target(
        format!(
            "Karmada guardrail: time until every Work of {n} Deployments exists, at most 1.1x karmada-scheduler's alone"
        ),
        format!(
            "{:.2} s vs {:.2} s ({guard_time_ratio:.2}x)",
            guarded.seconds, native.seconds
        ),
        Status::from_bool(guard_time_ratio <= 1.1),
    );
    report.target(
        format!("Karmada: scheduler CPU for {n} Deployments, at most karmada-scheduler's"),
        format!("{:.2} s vs {:.2} s ({cpu_ratio:.2}x)", ours.cpu, native.cpu),
        Status::from_bool(cpu_ratio <= 1.0),
    );
    report.target(
        format!(
            "Karmada failover: taint to the last of {} bindings re-placed, at most karmada's own",
            n * settings.runs
        ),
        format!("{} vs {}", shown(failover.ours), shown(failover.native)),
        Status::from_bool(match (failover.ours, failover.native) {
            (Some(ours), Some(native)) => ours <= native,
            (Some(_), None) => true,
            (None, _) => false,
        }),
    );
    drop(contenders);
    drop(karmada);
    Ok(())
}

/// placement-policy beside a Karmada bed, in every role the scenarios
/// compare: OPA with the shipped policy (in [`POLICY_NAMESPACE`]);
/// placement-sync scheduling the bindings handed to it and guarding those of
/// the namespaces labelled [`GUARD_LABEL`]; the webhook registered with
/// Karmada's API server as the guardrail of those namespaces and the last hop
/// of their Works (those of namespaces named `guarded_prefix...`).
/// Dropped in the order the fields are declared: the webhook, then
/// placement-sync, then OPA.
pub(crate) struct Contenders {
    webhook: crate::common::Server,
    pub(crate) webhook_metrics: SocketAddr,
    pub(crate) sync: Sidecar,
    opa: OpaServer,
    pub(crate) scheduler_pid: u32,
}

impl Contenders {
    pub(crate) fn start(
        bins: &Bins,
        dir: &Path,
        karmada: &Karmada,
        guarded_prefix: &str,
    ) -> Result<Contenders> {
        let scheduler_pid = karmada
            .component_pid("karmada-scheduler")
            .context("karmada-scheduler is not running")?;
        karmada.create_policy_namespace(POLICY_NAMESPACE);
        placement_tests::kubectl::create_shipped_policy_configmap(
            &karmada.karmada_kubeconfig(),
            POLICY_NAMESPACE,
        );
        let opa = OpaServer::start();
        let mut args = scheduler_args(POLICY_NAMESPACE);
        args.extend([
            "--lease-namespace=placement-system".to_owned(),
            "--identity=bench".to_owned(),
            // The guardrail, for the guarded contender's namespaces only.
            "--guard-karmada-bindings".to_owned(),
            // Writes paced as Karmada's components are in the bed.
            format!(
                "--remediation-rate={}",
                placement_tests::karmada::COMPONENT_QPS
            ),
            format!("--scope-namespace-selector={GUARD_LABEL}=true"),
        ]);
        let mut sync = Sidecar::start(
            bins,
            dir,
            karmada.plane(),
            Identity::Admin,
            &opa,
            &args,
            "karmada",
        )?;
        sync.wait_ready(Duration::from_secs(120), Duration::from_millis(100))?;
        let certs = placement_certs::generate_to_dir(
            &dir.join("webhook-certs"),
            &["127.0.0.1".into(), "localhost".into()],
        )?;
        let (webhook, admission, webhook_metrics) = start_webhook(
            bins,
            dir,
            &certs,
            &[
                format!("--opa-url={}", opa.url()),
                format!("--opa-token-file={}", opa.token_file().display()),
                format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
                format!("--policy-namespace={POLICY_NAMESPACE}"),
                // As in the chart's pod: placement-sync, OPA's only writer,
                // announces its writes, so the webhook remembers decisions.
                format!(
                    "--engine-revisions-url=http://127.0.0.1:{}/engine/revisions",
                    sync.port
                ),
            ],
        )?;
        register_guardrail(
            karmada,
            &format!("https://{admission}/mutate"),
            &certs,
            guarded_prefix,
        )?;
        Ok(Contenders {
            webhook,
            webhook_metrics,
            sync,
            opa,
            scheduler_pid,
        })
    }

    /// placement-sync and OPA: the scheduler of handed bindings.
    pub(crate) fn ours_pids(&self) -> Vec<u32> {
        vec![self.sync.pid(), self.opa.pid().unwrap_or(0)]
    }

    /// karmada-scheduler with the guardrail: the webhook, placement-sync, OPA.
    pub(crate) fn guarded_pids(&self) -> Vec<u32> {
        vec![
            self.scheduler_pid,
            self.webhook.pid(),
            self.sync.pid(),
            self.opa.pid().unwrap_or(0),
        ]
    }

    /// The webhook's process id.
    pub(crate) fn webhook_pid(&self) -> u32 {
        self.webhook.pid()
    }
}

/// Register the webhook at `url` with Karmada's API server as the guardrail
/// of the namespaces labelled [`GUARD_LABEL`] (and the last hop of the Works
/// of namespaces named `guarded_prefix...`).
fn register_guardrail(
    karmada: &Karmada,
    url: &str,
    certs: &placement_certs::CertPaths,
    guarded_prefix: &str,
) -> Result<()> {
    let ca = std::fs::read_to_string(&certs.ca)?;
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "bench-guardrail"},
        "webhooks": [{
            "name": "placement.placement-policy.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": url, "caBundle": placement_certs::ca_bundle(&ca)},
            "rules": guardrail_rules(),
            "namespaceSelector": {"matchLabels": {GUARD_LABEL: "true"}},
            // The chart's: without them every status write of a binding is a
            // webhook call (13,000 in two runs of 1,000 Deployments).
            "matchConditions": guardrail_match_conditions(),
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 10,
            "failurePolicy": "Fail",
        }]
    });
    let delivery = delivery_configuration(
        "bench-delivery",
        &url.replace("/mutate", "/validate"),
        &ca,
        json!({"matchLabels": {GUARD_LABEL: "true"}}),
        false,
        Some(guarded_prefix),
    );
    for configuration in [configuration, delivery] {
        let out = karmada.kubectl_stdin(&["apply", "-f", "-"], &configuration.to_string());
        if !out.status.success() {
            bail!(
                "register the guardrail: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// Median latencies of writes, with and without the guardrail, and what
/// the guardrail's webhook and the API server did while they were measured.
pub(crate) struct AdmissionLatency {
    pub(crate) guarded_ms: f64,
    pub(crate) plain_ms: f64,
    pub(crate) samples: usize,
    /// The webhook's mean time to answer an UPDATE review (its own
    /// `admission_duration_seconds`, every UPDATE it answered meanwhile).
    pub(crate) webhook_update_ms: f64,
    /// The API server's calls of admission webhooks for UPDATEs meanwhile,
    /// as it timed them: `(webhook, calls, mean ms)`.
    pub(crate) calls: Vec<(String, f64, f64)>,
    /// How busy the machine's cores were meanwhile (0 to 1).
    pub(crate) machine_busy: f64,
    /// The decision memories and OPA's writes meanwhile.
    pub(crate) remembered: Remembered,
}

impl AdmissionLatency {
    /// The API server's mean time for a call of the webhook `name`.
    pub(crate) fn call(&self, name: &str) -> String {
        self.calls
            .iter()
            .find(|(called, ..)| called == name)
            .map_or_else(
                || "not called".to_owned(),
                |(_, _, mean)| format!("{mean:.2} ms"),
            )
    }
}

impl std::fmt::Display for AdmissionLatency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let calls = self
            .calls
            .iter()
            .map(|(name, calls, mean)| format!("{name} {mean:.2} ms ({calls:.0} calls)"))
            .collect::<Vec<_>>()
            .join(", ");
        write!(
            f,
            "{:.2} ms guarded against {:.2} ms where no webhook is registered: +{:.2} ms (medians of {} writes each, \
             a guarded and an unguarded write in turn, so that both meet the same load; the machine's cores {:.0}% busy \
             meanwhile). The API server timed its webhook calls for UPDATEs meanwhile at: {calls}; the guardrail's \
             webhook answered an UPDATE review in {:.2} ms on average by its own `admission_duration_seconds`, and {}",
            self.guarded_ms,
            self.plain_ms,
            self.guarded_ms - self.plain_ms,
            self.samples,
            self.machine_busy * 100.0,
            self.webhook_update_ms,
            self.remembered,
        )
    }
}

/// The API server's `apiserver_admission_webhook_admission_duration_seconds`
/// of UPDATE calls by webhook name: `name -> (sum seconds, count)`.
async fn webhook_calls(client: &kube::Client) -> Result<BTreeMap<String, (f64, f64)>> {
    const METRIC: &str = "apiserver_admission_webhook_admission_duration_seconds";
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let page = client.request_text(request).await?;
    let names: BTreeSet<&str> = page
        .lines()
        .filter(|l| l.starts_with(METRIC))
        .filter_map(|l| {
            l.split_once("name=\"")?
                .1
                .split_once('"')
                .map(|(name, _)| name)
        })
        .collect();
    Ok(names
        .into_iter()
        .map(|name| {
            let labels = [&*format!("name=\"{name}\""), "operation=\"UPDATE\""];
            let sum = metric_sum(&page, &format!("{METRIC}_sum"), &labels);
            let count = metric_sum(&page, &format!("{METRIC}_count"), &labels);
            (name.to_owned(), (sum, count))
        })
        .collect())
}

/// Writes timed per sample: this object, changed by `edit` (given the
/// sample's number) before each write.
struct Written<E> {
    api: Api<DynamicObject>,
    name: String,
    edit: E,
}

/// Time `SAMPLES` writes of `guarded` and as many of `plain`, in turn, so
/// that both meet the same load; with what the guardrail's webhook did
/// meanwhile.
fn in_turn(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    contenders: &Contenders,
    guarded: Written<impl Fn(usize, &mut DynamicObject)>,
    plain: Written<impl Fn(usize, &mut DynamicObject)>,
) -> Result<AdmissionLatency> {
    const SAMPLES: usize = 200;
    let webhook_before = webhook_updates(contenders.webhook_metrics)?;
    let before = Remembered::read(contenders.webhook_metrics, &contenders.sync)?;
    let calls_before = runtime.block_on(webhook_calls(client))?;
    let (machine, started) = (CpuSince::start(&[])?, Instant::now());
    let (mut guarded_times, mut plain_times) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        for sample in 0..SAMPLES {
            let edit = |o: &mut DynamicObject| (guarded.edit)(sample, o);
            guarded_times.push(time_write(&guarded.api, &guarded.name, edit).await?);
            let edit = |o: &mut DynamicObject| (plain.edit)(sample, o);
            plain_times.push(time_write(&plain.api, &plain.name, edit).await?);
        }
        anyhow::Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let machine_busy = machine.contending(seconds)?.machine / seconds / cores;
    let calls_after = runtime.block_on(webhook_calls(client))?;
    let remembered = Remembered::read(contenders.webhook_metrics, &contenders.sync)?.since(&before);
    let webhook_after = webhook_updates(contenders.webhook_metrics)?;
    let answered = webhook_after.1 - webhook_before.1;
    let calls = calls_after
        .into_iter()
        .filter_map(|(name, (sum, count))| {
            let (sum_before, count_before) = calls_before.get(&name).copied().unwrap_or_default();
            let calls = count - count_before;
            (calls > 0.0).then(|| (name, calls, (sum - sum_before) / calls * 1000.0))
        })
        .collect();
    Ok(AdmissionLatency {
        guarded_ms: median(&guarded_times),
        plain_ms: median(&plain_times),
        samples: SAMPLES,
        webhook_update_ms: if answered > 0.0 {
            (webhook_after.0 - webhook_before.0) / answered * 1000.0
        } else {
            f64::NAN
        },
        calls,
        machine_busy,
        remembered,
    })
}

/// Binding writes timed: one binding of `guarded` with its placement as the
/// detector writes it, without the names the guardrail narrows it to
/// (evaluated, and stored as it was), and one binding of `plain` written as
/// it is (no webhook there).
pub(crate) fn binding_admission_latency(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    contenders: &Contenders,
    guarded: &str,
    plain: &str,
) -> Result<AdmissionLatency> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "work.karmada.io",
        "v1alpha2",
        "ResourceBinding",
    ));
    let first = |namespace: &str| -> Result<(Api<DynamicObject>, String)> {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let name = runtime
            .block_on(api.list(&ListParams::default().limit(1)))?
            .items
            .first()
            .and_then(|b| b.metadata.name.clone())
            .with_context(|| format!("no binding in {namespace}"))?;
        Ok((api, name))
    };
    let (api, name) = first(guarded)?;
    let widened = |_: usize, binding: &mut DynamicObject| {
        if let Some(placement) = binding
            .data
            .pointer_mut("/spec/placement")
            .and_then(Value::as_object_mut)
        {
            placement.remove("clusterAffinity");
        }
    };
    let guarded = Written {
        api,
        name,
        edit: widened,
    };
    let (api, name) = first(plain)?;
    let plain = Written {
        api,
        name,
        edit: |_: usize, _: &mut DynamicObject| {},
    };
    in_turn(runtime, client, contenders, guarded, plain)
}

/// The webhook's `admission_duration_seconds` of UPDATE reviews: its sum
/// (seconds) and count.
fn webhook_updates(webhook_metrics: SocketAddr) -> Result<(f64, f64)> {
    const METRIC: &str = "placement_webhook_admission_duration_seconds";
    let page = crate::admission::metrics_page(webhook_metrics)?;
    let read = |part: &str| {
        metric_sum(
            &page,
            &format!("{METRIC}_{part}"),
            &["operation=\"UPDATE\""],
        )
    };
    Ok((read("sum"), read("count")))
}

/// Work writes timed: one Work of a binding of `guarded` (its Deployment's
/// manifest annotated anew each time: a changed manifest, checked against
/// the Work's member) and one Work of `plain`'s, changed alike.
fn work_admission_latency(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    contenders: &Contenders,
    guarded: &str,
    plain: &str,
) -> Result<AdmissionLatency> {
    const OF: &str = "resourcebinding.karmada.io/namespace";
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "work.karmada.io",
        "v1alpha1",
        "Work",
    ));
    let works: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let all = runtime.block_on(works.list(&ListParams::default()))?.items;
    let annotated = |sample: usize, work: &mut DynamicObject| {
        if let Some(metadata) = work
            .data
            .pointer_mut("/spec/workload/manifests/0/metadata")
            .and_then(Value::as_object_mut)
        {
            let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
            annotations["bench.placement-policy.io/sample"] = json!(sample.to_string());
        }
    };
    let work_of = |namespace: &str| -> Result<Written<_>> {
        let work = all
            .iter()
            .find(|w| {
                w.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(OF))
                    .is_some_and(|ns| ns == namespace)
            })
            .with_context(|| format!("no Work of a binding of {namespace}"))?;
        Ok(Written {
            api: Api::namespaced_with(
                client.clone(),
                work.metadata.namespace.as_deref().unwrap_or_default(),
                &resource,
            ),
            name: work.metadata.name.clone().unwrap_or_default(),
            edit: annotated,
        })
    };
    in_turn(
        runtime,
        client,
        contenders,
        work_of(guarded)?,
        work_of(plain)?,
    )
}

/// Milliseconds of one write of `name` as `edit` changes it. Karmada's
/// controllers write bindings and Works too, so a write may meet a newer
/// version (409): it is read again and retried, and only the write that
/// lands is timed.
async fn time_write(
    api: &Api<DynamicObject>,
    name: &str,
    edit: impl Fn(&mut DynamicObject),
) -> Result<f64> {
    const RETRIES: usize = 10;
    let mut retries = 0;
    loop {
        let mut object = api.get(name).await?;
        edit(&mut object);
        let started = Instant::now();
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(_) => return Ok(started.elapsed().as_secs_f64() * 1000.0),
            Err(kube::Error::Api(e)) if e.code == 409 && retries < RETRIES => retries += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Scenario 8 without Karmada: said in the report, never counted as met.
pub(crate) fn skipped(reason: &str, report: &mut Report) {
    report.section(format!(
        "## 8. Scheduling through Karmada\n\nNot run: {reason}\n"
    ));
    report.target(
        "Karmada: scheduling and failover beside karmada-scheduler",
        format!("not run: {reason}"),
        Status::Blocked,
    );
}

fn selector(namespace: &str) -> Value {
    json!([{"apiVersion": "apps/v1", "kind": "Deployment", "labelSelector": {"matchLabels": {"bench": namespace}}}])
}

fn native_policy() -> impl Fn(&str) -> Value {
    |namespace: &str| {
        json!({
            "apiVersion": "policy.karmada.io/v1alpha1",
            "kind": "PropagationPolicy",
            "metadata": {"name": "bench", "namespace": namespace},
            "spec": {
                "resourceSelectors": selector(namespace),
                "placement": {
                    "clusterAffinity": {"clusterNames": [LEFT, DEAD]},
                    "replicaScheduling": {
                        "replicaSchedulingType": "Divided",
                        "replicaDivisionPreference": "Weighted",
                        "weightPreference": {"staticWeightList": [
                            {"targetCluster": {"clusterNames": [LEFT]}, "weight": 1},
                            {"targetCluster": {"clusterNames": [DEAD]}, "weight": 1}
                        ]}
                    }
                }
            }
        })
    }
}

fn handed_policy() -> impl Fn(&str) -> Value {
    |namespace: &str| {
        json!({
            "apiVersion": "policy.karmada.io/v1alpha1",
            "kind": "PropagationPolicy",
            "metadata": {"name": "bench", "namespace": namespace},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "resourceSelectors": selector(namespace),
                "placement": {
                    "replicaScheduling": {
                        "replicaSchedulingType": "Divided",
                        "replicaDivisionPreference": "Weighted"
                    }
                }
            }
        })
    }
}

fn deployment(namespace: &str, name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": namespace},
                     "annotations": {PCI_KEY: "3"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": placement_tests::karmada::WORKLOAD_IMAGE}]}
            }
        }
    }))
    .expect("a Deployment")
}

/// Create the policy and every Deployment in `namespace`, and wait until
/// every Work of them exists.
fn schedule_all(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    karmada: &Karmada,
    namespace: &str,
    policy: impl Fn(&str) -> Value,
    settings: &Settings,
    pids: &[u32],
) -> Result<Contending> {
    karmada.create_namespace(namespace);
    let out = karmada.kubectl_stdin(&["create", "-f", "-"], &policy(namespace).to_string());
    if !out.status.success() {
        bail!(
            "create the PropagationPolicy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let expected = 2 * settings.deployments;
    let works = WorkCount::start(runtime, client, namespace);
    let cpu = CpuSince::start(pids)?;
    let started = Instant::now();
    runtime.block_on(async {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let creates = futures::stream::iter(0..settings.deployments).map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &deployment(namespace, &format!("d{i:05}"), settings.replicas),
                )
                .await
            }
        });
        let results: Vec<_> = creates.buffer_unordered(16).collect().await;
        results.into_iter().collect::<Result<Vec<_>, _>>()
    })?;
    poll(
        &format!("{expected} Works of {namespace}"),
        Duration::from_secs(900),
        Duration::from_millis(100),
        || {
            karmada.check_components();
            Ok((works.count() >= expected).then_some(()))
        },
    )?;
    let run = cpu.contending(started.elapsed().as_secs_f64())?;
    eprintln!(
        "{namespace}: {expected} Works after {:.2} s, CPU {:.2} s ({:.2?}), the machine's {:.2} s",
        run.seconds, run.cpu, run.parts, run.machine
    );
    Ok(run)
}

/// What the guardrail's webhook and placement-sync remembered during a
/// guarded run, and what made them forget: their decision memories' hits and
/// misses, and placement-sync's writes to OPA (each one a new revision, which
/// empties both memories).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Remembered {
    hits: f64,
    misses: f64,
    sync_hits: f64,
    sync_misses: f64,
    engine_writes: f64,
}

impl Remembered {
    fn read(webhook_metrics: SocketAddr, sync: &Sidecar) -> Result<Self> {
        let (hits, misses) = crate::admission::cache_counters(webhook_metrics)?;
        let page = sync.metrics()?;
        Ok(Remembered {
            hits: hits as f64,
            misses: misses as f64,
            sync_hits: metric_sum(&page, "placement_sync_decision_cache_hits_total", &[]),
            sync_misses: metric_sum(&page, "placement_sync_decision_cache_misses_total", &[]),
            engine_writes: metric_sum(&page, "placement_sync_engine_writes_total", &[]),
        })
    }

    fn figures(&self) -> [f64; 5] {
        [
            self.hits,
            self.misses,
            self.sync_hits,
            self.sync_misses,
            self.engine_writes,
        ]
    }

    fn of(figures: [f64; 5]) -> Self {
        let [hits, misses, sync_hits, sync_misses, engine_writes] = figures;
        Remembered {
            hits,
            misses,
            sync_hits,
            sync_misses,
            engine_writes,
        }
    }

    fn since(&self, before: &Self) -> Self {
        let (now, then) = (self.figures(), before.figures());
        Remembered::of(std::array::from_fn(|i| now[i] - then[i]))
    }

    fn add(&mut self, other: &Self) {
        let (mine, theirs) = (self.figures(), other.figures());
        *self = Remembered::of(std::array::from_fn(|i| mine[i] + theirs[i]));
    }

    fn scale(&mut self, by: f64) {
        *self = Remembered::of(self.figures().map(|figure| figure * by));
    }
}

impl std::fmt::Display for Remembered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the webhook's decision memory answered {:.0} decisions and evaluated {:.0}; placement-sync's answered {:.0} and asked OPA {:.0}; placement-sync wrote OPA {:.0} times",
            self.hits, self.misses, self.sync_hits, self.sync_misses, self.engine_writes
        )
    }
}

/// The Works Karmada made of the Deployments of one namespace, counted by a
/// watch (a poll listing thousands of Works would load the API server that
/// both contenders share).
struct WorkCount {
    seen: Arc<Mutex<BTreeSet<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WorkCount {
    fn start(
        runtime: &tokio::runtime::Runtime,
        client: &kube::Client,
        namespace: &str,
    ) -> WorkCount {
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "work.karmada.io",
            "v1alpha1",
            "Work",
        ));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let namespace = namespace.to_owned();
        let task = {
            let seen = seen.clone();
            runtime.spawn(async move {
                let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { continue };
                    let (watcher::Event::Apply(work) | watcher::Event::InitApply(work)) = event
                    else {
                        continue;
                    };
                    let manifests = work
                        .data
                        .pointer("/spec/workload/manifests")
                        .and_then(Value::as_array);
                    let ours = manifests.into_iter().flatten().any(|m| {
                        m.pointer("/metadata/namespace").and_then(Value::as_str)
                            == Some(namespace.as_str())
                    });
                    if ours {
                        seen.lock().unwrap_or_else(|e| e.into_inner()).insert((
                            work.metadata.namespace.clone().unwrap_or_default(),
                            work.metadata.name.clone().unwrap_or_default(),
                        ));
                    }
                }
            })
        };
        WorkCount { seen, task }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for WorkCount {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long failover waits for both schedulers.
const FAILOVER_LIMIT: Duration = Duration::from_secs(600);

/// Seconds after the member's API server was killed; `None`: not within
/// [`FAILOVER_LIMIT`] (a result, not a failed run).
struct Failover {
    taint_after_kill: f64,
    native: Option<f64>,
    ours: Option<f64>,
}

/// A failover time, or that it did not end within the limit.
fn shown(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) => format!("{s:.2} s"),
        None => format!("not within {} s", FAILOVER_LIMIT.as_secs()),
    }
}

/// Which bindings are on [`LEFT`] alone with their replicas, followed by a
/// reflector of every ResourceBinding: a poll listing thousands of bindings
/// four times a second loaded the API server the failover it measures runs
/// through.
struct LeftAlone {
    bindings: Store<DynamicObject>,
    replicas: i64,
    task: tokio::task::JoinHandle<()>,
}

impl LeftAlone {
    fn start(client: &kube::Client, replicas: i64) -> LeftAlone {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "work.karmada.io",
            "v1alpha2",
            "ResourceBinding",
        ));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let writer = reflector::store::Writer::new(resource);
        let bindings = writer.as_reader();
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let task = tokio::spawn(reflector(writer, stream).for_each(|_| async {}));
        LeftAlone {
            bindings,
            replicas,
            task,
        }
    }

    /// Wait until the watch's first list is in (it is no load on the
    /// failover then).
    async fn listed(&self) -> Result<()> {
        tokio::time::timeout(Duration::from_secs(60), self.bindings.wait_until_ready())
            .await
            .map_err(|_| anyhow!("the ResourceBindings were not listed within 60 s"))?
            .map_err(|e| anyhow!("the ResourceBindings' watch: {e}"))
    }

    /// Whether the `deployments` bindings of each of `namespaces` are on
    /// [`LEFT`] alone.
    fn all(&self, namespaces: &[String], deployments: usize) -> bool {
        let bindings = self.bindings.state();
        namespaces.iter().all(|namespace| {
            let placed = bindings
                .iter()
                .filter(|b| b.metadata.namespace.as_ref() == Some(namespace))
                .filter(|b| left_alone(b, self.replicas))
                .count();
            placed == deployments
        })
    }
}

impl Drop for LeftAlone {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether `binding` is on [`LEFT`] alone with its `replicas`.
fn left_alone(binding: &DynamicObject, replicas: i64) -> bool {
    let clusters: BTreeMap<&str, i64> = binding
        .data
        .pointer("/spec/clusters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c.get("name")?.as_str()?, c.get("replicas")?.as_i64()?)))
        .collect();
    clusters == BTreeMap::from([(LEFT, replicas)])
}

/// The taint the failover's ClusterTaintPolicy puts on a member not Ready.
const FAILOVER_TAINT: &str = "bench/not-ready";

/// ClusterTaintPolicy `name`, created through Karmada's API server:
/// `member` tainted [`FAILOVER_TAINT`] NoExecute while it is not Ready (so
/// Karmada evicts what runs there), untainted once Ready again.
pub(crate) fn create_failover_taint_policy(
    karmada: &Karmada,
    name: &str,
    member: &str,
) -> Result<()> {
    let policy = json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "ClusterTaintPolicy",
        "metadata": {"name": name},
        "spec": {
            "targetClusters": {"clusterNames": [member]},
            "addOnConditions": [{"conditionType": "Ready", "operator": "NotIn", "statusValues": ["True"]}],
            "removeOnConditions": [{"conditionType": "Ready", "operator": "In", "statusValues": ["True"]}],
            "taints": [{"key": FAILOVER_TAINT, "effect": "NoExecute"}]
        }
    });
    let out = karmada.kubectl_stdin(&["create", "-f", "-"], &policy.to_string());
    if !out.status.success() {
        bail!(
            "create the ClusterTaintPolicy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Whether Karmada has tainted `member` with [`FAILOVER_TAINT`] NoExecute.
pub(crate) fn failover_tainted(karmada: &Karmada, member: &str) -> Result<bool> {
    let cluster: Value = serde_json::from_str(&karmada.kubectl_ok(&[
        "get",
        "clusters.cluster.karmada.io",
        member,
        "-o",
        "json",
    ]))?;
    Ok(cluster
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| t["key"] == FAILOVER_TAINT && t["effect"] == "NoExecute"))
}

/// `namespaces`: those of karmada-scheduler's and of placement-policy's
/// Deployments.
async fn failover(
    client: &kube::Client,
    karmada: &Karmada,
    settings: &Settings,
    [native_namespaces, ours_namespaces]: [Vec<String>; 2],
) -> Result<Failover> {
    create_failover_taint_policy(karmada, "bench-failover", DEAD)?;
    let left = LeftAlone::start(client, i64::from(settings.replicas));
    left.listed().await?;
    let member = karmada.member(DEAD);
    let killed = Instant::now();
    member.stop_apiserver();
    let result = async {
        let tainted = loop {
            if failover_tainted(karmada, DEAD)? {
                break Instant::now();
            }
            if killed.elapsed() > Duration::from_secs(180) {
                bail!("{DEAD} was not tainted within 180 s of its API server's death");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let (mut native, mut ours) = (None, None);
        while native.is_none() || ours.is_none() {
            if killed.elapsed() > FAILOVER_LIMIT {
                break;
            }
            if native.is_none() && left.all(&native_namespaces, settings.deployments) {
                native = Some(killed.elapsed().as_secs_f64());
            }
            if ours.is_none() && left.all(&ours_namespaces, settings.deployments) {
                ours = Some(killed.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(Failover {
            taint_after_kill: (tainted - killed).as_secs_f64(),
            native,
            ours,
        })
    }
    .await;
    member.start_apiserver();
    karmada.kubectl(&["delete", "clustertaintpolicy", "bench-failover"]);
    result
}

/// The RSS (KiB) of every process below `roots`.
fn bed_memory(roots: &[u32]) -> u64 {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The parent is the second field after the command's closing parenthesis.
        let Some(parent) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        children.entry(parent).or_default().push(pid);
    }
    let mut total = 0;
    let mut stack: Vec<u32> = roots.to_vec();
    while let Some(pid) = stack.pop() {
        total += vm_kib(pid, "VmRSS").unwrap_or(0);
        stack.extend(children.get(&pid).into_iter().flatten());
    }
    total
}
