//! What an engine counts of its own work (its decision cache, the embedded
//! engine's answer checks), exported at each scrape by every binary that
//! asks an engine, under that binary's metric prefix.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::engine::PolicyEngine;

/// The embedded engine's decision cache and answer checks, as their
/// counters stand.
#[derive(Debug)]
pub struct EngineCollector(Arc<dyn PolicyEngine>);

impl EngineCollector {
    /// Read `engine`'s counters at each scrape.
    pub fn new(engine: Arc<dyn PolicyEngine>) -> Self {
        EngineCollector(engine)
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        if let Some(checks) = self.0.answer_checks() {
            encode_counters(
                &mut encoder,
                &[
                    (
                        "embedded_answer_checks",
                        "Compiled answers of the embedded engine compared with its interpreter's",
                        checks.compared,
                    ),
                    (
                        "embedded_disagreements",
                        "Compiled answers the embedded engine's interpreter gave otherwise or refused (each sends its query to the interpreter; the log names the first)",
                        checks.disagreements,
                    ),
                ],
            )?;
        }
        let Some(stats) = self.0.decision_cache() else {
            return Ok(());
        };
        let enabled = stats.refused.is_none() && stats.budget_bytes > 0;
        let gauge = |value: u64| ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
        let counters = [
            (
                "decision_cache_hits",
                "Decisions answered from the decision cache",
                stats.hits,
            ),
            (
                "decision_cache_misses",
                "Decisions evaluated because the cache did not hold them",
                stats.misses,
            ),
        ];
        encode_counters(&mut encoder, &counters)?;
        let gauges = [
            (
                "decision_cache_enabled",
                "1 when decisions are cached; 0 when the cache is off or the policy set cannot be cached (the log says why)",
                u64::from(enabled),
            ),
            (
                "decision_cache_entries",
                "Decisions held by the decision cache",
                stats.entries,
            ),
            (
                "decision_cache_bytes",
                "Bytes held by the decision cache (estimate)",
                stats.bytes,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = gauge(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// Counters as they stand now: name, help, value.
fn encode_counters(
    encoder: &mut DescriptorEncoder,
    counters: &[(&str, &str, u64)],
) -> Result<(), fmt::Error> {
    for &(name, help, value) in counters {
        let counter = ConstCounter::new(value);
        counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
    }
    Ok(())
}
