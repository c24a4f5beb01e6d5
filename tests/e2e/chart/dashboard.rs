//! The shipped dashboard queries only metrics the binaries export.

use super::*;

/// The metric names a Prometheus query names: `placement_webhook_*` and
/// `placement_sync_*`, as their families are named (no `_total`,
/// `_bucket`, `_sum`, `_count`).
fn queried_metrics(expr: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("placement_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if name.starts_with("placement_webhook_") || name.starts_with("placement_sync_") {
            let family = ["_bucket", "_sum", "_count", "_total", "_created"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            names.insert(family.to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The metric families a `/metrics` page exports (its `# TYPE` lines).
fn exported_metrics(page: &str) -> std::collections::BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The dashboard is off by default; on, it is a ConfigMap labelled for
/// Grafana's dashboard sidecar, with its rows, and every metric its queries
/// name is one a running placement-webhook or placement-sync exports
/// (scraped from both on the test bed: the embedded engine's webhook, for
/// its decision memory, and placement-sync beside OPA).
#[test]
fn the_dashboard_queries_only_metrics_the_binaries_export() {
    assert!(
        of_kind(&render(&[]), "ConfigMap")
            .iter()
            .all(|cm| cm["metadata"]["name"] != "placement-policy-dashboard"),
        "the dashboard is off by default"
    );
    let docs = render(&[
        "dashboard.enabled=true",
        "dashboard.annotations.grafana_folder=placement-policy",
    ]);
    let cm = named(&docs, "ConfigMap", "placement-policy-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1", "{cm}");
    assert_eq!(
        cm["metadata"]["annotations"]["grafana_folder"],
        "placement-policy"
    );
    let dashboard: Value = serde_json::from_str(
        cm["data"]["placement-policy.json"]
            .as_str()
            .expect("the dashboard's JSON"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Admissions",
            "Decision memory",
            "Engine sync and policy status",
            "Held changes",
            "Reconcile passes and writes",
            "Karmada and Open Cluster Management",
        ]
    );
    let queried: std::collections::BTreeSet<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(queried_metrics))
        .flatten()
        .collect();
    assert!(queried.len() > 20, "{queried:?}");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    placement_tests::install_crypto();
    let plane = ControlPlane::start();
    let opa = placement_tests::OpaServer::start();
    plane.ensure_example_clusters();
    let sidecar = placement_tests::SidecarProcess::start(
        &plane,
        &opa,
        &["--replicate-cluster=placement-policy.io/v1alpha1/clusters"],
    );
    // The embedded engine's webhook (its decision memory), refusing a review
    // too large; and one whose engine cannot be reached (its engine errors).
    let webhook = placement_tests::WebhookProcess::start(&[
        format!("--policy-dir={}", repo_root().join("policies").display()),
        "--max-request-bytes=64Ki".to_owned(),
    ]);
    let unreachable = placement_tests::WebhookProcess::start(&[
        "--opa-url=http://127.0.0.1:9".to_owned(),
        "--engine-deadline=1s".to_owned(),
    ]);
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "dashboard", "operation": "CREATE", "namespace": "default", "name": "web",
            "kind": {"group": "apps", "version": "v1", "kind": "ReplicaSet"},
            "resource": {"group": "apps", "version": "v1", "resource": "replicasets"},
            "userInfo": {"username": "dashboard-test"}, "dryRun": true,
            "object": {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": "web", "namespace": "default", "annotations": {
                    "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"}},
                "spec": {"replicas": 1}},
        }
    });
    let (exported, webhook_page) = runtime.block_on(async {
        sidecar.wait_ready(std::time::Duration::from_secs(60)).await;
        for target in [&webhook, &unreachable] {
            let answer = target
                .https_client()
                .post(target.url("/mutate"))
                .json(&review)
                .send()
                .await
                .expect("a review");
            assert!(answer.status().is_success(), "{answer:?}");
        }
        let too_large = webhook
            .https_client()
            .post(webhook.url("/mutate"))
            .header("content-type", "application/json")
            .body(vec![b' '; 128 * 1024])
            .send()
            .await
            .expect("a review too large");
        assert_eq!(too_large.status().as_u16(), 413);
        let (_, sync_page) = sidecar.get("/metrics").await;
        let mut pages = vec![sync_page];
        for target in [&webhook, &unreachable] {
            pages.push(
                reqwest::get(format!("http://{}/metrics", target.metrics_addr))
                    .await
                    .expect("the webhook's metrics")
                    .text()
                    .await
                    .unwrap(),
            );
        }
        (
            pages
                .iter()
                .flat_map(|page| exported_metrics(page))
                .collect::<std::collections::BTreeSet<_>>(),
            pages[1].clone(),
        )
    });
    assert!(
        exported.contains("placement_webhook_decision_cache_hits")
            && exported.contains("placement_sync_binding_schedules"),
        "{exported:?}\n{webhook_page}"
    );
    // The check itself tells a name that is not exported.
    assert!(!exported.contains("placement_sync_no_such_metric"));
    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no binary exports: {missing:?}"
    );
}
