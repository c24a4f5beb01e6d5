//! The embedded engine's memory ceiling. It is process-wide (regorus counts
//! the allocations of every thread), so this test has a process of its own:
//! beside other tests, their evaluations failed with `MemoryLimit` while the
//! ceiling was set and this one's builtin had allocated gigabytes.

use std::time::Duration;

use policy_client::embedded::{Embedded, set_memory_limit};
use policy_client::engine::{EngineError, PolicyEngine};
use serde_json::json;
use tokio::time::Instant;

#[tokio::test]
async fn memory_limit_stops_a_huge_builtin_call() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "huge.rego",
            "package huge\n\nn := count(numbers.range(1, 100000000))\n",
        )
        .await
        .unwrap();
    set_memory_limit(Some(256 << 20));
    let out = engine
        .query(
            "huge/n",
            &json!({}),
            Instant::now() + Duration::from_secs(1),
        )
        .await;
    set_memory_limit(None);
    // Without the ceiling the builtin runs past the deadline (one call
    // cannot be interrupted by the timer) and the query times out.
    assert!(matches!(out, Err(EngineError::MemoryLimit(_))), "{out:?}");
}
