//! Connection slots: each peer holds at most its share, makes room for
//! others, connections are retired by age, and probes and the API server
//! get through whatever other peers hold.

use super::*;

/// A connection's opening (its handshake and first request) lasts at most a
/// second, during which no newcomer takes it: waiting this long, silent
/// connections are idle.
const PAST_THE_OPENING: Duration = Duration::from_millis(1200);

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
