//! What an OPA server holds and has been asked, read the same way for every
//! contender: objects counted by a query (never by fetching a document of
//! 100,000 objects), policy modules by id, decision queries from its own
//! request counters.

use anyhow::{Context, Result, ensure};
use placement_tests::OpaServer;
use serde_json::{Value, json};

use crate::common::{http_get, http_post, metric_sum};

/// How many objects OPA holds under `data.<root>.<resource>.<namespace>` (0 when
/// that document does not exist).
pub(crate) fn count_objects(
    opa: &OpaServer,
    root: &str,
    resource: &str,
    namespace: &str,
) -> Result<usize> {
    // A reference, not `object.get(data, ...)`: that materialises all of
    // `data` on every call (about 2 s at 100,000 objects), holding OPA's read
    // transaction, so that the contender's next write waited for the probe.
    // An undefined reference (nothing there yet) has no result: 0.
    let query = json!({
        "query": format!("n := count(data[{root:?}][{resource:?}][{namespace:?}])")
    });
    let (status, body) = http_post(opa.port, "/v1/query", Some(opa.token()), &query.to_string())?;
    ensure!(status == 200, "OPA /v1/query: HTTP {status}: {body}");
    let doc: Value =
        serde_json::from_str(&body).with_context(|| format!("OPA /v1/query: {body}"))?;
    Ok(doc["result"][0]["n"].as_u64().unwrap_or(0) as usize)
}

/// The ids of the policy modules OPA holds that start with `prefix` (placement-sync
/// and kube-mgmt both name a module `<namespace>/<configmap>/<key>`).
pub(crate) fn policy_ids(opa: &OpaServer, prefix: &str) -> Result<Vec<String>> {
    let (status, body) = http_get(opa.port, "/v1/policies", Some(opa.token()))?;
    ensure!(status == 200, "OPA /v1/policies: HTTP {status}: {body}");
    let doc: Value = serde_json::from_str(&body).context("OPA /v1/policies")?;
    Ok(doc["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_str())
        .filter(|id| id.starts_with(prefix))
        .map(str::to_owned)
        .collect())
}

/// Decision queries OPA has answered so far: its `POST /v1/data/...` requests,
/// whatever their status. Writes of replicated data and policies are `PUT`,
/// `PATCH` and `DELETE`, restart checks `GET`, so on an OPA that only one
/// sidecar talks to, these are that sidecar's decision queries.
pub(crate) fn decision_queries(opa: &OpaServer) -> Result<f64> {
    let (status, body) = http_get(opa.port, "/metrics", Some(opa.token()))?;
    ensure!(status == 200, "OPA /metrics: HTTP {status}");
    Ok(metric_sum(
        &body,
        "http_request_duration_seconds_count",
        &[r#"handler="v1/data""#, r#"method="post""#],
    ))
}
