//! `evaluations`: the embedded engine deciding scenario 1's varied stream in
//! process, with no HTTP and no TLS around it, for a profiler
//! (`scripts/profile` runs it under callgrind with `--rounds 0` and
//! `--rounds 1`).
//!
//! Each review's policy input is built as the webhook builds it
//! (`policy_client::input::PolicyInput`) and asked of the engine
//! (`Embedded::query_input`), the decision memory off unless
//! `--decision-cache-memory` says otherwise. Setup (loading the policy,
//! building the reviews) and one warm-up round run whatever `--rounds` is,
//! so the difference between
//! `--rounds 1` and `--rounds 0` is what the reviews of one round cost.
//!
//! `--write-reviews FILE` writes the stream's AdmissionReviews instead, one a
//! line as scenario 1 sends them (`oha -Z FILE`), for profiling a whole
//! webhook process.

// The stream of scenario 1 (this binary uses only `varied_reviews`).
#[allow(dead_code)]
#[path = "../review.rs"]
mod review;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use policy_client::embedded::Embedded;
use policy_client::engine::{PolicyEngine, QueryOutcome};
use policy_client::input::{PolicyInput, RequestMeta};
use policy_client::ownership_keys::OwnershipKeys;
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(about = "The embedded engine deciding scenario 1's varied stream, for a profiler")]
struct Args {
    /// Times every review of the stream is decided.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Reviews in the stream (scenario 1's varied set).
    #[arg(long, default_value_t = 2_000)]
    reviews: usize,
    /// The decision memory's size in bytes (0: off, every review evaluated).
    #[arg(long, default_value_t = 0)]
    decision_cache_memory: usize,
    /// An extra policy module (a file) loaded beside the shipped ones.
    #[arg(long)]
    module: Option<std::path::PathBuf>,
    /// Write the stream's AdmissionReviews to this file, one a line, and exit.
    #[arg(long)]
    write_reviews: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.write_reviews {
        let lines: Vec<Vec<u8>> = review::varied_reviews(args.reviews)?
            .iter()
            .map(serde_json::to_vec)
            .collect::<Result<_, _>>()?;
        std::fs::write(path, lines.join(&b'\n'))
            .with_context(|| format!("write {}", path.display()))?;
        return Ok(());
    }
    let root = placement_tests::repo_root();
    let engine =
        Embedded::from_dir(&root.join("policies"))?.with_decision_cache(args.decision_cache_memory);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()?;
    if let Some(path) = &args.module {
        let source =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        runtime.block_on(engine.put_policy(&path.display().to_string(), &source))?;
    }
    let keys = OwnershipKeys::ephemeral()?;
    let requests: Vec<Value> = review::varied_reviews(args.reviews)?
        .into_iter()
        .map(|mut review| review["request"].take())
        .collect();
    let decide = |request: &Value| {
        let input = PolicyInput::new(
            &request["object"],
            &RequestMeta {
                uid: request["uid"].as_str().unwrap_or_default(),
                operation: request["operation"].as_str().unwrap_or_default(),
                kind: &request["kind"],
                resource: &request["resource"],
                namespace: request["namespace"].as_str(),
                name: request["name"].as_str(),
                user_info: &request["userInfo"],
                dry_run: false,
                old_object: None,
                keys: &keys,
            },
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        runtime.block_on(engine.query_input(policy_client::DEFAULT_DECISION_PATH, &input, deadline))
    };
    // A round of warm-up: the first query prepares the engine of the
    // evaluating thread, and the engine checks its first compiled answers
    // after loading against the interpreter's.
    if requests.is_empty() {
        bail!("no reviews");
    }
    for request in &requests {
        decide(request)?;
    }
    let started = Instant::now();
    let mut defined = 0;
    for _ in 0..args.rounds {
        for request in &requests {
            if let QueryOutcome::Defined(_) = decide(request)? {
                defined += 1;
            }
        }
    }
    let elapsed = started.elapsed();
    let decisions = args.rounds * requests.len();
    println!(
        "{decisions} decisions ({defined} defined) in {:.3} s: {:.1} us each (wall clock)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / decisions.max(1) as f64
    );
    Ok(())
}
