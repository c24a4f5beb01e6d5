//! Scenario 2: ReplicaSet creates through a real kube-apiserver (kube-rs client,
//! 8 in flight), without a webhook and with placement-webhook registered
//! (embedded engine; OPA on loopback), as a `MutatingWebhookConfiguration` with
//! the webhook's CA as `caBundle`. Reports the latency each adds per create.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, PostParams};
use placement_tests::{ControlPlane, Identity, POLICY_NAMESPACE};

use crate::common::{
    Bins, Sidecar, median, percentile, post_review, start_noop, start_opa, start_webhook,
};
use crate::report::{Report, Status, fmt_ms};
use crate::review::{PREFS, replicaset};

const IN_FLIGHT: usize = 8;
const WARMUP: usize = 50;

struct Contender {
    key: &'static str,
    label: &'static str,
    /// Webhook URL and CA; `None`: no webhook registered.
    webhook: Option<(String, String)>,
    /// The no-op webhook's review counter (it does not patch, so this is how to
    /// tell that the API server calls it).
    counter: Option<u16>,
}

pub(crate) fn run(
    bins: &Bins,
    dir: &Path,
    creates: usize,
    runs: usize,
    report: &mut Report,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let root = placement_tests::repo_root();
    eprintln!("scenario 2: starting etcd and kube-apiserver");
    let plane = ControlPlane::start();
    let certs = placement_certs::generate_to_dir(
        &dir.join("certs"),
        &["127.0.0.1".into(), "localhost".into()],
    )?;
    let ca_pem = std::fs::read_to_string(&certs.ca)?;
    let (_noop, noop_addr, noop_stats) = start_noop(bins, dir, &certs, &[])?;
    let webhook_kubeconfig = format!(
        "--kubeconfig={}",
        plane.kubeconfig(Identity::Webhook).display()
    );
    let (_embedded, embedded_addr, _) = start_webhook(
        bins,
        dir,
        &certs,
        &[
            format!("--policy-dir={}", root.join("policies").display()),
            webhook_kubeconfig.clone(),
        ],
    )?;
    // The patch placement-webhook answers for the benchmark ReplicaSet, for a
    // no-op webhook that answers every create with it.
    let patch_file = dir.join("placement-patch.json");
    std::fs::write(
        &patch_file,
        placement_patch(&format!("https://{embedded_addr}/mutate"), &ca_pem)?,
    )?;
    let (_patching, patching_addr, patching_stats) = start_noop(
        bins,
        dir,
        &certs,
        &[format!("--patch-file={}", patch_file.display())],
    )?;
    let tree = crate::admission::policy_tree(
        &dir.join("opa-policy"),
        &root,
        crate::admission::Tree::Shipped,
    )?;
    let (_opa, opa_port) = start_opa(bins, dir, "policy", &[tree.display().to_string()])?;
    // OPA's writer beside it, as in the chart's pod (see scenario 1).
    let mut writer = Sidecar::start_for(
        bins,
        dir,
        &plane,
        Identity::Sidecar,
        &[format!("--opa-url=http://127.0.0.1:{opa_port}")],
        &["--remediation=off".to_owned()],
        "opa-writer",
    )?;
    writer.wait_ready(Duration::from_secs(60), Duration::from_millis(200))?;
    let (_with_opa, with_opa_addr, with_opa_metrics) = start_webhook(
        bins,
        dir,
        &certs,
        &[
            format!("--opa-url=http://127.0.0.1:{opa_port}"),
            format!(
                "--engine-revisions-url=http://127.0.0.1:{}/engine/revisions",
                writer.port
            ),
            webhook_kubeconfig,
            format!("--policy-namespace={POLICY_NAMESPACE}"),
        ],
    )?;
    crate::admission::wait_remembering(with_opa_metrics)?;
    let contenders = [
        Contender {
            key: "none",
            label: "no webhook",
            webhook: None,
            counter: None,
        },
        Contender {
            key: "ceiling",
            label: "no-op webhook (the ceiling of scenario 1)",
            webhook: Some((format!("https://{noop_addr}/mutate"), ca_pem.clone())),
            counter: Some(noop_stats.port()),
        },
        Contender {
            key: "patching",
            label: "no-op webhook answering placement-webhook's patch",
            webhook: Some((format!("https://{patching_addr}/mutate"), ca_pem.clone())),
            counter: Some(patching_stats.port()),
        },
        Contender {
            key: "embedded",
            label: "placement-webhook, embedded engine",
            webhook: Some((format!("https://{embedded_addr}/mutate"), ca_pem.clone())),
            counter: None,
        },
        Contender {
            key: "with-opa",
            label: "placement-webhook + OPA",
            webhook: Some((format!("https://{with_opa_addr}/mutate"), ca_pem.clone())),
            counter: None,
        },
    ];

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = rt.block_on(plane.client(Identity::Admin));
    // Per contender: per run (median, p99) in ms.
    let mut stats: BTreeMap<&str, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for run in 1..=runs {
        for c in &contenders {
            let ns = format!("bench-{}-{run}", c.key);
            match &c.webhook {
                None => {
                    plane.kubectl_stdin(
                        &["apply", "-f", "-"],
                        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"),
                    );
                }
                Some((url, ca)) => {
                    plane.create_namespace(&ns);
                    plane.register_webhook(&ns, url, ca, POLICY_NAMESPACE);
                }
            }
            let api: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
            if c.webhook.is_some() {
                rt.block_on(wait_until_called(&api, &ns, c.counter))?;
            }
            rt.block_on(create_many(&api, &ns, "warmup", WARMUP))?;
            let t = Instant::now();
            let latencies = rt.block_on(create_many(&api, &ns, "rs", creates))?;
            let wall = t.elapsed().as_secs_f64();
            let (p50, p99) = (median(&latencies), percentile(&latencies, 99.0));
            eprintln!(
                "scenario 2 run {run} {:<9} {creates} creates in {wall:.1} s: median {} p99 {}",
                c.key,
                fmt_ms(p50),
                fmt_ms(p99)
            );
            if c.webhook.is_some() {
                // Placed by the webhook?
                let rs = rt.block_on(api.get("rs-00000"))?;
                let placed = rs
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(PREFS));
                if !placed && c.counter.is_none() {
                    bail!(
                        "{}: the created ReplicaSet was not placed by the webhook",
                        c.label
                    );
                }
                plane.kubectl(&[
                    "delete",
                    "mutatingwebhookconfiguration",
                    &ns,
                    "--wait=false",
                ]);
            }
            stats
                .entry(c.key)
                .or_default()
                .push((p50, p99, creates as f64 / wall));
        }
    }

    let med = |key: &str, i: usize| -> f64 {
        median(
            &stats[key]
                .iter()
                .map(|s| [s.0, s.1, s.2][i])
                .collect::<Vec<_>>(),
        )
    };
    let mut md = format!(
        "## 2. Creates through kube-apiserver\n\n{creates} ReplicaSet creates per contender and run (the EU/PCI ReplicaSet, kube-rs client as the admin, {IN_FLIGHT} in flight, after {WARMUP} warm-up creates), {runs} runs, medians of the per-run median and p99. \
         The webhook is registered with a `MutatingWebhookConfiguration` (URL, `caBundle`, `failurePolicy: Fail`) selecting only that run's namespace.\n\n\
         | contender | median per create | p99 per create | creates/s | added median | added p99 |\n|---|---:|---:|---:|---:|---:|\n"
    );
    for c in &contenders {
        md.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} |\n",
            c.label,
            fmt_ms(med(c.key, 0)),
            fmt_ms(med(c.key, 1)),
            med(c.key, 2),
            if c.webhook.is_some() {
                format!("{:+.2} ms", med(c.key, 0) - med("none", 0))
            } else {
                "".into()
            },
            if c.webhook.is_some() {
                format!("{:+.2} ms", med(c.key, 1) - med("none", 1))
            } else {
                "".into()
            },
        ));
    }
    md.push_str("\nPer run (median; p99):\n\n");
    for c in &contenders {
        let runs: Vec<String> = stats[c.key]
            .iter()
            .map(|s| format!("{}; {}", fmt_ms(s.0), fmt_ms(s.1)))
            .collect();
        md.push_str(&format!("- {}: {}\n", c.key, runs.join(" | ")));
    }
    report.section(md);
    report.note(format!(
        "Scenario 2: the rows split what a placing webhook adds to a create. The no-op webhook ({:+.2} ms over no webhook) is what any TLS \
         webhook costs through the API server on this machine (it encodes the object, calls out over TLS, decodes the answer). The no-op webhook \
         answering placement-webhook's own patch adds {:+.2} ms more: that is the API server applying a mutation (the JSON patch, decoding the \
         object again, managed fields), before any policy is evaluated. placement-webhook's own share is what is left: {:+.2} ms embedded and \
         {:+.2} ms with OPA over the patching no-op webhook (both remember decisions; with OPA while following placement-sync, OPA's writer). With 8 creates in flight the API server, etcd, the webhook (and OPA) and the client \
         share 2 cores, so every extra millisecond of CPU per create shows up several times over in the latency.",
        med("ceiling", 0) - med("none", 0),
        med("patching", 0) - med("ceiling", 0),
        med("embedded", 0) - med("patching", 0),
        med("with-opa", 0) - med("patching", 0),
    ));
    for key in ["with-opa", "embedded"] {
        let added = med(key, 0) - med("none", 0);
        report.target(
            format!(
                "Through kube-apiserver: the webhook ({}) adds under 5 ms to the median create",
                if key == "with-opa" {
                    "with OPA"
                } else {
                    "embedded"
                }
            ),
            format!(
                "{added:+.2} ms (median {} vs {})",
                fmt_ms(med(key, 0)),
                fmt_ms(med("none", 0))
            ),
            Status::from_bool(added < 5.0),
        );
    }
    let added = med("embedded", 0) - med("patching", 0);
    report.target(
        "Through kube-apiserver: the embedded webhook adds at most 1 ms to the median create over the patching no-op webhook",
        format!(
            "{added:+.2} ms (median {} vs {})",
            fmt_ms(med("embedded", 0)),
            fmt_ms(med("patching", 0))
        ),
        Status::from_bool(added <= 1.0),
    );
    Ok(())
}

/// The JSON patch (text) the webhook at `url` answers for the benchmark review.
fn placement_patch(url: &str, ca_pem: &str) -> Result<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes())?)
        .build()?;
    let body = serde_json::to_vec(&crate::review::admission_review()?)?;
    let (review, patch) = rt.block_on(post_review(&client, url, body))?;
    patch.with_context(|| format!("placement-webhook answered no patch: {review}"))
}

/// The API server picks up a new webhook configuration asynchronously: dry-run
/// creates until one comes back placed.
async fn wait_until_called(api: &Api<ReplicaSet>, ns: &str, counter: Option<u16>) -> Result<()> {
    let probe: ReplicaSet = serde_json::from_value(replicaset("probe", ns)?)?;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let count = |port: u16| -> Result<u64> {
        let (_, body) = crate::common::http_get(port, "/count", None)?;
        Ok(body.trim().parse()?)
    };
    loop {
        let before = counter.map(count).transpose()?;
        let called = match (api.create(&dry, &probe).await, before, counter) {
            (Ok(_), Some(before), Some(port)) => count(port)? > before,
            (Ok(rs), None, _) => rs
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(PREFS)),
            _ => false,
        };
        if called {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the API server did not call the webhook for namespace {ns} within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Create `count` ReplicaSets named `{prefix}-NNNNN`, [`IN_FLIGHT`] at a time;
/// returns each create's latency in ms.
async fn create_many(
    api: &Api<ReplicaSet>,
    ns: &str,
    prefix: &str,
    count: usize,
) -> Result<Vec<f64>> {
    let template: Arc<serde_json::Value> = Arc::new(replicaset("x", ns)?);
    let mut latencies = Vec::with_capacity(count);
    let mut next = 0usize;
    let mut in_flight = tokio::task::JoinSet::new();
    while next < count || !in_flight.is_empty() {
        while next < count && in_flight.len() < IN_FLIGHT {
            let api = api.clone();
            let mut object = (*template).clone();
            let name = format!("{prefix}-{next:05}");
            object["metadata"]["name"] = serde_json::json!(name);
            object["metadata"]["labels"]["app"] = serde_json::json!(name);
            object["spec"]["selector"]["matchLabels"]["app"] = serde_json::json!(name);
            object["spec"]["template"]["metadata"]["labels"]["app"] = serde_json::json!(name);
            let rs: ReplicaSet = serde_json::from_value(object)?;
            in_flight.spawn(async move {
                let t = Instant::now();
                api.create(&PostParams::default(), &rs)
                    .await
                    .with_context(|| format!("create ReplicaSet {name}"))?;
                Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
            });
            next += 1;
        }
        if let Some(done) = in_flight.join_next().await {
            latencies.push(done??);
        }
    }
    Ok(latencies)
}
