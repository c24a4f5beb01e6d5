//! A hostile client inside the cluster, against the real `placement-webhook`
//! binary over real TLS: idle and slow connections are cut off, floods of
//! stalled or expanding bodies and stalled HTTP/2 streams keep the process's
//! memory within its budget while normal reviews still pass, bodies declared
//! and never sent hold nothing, no peer holds more than its share of the
//! memory budget, probes are answered whatever other peers hold (on the
//! webhook's ports and placement-sync's, handshake churn beside busy slots
//! included), an API server with a verified certificate is never refused
//! for its many connections nor for pods of its peer, trust is a
//! connection's own and never its address's, one caller's
//! Events leave the others' alone, and running out of file descriptors is
//! survived and counted.
//!
//! Every bound asserted here is generous (a multiple of the configured
//! timeout, the configured memory budget plus slack): these tests check that
//! limits exist, `placement-bench` scenario 6 measures them.

use placement_tests::cgroup::MemoryCgroup;
use placement_tests::hostile::{
    Outcome, RssSampler, Target, limit_open_files, open_fds, placement_review,
    plain_idle_connections, probe, probes_answered, proc_status_kib,
};
use placement_tests::{
    ControlPlane, Identity, OpaServer, SidecarProcess, WebhookProcess, repo_root, scratch_dir,
    unique_name, wait_for,
};
use std::net::IpAddr;
use std::time::Duration;

mod budgets;
mod slots;
mod trust;

const MIB: usize = 1024 * 1024;

fn webhook(extra: &[&str]) -> WebhookProcess {
    let mut args = vec![format!(
        "--policy-dir={}",
        repo_root().join("policies").display()
    )];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    WebhookProcess::start(&args)
}

fn target(webhook: &WebhookProcess, alpn: &[&[u8]]) -> Target {
    Target::new(webhook.admission_addr, &webhook.ca_pem, alpn)
}

/// A normal review passes: HTTP 200 and allowed. Returns its latency.
async fn review_passes(target: &Target, uid: &str) -> Duration {
    let (status, allowed, latency) = target
        .normal_review(&placement_review(uid))
        .await
        .unwrap_or_else(|| panic!("{uid}: the webhook cannot be reached"));
    assert_eq!(status, 200, "{uid}: HTTP {status}");
    assert!(allowed, "{uid}: not allowed");
    latency
}

async fn outcomes(tasks: Vec<tokio::task::JoinHandle<Outcome>>) -> Vec<Outcome> {
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("attack task"));
    }
    out
}

/// Another peer, as the webhook sees it: connections from this loopback
/// address.
const HOSTILE: [u8; 4] = [127, 0, 0, 2];

/// Waits (at most 20 s) until `sample` on the webhook's metrics page is at
/// least `value`; the page.
async fn metric_reaches(webhook: &WebhookProcess, sample: &str, value: f64) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = webhook.metrics().await;
        if placement_tests::webhook::metric_value(&page, sample) >= value {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{sample} stayed below {value}:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops the tasks of an attack (their connections close).
fn end(tasks: Vec<tokio::task::JoinHandle<Outcome>>) {
    for task in tasks {
        task.abort();
    }
}
