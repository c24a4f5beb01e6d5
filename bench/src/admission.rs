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
//! Two load generators: oha (Rust) for every contender, and vegeta (Go) on
//! the varied stream for the ceiling and (b), (b1), since what a server costs
//! per review depends on the client it shares the cores with.
//!
//! Every contender runs at once (idle while another is measured); runs are
//! interleaved (run 1 of every contender, then run 2, ...) so a noisy neighbour
//! hits all alike. CPU is the servers' utime + stime from /proc (for (c) the
//! webhook's and OPA's), before and after each load run; beside it the
//! client's own CPU and how often the servers' threads left a core.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use policy_client::ownership_keys::OwnershipKeys;
use serde_json::Value;

use crate::common::{
    Bins, Server, Sidecar, context_switches, cpu_seconds, median, post_review, start_noop,
    start_opa, start_webhook,
};
use crate::load::{Body, Client, LoadStats};
use crate::report::{Report, Status, fmt_ms, fmt_ratio};
use crate::review::{admission_review, varied_reviews};

/// Reviews in the varied input set.
const VARIED_REVIEWS: usize = 2_000;

/// The decision memory of (b2) and (c2): a workload is created once, so under
/// a policy that reads what differs between workloads a webhook meets each one
/// new; the load generator repeats the 2,000 reviews, which the default 16 MiB
/// would all remember, so the memory holds only some 70 decisions.
const SMALL_MEMORY: &str = "--decision-cache-memory=32Ki";

/// The contenders the second client (vegeta, Go's net/http and crypto/tls) is
/// measured on, on the varied stream: the ceiling and the embedded webhook
/// with and without its decision memory.
const SECOND_CLIENT: [&str; 3] = ["ceiling", "embedded", "embedded-no-memory"];

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
    fn measures(&self, client: Client<'_>, set: &InputSet) -> bool {
        match client {
            Client::Oha(_) => set.key == "varied" || !self.varied_only,
            Client::Vegeta(_) => set.key == "varied" && SECOND_CLIENT.contains(&self.key),
        }
    }

    fn cpu(&self) -> Result<f64> {
        self.servers.iter().map(|s| cpu_seconds(s.pid())).sum()
    }

    /// Its servers' threads switched off a core so far: (waiting, preempted).
    fn switches(&self) -> Result<(u64, u64)> {
        self.servers.iter().try_fold((0, 0), |sum, s| {
            let (waits, preempted) = context_switches(s.pid())?;
            Ok((sum.0 + waits, sum.1 + preempted))
        })
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
    /// The servers' threads switched off a core per review, waiting and
    /// preempted.
    switches: (f64, f64),
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
        if patches.byte_equal { "is byte for byte" } else { "equals, as JSON once each ownership record verifies with the webhooks' key and is compared without its tag and time (OPA writes the tag in hex, and two answers may come in different seconds), not byte for byte," },
        patches.description
    ));

    // Warm-up: connections, JIT-free but caches and allocators settle.
    let clients = [Client::Oha(&bins.oha), Client::Vegeta(&bins.vegeta)];
    for client in clients {
        for c in &contenders {
            for set in sets.iter().filter(|set| c.measures(client, set)) {
                client.run(&c.url, set.body(), &certs.ca, 8, settings.warmup)?;
            }
        }
    }

    let mut samples: Samples = BTreeMap::new();
    for run in 1..=settings.runs {
        for (client, set) in clients
            .iter()
            .flat_map(|&client| sets.iter().map(move |set| (client, set)))
        {
            for &concurrency in &settings.concurrency {
                for c in contenders.iter().filter(|c| c.measures(client, set)) {
                    let before = c.cpu()?;
                    let switches_before = c.switches()?;
                    let cache_before = c.cache()?;
                    let load = client.run(
                        &c.url,
                        set.body(),
                        &certs.ca,
                        concurrency,
                        settings.duration,
                    )?;
                    let cpu = c.cpu()? - before;
                    let switches_after = c.switches()?;
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
                    let per_review = |n: u64| n as f64 / load.ok as f64;
                    let switches = (
                        per_review(switches_after.0 - switches_before.0),
                        per_review(switches_after.1 - switches_before.1),
                    );
                    eprintln!(
                        "scenario 1 run {run} {:<6} {:<6} c={concurrency:>2} {:<11} {:>8.0} req/s  p50 {:>7}  p99 {:>7}  cpu/1k {:.3}s  failed {}  client cpu/1k {:.3}s  switches/review {:.2}; {:.2}",
                        client.name(),
                        set.key,
                        c.key,
                        load.rps,
                        fmt_ms(load.p50_ms),
                        fmt_ms(load.p99_ms),
                        cpu_per_1000,
                        load.failed,
                        load.client_cpu / load.ok as f64 * 1000.0,
                        switches.0,
                        switches.1,
                    );
                    samples
                        .entry((client.name(), set.key, c.key, concurrency))
                        .or_default()
                        .push(Sample {
                            load,
                            cpu_per_1000,
                            cache,
                            switches,
                        });
                }
            }
        }
    }
    let profile = crate::profile::decision_profile(dir);
    write_report(
        &contenders,
        &sets,
        clients,
        &samples,
        settings,
        &profile,
        report,
    );
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

/// Client, input set, contender and concurrency.
type Key = (&'static str, &'static str, &'static str, usize);

/// Samples by client, input set, contender and concurrency.
type Samples = BTreeMap<Key, Vec<Sample>>;

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

/// `patch` as two contenders' patches compare: each ownership record's tag
/// checked against `object` with the webhooks' key (OPA-itself writes it in
/// hex, `hmac-sha256-hex:`, decoded first), then left out together with the
/// creation time it signs, which differs between two answers given in
/// different seconds; the rest of the record re-serialized (keys sorted).
fn verified_records(object: &Value, patch: &Value, keys: &OwnershipKeys) -> Result<Value> {
    use policy_client::placement::{OWNERSHIP_ANNOTATION, ownership};
    let record_path = format!(
        "/metadata/annotations/{}",
        OWNERSHIP_ANNOTATION.replace('~', "~0").replace('/', "~1")
    );
    let mut patch = patch.clone();
    for op in patch.as_array_mut().into_iter().flatten() {
        let record = match op["path"].as_str() {
            Some(path) if path == record_path => &mut op["value"],
            Some("/metadata/annotations") => &mut op["value"][OWNERSHIP_ANNOTATION],
            _ => continue,
        };
        let Some(text) = record.as_str() else {
            continue;
        };
        let mut parsed: Value = serde_json::from_str(text)
            .with_context(|| format!("the ownership record is not JSON: {text}"))?;
        if let Some(tag) = parsed["mac"].as_str().and_then(webhook_tag) {
            parsed["mac"] = Value::String(tag);
        }
        // The object as the webhook identifies one being created (the bench
        // sends CREATEs): without a uid or creation time of its own.
        let mut signed = object.clone();
        if let Some(meta) = signed["metadata"].as_object_mut() {
            meta.remove("uid");
            meta.remove("creationTimestamp");
            meta.insert(
                "annotations".to_owned(),
                serde_json::json!({ OWNERSHIP_ANNOTATION: parsed.to_string() }),
            );
        }
        ensure!(
            !ownership(&signed, keys).is_empty(),
            "the ownership record does not verify with the webhooks' key: {text}"
        );
        if let Some(fields) = parsed.as_object_mut() {
            fields.remove("mac");
            fields.remove("creating");
        }
        *record = Value::String(parsed.to_string());
    }
    Ok(patch)
}

/// A tag in hex (`hmac-sha256-hex:`, as OPA-itself writes it) as the webhook
/// writes it (`hmac-sha256:` and unpadded base64); `None` if not in hex.
fn webhook_tag(tag: &str) -> Option<String> {
    use base64::Engine as _;
    let hex = tag.strip_prefix("hmac-sha256-hex:")?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(format!(
        "hmac-sha256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
    ))
}

/// The webhooks' signing key, which OPA-itself also signs with.
fn webhook_keys() -> Result<OwnershipKeys> {
    let text = std::fs::read_to_string(placement_tests::ownership_key_file())?;
    Ok(OwnershipKeys::from_text(&text)?)
}

struct PatchCheck {
    byte_equal: bool,
    description: String,
}

/// One review to each contender: allowed, same uid; (b), (c), (d) patch alike.
fn verify(contenders: &[Contender], body: &[u8], ca: &Path) -> Result<PatchCheck> {
    let (rt, client) = review_client(ca)?;
    let keys = webhook_keys()?;
    let review: Value = serde_json::from_slice(body)?;
    let (uid, object) = (&review["request"]["uid"], &review["request"]["object"]);
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
        ensure!(r["uid"] == *uid, "{}: uid not echoed: {review}", c.label);
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
        if verified_records(object, json, &keys)? != verified_records(object, json_b, &keys)? {
            bail!(
                "the patch of {key} differs from the embedded webhook's:\n{}\nvs\n{}",
                patches[key].0,
                raw_b
            );
        }
    }
    // OPA-itself writes the ownership record's tag in hex: equal as JSON
    // once the tags are verified, never byte for byte.
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
/// each (allowed, the policy's message, the patch with ownership records
/// verified). Returns how the answers split.
fn verify_varied(contenders: &[Contender], reviews: &[Vec<u8>], ca: &Path) -> Result<String> {
    let (rt, client) = review_client(ca)?;
    let keys = webhook_keys()?;
    let (mut patched, mut unchanged, mut denied) = (0, 0, 0);
    for (i, body) in reviews.iter().enumerate() {
        let mut first: Option<(&str, Value)> = None;
        let object = serde_json::from_slice::<Value>(body)?["request"]["object"].take();
        for c in contenders.iter().filter(|c| c.key != "ceiling") {
            let (review, patch) = rt
                .block_on(post_review(&client, &c.url, body.clone()))
                .with_context(|| format!("{}: review {i} of the varied set", c.label))?;
            let r = &review["response"];
            let patch = match patch {
                Some(raw) => verified_records(&object, &serde_json::from_str(&raw)?, &keys)
                    .with_context(|| format!("{}: review {i} of the varied set", c.label))?,
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

/// Medians over the samples of one key.
struct Medians<'a>(&'a Samples);

impl Medians<'_> {
    fn of(&self, key: Key, f: impl Fn(&Sample) -> f64) -> f64 {
        self.0
            .get(&key)
            .map(|s| median(&s.iter().map(f).collect::<Vec<_>>()))
            .unwrap_or(f64::NAN)
    }
    fn rps(&self, key: Key) -> f64 {
        self.of(key, |s| s.load.rps)
    }
    fn p50(&self, key: Key) -> f64 {
        self.of(key, |s| s.load.p50_ms)
    }
    fn p99(&self, key: Key) -> f64 {
        self.of(key, |s| s.load.p99_ms)
    }
    fn cpu(&self, key: Key) -> f64 {
        self.of(key, |s| s.cpu_per_1000)
    }
    fn client_cpu(&self, key: Key) -> f64 {
        self.of(key, |s| s.load.client_cpu / s.load.ok as f64 * 1000.0)
    }
}

/// One client's table of one input set, its runs and the decision memories'
/// hit rates.
fn input_table(
    client: Client<'_>,
    set: &InputSet,
    contenders: &[Contender],
    samples: &Samples,
    settings: &Settings,
) -> String {
    let m = Medians(samples);
    let (cl, s) = (client.name(), set.key);
    let measured: Vec<&Contender> = contenders
        .iter()
        .filter(|con| con.measures(client, set))
        .collect();
    let mut md = String::new();
    md.push_str("| contender | conc. | req/s | p50 | p99 | CPU s / 1k reviews | req/s vs ceiling | req/s vs OPA-itself | CPU vs ceiling | p99 vs ceiling | failed | client's CPU s / 1k | servers' switches / review (waiting; preempted) |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &c in &settings.concurrency {
        let ceiling = (cl, s, "ceiling", c);
        let opa_itself = (cl, s, "opa-itself", c);
        for con in &measured {
            let key = (cl, s, con.key, c);
            let failed: u64 = samples
                .get(&(cl, s, con.key, c))
                .map(|x| x.iter().map(|x| x.load.failed).sum())
                .unwrap_or(0);
            let waiting = m.of(key, |s| s.switches.0);
            let preempted = m.of(key, |s| s.switches.1);
            md.push_str(&format!(
                "| {} | {c} | {:.0} | {} | {} | {:.3} | {} | {} | {} | {} | {failed} | {:.3} | {waiting:.2}; {preempted:.2} |\n",
                con.label,
                m.rps(key),
                fmt_ms(m.p50(key)),
                fmt_ms(m.p99(key)),
                m.cpu(key),
                fmt_ratio(m.rps(key) / m.rps(ceiling), "%"),
                fmt_ratio(m.rps(key) / m.rps(opa_itself), "%"),
                fmt_ratio(m.cpu(key) / m.cpu(ceiling), "x"),
                fmt_ratio(m.p99(key) / m.p99(ceiling), "x"),
                m.client_cpu(key),
            ));
        }
    }
    md.push_str("\nPer run (req/s; p99):\n\n");
    for &c in &settings.concurrency {
        for con in &measured {
            if let Some(x) = samples.get(&(cl, s, con.key, c)) {
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
                    .get(&(cl, s, key, c))?
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
    let caches: Vec<String> = measured
        .iter()
        .filter(|con| con.webhook_metrics.is_some())
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
    md
}

/// What the two clients' runs on the varied set say about each other.
fn why_clients_differ(m: &Medians<'_>, clients: [Client<'_>; 2], settings: &Settings) -> String {
    let top = settings.concurrency.iter().copied().max().unwrap_or(32);
    let [a, b] = clients.map(Client::name);
    let at = |client: &'static str, k: &'static str| (client, "varied", k, top);
    let ratio = |client| m.cpu(at(client, "embedded")) / m.cpu(at(client, "ceiling"));
    format!(
        "### Why the clients differ\n\n\
         Each client shares the two cores with the servers, so what it spends per review the servers do not get. At concurrency {top} on the varied \
         set {a} took {:.3} ms of CPU per review against the ceiling and {:.3} ms against the embedded webhook (b); {b} took {:.3} and {:.3} ms \
         (Go's net/http and crypto/tls, its goroutines parked and woken for every answer). The servers' threads were preempted {:.2} (ceiling) and \
         {:.2} ((b)) times per review under {a}, {:.2} and {:.2} under {b}. (b)'s CPU per review was {:.3} ms under {a} and {:.3} ms under {b}, \
         the ceiling's {:.3} and {:.3} ms: a ratio of {:.2}x under {a} and {:.2}x under {b}. The ratio holds the client's interference as well as \
         the servers' work, and a client that costs more per review when the answers come slower weighs more on the slower server.\n\n",
        m.client_cpu(at(a, "ceiling")),
        m.client_cpu(at(a, "embedded")),
        m.client_cpu(at(b, "ceiling")),
        m.client_cpu(at(b, "embedded")),
        m.of(at(a, "ceiling"), |s| s.switches.1),
        m.of(at(a, "embedded"), |s| s.switches.1),
        m.of(at(b, "ceiling"), |s| s.switches.1),
        m.of(at(b, "embedded"), |s| s.switches.1),
        m.cpu(at(a, "embedded")),
        m.cpu(at(b, "embedded")),
        m.cpu(at(a, "ceiling")),
        m.cpu(at(b, "ceiling")),
        ratio(a),
        ratio(b),
    )
}

fn write_report(
    contenders: &[Contender],
    sets: &[InputSet],
    clients: [Client<'_>; 2],
    samples: &Samples,
    settings: &Settings,
    profile: &str,
    report: &mut Report,
) {
    let [first, second] = clients;
    let m = Medians(samples);
    let rps = |set: &'static str, k: &'static str, c: usize| m.rps((first.name(), set, k, c));
    let p99 = |set: &'static str, k: &'static str, c: usize| m.p99((first.name(), set, k, c));
    let cpu = |set: &'static str, k: &'static str, c: usize| m.cpu((first.name(), set, k, c));

    let mut md = String::new();
    md.push_str(&format!(
        "## 1. Admission over TLS\n\n{} s per run, {} runs, medians; HTTP/1.1 keep-alive, the same client for every contender: `oha` (Rust: hyper and rustls), and on the varied set for the ceiling and (b), (b1) also `vegeta` (Go: net/http and crypto/tls; below the first tables). \
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
         The varied set is written by `bench/src/review.rs` (`varied_reviews`): names, namespaces (50), request uids, images, replicas and labels differ in every review, and the objects carry no uid or creation time (a CREATE gets those from the API server once admitted); \
         EU and PCI annotations take every combination; a third carry their own replica-set preferences; oha sends a random line of the file per request, vegeta the lines in turn.\n\n",
        settings.duration.as_secs_f64(),
        settings.runs
    ));
    for set in sets {
        md.push_str(&format!("### Input: {}\n\n", set.label));
        md.push_str(&input_table(first, set, contenders, samples, settings));
    }
    for set in sets
        .iter()
        .filter(|set| contenders.iter().any(|c| c.measures(second, set)))
    {
        md.push_str(&format!(
            "### The second client, vegeta (Go), input: {}\n\n",
            set.label
        ));
        md.push_str(&input_table(second, set, contenders, samples, settings));
    }
    md.push_str(&why_clients_differ(&m, [first, second], settings));
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
    let p = p99(v, "embedded", low);
    report.target(
        format!("Varied stream, embedded: p99 under 0.5 ms at concurrency {low}"),
        format!("p99 {}", fmt_ms(p)),
        Status::from_bool(p < 0.5),
    );
    let p = p99(v, "embedded-no-memory", low);
    report.target(
        format!("Varied stream, embedded without memory: p99 under 0.5 ms at concurrency {low}"),
        format!("p99 {}", fmt_ms(p)),
        Status::from_bool(p < 0.5),
    );
    // The same targets under either client: what differs between them is the
    // client's own cost on the cores it shares with the servers.
    for client in clients.map(Client::name) {
        let at = |k: &'static str, c: usize| (client, v, k, c);
        let ceiling = at("ceiling", top);
        let remembered = at("embedded", top);
        let r = m.cpu(remembered) / m.cpu(ceiling);
        report.target(
            format!(
                "Varied stream, embedded ({client}): CPU per review <= 1.5x the ceiling's (concurrency {top})"
            ),
            format!(
                "{r:.2}x ({:.3} vs {:.3} ms)",
                m.cpu(remembered),
                m.cpu(ceiling)
            ),
            Status::from_bool(r <= 1.5),
        );
        // With no decision memory: every review evaluated.
        let forgetful = at("embedded-no-memory", top);
        let r = m.rps(forgetful) / m.rps(ceiling);
        report.target(
            format!(
                "Varied stream, embedded without memory ({client}): >= 0.25x the ceiling's throughput at concurrency {top}"
            ),
            format!(
                "{r:.2}x ({:.0} vs {:.0} req/s)",
                m.rps(forgetful),
                m.rps(ceiling)
            ),
            Status::from_bool(r >= 0.25),
        );
        let r = m.cpu(forgetful) / m.cpu(ceiling);
        report.target(
            format!(
                "Varied stream, embedded without memory ({client}): CPU per review <= 8x the ceiling's (concurrency {top})"
            ),
            format!(
                "{r:.2}x ({:.3} vs {:.3} ms)",
                m.cpu(forgetful),
                m.cpu(ceiling)
            ),
            Status::from_bool(r <= 8.0),
        );
        let (forgetful, ceiling) = (at("embedded-no-memory", low), at("ceiling", low));
        let r = m.p99(forgetful) / m.p99(ceiling);
        report.target(
            format!(
                "Varied stream, embedded without memory ({client}): p99 <= 3x the ceiling's at concurrency {low}"
            ),
            format!(
                "{r:.2}x ({} vs {})",
                fmt_ms(m.p99(forgetful)),
                fmt_ms(m.p99(ceiling))
            ),
            Status::from_bool(r <= 3.0),
        );
    }
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
    fn ownership_records_compare_once_verified() {
        use policy_client::decision::Decision;
        use policy_client::placement::{OWNERSHIP_ANNOTATION, desired_annotations};
        let keys = OwnershipKeys::ephemeral().unwrap();
        let object = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"namespace": "ns", "name": "web"}});
        let decision = Decision {
            annotations: [("a".to_owned(), "1".to_owned())].into(),
            errors: vec![],
            policy_weights: false,
        };
        let record =
            desired_annotations(&object, &decision, &keys).unwrap()[OWNERSHIP_ANNOTATION].clone();
        let op = |record: &str| {
            json!([{"op": "add",
            "path": "/metadata/annotations/placement-policy.io~1policy-owned", "value": record}])
        };
        let compared = verified_records(&object, &op(&record), &keys).unwrap();
        let kept: Value = serde_json::from_str(compared[0]["value"].as_str().unwrap()).unwrap();
        assert_eq!(
            kept,
            json!({"owned": {"a": {"written": "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b", "requested": null}}})
        );
        // The same tag in hex, as OPA-itself writes it.
        let mut parsed: Value = serde_json::from_str(&record).unwrap();
        let bytes = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            parsed["mac"]
                .as_str()
                .unwrap()
                .strip_prefix("hmac-sha256:")
                .unwrap(),
        )
        .unwrap();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        parsed["mac"] = json!(format!("hmac-sha256-hex:{hex}"));
        let in_hex = verified_records(&object, &op(&parsed.to_string()), &keys).unwrap();
        assert_eq!(in_hex, compared);
        // An edited record, or another object's, does not verify.
        let edited = record.replace("sha256:6b", "sha256:7b");
        assert!(verified_records(&object, &op(&edited), &keys).is_err());
        let mut other = object.clone();
        other["metadata"]["name"] = json!("db");
        assert!(verified_records(&other, &op(&record), &keys).is_err());
    }
}
