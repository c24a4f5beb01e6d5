//! Kubernetes Events on the object under review, so developers see why.
//!
//! Any client that reaches the webhook chooses the object, namespace and much of
//! the text of these Events, so publication is bounded: one Event per object and
//! reason within a dedupe window, token buckets, a bounded queue and a bounded
//! number of publications in flight. What does not fit is dropped and counted
//! (`placement_webhook_events_dropped_total`).
//!
//! The buckets are per caller, so that no caller spends another's: the
//! callers with a verified client certificate (the API server, with
//! `--client-ca-file`) share the configured one; every other caller (an
//! address, an IPv6 /64: without a client CA, the API server too) has one of
//! its own, of the same size, and all of those together at most
//! [`CALLERS_CEILING`] times it. With a client CA, only verified callers'
//! reviews cause Events at all ([`EventLimits::verified_only`]; the others
//! are refused before their review is read, and this holds whatever path a
//! review takes).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use policy_client::text::truncate;
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};

use crate::metrics::Metrics;
use crate::review::{AdmissionRequest, Caller};
use placement_endpoint::Throttle;

/// The Events API caps notes at 1 kB.
const MAX_NOTE_BYTES: usize = 1000;
/// Events waiting for publication.
const QUEUE: usize = 256;
/// Publications in flight at once.
const IN_FLIGHT: usize = 4;
/// Callers without a verified certificate gated apart at once; beyond, the
/// quietest is forgotten (a fresh bucket is no more than it had).
const MAX_CALLERS: usize = 16;
/// All callers without a verified certificate together: this many callers'
/// budgets at most.
pub(crate) const CALLERS_CEILING: u32 = 4;

/// How many Events may be published, and how often the same one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventLimits {
    /// Sustained Events per second (all objects together).
    pub rate: f64,
    /// Events allowed in a burst above the rate.
    pub burst: u32,
    /// One Event per object and reason within this window.
    pub dedupe_window: Duration,
    /// Only callers with a verified client certificate cause Events (a
    /// client CA is configured: the API server is recognised by its
    /// certificate); the others' are dropped (`unverified`).
    pub verified_only: bool,
}

impl Default for EventLimits {
    fn default() -> Self {
        EventLimits {
            rate: 5.0,
            burst: 20,
            dedupe_window: Duration::from_secs(300),
            verified_only: false,
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
    keys: RandomState,
    gates: Mutex<Gates>,
    metrics: Arc<Metrics>,
    drops: Throttle,
}

/// Every caller's gate, decided under one lock.
struct Gates {
    limits: EventLimits,
    /// Callers with a verified certificate (and the offline review).
    verified: Gate,
    /// Each other caller's own.
    callers: HashMap<IpAddr, Gate>,
    /// All other callers together.
    ceiling: Bucket,
}

/// Dedupe and rate limit of one caller.
struct Gate {
    limits: EventLimits,
    seen: HashMap<Key, Instant>,
    bucket: Bucket,
}

/// A token bucket.
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
}

/// The object and reason an Event is about, hashed with a key random per
/// process (no caller can make two collide on purpose): what a caller sends
/// costs the memory of remembered Events nothing.
type Key = u64;

fn key(hasher: &impl BuildHasher, namespace: &str, kind: &str, name: &str, reason: &str) -> Key {
    hasher.hash_one((namespace, kind, name, reason))
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

impl Bucket {
    fn new(rate: f64, burst: u32) -> Self {
        Bucket {
            rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            refilled: Instant::now(),
        }
    }

    /// The tokens there are `now`.
    fn available(&mut self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.refilled = now;
        self.tokens
    }
}

impl Gates {
    fn new(limits: EventLimits) -> Self {
        Gates {
            limits,
            verified: Gate::new(limits),
            callers: HashMap::new(),
            ceiling: Bucket::new(
                limits.rate * f64::from(CALLERS_CEILING),
                limits.burst.saturating_mul(CALLERS_CEILING),
            ),
        }
    }

    /// Whether an Event `caller`'s review causes may go now; `Err` names why
    /// not.
    fn admit(&mut self, caller: Caller, key: Key, now: Instant) -> Result<(), &'static str> {
        let Some(peer) = caller.peer.filter(|_| !caller.verified) else {
            return self.verified.admit(key, now);
        };
        if self.limits.verified_only {
            return Err("unverified");
        }
        if self.ceiling.available(now) < 1.0 {
            return Err("rate_limited");
        }
        if !self.callers.contains_key(&peer) && self.callers.len() >= MAX_CALLERS {
            let quietest = self
                .callers
                .iter_mut()
                .map(|(peer, gate)| (*peer, gate.bucket.available(now)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(peer, _)| peer);
            if let Some(quietest) = quietest {
                self.callers.remove(&quietest);
            }
        }
        let limits = self.limits;
        self.callers
            .entry(peer)
            .or_insert_with(|| Gate::new(limits))
            .admit(key, now)?;
        self.ceiling.tokens -= 1.0;
        Ok(())
    }
}

impl Gate {
    fn new(limits: EventLimits) -> Self {
        Gate {
            limits,
            seen: HashMap::new(),
            bucket: Bucket::new(limits.rate, limits.burst),
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
        if self.bucket.available(now) < 1.0 {
            return Err("rate_limited");
        }
        self.bucket.tokens -= 1.0;
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
                keys: RandomState::new(),
                gates: Mutex::new(Gates::new(limits)),
                metrics,
                drops: Throttle::new(Duration::from_secs(30)),
            })),
        }
    }

    /// Emit a Warning Event about the object of `request`, within the budget
    /// of the caller that sent it. Skipped for dry-run requests, which must
    /// have no side effects.
    pub(crate) fn emit(&self, request: &AdmissionRequest, reason: &str, message: &str) {
        self.emit_about(request, object_reference(request), reason, message);
    }

    /// Emit a Warning Event about `reference` (another object than the
    /// request's: the one its author watches), as [`EventSink::emit`] does.
    pub(crate) fn emit_about(
        &self,
        request: &AdmissionRequest,
        reference: ObjectReference,
        reason: &str,
        message: &str,
    ) {
        if request.dry_run.unwrap_or(false) {
            return;
        }
        let Some(inner) = &self.inner else {
            return;
        };
        let key = key(
            &inner.keys,
            reference.namespace.as_deref().unwrap_or_default(),
            reference.kind.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default(),
            reason,
        );
        let admitted = inner
            .gates
            .lock()
            .admit(request.caller, key, Instant::now());
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
            caller: Caller::default(),
        }
    }

    fn key(name: &str, reason: &str) -> Key {
        let hasher = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
        super::key(&hasher, "team-a", "ReplicaSet", name, reason)
    }

    #[test]
    fn gate_dedupes_and_rate_limits() {
        let limits = EventLimits {
            rate: 1.0,
            burst: 3,
            dedupe_window: Duration::from_secs(60),
            ..EventLimits::default()
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

    /// One caller without a verified certificate spends its own budget, not
    /// another's; all of them together at most the ceiling's; callers with a
    /// verified certificate share the configured one.
    #[test]
    fn each_caller_spends_its_own_budget() {
        let limits = EventLimits {
            rate: 1.0,
            burst: 3,
            dedupe_window: Duration::from_secs(60),
            ..EventLimits::default()
        };
        let mut gates = Gates::new(limits);
        let now = Instant::now();
        let caller = |last: u8| Caller {
            peer: Some(IpAddr::from([10, 0, 0, last])),
            verified: false,
        };
        for n in 0..3 {
            assert_eq!(
                gates.admit(caller(2), key(&format!("spam-{n}"), "r"), now),
                Ok(())
            );
        }
        assert_eq!(
            gates.admit(caller(2), key("spam-9", "r"), now),
            Err("rate_limited")
        );
        // Another caller's budget is whole.
        assert_eq!(gates.admit(caller(3), key("real", "r"), now), Ok(()));
        // A verified caller shares the configured one, apart from the others.
        let verified = Caller {
            verified: true,
            ..caller(2)
        };
        for n in 0..3 {
            assert_eq!(
                gates.admit(verified, key(&format!("api-{n}"), "r"), now),
                Ok(())
            );
        }
        assert_eq!(
            gates.admit(verified, key("api-9", "r"), now),
            Err("rate_limited")
        );
        // Unverified callers together: the ceiling (4 x 3 = 12 at once).
        let mut admitted = 4; // caller 2's three and caller 3's one
        for last in 4..40 {
            for n in 0..3 {
                if gates.admit(caller(last), key(&format!("{last}-{n}"), "r"), now) == Ok(()) {
                    admitted += 1;
                }
            }
        }
        assert_eq!(admitted, 12);
        assert!(gates.callers.len() <= MAX_CALLERS);
    }

    #[test]
    fn remembered_events_stay_bounded() {
        let limits = EventLimits {
            rate: 1000.0,
            burst: 10,
            dedupe_window: Duration::from_secs(1),
            ..EventLimits::default()
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

    /// With a client CA, only verified callers cause Events (issue 39): an
    /// unverified caller's are dropped whatever its budget; the offline
    /// review (no peer) and verified callers keep theirs.
    #[test]
    fn with_a_client_ca_only_verified_callers_cause_events() {
        let limits = EventLimits {
            verified_only: true,
            ..EventLimits::default()
        };
        let mut gates = Gates::new(limits);
        let now = Instant::now();
        let unverified = Caller {
            peer: Some(IpAddr::from([10, 0, 0, 2])),
            verified: false,
        };
        let verified = Caller {
            peer: Some(IpAddr::from([10, 0, 0, 2])),
            verified: true,
        };
        assert_eq!(
            gates.admit(unverified, key("web", "r"), now),
            Err("unverified")
        );
        assert!(gates.callers.is_empty(), "nothing remembered for it");
        assert_eq!(gates.admit(verified, key("web", "r"), now), Ok(()));
        assert_eq!(gates.admit(Caller::default(), key("db", "r"), now), Ok(()));
        // Without a client CA, every caller has its budget.
        let mut gates = Gates::new(EventLimits::default());
        assert_eq!(gates.admit(unverified, key("web", "r"), now), Ok(()));
    }
}
