//! Kubernetes Events on the object under review, so developers see why.
//!
//! Any client that reaches the webhook chooses the object, namespace and much of
//! the text of these Events, so publication is bounded: one Event per object and
//! reason within a dedupe window, a token bucket over all of them, a bounded
//! queue and a bounded number of publications in flight. What does not fit is
//! dropped and counted (`placement_webhook_events_dropped_total`).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use policy_client::text::truncate;
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};

use crate::metrics::Metrics;
use crate::review::AdmissionRequest;
use placement_endpoint::Throttle;

/// The Events API caps notes at 1 kB.
const MAX_NOTE_BYTES: usize = 1000;
/// Longest name, namespace or reason kept in a dedupe key (Kubernetes names are
/// at most 253 bytes; a hostile client's need not be).
const MAX_KEY_PART_BYTES: usize = 256;
/// Events waiting for publication.
const QUEUE: usize = 256;
/// Publications in flight at once.
const IN_FLIGHT: usize = 4;

/// How many Events may be published, and how often the same one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventLimits {
    /// Sustained Events per second (all objects together).
    pub rate: f64,
    /// Events allowed in a burst above the rate.
    pub burst: u32,
    /// One Event per object and reason within this window.
    pub dedupe_window: Duration,
}

impl Default for EventLimits {
    fn default() -> Self {
        EventLimits {
            rate: 5.0,
            burst: 20,
            dedupe_window: Duration::from_secs(300),
        }
    }
}

/// Publishes Events without delaying the admission response. Without a
/// Kubernetes client it only logs.
#[derive(Clone, Default)]
pub(crate) struct EventSink {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    queue: mpsc::Sender<(Event, ObjectReference)>,
    gate: Mutex<Gate>,
    metrics: Arc<Metrics>,
    drops: Throttle,
}

/// Dedupe and rate limit, decided together under one lock.
struct Gate {
    limits: EventLimits,
    seen: HashMap<Key, Instant>,
    tokens: f64,
    refilled: Instant,
}

/// The object and reason an Event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    kind: String,
    name: String,
    reason: String,
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

impl Gate {
    fn new(limits: EventLimits) -> Self {
        Gate {
            limits,
            seen: HashMap::new(),
            tokens: f64::from(limits.burst),
            refilled: Instant::now(),
        }
    }

    /// Whether an Event with `key` may go now; `Err` names why not.
    fn admit(&mut self, key: Key, now: Instant) -> Result<(), &'static str> {
        let window = self.limits.dedupe_window;
        if self
            .seen
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < window)
        {
            return Err("duplicate");
        }
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.limits.rate).min(f64::from(self.limits.burst));
        self.refilled = now;
        if self.tokens < 1.0 {
            return Err("rate_limited");
        }
        self.tokens -= 1.0;
        // Only admitted Events are remembered, so the map holds at most what
        // the rate lets through in one window (plus the burst).
        if self.seen.len() >= self.capacity() {
            self.seen.retain(|_, at| now.duration_since(*at) < window);
        }
        self.seen.insert(key, now);
        Ok(())
    }

    fn capacity(&self) -> usize {
        let per_window = self.limits.rate * self.limits.dedupe_window.as_secs_f64();
        (per_window as usize)
            .saturating_add(self.limits.burst as usize)
            .max(16)
    }
}

impl EventSink {
    pub(crate) fn disabled() -> Self {
        EventSink::default()
    }

    /// Publishes through `client`; starts the publishing task, so call it
    /// inside the runtime.
    pub(crate) fn new(client: Client, metrics: Arc<Metrics>, limits: EventLimits) -> Self {
        let reporter = Reporter {
            controller: "placement-webhook".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let recorder = Recorder::new(client, reporter);
        let (queue, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(publish(recorder, receiver, Arc::clone(&metrics)));
        EventSink {
            inner: Some(Arc::new(Inner {
                queue,
                gate: Mutex::new(Gate::new(limits)),
                metrics,
                drops: Throttle::new(Duration::from_secs(30)),
            })),
        }
    }

    /// Emit a Warning Event about the object of `request`. Skipped for dry-run
    /// requests, which must have no side effects.
    pub(crate) fn emit(&self, request: &AdmissionRequest, reason: &str, message: &str) {
        if request.dry_run.unwrap_or(false) {
            return;
        }
        let Some(inner) = &self.inner else {
            return;
        };
        let reference = object_reference(request);
        let part =
            |s: Option<&str>| truncate(s.unwrap_or_default(), MAX_KEY_PART_BYTES).into_owned();
        let key = Key {
            namespace: part(reference.namespace.as_deref()),
            kind: part(reference.kind.as_deref()),
            name: part(reference.name.as_deref()),
            reason: part(Some(reason)),
        };
        let admitted = inner
            .gate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(key, Instant::now());
        let dropped = match admitted {
            Err(why) => why,
            Ok(()) => {
                let event = Event {
                    type_: EventType::Warning,
                    reason: truncate(reason, 128).into_owned(),
                    note: Some(truncate(message, MAX_NOTE_BYTES).into_owned()),
                    action: format!("Admit{}", capitalized(request.operation.as_str())),
                    secondary: None,
                };
                match inner.queue.try_send((event, reference)) {
                    Ok(()) => return,
                    Err(_) => "queue_full",
                }
            }
        };
        inner.metrics.event_dropped(dropped);
        if dropped != "duplicate"
            && let Some(held_back) = inner.drops.admit()
        {
            tracing::warn!(
                why = dropped,
                held_back,
                "Events are being dropped (--event-rate, --event-burst)"
            );
        }
    }
}

/// Publishes queued Events, at most [`IN_FLIGHT`] at once.
async fn publish(
    recorder: Recorder,
    mut receiver: mpsc::Receiver<(Event, ObjectReference)>,
    metrics: Arc<Metrics>,
) {
    let recorder = Arc::new(recorder);
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some((event, reference)) = receiver.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (recorder, metrics) = (Arc::clone(&recorder), Arc::clone(&metrics));
        tokio::spawn(async move {
            match recorder.publish(&event, &reference).await {
                Ok(()) => metrics.event_published(),
                Err(e) => {
                    tracing::warn!(error = %e, object = ?reference.name, namespace = ?reference.namespace, "cannot publish Event");
                    metrics.event_failed();
                }
            }
            drop(slot);
        });
    }
}

fn capitalized(op: &str) -> String {
    let lower = op.to_ascii_lowercase();
    let mut chars = lower.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// The object the Event is about. Objects being created have no uid yet; a
/// `generateName` object has no name yet either, so its prefix stands in.
pub(crate) fn object_reference(request: &AdmissionRequest) -> ObjectReference {
    let object = request.object.as_ref().or(request.old_object.as_ref());
    let meta = object.and_then(|o| o.get("metadata"));
    let field = |name: &str| {
        meta.and_then(|m| m.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let api_version = if request.kind.group.is_empty() {
        request.kind.version.clone()
    } else {
        format!("{}/{}", request.kind.group, request.kind.version)
    };
    ObjectReference {
        api_version: Some(api_version),
        kind: Some(request.kind.kind.clone()),
        name: request
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| field("name"))
            .or_else(|| field("generateName")),
        namespace: request.namespace.clone().or_else(|| field("namespace")),
        uid: field("uid"),
        resource_version: None,
        field_path: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::{GroupVersionKind, GroupVersionResource, Operation};
    use serde_json::json;

    fn request(object: Value) -> AdmissionRequest {
        AdmissionRequest {
            uid: "u".into(),
            kind: GroupVersionKind {
                group: "apps".into(),
                version: "v1".into(),
                kind: "ReplicaSet".into(),
            },
            resource: GroupVersionResource {
                group: "apps".into(),
                version: "v1".into(),
                resource: "replicasets".into(),
            },
            sub_resource: None,
            name: None,
            namespace: Some("team-a".into()),
            operation: Operation::Create,
            user_info: Value::Null,
            object: Some(object),
            old_object: None,
            dry_run: None,
        }
    }

    fn key(name: &str, reason: &str) -> Key {
        Key {
            namespace: "team-a".into(),
            kind: "ReplicaSet".into(),
            name: name.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn gate_dedupes_and_rate_limits() {
        let limits = EventLimits {
            rate: 1.0,
            burst: 3,
            dedupe_window: Duration::from_secs(60),
        };
        let mut gate = Gate::new(limits);
        let start = Instant::now();
        assert_eq!(gate.admit(key("web", "PlacementDenied"), start), Ok(()));
        assert_eq!(
            gate.admit(key("web", "PlacementDenied"), start),
            Err("duplicate")
        );
        assert_eq!(gate.admit(key("web", "Other"), start), Ok(()));
        assert_eq!(gate.admit(key("api", "PlacementDenied"), start), Ok(()));
        // The burst is spent.
        assert_eq!(
            gate.admit(key("db", "PlacementDenied"), start),
            Err("rate_limited")
        );
        // A second later one more token.
        let later = start + Duration::from_secs(1);
        assert_eq!(gate.admit(key("db", "PlacementDenied"), later), Ok(()));
        // After the window the same Event may go again.
        let much_later = start + Duration::from_secs(120);
        assert_eq!(
            gate.admit(key("web", "PlacementDenied"), much_later),
            Ok(())
        );
    }

    #[test]
    fn remembered_events_stay_bounded() {
        let limits = EventLimits {
            rate: 1000.0,
            burst: 10,
            dedupe_window: Duration::from_secs(1),
        };
        let mut gate = Gate::new(limits);
        let start = Instant::now();
        for i in 0..100_000u64 {
            let now = start + Duration::from_millis(i);
            let _ = gate.admit(key(&format!("rs-{i}"), "PlacementDenied"), now);
        }
        assert!(gate.seen.len() <= gate.capacity(), "{}", gate.seen.len());
    }

    #[test]
    fn reference_names_the_object() {
        let r = object_reference(&request(json!({"metadata": {"name": "web", "uid": "abc"}})));
        assert_eq!(r.api_version.as_deref(), Some("apps/v1"));
        assert_eq!(r.kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
        assert_eq!(r.uid.as_deref(), Some("abc"));
        let r = object_reference(&request(json!({"metadata": {"generateName": "web-"}})));
        assert_eq!(r.name.as_deref(), Some("web-"));
        assert_eq!(capitalized("CREATE"), "Create");
    }
}
