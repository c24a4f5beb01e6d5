//! Serving: the review command, certificate files reloaded when they
//! change, and a stopping webhook closing kept-alive connections.

use super::*;

#[test]
fn review_command_prints_the_placed_object() {
    let output = std::process::Command::new(project_bin("placement-webhook"))
        .current_dir(repo_root())
        .args(["review", "-o", "json", "examples/replicaset-eu-pci.yaml"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["review"]["response"]["allowed"], true);
    assert_eq!(
        placed_clusters(&out["object"]),
        vec!["gce-europe-west1", "gce-europe-west2"]
    );

    let output = std::process::Command::new(project_bin("placement-webhook"))
        .current_dir(repo_root())
        .args(["review", "examples/replicaset-forbidden.yaml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "denials exit 3");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("includes invalid clusters: gce-us-central1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_certificate_files_are_reloaded_when_they_change() {
    let webhook = embedded_webhook(&[]);
    let old_client = webhook.https_client();
    assert!(old_client.get(webhook.url("/healthz")).send().await.is_ok());

    // Rotate: a new CA and certificate written over the files the webhook serves.
    let rotated =
        placement_certs::generate_to_dir(&webhook.dir.join("certs"), &["127.0.0.1".into()])
            .unwrap();
    let new_ca = std::fs::read_to_string(&rotated.ca).unwrap();
    let new_client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(new_ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let mut served_new = false;
    for _ in 0..100 {
        if new_client.get(webhook.url("/healthz")).send().await.is_ok() {
            served_new = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        served_new,
        "the rotated certificate is served within 10 s:\n{}",
        webhook.log()
    );
    // A fresh connection trusting only the old CA no longer verifies.
    let fresh_old = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(webhook.ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    assert!(fresh_old.get(webhook.url("/healthz")).send().await.is_err());
}

/// kube-apiserver calls webhooks over kept-alive HTTP/1.1 connections and
/// retries no admission call: a connection the webhook closes while the API
/// server is reusing it fails that write with `EOF` (seen in the operations
/// suite while a webhook pod was replaced). From SIGTERM on, the webhook
/// announces every close in the response before it (`Connection: close`) and
/// serves every request on a connection it has not announced closing.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_webhook_announces_each_close_to_kept_alive_clients() {
    use http_body_util::BodyExt as _;
    use hyper_util::rt::TokioIo;

    let webhook = embedded_webhook(&["--shutdown-delay=3s"]);
    let target = placement_tests::hostile::Target::new(
        webhook.admission_addr,
        &webhook.ca_pem,
        &[b"http/1.1"],
    );
    let stream = target.connect().await.expect("TLS connection");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    let driver = tokio::spawn(connection);
    let review = placement_tests::hostile::placement_review("keep-alive");
    let body = bytes::Bytes::from(serde_json::to_vec(&review).unwrap());
    let mut signalled = None;
    for i in 0..60 {
        if i == 3 {
            // SAFETY: kill(2) on the child's pid has no memory effects.
            unsafe { libc::kill(webhook.pid() as libc::pid_t, libc::SIGTERM) };
            signalled = Some(std::time::Instant::now());
        }
        sender.ready().await.unwrap_or_else(|e| {
            panic!(
                "request {i}: the webhook closed a kept-alive connection without announcing it ({e}); \
                 a client reusing it would fail with EOF"
            )
        });
        let request = hyper::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(body.clone()))
            .unwrap();
        let response = sender
            .send_request(request)
            .await
            .unwrap_or_else(|e| panic!("request {i} on a kept-alive connection failed: {e}"));
        let status = response.status();
        let closes = response
            .headers()
            .get(hyper::header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let answer = response.into_body().collect().await.expect("response body");
        assert_eq!(status, 200, "request {i}: {:?}", answer.to_bytes());
        if closes {
            let after = signalled.map(|at| at.elapsed());
            assert!(
                after.is_some(),
                "request {i}: the webhook closed a connection before it was asked to stop"
            );
            eprintln!("the close was announced {after:?} after SIGTERM (request {i})");
            // The connection ends after the announced close.
            tokio::time::timeout(std::time::Duration::from_secs(5), driver)
                .await
                .expect("the connection ends after the announced close")
                .expect("connection task")
                .expect("the connection ends cleanly");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("60 requests on one connection and no close announced after SIGTERM");
}
