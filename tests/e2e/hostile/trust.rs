//! Trust is by certificate, never by address: one caller's Events leave the
//! others alone, and the API server is recognised by its certificate.

use super::*;

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
