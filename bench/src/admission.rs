//! Scenario 1: AdmissionReviews over TLS, four contenders side by side.
//!
//! (a) the ceiling: `noop-webhook` (same stack, no policy);
//! (b) placement-webhook with the embedded engine (`--policy-dir policies`);
//! (c) placement-webhook asking OPA on loopback (plain HTTP, policy + clusters loaded);
//! (d) OPA answering the AdmissionReview itself (TLS server, `system.main`).
//!
//! Two input sets: one repeated object (the example ReplicaSet), and a varied
//! stream of distinct ReplicaSets and Deployments (oha sends a random line of
//! the file per request), where only what a placement policy reads repeats.
//! On the varied stream also the decisions no memory answers: (b1) the
//! embedded webhook with `--decision-cache-memory 0`, and (b2) embedded and
//! (c2) with OPA under the shipped policy plus a rule that reads the app label
//! (`bench/rego/app_label.rego`), which differs between all its workloads.
//!
//! Every contender runs at once (idle while another is measured); runs are
//! interleaved (run 1 of every contender, then run 2, ...) so a noisy neighbour
//! hits all alike. CPU is the servers' utime + stime from /proc (for (c) the
//! webhook's and OPA's), before and after each load run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::common::{
    Bins, Server, Sidecar, cpu_seconds, median, post_review, start_noop, start_opa, start_webhook,
};
use crate::load::{Body, LoadStats, oha};
use crate::report::{Report, Status, fmt_ms, fmt_ratio};
use crate::review::{admission_review, varied_reviews};

/// Reviews in the varied input set.
const VARIED_REVIEWS: usize = 2_000;

/// The decision memory of (b2) and (c2): a workload is created once, so under
/// a policy that reads what differs between workloads a webhook meets each one
/// new; the load generator repeats the 2,000 reviews, which the default 16 MiB
/// would all remember, so the memory holds only some 70 decisions.
const SMALL_MEMORY: &str = "--decision-cache-memory=32Ki";

/// A stream of reviews the contenders are measured on.
struct InputSet {
    key: &'static str,
    label: String,
    path: PathBuf,
    lines: bool,
}

impl InputSet {
    fn body(&self) -> Body<'_> {
        if self.lines {
            Body::Lines(&self.path)
        } else {
            Body::File(&self.path)
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) runs: usize,
}

struct Contender {
    key: &'static str,
    label: &'static str,
    /// Measured on the varied stream only.
    varied_only: bool,
    url: String,
    servers: Vec<Server>,
    /// placement-webhook's metrics, for its decision cache's counters.
    webhook_metrics: Option<std::net::SocketAddr>,
}

impl Contender {
    fn measures(&self, set: &InputSet) -> bool {
        set.key == "varied" || !self.varied_only
    }

    fn cpu(&self) -> Result<f64> {
        self.servers.iter().map(|s| cpu_seconds(s.pid())).sum()
    }

    /// Its decision cache's (hits, misses) so far; none for the others.
    fn cache(&self) -> Result<(u64, u64)> {
        self.webhook_metrics.map_or(Ok((0, 0)), cache_counters)
    }
}

/// One measured run.
#[derive(Debug, Clone)]
struct Sample {
    load: LoadStats,
    cpu_per_1000: f64,
    /// placement-webhook's decision cache hits and misses in the run.
    cache: (u64, u64),
}

pub(crate) fn run(bins: &Bins, dir: &Path, settings: &Settings, report: &mut Report) -> Result<()> {
    let root = placement_tests::repo_root();
    std::fs::create_dir_all(dir)?;
    let certs = placement_certs::generate_to_dir(
        &dir.join("certs"),
        &["127.0.0.1".into(), "localhost".into()],
    )?;
    let review = admission_review()?;
    let body = serde_json::to_vec(&review)?;
    let body_path = dir.join("review.json");
    std::fs::write(&body_path, &body)?;
    eprintln!("scenario 1: AdmissionReview of {} bytes", body.len());
    let varied: Vec<Vec<u8>> = varied_reviews(VARIED_REVIEWS)?
        .iter()
        .map(serde_json::to_vec)
        .collect::<Result<_, _>>()?;
    let varied_path = dir.join("varied-reviews.jsonl");
    std::fs::write(&varied_path, varied.join(&b'\n'))?;
    let varied_bytes = varied.iter().map(Vec::len).sum::<usize>() / varied.len();
    let sets = [
        InputSet {
            key: "one",
            label: format!("one object (the example ReplicaSet, {} bytes)", body.len()),
            path: body_path,
            lines: false,
        },
        InputSet {
            key: "varied",
            label: format!(
                "varied ({VARIED_REVIEWS} distinct ReplicaSets and Deployments, {varied_bytes} bytes on average)"
            ),
            path: varied_path,
            lines: true,
        },
    ];

    // The policy trees: (c) the shipped policy + example clusters; (b2) and
    // (c2) the same plus the app-label rule; (d) the shipped policy plus the
    // system.main module that answers AdmissionReviews.
    let tree_c = policy_tree(&dir.join("opa-policy"), &root, Tree::Shipped)?;
    let tree_app = policy_tree(&dir.join("app-label-policy"), &root, Tree::AppLabel)?;
    let tree_d = policy_tree(&dir.join("opa-admission"), &root, Tree::Admission)?;

    let (noop, noop_addr, _) = start_noop(bins, dir, &certs, &[])?;
    let policy_dir = root.join("policies");
    let embedded_with = |args: &[String]| start_webhook(bins, dir, &certs, args);
    let (embedded, embedded_addr, embedded_metrics) =
        embedded_with(&[format!("--policy-dir={}", policy_dir.display())])?;
    let (forgetful, forgetful_addr, _) = embedded_with(&[
        format!("--policy-dir={}", policy_dir.display()),
        "--decision-cache-memory=0".to_owned(),
    ])?;
    let (embedded_app, embedded_app_addr, embedded_app_metrics) = embedded_with(&[
        format!("--policy-dir={}", tree_app.display()),
        SMALL_MEMORY.to_owned(),
    ])?;
    // OPA's writer beside each OPA, as in the chart's pod: placement-sync (it
    // needs an API server; no policy ConfigMaps, nothing replicated, so it
    // writes nothing while measured) announces its revisions to the webhook.
    let plane = placement_tests::ControlPlane::start();
    let (with_opa, with_opa_addr, with_opa_metrics, opa_c, writer) =
        webhook_with_opa(bins, dir, &certs, &plane, &tree_c, "policy", &[])?;
    let (with_opa_app, with_opa_app_addr, with_opa_app_metrics, opa_app, writer_app) =
        webhook_with_opa(
            bins,
            dir,
            &certs,
            &plane,
            &tree_app,
            "app-label",
            &[SMALL_MEMORY.to_owned()],
        )?;
    let (opa_d, opa_d_port) = start_opa(
        bins,
        dir,
        "admission",
        &[
            format!("--tls-cert-file={}", certs.cert.display()),
            format!("--tls-private-key-file={}", certs.key.display()),
            tree_d.display().to_string(),
        ],
    )?;
    let contenders = vec![
        Contender {
            key: "ceiling",
            label: "(a) ceiling: no-op TLS webhook (axum + rustls)",
            varied_only: false,
            url: format!("https://{noop_addr}/mutate"),
            servers: vec![noop],
            webhook_metrics: None,
        },
        Contender {
            key: "embedded",
            label: "(b) placement-webhook, embedded engine",
            varied_only: false,
            url: format!("https://{embedded_addr}/mutate"),
            servers: vec![embedded],
            webhook_metrics: Some(embedded_metrics),
        },
        Contender {
            key: "embedded-no-memory",
            label: "(b1) embedded, `--decision-cache-memory 0`",
            varied_only: true,
            url: format!("https://{forgetful_addr}/mutate"),
            servers: vec![forgetful],
            // Nothing remembered, nothing counted.
            webhook_metrics: None,
        },
        Contender {
            key: "embedded-app",
            label: "(b2) embedded, policy reading the app label",
            varied_only: true,
            url: format!("https://{embedded_app_addr}/mutate"),
            servers: vec![embedded_app],
            webhook_metrics: Some(embedded_app_metrics),
        },
        Contender {
            key: "with-opa",
            label: "(c) placement-webhook + OPA on loopback",
            varied_only: false,
            url: format!("https://{with_opa_addr}/mutate"),
            servers: vec![with_opa, opa_c, writer.server],
            webhook_metrics: Some(with_opa_metrics),
        },
        Contender {
            key: "with-opa-app",
            label: "(c2) + OPA, policy reading the app label",
            varied_only: true,
            url: format!("https://{with_opa_app_addr}/mutate"),
            servers: vec![with_opa_app, opa_app, writer_app.server],
            webhook_metrics: Some(with_opa_app_metrics),
        },
        Contender {
            key: "opa-itself",
            label: "(d) OPA answering the AdmissionReview itself",
            varied_only: false,
            url: format!("https://127.0.0.1:{opa_d_port}/"),
            servers: vec![opa_d],
            webhook_metrics: None,
        },
    ];

    let patches = verify(&contenders, &body, &certs.ca)?;
    let before: Vec<(u64, u64)> = contenders
        .iter()
        .map(Contender::cache)
        .collect::<Result<_>>()?;
    let agreement = verify_varied(&contenders, &varied, &certs.ca)?;
    let checked: Vec<String> = contenders
        .iter()
        .zip(&before)
        .filter(|(c, _)| c.webhook_metrics.is_some())
        .map(|(c, before)| {
            let after = c.cache()?;
            Ok(format!(
                "{} {} {} times and answered {} from memory",
                c.label.split(' ').next().unwrap_or(c.key),
                if c.key.starts_with("with-opa") {
                    "asked OPA"
                } else {
                    "evaluated"
                },
                after.1 - before.1,
                after.0 - before.0
            ))
        })
        .collect::<Result<_>>()?;
    report.note(format!(
        "Scenario 1 check of the varied set before measuring: every placement-webhook ((b), (b1), (b2), (c), (c2)) and OPA-itself (d) gave the same answer to each of the {VARIED_REVIEWS} reviews ({agreement}). \
         Of them {}; (b1) remembers nothing: under the shipped policy the {VARIED_REVIEWS} distinct reviews hold as many distinct decision keys as (b) evaluated; under the app-label rule, one each.",
        checked.join("; "),
    ));
    report.note(format!(
        "Scenario 1 check before measuring: every contender answered the {}-byte review with `allowed: true` and its uid; the patch of (d) OPA-itself {} the patch of placement-webhook (b) and (c) ({}).",
        body.len(),
        if patches.byte_equal { "is byte for byte" } else { "equals, as JSON and with the ownership record's tag decoded (OPA writes it in hex), not byte for byte," },
        patches.description
    ));

    // Warm-up: connections, JIT-free but caches and allocators settle.
    for c in &contenders {
        for set in sets.iter().filter(|set| c.measures(set)) {
            oha(&bins.oha, &c.url, set.body(), &certs.ca, 8, settings.warmup)?;
        }
    }

    let mut samples: Samples = BTreeMap::new();
    for run in 1..=settings.runs {
        for set in &sets {
            for &concurrency in &settings.concurrency {
                for c in contenders.iter().filter(|c| c.measures(set)) {
                    let before = c.cpu()?;
                    let cache_before = c.cache()?;
                    let load = oha(
                        &bins.oha,
                        &c.url,
                        set.body(),
                        &certs.ca,
                        concurrency,
                        settings.duration,
                    )?;
                    let cpu = c.cpu()? - before;
                    let cache_after = c.cache()?;
                    let cache = (
                        cache_after.0 - cache_before.0,
                        cache_after.1 - cache_before.1,
                    );
                    ensure!(
                        load.ok > 0,
                        "{}: no successful response at concurrency {concurrency}",
                        c.label
                    );
                    let cpu_per_1000 = cpu / load.ok as f64 * 1000.0;
                    eprintln!(
                        "scenario 1 run {run} {:<6} c={concurrency:>2} {:<11} {:>8.0} req/s  p50 {:>7}  p99 {:>7}  cpu/1k {:.3}s  failed {}",
                        set.key,
                        c.key,
                        load.rps,
                        fmt_ms(load.p50_ms),
                        fmt_ms(load.p99_ms),
                        cpu_per_1000,
                        load.failed
                    );
                    samples
                        .entry((set.key, c.key, concurrency))
                        .or_default()
                        .push(Sample {
                            load,
                            cpu_per_1000,
                            cache,
                        });
                }
            }
        }
    }
    let profile = crate::profile::decision_profile(dir);
    write_report(&contenders, &sets, &samples, settings, &profile, report);
    Ok(())
}

/// placement-webhook asking an OPA of its own that loads `tree`, and
/// following the revisions of that OPA's writer, placement-sync, as in the
/// chart's pod: (webhook, its address, its metrics, OPA, the writer).
fn webhook_with_opa(
    bins: &Bins,
    dir: &Path,
    certs: &placement_certs::CertPaths,
    plane: &placement_tests::ControlPlane,
    tree: &Path,
    label: &str,
    extra: &[String],
) -> Result<(
    Server,
    std::net::SocketAddr,
    std::net::SocketAddr,
    Server,
    Sidecar,
)> {
    let (opa, opa_port) = start_opa(bins, dir, label, &[tree.display().to_string()])?;
    let mut writer = Sidecar::start_for(
        bins,
        dir,
        plane,
        placement_tests::Identity::Sidecar,
        &[format!("--opa-url=http://127.0.0.1:{opa_port}")],
        &["--remediation=off".to_owned()],
        &format!("opa-writer-{label}"),
    )?;
    writer.wait_ready(Duration::from_secs(60), Duration::from_millis(200))?;
    let mut args = vec![
        format!("--opa-url=http://127.0.0.1:{opa_port}"),
        format!(
            "--engine-revisions-url=http://127.0.0.1:{}/engine/revisions",
            writer.port
        ),
    ];
    args.extend_from_slice(extra);
    let (webhook, addr, metrics) = start_webhook(bins, dir, certs, &args)?;
    wait_remembering(metrics)?;
    Ok((webhook, addr, metrics, opa, writer))
}

/// Samples by input set, contender and concurrency.
type Samples = BTreeMap<(&'static str, &'static str, usize), Vec<Sample>>;

/// What a policy tree holds beside the shipped policy and the example clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tree {
    Shipped,
    /// The rule reading the app label (`bench/rego/app_label.rego`).
    AppLabel,
    /// The `system.main` module of OPA answering AdmissionReviews, and the
    /// ownership records' signing key.
    Admission,
}

/// A directory OPA (or the embedded engine) loads: the shipped policy, the
/// example clusters at `data.kubernetes.clusters`, and what `tree` adds.
pub(crate) fn policy_tree(dir: &Path, root: &Path, tree: Tree) -> Result<PathBuf> {
    let clusters = dir.join("kubernetes/clusters");
    std::fs::create_dir_all(&clusters)?;
    for (name, source) in crate::replication::shipped_modules()? {
        std::fs::write(dir.join(name), source)?;
    }
    std::fs::copy(
        root.join("policies/kubernetes/clusters/data.json"),
        clusters.join("data.json"),
    )?;
    if tree == Tree::AppLabel {
        std::fs::copy(
            root.join("bench/rego/app_label.rego"),
            dir.join("app_label.rego"),
        )?;
    }
    if tree == Tree::Admission {
        std::fs::copy(
            root.join("bench/rego/system_main.rego"),
            dir.join("system_main.rego"),
        )?;
        // The signing key of the webhooks' ownership records (the first line
        // of the key file), as `data.bench.ownership_key`.
        let keys = std::fs::read_to_string(placement_tests::ownership_key_file())?;
        let key = keys
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or_default();
        std::fs::create_dir_all(dir.join("bench"))?;
        std::fs::write(
            dir.join("bench/data.json"),
            serde_json::to_vec(&serde_json::json!({ "ownership_key": key }))?,
        )?;
    }
    Ok(dir.to_owned())
}

/// `patch` with each ownership record re-serialized (keys sorted) and its tag
/// (`hmac-sha256:<unpadded base64>`) written as `hmac-sha256-hex:<hex>`, as
/// OPA-itself writes it.
fn hex_tags(patch: &Value) -> Value {
    use base64::Engine as _;
    let mut patch = patch.clone();
    for op in patch.as_array_mut().into_iter().flatten() {
        let Some(Ok(mut record)) = op["value"].as_str().map(serde_json::from_str::<Value>) else {
            continue;
        };
        let Some(mac) = record.get("mac").and_then(Value::as_str) else {
            continue;
        };
        if let Some(Ok(bytes)) = mac
            .strip_prefix("hmac-sha256:")
            .map(|tag| base64::engine::general_purpose::STANDARD_NO_PAD.decode(tag))
        {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            record["mac"] = Value::String(format!("hmac-sha256-hex:{hex}"));
        }
        op["value"] = Value::String(record.to_string());
    }
    patch
}

struct PatchCheck {
    byte_equal: bool,
    description: String,
}

/// One review to each contender: allowed, same uid; (b), (c), (d) patch alike.
fn verify(contenders: &[Contender], body: &[u8], ca: &Path) -> Result<PatchCheck> {
    let (rt, client) = review_client(ca)?;
    let uid = serde_json::from_slice::<Value>(body)?["request"]["uid"].clone();
    let mut patches: BTreeMap<&str, (String, Value)> = BTreeMap::new();
    for c in contenders {
        let (review, patch) = rt
            .block_on(post_review(&client, &c.url, body.to_vec()))
            .with_context(|| c.label.to_owned())?;
        let r = &review["response"];
        ensure!(
            review["apiVersion"] == "admission.k8s.io/v1" && review["kind"] == "AdmissionReview",
            "{}: not an AdmissionReview: {review}",
            c.label
        );
        ensure!(r["uid"] == uid, "{}: uid not echoed: {review}", c.label);
        ensure!(r["allowed"] == true, "{}: not allowed: {review}", c.label);
        if c.key == "ceiling" {
            continue;
        }
        let raw = patch.with_context(|| format!("{}: no patch: {review}", c.label))?;
        let parsed: Value = serde_json::from_str(&raw)?;
        patches.insert(c.key, (raw, parsed));
    }
    let (raw_b, json_b) = &patches["embedded"];
    for (key, (_, json)) in &patches {
        if hex_tags(json) != hex_tags(json_b) {
            bail!(
                "the patch of {key} differs from the embedded webhook's:\n{}\nvs\n{}",
                patches[key].0,
                raw_b
            );
        }
    }
    // OPA-itself writes the ownership record's tag in hex: equal as JSON
    // once the tags are decoded, never byte for byte.
    let byte_equal = patches.values().all(|(raw, _)| raw == raw_b);
    let ops: Vec<String> = json_b
        .as_array()
        .into_iter()
        .flatten()
        .map(|op| {
            format!(
                "{} {}",
                op["op"].as_str().unwrap_or("?"),
                op["path"].as_str().unwrap_or("?")
            )
        })
        .collect();
    Ok(PatchCheck {
        byte_equal,
        description: format!("{} ops: {}", ops.len(), ops.join(", ").replace('~', "\\~")),
    })
}

/// A runtime and a client trusting `ca`, to send reviews one at a time.
fn review_client(ca: &Path) -> Result<(tokio::runtime::Runtime, reqwest::Client)> {
    let ca_pem = std::fs::read(ca)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca_pem)?)
        .timeout(Duration::from_secs(30))
        .build()?;
    Ok((rt, client))
}

/// Every review of the varied set to (b), (c) and (d): the same answer from
/// each (allowed, the policy's message, the patch with ownership tags
/// decoded). Returns how the answers split.
fn verify_varied(contenders: &[Contender], reviews: &[Vec<u8>], ca: &Path) -> Result<String> {
    let (rt, client) = review_client(ca)?;
    let (mut patched, mut unchanged, mut denied) = (0, 0, 0);
    for (i, body) in reviews.iter().enumerate() {
        let mut first: Option<(&str, Value)> = None;
        for c in contenders.iter().filter(|c| c.key != "ceiling") {
            let (review, patch) = rt
                .block_on(post_review(&client, &c.url, body.clone()))
                .with_context(|| format!("{}: review {i} of the varied set", c.label))?;
            let r = &review["response"];
            let patch = match patch {
                Some(raw) => hex_tags(&serde_json::from_str(&raw)?),
                None => Value::Null,
            };
            let answer = serde_json::json!({
                "allowed": r["allowed"],
                "code": r["status"]["code"],
                "patch": patch,
            });
            match &first {
                None => first = Some((c.key, answer)),
                Some((key, expected)) => ensure!(
                    *expected == answer,
                    "review {i} of the varied set: {} answered {answer}, {key} {expected}",
                    c.key
                ),
            }
        }
        let Some((_, answer)) = first else {
            bail!("no contender to compare")
        };
        match (answer["allowed"].as_bool(), answer["patch"].is_null()) {
            (Some(true), false) => patched += 1,
            (Some(true), true) => unchanged += 1,
            _ => denied += 1,
        }
    }
    Ok(format!(
        "{patched} placed, {unchanged} admitted unchanged, {denied} denied by the policy"
    ))
}

fn write_report(
    contenders: &[Contender],
    sets: &[InputSet],
    samples: &Samples,
    settings: &Settings,
    profile: &str,
    report: &mut Report,
) {
    let med = |set: &str, key: &str, c: usize, f: &dyn Fn(&Sample) -> f64| -> f64 {
        samples
            .get(&(set, key, c))
            .map(|s| median(&s.iter().map(f).collect::<Vec<_>>()))
            .unwrap_or(f64::NAN)
    };
    let rps = |set: &str, k: &str, c: usize| med(set, k, c, &|s| s.load.rps);
    let p50 = |set: &str, k: &str, c: usize| med(set, k, c, &|s| s.load.p50_ms);
    let p99 = |set: &str, k: &str, c: usize| med(set, k, c, &|s| s.load.p99_ms);
    let cpu = |set: &str, k: &str, c: usize| med(set, k, c, &|s| s.cpu_per_1000);

    let mut md = String::new();
    md.push_str(&format!(
        "## 1. Admission over TLS\n\n{} s per run, {} runs, medians; HTTP/1.1 keep-alive, the same `oha` for every contender. \
         Throughput counts HTTP 200 answers only. CPU is the server processes' user+system time per 1,000 reviews \
         ((c), (c2): placement-webhook, OPA and placement-sync, which writes OPA). Ratios: throughput as a fraction of the ceiling's and of OPA-itself's; CPU and latency as a multiple of the ceiling's. \
         Both OPAs run without authentication (OPA on loopback beside the webhook, like the sidecar deployment), `--log-level=error`, with the shipped \
         policy and the example clusters (`policies/kubernetes/clusters/data.json`) loaded from files; (d) also loads `bench/rego/system_main.rego` and serves TLS \
         with the same certificate. The embedded webhook (b) runs with its defaults, so its decision cache (`--decision-cache-memory`, 16 MiB) is on; \
         (b1) is the same with `--decision-cache-memory 0`, every review evaluated. (b2) and (c2) load the shipped policy plus `bench/rego/app_label.rego`, \
         a rule that reads the app label (no workload of the stream has one it refuses, so the answers are the shipped policy's): every review of the varied \
         set has a decision key of its own. A workload is created once, so under such a policy a webhook meets each one new, but the load generator repeats \
         the 2,000 reviews, which the default memory would all remember: (b2) and (c2) run with `--decision-cache-memory 32Ki` (some 70 decisions), so that \
         (b2) evaluates nearly every review and (c2) asks OPA for nearly every one (the hit rates are below). (b1), (b2) and (c2) are measured \
         on the varied set only. \
         The varied set is written by `bench/src/review.rs` (`varied_reviews`): names, namespaces (50), uids, images, replicas and labels differ in every review; \
         EU and PCI annotations take every combination; a third carry their own replica-set preferences; oha sends a random line of the file per request.\n\n",
        settings.duration.as_secs_f64(),
        settings.runs
    ));
    for set in sets {
        let s = set.key;
        md.push_str(&format!("### Input: {}\n\n", set.label));
        md.push_str("| contender | conc. | req/s | p50 | p99 | CPU s / 1k reviews | req/s vs ceiling | req/s vs OPA-itself | CPU vs ceiling | p99 vs ceiling | failed |\n");
        md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for &c in &settings.concurrency {
            for con in contenders.iter().filter(|con| con.measures(set)) {
                let failed: u64 = samples
                    .get(&(s, con.key, c))
                    .map(|x| x.iter().map(|x| x.load.failed).sum())
                    .unwrap_or(0);
                md.push_str(&format!(
                    "| {} | {c} | {:.0} | {} | {} | {:.3} | {} | {} | {} | {} | {failed} |\n",
                    con.label,
                    rps(s, con.key, c),
                    fmt_ms(p50(s, con.key, c)),
                    fmt_ms(p99(s, con.key, c)),
                    cpu(s, con.key, c),
                    fmt_ratio(rps(s, con.key, c) / rps(s, "ceiling", c), "%"),
                    fmt_ratio(rps(s, con.key, c) / rps(s, "opa-itself", c), "%"),
                    fmt_ratio(cpu(s, con.key, c) / cpu(s, "ceiling", c), "x"),
                    fmt_ratio(p99(s, con.key, c) / p99(s, "ceiling", c), "x"),
                ));
            }
        }
        md.push_str("\nPer run (req/s; p99):\n\n");
        for &c in &settings.concurrency {
            for con in contenders.iter().filter(|con| con.measures(set)) {
                if let Some(x) = samples.get(&(s, con.key, c)) {
                    let runs: Vec<String> = x
                        .iter()
                        .map(|x| format!("{:.0}; {}", x.load.rps, fmt_ms(x.load.p99_ms)))
                        .collect();
                    md.push_str(&format!("- c={c} {}: {}\n", con.key, runs.join(" | ")));
                }
            }
        }
        let cache = |key: &str| -> Vec<String> {
            settings
                .concurrency
                .iter()
                .filter_map(|&c| {
                    let (hits, misses) = samples
                        .get(&(s, key, c))?
                        .iter()
                        .fold((0, 0), |(h, m), x| (h + x.cache.0, m + x.cache.1));
                    let total = (hits + misses).max(1);
                    Some(format!(
                        "c={c}: {:.1}% of {} decisions ({misses} evaluated)",
                        hits as f64 * 100.0 / total as f64,
                        hits + misses
                    ))
                })
                .collect()
        };
        let caches: Vec<String> = contenders
            .iter()
            .filter(|con| con.webhook_metrics.is_some() && con.measures(set))
            .map(|con| {
                let name = con.label.split(' ').next().unwrap_or(con.key);
                format!("{name} hits {}", cache(con.key).join(", "))
            })
            .collect();
        md.push_str(&format!(
            "\nplacement-webhook's decision cache during these runs (`placement_webhook_decision_cache_hits_total` / `_misses_total`; one per review here, all CREATEs): \
             {}.\n\n",
            caches.join("; ")
        ));
    }
    let top = settings.concurrency.iter().copied().max().unwrap_or(32);
    let low = settings.concurrency.iter().copied().min().unwrap_or(1);
    let v = "varied";
    md.push_str(&format!(
        "### What a review costs\n\n\
         On the varied set at concurrency {top} the servers used {:.3} ms of CPU per review for the ceiling, {:.3} ms for placement-webhook embedded, \
         {:.3} ms for it with no decision memory (b1), {:.3} ms for it under a policy reading the app label (b2), \
         {:.3} ms for placement-webhook + OPA (with placement-sync, OPA's writer: the three processes), {:.3} ms for the same under the app-label policy (c2) \
         and {:.3} ms for OPA answering itself. \
         The embedded webhook evaluates a decision only when the policy has not answered one that agrees at every input path it reads: the shipped \
         policy reads `kind` and three annotations (`object.get(input, [\"metadata\", \"annotations\", ...])` counts as reading that one annotation), \
         so the 2,000 distinct reviews fall into a few dozen decisions, and what remains per review is the stack the ceiling has too (TLS, HTTP, one \
         JSON parse) plus the policy input, the cache key and the patch. An evaluation runs the decision compiled to regorus's bytecode VM on the part \
         of the input the policy reads, at a fraction of the instructions of regorus's interpreter (`scripts/profile`; see the profile below). With OPA the webhook \
         remembers decisions the same way, because placement-sync, OPA's only writer in the pod, announces every write on `/engine/revisions` and holds it \
         until the webhook has forgotten what it remembered (or its 3 s lease has run out); a miss is a round trip to OPA. \
         Evaluations run at most one per core (a semaphore in front of the blocking pool), so a burst of {top} queues instead of time-slicing.\n",
        cpu(v, "ceiling", top),
        cpu(v, "embedded", top),
        cpu(v, "embedded-no-memory", top),
        cpu(v, "embedded-app", top),
        cpu(v, "with-opa", top),
        cpu(v, "with-opa-app", top),
        cpu(v, "opa-itself", top),
    ));
    md.push_str(profile);
    report.section(md);

    // Issue targets on the varied set: the stream a placement webhook sees.
    let r = rps(v, "embedded", top) / rps(v, "ceiling", top);
    report.target(
        format!("Varied stream, embedded: >= 0.5x the ceiling's throughput at concurrency {top}"),
        format!(
            "{r:.2}x ({:.0} vs {:.0} req/s)",
            rps(v, "embedded", top),
            rps(v, "ceiling", top)
        ),
        Status::from_bool(r >= 0.5),
    );
    let r = cpu(v, "embedded", top) / cpu(v, "ceiling", top);
    report.target(
        format!(
            "Varied stream, embedded: CPU per review <= 1.5x the ceiling's (concurrency {top})"
        ),
        format!(
            "{r:.2}x ({:.3} vs {:.3} ms)",
            cpu(v, "embedded", top),
            cpu(v, "ceiling", top)
        ),
        Status::from_bool(r <= 1.5),
    );
    let p = p99(v, "embedded", low);
    report.target(
        format!("Varied stream, embedded: p99 under 0.5 ms at concurrency {low}"),
        format!("p99 {}", fmt_ms(p)),
        Status::from_bool(p < 0.5),
    );
    // With no decision memory: every review evaluated.
    let n = "embedded-no-memory";
    let r = rps(v, n, top) / rps(v, "ceiling", top);
    report.target(
        format!("Varied stream, embedded without memory: >= 0.25x the ceiling's throughput at concurrency {top}"),
        format!(
            "{r:.2}x ({:.0} vs {:.0} req/s)",
            rps(v, n, top),
            rps(v, "ceiling", top)
        ),
        Status::from_bool(r >= 0.25),
    );
    let r = cpu(v, n, top) / cpu(v, "ceiling", top);
    report.target(
        format!("Varied stream, embedded without memory: CPU per review <= 8x the ceiling's (concurrency {top})"),
        format!(
            "{r:.2}x ({:.3} vs {:.3} ms)",
            cpu(v, n, top),
            cpu(v, "ceiling", top)
        ),
        Status::from_bool(r <= 8.0),
    );
    let p = p99(v, n, low);
    report.target(
        format!("Varied stream, embedded without memory: p99 under 0.5 ms at concurrency {low}"),
        format!("p99 {}", fmt_ms(p)),
        Status::from_bool(p < 0.5),
    );
    let r = rps(v, "with-opa", top) / rps(v, "opa-itself", top);
    report.target(
        format!(
            "Varied stream, with OPA: >= 2x OPA-answering-itself throughput (concurrency {top})"
        ),
        format!(
            "{r:.2}x ({:.0} vs {:.0} req/s)",
            rps(v, "with-opa", top),
            rps(v, "opa-itself", top)
        ),
        Status::from_bool(r >= 2.0),
    );

    // Earlier targets, on the one repeated object as they were set.
    let o = "one";
    let r = rps(o, "embedded", top) / rps(o, "ceiling", top);
    report.target(
        format!("One object, embedded: >= 50% of the ceiling's throughput at concurrency {top}"),
        format!(
            "{:.0}% ({:.0} vs {:.0} req/s)",
            r * 100.0,
            rps(o, "embedded", top),
            rps(o, "ceiling", top)
        ),
        Status::from_bool(r >= 0.5),
    );
    for c in [low, top] {
        let p = p99(o, "embedded", c);
        report.target(
            format!("One object, embedded: p99 under 2 ms (concurrency {c})"),
            format!("p99 {}", fmt_ms(p)),
            Status::from_bool(p < 2.0),
        );
        if low == top {
            break;
        }
    }
    for c in [low, top] {
        let r = rps(o, "with-opa", c) / rps(o, "opa-itself", c);
        report.target(
            format!(
                "One object, with OPA: >= 80% of OPA-answering-itself throughput (concurrency {c})"
            ),
            format!(
                "{:.0}% ({:.0} vs {:.0} req/s)",
                r * 100.0,
                rps(o, "with-opa", c),
                rps(o, "opa-itself", c)
            ),
            Status::from_bool(r >= 0.8),
        );
        if low == top {
            break;
        }
    }
    let r = rps(o, "embedded", top) / rps(o, "opa-itself", top);
    report.target(
        format!("One object, embedded >= 3x OPA-answering-itself throughput (concurrency {top})"),
        format!(
            "{r:.2}x ({:.0} vs {:.0} req/s)",
            rps(o, "embedded", top),
            rps(o, "opa-itself", top)
        ),
        Status::from_bool(r >= 3.0),
    );
}

/// Wait until the webhook with OPA remembers decisions (it follows its
/// writer's revisions and has read OPA's modules).
pub(crate) fn wait_remembering(metrics: std::net::SocketAddr) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let page = metrics_page(metrics)?;
        if page
            .lines()
            .any(|l| l == "placement_webhook_decision_cache_enabled 1")
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("the webhook with OPA never remembered decisions:\n{page}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// placement-webhook's decision cache counters (hits, misses).
pub(crate) fn cache_counters(metrics: std::net::SocketAddr) -> Result<(u64, u64)> {
    let text = metrics_page(metrics)?;
    let counter = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .with_context(|| format!("{name} in the webhook's metrics"))
    };
    Ok((
        counter("placement_webhook_decision_cache_hits_total ")?,
        counter("placement_webhook_decision_cache_misses_total ")?,
    ))
}

pub(crate) fn metrics_page(metrics: std::net::SocketAddr) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(metrics)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ownership_tags_compare_decoded() {
        let op = |record: &str| json!([{"op": "add", "path": "/metadata/annotations/x", "value": record}]);
        // 0x00ff in unpadded base64 and in hex; the records' keys in either order.
        let webhook = op(r#"{"owned":{"k":1},"mac":"hmac-sha256:AP8"}"#);
        let opa = op(r#"{"owned":{"k":1},"mac":"hmac-sha256-hex:00ff"}"#);
        assert_eq!(hex_tags(&webhook), hex_tags(&opa));
        let forged = op(r#"{"owned":{"k":1},"mac":"hmac-sha256-hex:00fe"}"#);
        assert_ne!(hex_tags(&webhook), hex_tags(&forged));
        let other = op(r#"{"owned":{"k":2},"mac":"hmac-sha256-hex:00ff"}"#);
        assert_ne!(hex_tags(&webhook), hex_tags(&other));
    }
}
