//! Scenario 6: a hostile client inside the cluster (issue 11, part 4), against
//! the release `placement-webhook` with its default limits (only
//! `--idle-timeout` is shortened so the run is short).
//!
//! Each attack runs against a fresh webhook (embedded engine, shipped
//! policies) so its memory is its own. Measured: resident memory at rest and
//! its peak under attack (`/proc/<pid>/status` `VmRSS`, sampled every 20 ms),
//! the connections the webhook holds (its `connections_open` gauge) during the
//! attack and after the idle timeout, and ten normal reviews (the 4 KB EU/PCI
//! ReplicaSet, each over a new HTTP/2 connection) sent during the attack. The
//! attacker connects from other loopback addresses (127.0.0.2 and up) than
//! the well-behaved client (127.0.0.1), as another pod would. The attacks are
//! the ones of `tests/e2e/hostile.rs` (`placement_tests::hostile`), bigger.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use placement_tests::hostile::{Attack, RssSampler, Target, raise_own_open_files_limit};

use crate::common::{Bins, Server, http_get, median, metric, start_webhook, vm_kib};
use crate::report::{Report, Status, fmt_ms};
use crate::review::admission_review;

const MIB: usize = 1024 * 1024;
/// Shorter than the default 30 s so the "held after" column is quick to read.
const IDLE_TIMEOUT: &str = "5s";
const NORMAL_REVIEWS: usize = 10;
/// Where the attacker connects from; the peers of a many-peer attack follow.
const HOSTILE: [u8; 4] = [127, 0, 0, 2];
/// The peers and connections of each of the many-peer attack.
const MANY_PEERS: u8 = 8;
const PER_PEER: usize = 200;

fn hostile_peer(index: u8) -> IpAddr {
    IpAddr::from([HOSTILE[0], HOSTILE[1], HOSTILE[2], HOSTILE[3] + index])
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Idle,
    ManyPeers,
    SlowBodies,
    StalledBodies,
    StalledStreams,
    Expanding,
    Everything,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Idle => "1,000 idle TLS connections from one peer",
            Kind::ManyPeers => "1,600 idle TLS connections from 8 peers (200 each)",
            Kind::SlowBodies => "100 bodies at 1 byte/s (slowloris)",
            Kind::StalledBodies => "40 bodies declaring 6 MiB, stalled after 5 MiB (HTTP/1.1)",
            Kind::StalledStreams => {
                "1 HTTP/2 connection, 100 streams declaring 6 MiB, stalled after 1 MiB"
            }
            Kind::Expanding => "16 concurrent 6 MiB bodies of empty arrays (about 30x when parsed)",
            Kind::Everything => "the last three at once",
        }
    }
}

#[derive(Debug)]
struct Row {
    kind: Kind,
    rest_mib: f64,
    peak_mib: f64,
    after_mib: f64,
    open_during: f64,
    open_after: f64,
    latencies_ms: Vec<f64>,
    refusals: String,
}

pub(crate) fn run(bins: &Bins, dir: &Path, report: &mut Report) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let fds = raise_own_open_files_limit();
    ensure!(
        fds >= 2048,
        "the attacker needs 2,048 open files, the hard limit is {fds}"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let certs = placement_certs::generate_to_dir(&dir.join("certs"), &["127.0.0.1".into()])?;
    let ca = std::fs::read_to_string(&certs.ca)?;
    let mut rows = Vec::new();
    for kind in [
        Kind::Idle,
        Kind::ManyPeers,
        Kind::SlowBodies,
        Kind::StalledBodies,
        Kind::StalledStreams,
        Kind::Expanding,
        Kind::Everything,
    ] {
        eprintln!("hostile: {}", kind.label());
        let (server, admission, metrics) = start_webhook(
            bins,
            dir,
            &certs,
            &[
                format!(
                    "--policy-dir={}",
                    placement_tests::repo_root().join("policies").display()
                ),
                format!("--idle-timeout={IDLE_TIMEOUT}"),
            ],
        )?;
        let row = runtime.block_on(attack(kind, &server, admission, metrics, &ca))?;
        eprintln!("hostile: {row:?}");
        rows.push(row);
    }
    write_section(&rows, report);
    Ok(())
}

async fn attack(
    kind: Kind,
    server: &Server,
    admission: SocketAddr,
    metrics: SocketAddr,
    ca: &str,
) -> Result<Row> {
    let good = Target::new(admission, ca, &[b"h2"]);
    let h1 = Target::new(admission, ca, &[b"http/1.1"]).from_address(hostile_peer(0));
    let h2 = good.from_address(hostile_peer(0));
    let review = admission_review()?;
    let (status, allowed, _) = good
        .normal_review(&review)
        .await
        .context("warm-up review")?;
    ensure!(status == 200 && allowed, "warm-up review: HTTP {status}");
    let pid = server.pid();
    let rest = vm_kib(pid, "VmRSS")?;
    let sampler = RssSampler::start(pid);

    let mut attacks: Vec<Attack> = Vec::new();
    let mut idle = Vec::new();
    match kind {
        Kind::Idle => idle = h1.idle_connections(1000, Duration::from_secs(120)),
        Kind::ManyPeers => {
            for peer in 0..MANY_PEERS {
                idle.extend(
                    h1.from_address(hostile_peer(peer))
                        .idle_connections(PER_PEER, Duration::from_secs(120)),
                );
            }
        }
        Kind::SlowBodies => {
            for _ in 0..100 {
                let target = h1.clone();
                idle.push(tokio::spawn(async move {
                    target
                        .slow_body(10_000, Duration::from_secs(1), Duration::from_secs(120))
                        .await
                }));
            }
        }
        Kind::StalledBodies => attacks.push(h1.stalled_bodies(40, 6 * MIB, 5 * MIB)),
        Kind::StalledStreams => attacks.push(h2.stalled_streams(100, 6 * MIB, MIB).await),
        Kind::Expanding => attacks.push(h1.expanding_bodies(16, 6 * MIB)),
        Kind::Everything => {
            attacks.push(h1.stalled_bodies(40, 6 * MIB, 5 * MIB));
            attacks.push(h2.stalled_streams(100, 6 * MIB, MIB).await);
            attacks.push(h1.expanding_bodies(16, 6 * MIB));
        }
    }
    // Let the attack land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let open_during = open_connections(metrics);
    let mut latencies_ms = Vec::new();
    for _ in 0..NORMAL_REVIEWS {
        if let Some((200, true, latency)) = good.normal_review(&review).await {
            latencies_ms.push(latency.as_secs_f64() * 1000.0);
        }
    }
    // After the idle timeout (and the body timeout, 10 s by default).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let peak = sampler.peak_kib().max(vm_kib(pid, "VmRSS")?);
    let open_after = open_connections(metrics);
    let page = http_get(metrics.port(), "/metrics", None)
        .map(|(_, body)| body)
        .unwrap_or_default();
    drop(attacks);
    for task in idle {
        task.abort();
    }
    // What the process keeps once the attacker has left.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = vm_kib(pid, "VmRSS")?;
    Ok(Row {
        kind,
        rest_mib: rest as f64 / 1024.0,
        peak_mib: peak as f64 / 1024.0,
        after_mib: after as f64 / 1024.0,
        open_during,
        open_after,
        latencies_ms,
        refusals: refusals(&page),
    })
}

fn open_connections(metrics: SocketAddr) -> f64 {
    http_get(metrics.port(), "/metrics", None)
        .ok()
        .and_then(|(_, page)| {
            metric(
                &page,
                r#"placement_webhook_connections_open{listener="admission"}"#,
            )
        })
        .unwrap_or(0.0)
}

/// The refusals counted by the webhook, `reason n` pairs.
fn refusals(page: &str) -> String {
    let mut out = Vec::new();
    for reason in ["memory_budget", "too_complex", "too_large", "body_timeout"] {
        let sample = format!(r#"placement_webhook_requests_rejected_total{{reason="{reason}"}}"#);
        if let Some(n) = metric(page, &sample).filter(|n| *n > 0.0) {
            out.push(format!("{reason} {n}"));
        }
    }
    for reason in ["limit", "peer_limit", "tls_handshake_timeout"] {
        let sample = format!(
            r#"placement_webhook_connections_refused_total{{listener="admission",reason="{reason}"}}"#
        );
        if let Some(n) = metric(page, &sample).filter(|n| *n > 0.0) {
            out.push(format!("connection {reason} {n}"));
        }
    }
    let evicted =
        r#"placement_webhook_connections_closed_total{listener="admission",reason="evicted"}"#;
    if let Some(n) = metric(page, evicted).filter(|n| *n > 0.0) {
        out.push(format!("connections evicted {n}"));
    }
    if out.is_empty() {
        "none".to_owned()
    } else {
        out.join(", ")
    }
}

fn write_section(rows: &[Row], report: &mut Report) {
    let mut md = String::new();
    md.push_str("## 6. Hostile clients\n\n");
    let _ = writeln!(
        md,
        "The release `placement-webhook` (embedded engine, shipped policies) with its default limits — \
         `--memory-budget=256Mi`, `--max-request-memory=64Mi`, `--max-request-bytes=6Mi`, `--max-connections` 1,024, \
         `--max-connections-per-peer` 256, `--max-http2-streams=32`, `--header-timeout=10s`, `--body-timeout=10s`, `--tls-handshake-timeout=5s` — except \
         `--idle-timeout={IDLE_TIMEOUT}` (default 120 s), a fresh process per attack. RSS is `VmRSS` at rest after one review, \
         its peak during the first 15 s of the attack (sampled every 20 ms), and 2 s after the attacker left. Connections are the webhook's \
         `connections_open` gauge 3 s into the attack and 15 s into it (after the idle and body timeouts); refusals are its \
         counters at 15 s. The attacker connects from 127.0.0.2 (the many-peer attack from 127.0.0.2 to 127.0.0.9). \
         Normal reviews: {NORMAL_REVIEWS} reviews of the 4 KB \
         EU/PCI ReplicaSet sent one after another during the attack from 127.0.0.1, each on a new HTTP/2 connection (TLS handshake included): \
         their answered share and latency are those of a well-behaved peer while the attacker holds all it can. \
         The same attacks, smaller, are the regression test `tests/e2e/hostile.rs`.\n"
    );
    md.push_str(
        "| attack | RSS at rest | peak RSS | RSS after | connections held (3 s / 15 s) | normal reviews passed | p50 / max | refused (webhook's counters) |\n\
         |---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for row in rows {
        let max = row.latencies_ms.iter().copied().fold(f64::NAN, f64::max);
        let _ = writeln!(
            md,
            "| {} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} / {:.0} | {}/{NORMAL_REVIEWS} | {} / {} | {} |",
            row.kind.label(),
            row.rest_mib,
            row.peak_mib,
            row.after_mib,
            row.open_during,
            row.open_after,
            row.latencies_ms.len(),
            fmt_ms(median(&row.latencies_ms)),
            fmt_ms(max),
            row.refusals,
        );
    }
    md.push_str(
        "\nAn HTTP/2 client respects the webhook's stream limit: of its 100 stalled streams 32 are open at a time (as many as \
         the budget's share for large reviews holds: 32 x 6 MiB), each cut at the body timeout, after which the next ones open; \
         the one connection stays busy, the memory it can hold stays bounded.\n\n\
         Before connection slots were shared per peer (issue 22), one peer opening idle TLS connections took every slot \
         (832 under an open-files limit of 1,024), and every other request, the API server's included, was refused at once \
         until they timed out. Before these limits (issue 11): 200 idle TLS connections were held 35 s and more (never closed), a body at \
         1 byte/s was waited for, 40 stalled 6 MiB bodies took the process from 50 MB to 346 MB, one HTTP/2 connection with \
         100 stalled streams to 830 MB (still held after the client left), 16 bodies of empty arrays to 1.27 GB.\n",
    );
    report.section(md);
    let worst = rows.iter().map(|r| r.peak_mib).fold(0.0, f64::max);
    let all_passed = rows.iter().all(|r| r.latencies_ms.len() == NORMAL_REVIEWS);
    report.target(
        "Hostile clients: memory bounded, normal reviews pass",
        format!(
            "peak RSS {worst:.0} MiB over all attacks (budget 256 MiB); normal reviews passed during every attack: {}",
            if all_passed { "yes" } else { "no" }
        ),
        Status::from_bool(all_passed && worst < 256.0 + 128.0),
    );
}
