//! Prometheus metrics of the sidecar (prefix `placement_sync_`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use placement_endpoint::ListenerMetrics;
use policy_client::engine::PolicyEngine;
use policy_client::engine_metrics::EngineCollector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResourceLabels {
    pub resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WriteLabels {
    pub resource: String,
    /// `put_document`, `put`, `delete`, `put_policy`, `delete_policy`.
    pub op: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WriteErrorLabels {
    pub resource: String,
    /// The error's kind (`unreachable`, `timeout`, `http`, ...).
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    /// `ok` or `error`.
    pub result: String,
}

/// Every metric the sidecar exports. Names in the registry are documented in
/// docs/sync.md; each field's doc names its metric.
pub(crate) struct Metrics {
    registry: Registry,
    /// `placement_sync_replicated_objects{resource}`: objects of a type currently in the engine.
    pub replicated_objects: Family<ResourceLabels, Gauge>,
    /// `placement_sync_engine_writes_total{resource,op}`: successful engine writes.
    pub engine_writes: Family<WriteLabels, Counter>,
    /// `placement_sync_engine_write_errors_total{resource,kind}`: failed engine writes (each is retried).
    pub engine_write_errors: Family<WriteErrorLabels, Counter>,
    /// `placement_sync_watch_errors_total{resource}`: list/watch errors (the watch recovers by itself).
    pub watch_errors: Family<ResourceLabels, Counter>,
    /// `placement_sync_synced`: 1 when the engine holds every policy and all replicated data.
    pub synced: Gauge,
    /// `placement_sync_engine_up`: 1 when the last engine check answered.
    pub engine_up: Gauge,
    /// `placement_sync_engine_restarts_total`: engine restarts (or state losses) detected.
    pub engine_restarts: Counter,
    /// `placement_sync_resync_duration_seconds`: time from the start of the last full
    /// (re)load to the engine being in sync.
    pub resync_seconds: Gauge<f64, AtomicU64>,
    /// `placement_sync_policies_loaded`: policy modules loaded.
    pub policies_loaded: Gauge,
    /// `placement_sync_policies_failed`: policy modules whose current source fails to compile.
    pub policies_failed: Gauge,
    /// `placement_sync_remediation_patches_total{result}`: remediation PATCHes.
    pub remediation_patches: Family<ResultLabels, Counter>,
    /// `placement_sync_remediation_stale_objects`: objects whose placement differed from
    /// the decision in the last pass and were not patched (report mode: all of them).
    pub remediation_stale: Gauge,
    /// `placement_sync_remediation_unplaceable_objects`: objects the policy reported errors for.
    pub remediation_unplaceable: Gauge,
    /// `placement_sync_remediation_held_objects`: placements the last pass would
    /// have rewritten or removed, held by the blast-radius guard (0: none held).
    pub remediation_held: Gauge,
    /// `placement_sync_remediation_passes_total`: remediation passes over all workloads.
    pub remediation_passes: Counter,
    /// `placement_sync_remediation_queries_total`: decision queries the remediator sent.
    pub remediation_queries: Counter,
    /// `placement_sync_binding_schedules_total{result}`: Karmada binding writes:
    /// `scheduled` (placed), `failed` (`Scheduled=False` written), `bounded`
    /// (a guarded binding admitted again with a new bound), `error`.
    pub binding_schedules: Family<ResultLabels, Counter>,
    /// `placement_sync_placement_decisions_total{result}`: writes of OCM
    /// Placements' decisions: `decided`, `failed` (`PolicyDenied` or
    /// `Misconfigured` written), `error`.
    pub placement_decisions: Family<ResultLabels, Counter>,
    /// `placement_sync_leader`: 1 while this replica holds the remediation Lease.
    pub leader: Gauge,
    /// `placement_sync_connections_*`: the HTTP listener's connections.
    listeners: ListenerMetrics,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("placement_sync");
        let m = Metrics {
            registry: Registry::default(),
            replicated_objects: Family::default(),
            engine_writes: Family::default(),
            engine_write_errors: Family::default(),
            watch_errors: Family::default(),
            synced: Gauge::default(),
            engine_up: Gauge::default(),
            engine_restarts: Counter::default(),
            resync_seconds: Gauge::default(),
            policies_loaded: Gauge::default(),
            policies_failed: Gauge::default(),
            remediation_patches: Family::default(),
            remediation_stale: Gauge::default(),
            remediation_unplaceable: Gauge::default(),
            remediation_held: Gauge::default(),
            remediation_passes: Counter::default(),
            remediation_queries: Counter::default(),
            binding_schedules: Family::default(),
            placement_decisions: Family::default(),
            leader: Gauge::default(),
            listeners: ListenerMetrics::default(),
        };
        m.register_engine(&mut registry);
        m.register_remediation(&mut registry);
        let listeners = ListenerMetrics::register(&mut registry);
        m.zero_results();
        Metrics {
            registry,
            listeners,
            ..m
        }
    }

    /// Export what `engine`'s decision cache did, read at each scrape.
    pub(crate) fn watch_decision_cache(&mut self, engine: Arc<dyn PolicyEngine>) {
        self.registry
            .register_collector(Box::new(EngineCollector::new(engine)));
    }

    /// The engine's and the replication's metrics.
    fn register_engine(&self, registry: &mut Registry) {
        registry.register(
            "replicated_objects",
            "Objects of a replicated type currently written to the engine",
            self.replicated_objects.clone(),
        );
        registry.register(
            "engine_writes",
            "Successful writes to the policy engine",
            self.engine_writes.clone(),
        );
        registry.register(
            "engine_write_errors",
            "Failed writes to the policy engine (each is retried)",
            self.engine_write_errors.clone(),
        );
        registry.register(
            "watch_errors",
            "List/watch errors from the API server (the watch recovers by itself)",
            self.watch_errors.clone(),
        );
        registry.register(
            "synced",
            "1 when the engine holds every policy and all replicated data, else 0",
            self.synced.clone(),
        );
        registry.register(
            "engine_up",
            "1 when the last engine check was answered, else 0",
            self.engine_up.clone(),
        );
        registry.register(
            "engine_restarts",
            "Engine restarts (or losses of its state) detected",
            self.engine_restarts.clone(),
        );
        registry.register(
            "resync_duration_seconds",
            "Seconds from the start of the last full load to the engine being in sync",
            self.resync_seconds.clone(),
        );
        registry.register(
            "policies_loaded",
            "Policy modules loaded into the engine",
            self.policies_loaded.clone(),
        );
        registry.register(
            "policies_failed",
            "Policy modules whose current source does not compile",
            self.policies_failed.clone(),
        );
    }

    /// The reconciler's metrics.
    fn register_remediation(&self, registry: &mut Registry) {
        registry.register(
            "remediation_patches",
            "Remediation PATCH requests by result",
            self.remediation_patches.clone(),
        );
        registry.register(
            "remediation_stale_objects",
            "Workloads whose placement differed from the policy decision in the last pass and were not patched",
            self.remediation_stale.clone(),
        );
        registry.register(
            "remediation_unplaceable_objects",
            "Workloads the policy reported errors for in the last pass",
            self.remediation_unplaceable.clone(),
        );
        registry.register(
            "remediation_held_objects",
            "Placements the last pass would have rewritten or removed, held until confirmed",
            self.remediation_held.clone(),
        );
        registry.register(
            "remediation_passes",
            "Remediation passes over all workloads",
            self.remediation_passes.clone(),
        );
        registry.register(
            "remediation_queries",
            "Decision queries sent by the remediator",
            self.remediation_queries.clone(),
        );
        registry.register(
            "binding_schedules",
            "Karmada binding writes by result (scheduled, failed, bounded, error)",
            self.binding_schedules.clone(),
        );
        registry.register(
            "placement_decisions",
            "OCM Placement decision writes by result (decided, failed, error)",
            self.placement_decisions.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the remediation Lease",
            self.leader.clone(),
        );
    }

    fn zero_results(&self) {
        // Every result of the writes at 0 from the start: a dashboard's
        // rate() and an alert see each series before its first write.
        for (family, results) in [
            (&self.remediation_patches, &["ok", "error"][..]),
            (
                &self.binding_schedules,
                &["scheduled", "failed", "bounded", "error"][..],
            ),
            (
                &self.placement_decisions,
                &["decided", "failed", "error"][..],
            ),
        ] {
            for result in results {
                let _ = family.get_or_create(&ResultLabels {
                    result: (*result).to_owned(),
                });
            }
        }
    }

    /// The listener's connection metrics.
    pub(crate) fn listeners(&self) -> &ListenerMetrics {
        &self.listeners
    }

    /// The OpenMetrics text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub(crate) fn write_ok(&self, resource: &str, op: &str) {
        self.engine_writes
            .get_or_create(&WriteLabels {
                resource: resource.to_owned(),
                op: op.to_owned(),
            })
            .inc();
    }

    pub(crate) fn write_error(&self, resource: &str, kind: &str) {
        self.engine_write_errors
            .get_or_create(&WriteErrorLabels {
                resource: resource.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    pub(crate) fn set_replicated(&self, resource: &str, count: usize) {
        self.replicated_objects
            .get_or_create(&ResourceLabels {
                resource: resource.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub(crate) fn watch_error(&self, resource: &str) {
        self.watch_errors
            .get_or_create(&ResourceLabels {
                resource: resource.to_owned(),
            })
            .inc();
    }

    pub(crate) fn binding_schedule(&self, result: &str) {
        self.binding_schedules
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    pub(crate) fn placement_decision(&self, result: &str) {
        self.placement_decisions
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    pub(crate) fn patch(&self, ok: bool) {
        self.remediation_patches
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" }.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writes' results are series from the start, at 0 (a dashboard
    /// queries them before the first Karmada or OCM write).
    #[test]
    fn every_write_result_is_a_series_from_the_start() {
        let text = Metrics::new().encode();
        for line in [
            "placement_sync_remediation_patches_total{result=\"error\"} 0",
            "placement_sync_binding_schedules_total{result=\"bounded\"} 0",
            "placement_sync_placement_decisions_total{result=\"decided\"} 0",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn exposition_names() {
        let m = Metrics::new();
        m.set_replicated("replicasets", 3);
        m.write_ok("replicasets", "put");
        m.write_error("clusters", "unreachable");
        m.synced.set(1);
        m.patch(true);
        m.resync_seconds.set(1.5);
        let text = m.encode();
        for needle in [
            "placement_sync_replicated_objects{resource=\"replicasets\"} 3",
            "placement_sync_engine_writes_total{resource=\"replicasets\",op=\"put\"} 1",
            "placement_sync_engine_write_errors_total{resource=\"clusters\",kind=\"unreachable\"} 1",
            "placement_sync_synced 1",
            "placement_sync_remediation_patches_total{result=\"ok\"} 1",
            "placement_sync_resync_duration_seconds 1.5",
            "placement_sync_policies_loaded 0",
            "placement_sync_remediation_stale_objects 0",
            "placement_sync_engine_restarts_total 0",
            "placement_sync_leader 0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
