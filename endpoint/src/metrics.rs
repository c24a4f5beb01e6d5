//! The listeners' metrics, registered into the binary's own registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerReasonLabels {
    listener: &'static str,
    reason: &'static str,
}

/// Connections of every listener of a process, by listener name.
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    open: Family<ListenerLabels, Gauge>,
    refused: Family<ListenerReasonLabels, Counter>,
    closed: Family<ListenerReasonLabels, Counter>,
    accept_errors: Family<ListenerReasonLabels, Counter>,
}

impl ListenerMetrics {
    /// The families, registered into `registry` (under its prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = ListenerMetrics::default();
        registry.register(
            "connections_open",
            "Open connections, by listener",
            metrics.open.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused a slot: limit (every slot taken and no peer holds more than this one), \
             peer_limit (the peer holds its share, --max-connections-per-peer), or closed before serving a request: \
             tls_handshake_timeout, tls_handshake_error. A connection refused a slot may still be taken beyond the slots \
             (listener <name>_probes): its TLS handshake, then a slot if its client certificate verified, else one probe",
            metrics.refused.clone(),
        );
        registry.register(
            "connections_closed",
            "Connections closed by the server: idle (no request for --idle-timeout), evicted (an idle connection of \
             the peer holding the most, for a peer holding fewer), max_age (retired after its next response), draining, shutdown",
            metrics.closed.clone(),
        );
        registry.register(
            "accept_errors",
            "Failed accepts: fd_exhausted (EMFILE/ENFILE: the open-files limit is reached), out_of_memory, other",
            metrics.accept_errors.clone(),
        );
        metrics
    }

    pub(crate) fn opened(&self, listener: &'static str) -> OpenConnection {
        let gauge = self
            .open
            .get_or_create(&ListenerLabels { listener })
            .clone();
        gauge.inc();
        OpenConnection { gauge }
    }

    pub(crate) fn refused(&self, listener: &'static str, reason: &'static str) {
        self.refused
            .get_or_create(&ListenerReasonLabels { listener, reason })
            .inc();
    }

    pub(crate) fn closed(&self, listener: &'static str, reason: &'static str) {
        self.closed
            .get_or_create(&ListenerReasonLabels { listener, reason })
            .inc();
    }

    pub(crate) fn accept_error(&self, listener: &'static str, reason: &'static str) {
        self.accept_errors
            .get_or_create(&ListenerReasonLabels { listener, reason })
            .inc();
    }
}

/// Keeps a listener's open-connections gauge up while it lives.
#[derive(Debug)]
pub(crate) struct OpenConnection {
    gauge: Gauge,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
