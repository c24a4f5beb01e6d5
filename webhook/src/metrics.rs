//! Prometheus metrics of the webhook.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use placement_endpoint::ListenerMetrics;
use policy_client::engine::PolicyEngine;
use policy_client::engine_metrics::EngineCollector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// How a review ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Allowed with a patch.
    Patched,
    /// Allowed; the object already carried its placement.
    Unchanged,
    /// Denied by the policy's `errors`.
    Denied,
    /// An UPDATE allowed although the policy reports errors, because the old
    /// object had the same ones (it adds no violation); with a warning.
    Tolerated,
    /// No decision, denied because policies exist.
    FailedClosed,
    /// No decision, admitted because no policy exists.
    FailedOpen,
    /// Not evaluated (DELETE, CONNECT, subresources).
    Skipped,
    /// The review itself was malformed.
    Malformed,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Patched => "patched",
            Outcome::Unchanged => "unchanged",
            Outcome::Denied => "denied",
            Outcome::Tolerated => "tolerated",
            Outcome::FailedClosed => "failed_closed",
            Outcome::FailedOpen => "failed_open",
            Outcome::Skipped => "skipped",
            Outcome::Malformed => "malformed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<OperationLabels, Histogram>,
    engine_errors: Family<KindLabels, Counter>,
    events_failed: Counter,
    events_published: Counter,
    events_dropped: Family<ReasonLabels, Counter>,
    listeners: ListenerMetrics,
    requests_rejected: Family<ReasonLabels, Counter>,
    memory_budget_used: Gauge,
    memory_budget_total: Gauge,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("placement_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "AdmissionReviews answered, by operation and outcome",
            requests.clone(),
        );
        let duration = Family::<OperationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ])
        });
        registry.register(
            "admission_duration_seconds",
            "Time to answer an AdmissionReview, engine retries included",
            duration.clone(),
        );
        let engine_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "engine_errors",
            "Policy engine failures after retries, by kind",
            engine_errors.clone(),
        );
        let events_failed = Counter::default();
        registry.register(
            "events_failed",
            "Kubernetes Events that could not be published",
            events_failed.clone(),
        );
        let events_published = Counter::default();
        registry.register(
            "events_published",
            "Kubernetes Events published",
            events_published.clone(),
        );
        let events_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "events_dropped",
            "Events not published: duplicate (same object and reason within the dedupe window), rate_limited, queue_full",
            events_dropped.clone(),
        );
        let listeners = ListenerMetrics::register(&mut registry);
        let requests_rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "requests_rejected",
            "Requests refused before evaluation: memory_budget, peer_memory_share, too_large, too_complex, body_timeout, body_error, unauthenticated",
            requests_rejected.clone(),
        );
        let memory_budget_used = Gauge::default();
        registry.register(
            "memory_budget_used_bytes",
            "Bytes of the request memory budget held by requests in progress",
            memory_budget_used.clone(),
        );
        let memory_budget_total = Gauge::default();
        registry.register(
            "memory_budget_bytes",
            "The request memory budget (--memory-budget)",
            memory_budget_total.clone(),
        );
        Metrics {
            registry,
            requests,
            duration,
            engine_errors,
            events_failed,
            events_published,
            events_dropped,
            listeners,
            requests_rejected,
            memory_budget_used,
            memory_budget_total,
        }
    }

    pub(crate) fn observe(&self, operation: &str, outcome: Outcome, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                operation: operation.to_owned(),
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
        self.duration
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn engine_error(&self, kind: &str) {
        self.engine_errors
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    pub(crate) fn event_failed(&self) {
        self.events_failed.inc();
    }

    pub(crate) fn event_published(&self) {
        self.events_published.inc();
    }

    pub(crate) fn event_dropped(&self, reason: &'static str) {
        self.events_dropped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The listeners' connection metrics.
    pub(crate) fn listeners(&self) -> &ListenerMetrics {
        &self.listeners
    }

    pub(crate) fn request_rejected(&self, reason: &'static str) {
        self.requests_rejected
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(crate) fn memory_budget(&self, used: usize, total: usize) {
        self.memory_budget_used
            .set(i64::try_from(used).unwrap_or(i64::MAX));
        self.memory_budget_total
            .set(i64::try_from(total).unwrap_or(i64::MAX));
    }

    /// Export what `engine`'s decision cache and answer checks did, read at
    /// each scrape.
    pub(crate) fn watch_decision_cache(&mut self, engine: Arc<dyn PolicyEngine>) {
        self.registry
            .register_collector(Box::new(EngineCollector::new(engine)));
    }

    /// The registry in Prometheus text format.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counts_by_operation_and_outcome() {
        let m = Metrics::new();
        m.observe("CREATE", Outcome::Patched, Duration::from_millis(2));
        m.observe("CREATE", Outcome::Patched, Duration::from_millis(3));
        m.engine_error("timeout");
        let text = m.encode();
        assert!(text.contains(r#"placement_webhook_admission_requests_total{operation="CREATE",outcome="patched"} 2"#), "{text}");
        assert!(
            text.contains("placement_webhook_admission_duration_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains(r#"placement_webhook_engine_errors_total{kind="timeout"} 1"#),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[tokio::test]
    async fn exports_the_decision_cache_as_it_stands() {
        let engine = Arc::new(policy_client::embedded::Embedded::new());
        engine
            .put_policy("p.rego", "package p\n\nx := input.kind\n")
            .await
            .unwrap();
        let mut m = Metrics::new();
        m.watch_decision_cache(engine.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for _ in 0..3 {
            engine
                .query("p", &serde_json::json!({"kind": "A"}), deadline)
                .await
                .unwrap();
        }
        let text = m.encode();
        for line in [
            "placement_webhook_decision_cache_hits_total 2",
            "placement_webhook_decision_cache_misses_total 1",
            "placement_webhook_decision_cache_enabled 1",
            "placement_webhook_decision_cache_entries 1",
            "placement_webhook_embedded_answer_checks_total 1",
            "placement_webhook_embedded_disagreements_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // A policy set that cannot be cached says so.
        engine
            .put_policy("p.rego", "package p\n\nx := count(walk(input))\n")
            .await
            .unwrap();
        assert!(
            m.encode()
                .lines()
                .any(|l| l == "placement_webhook_decision_cache_enabled 0")
        );
    }
}
