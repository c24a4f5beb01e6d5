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

use std::time::Duration;

use std::net::IpAddr;

use placement_tests::cgroup::MemoryCgroup;
use placement_tests::hostile::{
    Outcome, RssSampler, Target, limit_open_files, open_fds, placement_review,
    plain_idle_connections, probe, probes_answered, proc_status_kib,
};
use placement_tests::{
    ControlPlane, Identity, OpaServer, SidecarProcess, WebhookProcess, repo_root, scratch_dir,
    unique_name, wait_for,
};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_are_cut_off() {
    let webhook = webhook(&[
        "--tls-handshake-timeout=1s",
        "--header-timeout=2s",
        "--idle-timeout=2s",
        "--body-timeout=3s",
    ]);
    let target = target(&webhook, &[b"http/1.1"]);
    // Five times each timeout: generous, and far below "never".
    let give_up = Duration::from_secs(10);

    let idle = target.idle_connections(100, give_up);
    let no_handshake = target.no_handshake(give_up);
    let slow_headers = target.slow_headers(Duration::from_millis(300), give_up);
    let slow_body = target.slow_body(1000, Duration::from_millis(300), give_up);
    let (no_handshake, slow_headers, slow_body) =
        tokio::join!(no_handshake, slow_headers, slow_body);
    let idle = outcomes(idle).await;

    let still_open = idle.iter().filter(|o| o.closed_after.is_none()).count();
    assert_eq!(still_open, 0, "idle TLS connections left open: {idle:?}");
    let slowest = idle.iter().filter_map(|o| o.closed_after).max();
    eprintln!("100 idle connections closed; the last after {slowest:?} (--idle-timeout=2s)");
    assert!(
        no_handshake.closed_after.is_some(),
        "a connection that never starts TLS stays open: {no_handshake:?}"
    );
    assert!(
        slow_headers.closed_after.is_some(),
        "slow headers are waited for: {slow_headers:?}"
    );
    assert!(
        slow_body.closed_after.is_some(),
        "a body at ~3 bytes/s is waited for: {slow_body:?}"
    );
    assert_eq!(slow_body.status, Some(408), "{slow_body:?}");

    let page = webhook.metrics().await;
    let metric = |sample| placement_tests::webhook::metric_value(&page, sample);
    assert!(
        metric(r#"placement_webhook_connections_closed_total{listener="admission",reason="idle"}"#)
            >= 100.0,
        "{page}"
    );
    assert!(
        metric(
            r#"placement_webhook_connections_refused_total{listener="admission",reason="tls_handshake_timeout"}"#
        ) >= 1.0,
        "{page}"
    );
    assert!(
        metric(r#"placement_webhook_requests_rejected_total{reason="body_timeout"}"#) >= 1.0,
        "{page}"
    );
    assert_eq!(target.get("/healthz").await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_keep_memory_within_the_budget_and_normal_reviews_pass() {
    const BUDGET: usize = 64 * MIB;
    let webhook = webhook(&[
        "--memory-budget=64Mi",
        "--max-request-memory=48Mi",
        "--max-request-bytes=6Mi",
        // Long enough that the stalled bodies are held while memory is read.
        "--body-timeout=60s",
        "--idle-timeout=60s",
        "--max-http2-streams=16",
    ]);
    let h2 = target(&webhook, &[b"h2"]);
    // The attacker is another peer than the normal client (the API server).
    let h1 = target(&webhook, &[b"http/1.1"]).from_address(HOSTILE.into());
    let hostile_h2 = h2.from_address(HOSTILE.into());
    review_passes(&h2, "warm-up").await;
    let pid = webhook.pid();
    let baseline = proc_status_kib(pid, "VmRSS");
    let sampler = RssSampler::start(pid);

    // 16 complete 6 MiB bodies of empty arrays (about 30x when parsed).
    let expanding = h1.expanding_bodies(16, 6 * MIB);
    let expanding = expanding.outcomes(Duration::from_secs(30)).await;
    // 40 bodies declaring 6 MiB that stop after 5 MiB, and one HTTP/2
    // connection with 100 streams declaring 6 MiB that stop after 1 MiB.
    let bodies = h1.stalled_bodies(40, 6 * MIB, 5 * MIB);
    let streams = hostile_h2.stalled_streams(100, 6 * MIB, MIB).await;
    // Let the flood land, then ask as a normal client would.
    for _ in 0..100 {
        if bodies.finished() >= 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let latency = review_passes(&h2, "during-the-attack").await;
    let peak = sampler.peak_kib().max(proc_status_kib(pid, "VmRSS"));
    let grown_mib = peak.saturating_sub(baseline) / 1024;
    eprintln!(
        "baseline {} MiB, peak {} MiB (+{grown_mib} MiB; budget 64 MiB); a normal review took {latency:?} during the attack",
        baseline / 1024,
        peak / 1024
    );
    // The budget, plus slack for connection buffers and the allocator.
    let bound_mib = (BUDGET / MIB) as u64 + 64;
    assert!(
        grown_mib <= bound_mib,
        "resident memory grew by {grown_mib} MiB under attack (bound {bound_mib} MiB)"
    );

    let statuses: Vec<Option<u16>> = expanding
        .iter()
        .map(|o| o.as_ref().and_then(|o| o.status))
        .collect();
    assert!(
        statuses.iter().all(|s| matches!(s, Some(413 | 503))),
        "expanding bodies are refused (413 too complex, or 503 over budget): {statuses:?}"
    );
    let page = webhook.metrics().await;
    let metric = |sample| placement_tests::webhook::metric_value(&page, sample);
    assert!(
        metric(r#"placement_webhook_requests_rejected_total{reason="too_complex"}"#) >= 1.0,
        "{page}"
    );
    assert!(
        metric(r#"placement_webhook_requests_rejected_total{reason="memory_budget"}"#) >= 1.0,
        "{page}"
    );
    drop((bodies, streams, sampler));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_exhaustion_is_survived_and_counted() {
    let webhook = webhook(&[
        // Above the descriptors it will have, so accepts fail with EMFILE.
        "--max-connections=10000",
        "--idle-timeout=2s",
        "--tls-handshake-timeout=2s",
    ]);
    let target = target(&webhook, &[b"h2"]);
    review_passes(&target, "before").await;
    let pid = webhook.pid();
    let limit = open_fds(pid) as u64 + 32;
    limit_open_files(pid, limit);

    // More idle connections than descriptors left: the rest wait in the
    // kernel's queue, and without idle timeouts nothing would ever free them.
    let attack = target.idle_connections(120, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The attacker holds on far longer than this: only the webhook's own
    // timeouts can free the descriptors in time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
    let mut passed = None;
    let mut attempt = 0;
    while passed.is_none() && tokio::time::Instant::now() < deadline {
        attempt += 1;
        if let Some((200, true, latency)) = target
            .normal_review(&placement_review(&format!("during-{attempt}")))
            .await
        {
            passed = Some(latency);
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    assert!(
        passed.is_some(),
        "no review passed within 25 s of the descriptors running out:\n{}",
        webhook.log()
    );
    let page = webhook.metrics().await;
    let exhausted = placement_tests::webhook::metric_value(
        &page,
        r#"placement_webhook_accept_errors_total{listener="admission",reason="fd_exhausted"}"#,
    );
    assert!(
        exhausted >= 1.0,
        "descriptor exhaustion not counted:\n{page}"
    );
    let logged = webhook
        .log()
        .lines()
        .filter(|l| l.contains("open-files limit is reached"))
        .count();
    assert!(
        (1..=5).contains(&logged),
        "exhaustion logged {logged} times for {exhausted} failed accepts (rate-limited: once per 10 s)"
    );
    drop(outcomes(attack).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_builtin_call_stops_at_the_engine_memory_limit() {
    // One builtin call the evaluation timer cannot interrupt: a range of 10^8
    // numbers (about 2.4 GB before the limit existed).
    let dir = placement_tests::scratch_dir("huge-builtin");
    std::fs::write(
        dir.join("huge.rego"),
        "package io.k8s.federation.admission\n\nerrors := []\n\nannotations := {\"n\": sprintf(\"%d\", [count(numbers.range(1, 100000000))])}\n",
    )
    .unwrap();
    let webhook = WebhookProcess::start(&[
        format!("--policy-dir={}", dir.display()),
        "--engine-deadline=1s".to_owned(),
        "--engine-memory-limit=256Mi".to_owned(),
    ]);
    let target = target(&webhook, &[b"h2"]);
    let pid = webhook.pid();
    let baseline = proc_status_kib(pid, "VmRSS");
    let sampler = RssSampler::start(pid);
    let (status, allowed, _) = target
        .normal_review(&placement_review("huge"))
        .await
        .expect("an answer");
    assert_eq!(status, 200);
    assert!(!allowed, "fails closed: the policy exists");
    // The answer comes at the deadline; a builtin that kept running would
    // keep growing the process after it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown_mib = sampler.peak_kib().saturating_sub(baseline) / 1024;
    eprintln!("resident memory grew by {grown_mib} MiB (--engine-memory-limit=256Mi)");
    assert!(
        grown_mib <= 256,
        "the evaluation grew the process by {grown_mib} MiB past its 256 MiB limit"
    );
    let page = webhook.metrics().await;
    assert!(
        page.contains(r#"placement_webhook_engine_errors_total{kind="memory_limit"} 1"#),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_per_connection_are_capped() {
    let webhook = webhook(&["--max-http2-streams=8", "--body-timeout=30s"]);
    let target = target(&webhook, &[b"h2"]);
    // 100 streams on one connection, each declaring 1,000 bytes and stalling
    // after 500. Each review in progress holds its declared length of the
    // memory budget, so the budget in use counts the streams being served.
    let streams = target.stalled_streams(100, 1000, 500).await;
    let mut in_use = 0.0;
    for _ in 0..50 {
        in_use = webhook
            .metric("placement_webhook_memory_budget_used_bytes")
            .await;
        if in_use >= 8000.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give a client that ignored the limit time to open more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = webhook
        .metric("placement_webhook_memory_budget_used_bytes")
        .await;
    assert_eq!(
        (in_use, settled),
        (8000.0, 8000.0),
        "reviews in progress on one HTTP/2 connection, in bytes of 1,000 each"
    );
    drop(streams);
}

/// Another peer, as the webhook sees it: connections from this loopback
/// address.
const HOSTILE: [u8; 4] = [127, 0, 0, 2];

/// A connection's opening (its handshake and first request) lasts at most a
/// second, during which no newcomer takes it: waiting this long, silent
/// connections are idle.
const PAST_THE_OPENING: Duration = Duration::from_millis(1200);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_of_the_connections() {
    // A quarter of 40 per peer by default.
    let webhook = webhook(&["--max-connections=40", "--idle-timeout=60s"]);
    let ours = target(&webhook, &[b"h2"]);
    let hostile = ours.from_address(HOSTILE.into());

    let held = hostile.idle_connections(40, Duration::from_secs(30));
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_refused_total{listener="admission",reason="peer_limit"}"#,
        30.0,
    )
    .await;
    let page = webhook.metrics().await;
    let open = placement_tests::webhook::metric_value(
        &page,
        r#"placement_webhook_connections_open{listener="admission"}"#,
    );
    assert_eq!(
        open, 10.0,
        "the hostile peer holds more than its share:\n{page}"
    );
    for i in 0..20 {
        review_passes(&ours, &format!("beside-one-peer-{i}")).await;
    }
    assert_eq!(target(&webhook, &[b"h2"]).get("/readyz").await, Some(200));
    end(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_holding_every_slot_make_room_for_another() {
    let webhook = webhook(&[
        "--max-connections=40",
        "--max-connections-per-peer=10",
        "--idle-timeout=60s",
    ]);
    let ours = target(&webhook, &[b"h2"]);
    let attackers: Vec<Target> = (2..=5)
        .map(|last| ours.from_address([127, 0, 0, last].into()))
        .collect();
    let mut held = Vec::new();
    for attacker in &attackers {
        held.extend(attacker.idle_connections(10, Duration::from_secs(30)));
    }
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_open{listener="admission"}"#,
        40.0,
    )
    .await;
    tokio::time::sleep(PAST_THE_OPENING).await;

    // Every slot is taken: another peer's connection takes an idle one of
    // the largest holder.
    let mine = ours.idle_connections(1, Duration::from_secs(30));
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_closed_total{listener="admission",reason="evicted"}"#,
        1.0,
    )
    .await;
    // The attackers cannot win their slots back by reconnecting: refused at
    // once (an accepted idle connection would stay open for the 60 s idle
    // timeout).
    let again = outcomes(attackers[0].idle_connections(3, Duration::from_secs(5))).await;
    assert!(
        again.iter().all(|o| o.closed_after.is_some()),
        "an attacker won a slot back: {again:?}"
    );
    // And the other peer's reviews are answered, each on a connection of its
    // own while the attackers hold the rest.
    for i in 0..10 {
        review_passes(&ours, &format!("beside-many-peers-{i}")).await;
    }
    let page = webhook.metrics().await;
    let evicted = placement_tests::webhook::metric_value(
        &page,
        r#"placement_webhook_connections_closed_total{listener="admission",reason="evicted"}"#,
    );
    assert!(evicted >= 2.0, "{page}");
    end(held);
    end(mine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_retired_after_its_maximum_age() {
    let webhook = webhook(&["--max-connection-age=2s"]);
    let target = target(&webhook, &[b"http/1.1"]);
    // A client that sends a review every 250 ms never lets the connection
    // idle; at 2 s its next answer says `Connection: close`, and it ends.
    let answers = target
        .reviews_on_one_connection(&placement_review("aged"), 60, Duration::from_millis(250))
        .await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    let (last, before) = answers.split_last().expect("an answer");
    assert!(last.1, "the connection outlived its age: {answers:?}");
    assert!(
        before.len() >= 4 && before.iter().all(|(_, close)| !close),
        "retired before its age: {answers:?}"
    );
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_closed_total{listener="admission",reason="max_age"}"#,
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worst_mix_stays_under_the_containers_memory_limit() {
    // The chart's container limit; every memory limit of the webhook is left
    // to its defaults, which it derives from the cgroup's.
    let limit: u64 = 256 * MIB as u64;
    let cgroup = MemoryCgroup::create("webhook-memory", limit)
        .unwrap_or_else(|e| panic!("a memory cgroup for the webhook (the tests run as root): {e}"));
    let mut webhook = WebhookProcess::start_in(
        &[
            format!("--policy-dir={}", repo_root().join("policies").display()),
            "--idle-timeout=60s".to_owned(),
        ],
        &cgroup,
    );
    let ours = target(&webhook, &[b"h2"]);
    review_passes(&ours, "before").await;
    let log = webhook.log();
    assert!(
        log.contains(&format!("container_memory_limit={limit}"))
            && log.contains(&format!("memory_budget={}", 96 * MIB))
            && log.contains("max_connections=341"),
        "the limits in force are not derived from the cgroup's:\n{log}"
    );

    let h1 = Target::new(webhook.admission_addr, &webhook.ca_pem, &[b"http/1.1"])
        .from_address(HOSTILE.into());
    let h2 = ours.from_address(HOSTILE.into());
    let attacks = vec![
        h1.stalled_bodies(40, 6 * MIB, 5 * MIB),
        h2.stalled_streams(100, 6 * MIB, MIB).await,
        h1.expanding_bodies(16, 6 * MIB),
    ];
    // And every connection slot the other peers can take.
    let mut idle = Vec::new();
    for last in 3..=6 {
        idle.extend(
            ours.from_address([127, 0, 0, last].into())
                .idle_connections(85, Duration::from_secs(60)),
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..10 {
        review_passes(&ours, &format!("under-the-worst-mix-{i}")).await;
    }
    // Past the body timeout (10 s): every stalled body was held as long as
    // it can be.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_peak = proc_status_kib(webhook.pid(), "VmHWM") * 1024;
    let peak = cgroup.peak();
    eprintln!(
        "under a {limit}-byte limit: peak RSS {rss_peak}, cgroup peak {peak:?} (page cache included)"
    );
    assert!(webhook.is_running(), "the webhook died:\n{}", webhook.log());
    assert_eq!(
        cgroup.oom_kills(),
        0,
        "the kernel killed the webhook for memory"
    );
    assert!(rss_peak < limit, "peak RSS {rss_peak} reached the limit");
    review_passes(&ours, "after").await;
    drop(attacks);
    end(idle);
    drop(webhook);
}

/// Waits (at most 20 s) until process `pid` holds at least `fds` open
/// descriptors: the connections of an attack accepted (refused ones are
/// closed at once).
async fn descriptors_reach(pid: u32, fds: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while open_fds(pid) < fds {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} descriptors open, waiting for {fds}",
            open_fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `count` normal reviews from 127.0.0.1, one after another: how many were
/// answered 200 and allowed, and the statuses of the others.
async fn reviews_answered(target: &Target, prefix: &str, count: usize) -> (usize, Vec<u16>) {
    let mut answered = 0;
    let mut others = Vec::new();
    for i in 0..count {
        match target
            .normal_review(&placement_review(&format!("{prefix}-{i}")))
            .await
        {
            Some((200, true, _)) => answered += 1,
            Some((status, _, _)) => others.push(status),
            None => others.push(0),
        }
    }
    (answered, others)
}

/// Bodies declared and never sent hold no memory (issue 30, part 1). With
/// the chart's budget (96 MiB), one peer's 100 requests declaring 1 MiB each
/// and sending nothing used to take it all before a byte arrived: every
/// other review got 503 until the body timeout. Now only what arrives is
/// charged, from one peer or from several.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_declared_and_never_sent_deny_no_review() {
    let webhook = webhook(&[
        "--memory-budget=96Mi",
        "--body-timeout=60s",
        "--idle-timeout=60s",
    ]);
    let ours = target(&webhook, &[b"h2"]);
    let h1 = target(&webhook, &[b"http/1.1"]);
    review_passes(&ours, "before").await;
    for (label, peers) in [("one peer", 1u8), ("four peers", 4)] {
        let per_peer = 100 / usize::from(peers);
        let attacks: Vec<_> = (0..peers)
            .map(|n| {
                h1.from_address([127, 0, 0, 2 + n].into())
                    .stalled_bodies(per_peer, MIB, 0)
            })
            .collect();
        metric_reaches(
            &webhook,
            r#"placement_webhook_connections_open{listener="admission"}"#,
            100.0,
        )
        .await;
        // The heads follow the handshakes at once; give them a moment to land.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (answered, others) = reviews_answered(&ours, label, 10).await;
        let used = webhook
            .metric("placement_webhook_memory_budget_used_bytes")
            .await;
        assert_eq!(
            answered, 10,
            "{label}: 100 bodies declaring 1 MiB, none sent: other statuses {others:?}, budget in use {used}"
        );
        drop(attacks);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// No peer holds more than its share of the memory budget (issue 30, part
/// 1): one peer sending most of 100 bodies of 1 MiB (90 MiB that arrive, more
/// than the 64 MiB budget) holds three quarters of it at most, and another
/// peer's reviews pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_of_the_memory_budget() {
    const BUDGET: f64 = 64.0 * MIB as f64;
    let webhook = webhook(&[
        "--memory-budget=64Mi",
        "--max-request-memory=48Mi",
        "--body-timeout=60s",
        "--idle-timeout=60s",
    ]);
    let ours = target(&webhook, &[b"h2"]);
    let hostile = target(&webhook, &[b"http/1.1"]).from_address(HOSTILE.into());
    review_passes(&ours, "before").await;
    let flood = hostile.stalled_bodies(100, MIB, 900 * 1024);
    // The flood lands: its charges stop growing at the peer's share.
    let mut used = 0.0;
    for _ in 0..100 {
        used = webhook
            .metric("placement_webhook_memory_budget_used_bytes")
            .await;
        if flood.finished() >= 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (answered, others) = reviews_answered(&ours, "beside-a-flood", 10).await;
    assert_eq!(
        answered, 10,
        "beside one peer's 90 MiB: other statuses {others:?}, budget in use {used}"
    );
    let page = webhook.metrics().await;
    let used =
        placement_tests::webhook::metric_value(&page, "placement_webhook_memory_budget_used_bytes");
    assert!(
        used <= BUDGET * 0.75,
        "one peer holds {used} of {BUDGET} bytes:\n{page}"
    );
    assert!(
        placement_tests::webhook::metric_value(
            &page,
            r#"placement_webhook_requests_rejected_total{reason="peer_memory_share"}"#
        ) >= 1.0,
        "{page}"
    );
    drop(flood);
}

/// Where probes come from in these tests: another address than the attackers'
/// and the well-behaved review client's, as the kubelet is.
const KUBELET: [u8; 4] = [127, 0, 2, 1];

/// `peers` addresses (127.0.1.10 and up) each holding one idle connection to
/// `addr`.
fn one_idle_connection_each(
    addr: std::net::SocketAddr,
    peers: u8,
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    (0..peers)
        .flat_map(|n| {
            plain_idle_connections(
                addr,
                [127, 0, 1, 10 + n].into(),
                1,
                Duration::from_secs(120),
            )
        })
        .collect()
}

/// Probes are answered whatever other peers hold (issue 30, part 2): 70
/// addresses each holding one idle keep-alive connection take every slot of
/// the metrics listener (64), where the liveness probe goes; a newcomer used
/// to be reset, since no peer held two more than it. The kubelet's probe is
/// answered now, and so is the readiness probe on the admission port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_whatever_other_peers_hold() {
    let webhook = webhook(&["--idle-timeout=120s"]);
    let pid = webhook.pid();
    let baseline = open_fds(pid);
    let held = one_idle_connection_each(webhook.metrics_addr, 70);
    descriptors_reach(pid, baseline + 64).await;
    let kubelet = IpAddr::from(KUBELET);
    let answered = probes_answered(webhook.metrics_addr, kubelet, "/healthz", 5).await;
    assert_eq!(answered, 5, "liveness probes answered beside 70 idle peers");
    // Only probes are answered beyond the slots: a scrape waits for one.
    let scrape = probe(webhook.metrics_addr, kubelet, "/metrics").await;
    assert_ne!(scrape, Some(200), "a scrape beyond the slots");
    end(held);
}

/// The same on placement-sync's port (its probes, and in OPA pods the
/// webhook's `/engine/revisions` from loopback): 70 peers holding one idle
/// connection each lock out neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_the_revisions_reader_get_through_to_placement_sync() {
    placement_tests::install_crypto();
    let plane = ControlPlane::shared();
    let opa = OpaServer::start();
    let sidecar = SidecarProcess::start(plane, &opa, &["--remediation=off"]);
    sidecar.wait_ready(Duration::from_secs(60)).await;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], sidecar.port).into();
    let pid = sidecar.pid();
    let baseline = open_fds(pid);
    let held = one_idle_connection_each(addr, 70);
    descriptors_reach(pid, baseline + 64).await;
    // The reader takes an idle connection, once they are past their opening.
    tokio::time::sleep(PAST_THE_OPENING).await;
    let kubelet = IpAddr::from(KUBELET);
    for path in ["/healthz", "/readyz"] {
        let answered = probes_answered(addr, kubelet, path, 5).await;
        assert_eq!(answered, 5, "{path} probes answered beside 70 idle peers");
    }
    // The webhook in the pod reads the revisions from loopback.
    let reader = probe(
        addr,
        IpAddr::from([127, 0, 0, 1]),
        "/engine/revisions?reader=webhook-1",
    )
    .await;
    assert_eq!(
        reader,
        Some(200),
        "the revisions reader beside 70 idle peers"
    );
    end(held);
}

/// An API server that presents a verified client certificate is never
/// refused for being one peer with many connections (issue 30, part 2):
/// beyond the share of one peer (10 of 40) and past a listener that other
/// peers have filled with one connection each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_api_server_is_never_refused_for_its_many_connections() {
    let dir = scratch_dir("verified-peer");
    placement_tests::pki::client_pki(&dir, "apiserver", "kube-apiserver");
    let webhook = webhook(&[
        &format!(
            "--client-ca-file={}",
            dir.join("apiserver-ca.crt").display()
        ),
        "--max-connections=40",
        "--max-connections-per-peer=10",
        "--idle-timeout=120s",
    ]);
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let apiserver = Target::with_client_certificate(
        webhook.admission_addr,
        &webhook.ca_pem,
        &[b"h2"],
        &read("apiserver.crt"),
        &read("apiserver.key"),
    );
    let unverified = target(&webhook, &[b"h2"]);
    // 30 other peers, one idle connection each.
    let mut others = Vec::new();
    for n in 0..30u8 {
        others.extend(
            unverified
                .from_address([127, 0, 3, 10 + n].into())
                .idle_connections(1, Duration::from_secs(120)),
        );
    }
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_open{listener="admission"}"#,
        30.0,
    )
    .await;
    tokio::time::sleep(PAST_THE_OPENING).await;
    // The API server: a connection that has shown its certificate (a
    // review), then 29 more at once, held: those beyond its peer's share or
    // the listener's slots show their certificates beyond the slots, then
    // take other peers' idle connections.
    let (status, first) = apiserver
        .review_and_hold(&placement_review("first"))
        .await
        .expect("the API server's first review");
    assert_eq!(status, 200);
    let many = apiserver.idle_connections(29, Duration::from_secs(10));
    let answer = apiserver
        .normal_review(&placement_review("many-connections"))
        .await;
    assert!(
        matches!(answer, Some((200, true, _))),
        "a review beside them: {answer:?}\n{}",
        webhook.metrics().await
    );
    let outcomes = outcomes(many).await;
    let cut = outcomes.iter().filter(|o| o.closed_after.is_some()).count();
    assert_eq!(
        cut,
        0,
        "API server connections refused or cut: {outcomes:?}\n{}",
        webhook.log()
    );
    let page = webhook.metrics().await;
    assert!(
        placement_tests::webhook::metric_value(
            &page,
            r#"placement_webhook_connections_closed_total{listener="admission",reason="evicted"}"#
        ) >= 19.0,
        "the other peers' idle connections made room:\n{page}"
    );
    drop(first);
    end(others);
}

/// A denied review as the API server sends it (not a dry run): an invalid PCI
/// level.
fn denied_review(namespace: &str, name: &str) -> Vec<u8> {
    let mut review = placement_review(name);
    review["request"]["dryRun"] = false.into();
    review["request"]["namespace"] = namespace.into();
    review["request"]["object"]["metadata"]["namespace"] = namespace.into();
    review["request"]["object"]["metadata"]["annotations"]["policy.federation.alpha.kubernetes.io/pci-compliance-level"] =
        "high".into();
    serde_json::to_vec(&review).unwrap()
}

/// One caller's Events leave the others' budget alone (issue 30, part 7):
/// without a client CA any caller of /mutate could spend the Event budget
/// the API server's Events share. A caller flooding denied reviews gets its
/// own budget's worth; the API server's denial still gets its Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_events_leave_the_others_alone() {
    let plane = ControlPlane::shared();
    let ns = unique_name("event-callers");
    plane.create_namespace(&ns);
    let webhook = webhook(&[
        &format!(
            "--kubeconfig={}",
            plane.kubeconfig(Identity::Webhook).display()
        ),
        "--event-rate=1",
        "--event-burst=3",
        "--event-dedupe-window=1h",
    ]);
    let apiserver = target(&webhook, &[b"http/1.1"]);
    let hostile = apiserver.from_address(HOSTILE.into());
    let started = std::time::Instant::now();
    // The flood goes on while the API server's review comes.
    let flood = tokio::spawn({
        let (hostile, ns) = (hostile.clone(), ns.clone());
        async move {
            for i in 0.. {
                hostile
                    .post_http1(&denied_review(&ns, &format!("spam-{i}")))
                    .await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        apiserver.post_http1(&denied_review(&ns, "real")).await,
        Some(200)
    );
    let events = || -> Vec<serde_json::Value> {
        let list: serde_json::Value = serde_json::from_str(&plane.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            &ns,
            "-o",
            "json",
        ]))
        .unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    };
    let about = |events: &[serde_json::Value], name: &str| {
        events
            .iter()
            .filter(|e| e["regarding"]["name"] == name)
            .count()
    };
    wait_for(
        "the API server's denial to get its Event",
        Duration::from_secs(20),
        || (about(&events(), "real") == 1).then_some(()),
    );
    flood.abort();
    let elapsed = started.elapsed().as_secs_f64();
    let spam = events()
        .iter()
        .filter(|e| {
            e["regarding"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("spam-"))
        })
        .count();
    // Its own burst of 3 and one more per second.
    assert!(
        (spam as f64) <= 3.0 + elapsed.ceil() + 1.0,
        "the flooding caller got {spam} Events in {elapsed:.1} s"
    );
}

/// An HTTPS probe of `path` from `source` (a new TLS connection, as the
/// kubelet's readiness probe makes one), answered within 5 s: the status.
async fn https_probe(webhook: &WebhookProcess, source: IpAddr, path: &str) -> Option<u16> {
    let kubelet = target(webhook, &[b"h2"]).from_address(source);
    tokio::time::timeout(Duration::from_secs(5), kubelet.get(path))
        .await
        .ok()
        .flatten()
}

/// Handshake churn beside busy slots leaves the probes answered (issue 39):
/// peers holding every slot of the admission port with slow bodies (busy,
/// so none is taken), and a few peers reconnecting as fast as the server
/// closes them, used to take the kubelet's connection (among the slots
/// kept for probes, counted idle while its TLS handshake ran) before its
/// GET. A connection is idle now only after its handshake and first
/// request window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_churn_beside_busy_slots_leaves_the_probes_answered() {
    let webhook = webhook(&[
        "--max-connections=8",
        "--max-connections-per-peer=2",
        "--body-timeout=120s",
        "--idle-timeout=120s",
    ]);
    let h1 = target(&webhook, &[b"http/1.1"]);
    // Every slot busy: four peers, two slow bodies each.
    let busy: Vec<_> = (2..=5)
        .map(|last| {
            h1.from_address([127, 0, 0, last].into())
                .stalled_bodies(2, MIB, 1024)
        })
        .collect();
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_open{listener="admission"}"#,
        8.0,
    )
    .await;
    // Eight peers, ten connections each, opened again as soon as they close.
    let churn: Vec<_> = (0..8u8)
        .map(|n| {
            placement_tests::hostile::held_plain_connections(
                webhook.admission_addr,
                [127, 0, 4, 10 + n].into(),
                10,
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut answered = 0;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let status = https_probe(&webhook, KUBELET.into(), "/healthz").await;
        answered += usize::from(status == Some(200));
        statuses.push(status);
    }
    assert_eq!(
        answered,
        10,
        "readiness probes beside handshake churn: {statuses:?}\n{}",
        webhook.metrics().await
    );
    drop((busy, churn));
}

/// Trust belongs to a connection, never to its address (issue 39): beside
/// the API server's verified connection, unverified connections from its
/// address keep to the peer's share (10 of 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unverified_connections_inherit_no_trust_from_their_address() {
    let dir = scratch_dir("trust-by-address");
    placement_tests::pki::client_pki(&dir, "apiserver", "kube-apiserver");
    let webhook = webhook(&[
        &format!(
            "--client-ca-file={}",
            dir.join("apiserver-ca.crt").display()
        ),
        "--max-connections=40",
        "--max-connections-per-peer=10",
        "--idle-timeout=120s",
    ]);
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let apiserver = Target::with_client_certificate(
        webhook.admission_addr,
        &webhook.ca_pem,
        &[b"h2"],
        &read("apiserver.crt"),
        &read("apiserver.key"),
    )
    .from_address([127, 0, 0, 1].into());
    let (status, held) = apiserver
        .review_and_hold(&placement_review("verified"))
        .await
        .expect("the API server's review");
    assert_eq!(status, 200);
    // Twenty unverified connections from the same address.
    let unverified = target(&webhook, &[b"h2"])
        .from_address([127, 0, 0, 1].into())
        .idle_connections(20, Duration::from_secs(30));
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_open{listener="admission"}"#,
        11.0,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let page = webhook.metrics().await;
    let open = placement_tests::webhook::metric_value(
        &page,
        r#"placement_webhook_connections_open{listener="admission"}"#,
    );
    assert_eq!(
        open, 11.0,
        "the verified connection and the peer's share of 10:\n{page}"
    );
    drop(held);
    end(unverified);
}

/// The API server is recognised by its certificate, not its address (issue
/// 39): pods sharing its peer (its address here; its IPv6 /64 in a cluster)
/// hold that peer's share, and the API server's reviews still pass, each on
/// a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_is_recognised_by_its_certificate_beside_pods_of_its_peer() {
    let dir = scratch_dir("recognised-by-certificate");
    placement_tests::pki::client_pki(&dir, "apiserver", "kube-apiserver");
    let webhook = webhook(&[
        &format!(
            "--client-ca-file={}",
            dir.join("apiserver-ca.crt").display()
        ),
        "--max-connections=40",
        "--max-connections-per-peer=10",
        "--idle-timeout=120s",
    ]);
    let shared: IpAddr = [127, 0, 0, 7].into();
    let pods = target(&webhook, &[b"h2"])
        .from_address(shared)
        .idle_connections(10, Duration::from_secs(60));
    metric_reaches(
        &webhook,
        r#"placement_webhook_connections_open{listener="admission"}"#,
        10.0,
    )
    .await;
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let apiserver = Target::with_client_certificate(
        webhook.admission_addr,
        &webhook.ca_pem,
        &[b"h2"],
        &read("apiserver.crt"),
        &read("apiserver.key"),
    )
    .from_address(shared);
    for i in 0..5 {
        let answer = apiserver
            .normal_review(&placement_review(&format!("beside-pods-{i}")))
            .await;
        assert!(
            matches!(answer, Some((200, true, _))),
            "the API server's review {i} beside pods holding its peer's share: {answer:?}\n{}",
            webhook.metrics().await
        );
    }
    end(pods);
}
