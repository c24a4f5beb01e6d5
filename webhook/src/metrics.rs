//! Prometheus metrics of the webhook.

use std::fmt;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// How a review ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed with a patch.
    Patched,
    /// Allowed; the object already carried its placement.
    Unchanged,
    /// Denied by the policy's `errors`.
    Denied,
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
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Patched => "patched",
            Outcome::Unchanged => "unchanged",
            Outcome::Denied => "denied",
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

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<OperationLabels, Histogram>,
    engine_errors: Family<KindLabels, Counter>,
    events_failed: Counter,
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
    pub fn new() -> Self {
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
        Metrics {
            registry,
            requests,
            duration,
            engine_errors,
            events_failed,
        }
    }

    pub fn observe(&self, operation: &str, outcome: Outcome, elapsed: Duration) {
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

    pub fn engine_error(&self, kind: &str) {
        self.engine_errors
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    pub fn event_failed(&self) {
        self.events_failed.inc();
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
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
}
