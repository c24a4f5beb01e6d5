//! The reconciler's one write step, shared by every kind of target: an
//! object written from a resourceVersion the cache still shows is skipped
//! (the same write is not sent twice), writes are spaced by the rate limit,
//! none is sent once this replica may no longer act (leadership or the
//! engine's sync lost, or stopping), patches go out under the one field
//! manager ([`crate::kube_writes`]), and Events wait for the end of the pass.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, Patch};
use kube::runtime::events::{EventType, Recorder};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::changes::ItemKey;
use super::events::PassEvents;
use super::rate::RateLimiter;
use super::step::Step;
use super::target::Target;
use crate::engine_sync::SyncState;
use crate::error::SyncError;
use crate::kube_writes::patch_params;

/// What became of a write handed to [`Writer::send`].
pub(crate) enum Sent<T> {
    /// Not sent: in flight already, or this replica may no longer act.
    Skipped(Step),
    Done(T),
    Failed(SyncError),
}

/// Whether `e` says the object is gone.
pub(crate) fn is_gone(e: &SyncError) -> bool {
    matches!(e, SyncError::Kube(kube::Error::Api(s)) if s.code == 404)
}

/// Whether `e` says the object changed since the write was planned from it:
/// a conflict on its resourceVersion (409), or the failed `test` op of a
/// guarded JSON patch (the API server answers a patch that does not apply
/// with 422 and no field causes; a field the object refuses has causes).
pub(crate) fn is_conflict(e: &SyncError) -> bool {
    matches!(e, SyncError::Kube(kube::Error::Api(s))
        if s.code == 409
            || (s.code == 422 && s.details.as_ref().is_none_or(|d| d.causes.is_empty())))
}

pub(crate) struct Writer {
    limiter: RateLimiter,
    /// Objects written from a resourceVersion the cache still shows: skipped
    /// until the cache catches up, so the same write is not sent twice.
    in_flight: parking_lot::Mutex<HashMap<ItemKey, String>>,
    /// Events of the running pass, published once its writes are done.
    events: PassEvents,
    leader: watch::Receiver<bool>,
    state: Arc<SyncState>,
}

impl Writer {
    pub(crate) fn new(
        rate: f64,
        recorder: Recorder,
        leader: watch::Receiver<bool>,
        state: Arc<SyncState>,
    ) -> Self {
        Writer {
            limiter: RateLimiter::new(rate),
            in_flight: parking_lot::Mutex::new(HashMap::new()),
            events: PassEvents::new(recorder),
            leader,
            state,
        }
    }

    /// Whether this replica may act: it leads, and the engine is synced.
    pub(crate) fn may_act(&self) -> bool {
        *self.leader.borrow() && self.state.is_ready()
    }

    /// The write step: `write` is sent unless `key`, seen at
    /// `resource_version`, was written from it already, after the rate
    /// limit, and only while this replica may act.
    pub(crate) async fn send<T>(
        &self,
        key: Option<&ItemKey>,
        resource_version: Option<&str>,
        cancel: &CancellationToken,
        write: impl Future<Output = Result<T, SyncError>>,
    ) -> Sent<T> {
        if key.is_some_and(|key| self.is_in_flight(key, resource_version)) {
            return Sent::Skipped(Step::InFlight);
        }
        self.limiter.acquire().await;
        if cancel.is_cancelled() || !self.may_act() {
            return Sent::Skipped(Step::Aborted);
        }
        match write.await {
            Ok(done) => Sent::Done(done),
            Err(e) => Sent::Failed(e),
        }
    }

    /// JSON-patch `name` with `patch`, preceded by a test that the object is
    /// still at `resource_version` (it was planned from it).
    pub(crate) async fn json_patch(
        api: &Api<DynamicObject>,
        name: &str,
        patch: &json_patch::Patch,
        resource_version: Option<&str>,
    ) -> Result<DynamicObject, SyncError> {
        let guarded = guarded_patch(patch, resource_version);
        Ok(api
            .patch(name, &patch_params(), &Patch::<()>::Json(guarded))
            .await?)
    }

    /// Note that `key` was written from `resource_version`.
    pub(crate) fn mark_in_flight(&self, key: ItemKey, resource_version: Option<String>) {
        if let Some(rv) = resource_version {
            self.in_flight.lock().insert(key, rv);
        }
    }

    /// Whether `key`, seen at `resource_version`, was written from it already.
    fn is_in_flight(&self, key: &ItemKey, resource_version: Option<&str>) -> bool {
        self.in_flight
            .lock()
            .get(key)
            .is_some_and(|rv| resource_version == Some(rv.as_str()))
    }

    /// Forget the writes the caches of `targets` caught up with.
    pub(crate) fn forget_caught_up(&self, targets: &[Target]) {
        self.in_flight
            .lock()
            .retain(|(i, key), rv| targets[*i].resource_version(key).as_ref() == Some(rv));
    }

    /// Queue an Event about `reference` for the end of the pass.
    pub(crate) fn event(
        &self,
        reference: ObjectReference,
        normal: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let type_ = if normal {
            EventType::Normal
        } else {
            EventType::Warning
        };
        self.events.queue(reference, type_, reason, action, note);
    }

    /// Publish the pass's Events.
    pub(crate) async fn publish(&self, cancel: &CancellationToken) {
        self.events.publish(cancel).await;
    }
}

/// `result` as done also when the API answered `code` (the object exists
/// already, or is gone).
pub(crate) fn tolerate<T>(code: u16, result: Result<T, kube::Error>) -> Result<(), SyncError> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == code => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Now, as Kubernetes writes times in conditions (RFC 3339, seconds, UTC).
pub(crate) fn now_rfc3339() -> String {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .ok()
    .and_then(|v| v.as_str().map(str::to_owned))
    .unwrap_or_default()
}

/// `patch` preceded by a test that the object is still at `resource_version`.
pub(crate) fn guarded_patch(
    patch: &json_patch::Patch,
    resource_version: Option<&str>,
) -> json_patch::Patch {
    let mut ops = Vec::with_capacity(patch.0.len() + 1);
    if let Some(rv) = resource_version {
        // A test op built from JSON cannot fail to parse.
        if let Ok(test) = serde_json::from_value::<json_patch::PatchOperation>(json!({
            "op": "test", "path": "/metadata/resourceVersion", "value": rv
        })) {
            ops.push(test);
        }
    }
    ops.extend(patch.0.iter().cloned());
    json_patch::Patch(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_kubernetes_writes_them() {
        let t = now_rfc3339();
        assert_eq!(t.len(), "2026-11-25T10:00:00Z".len(), "{t}");
        assert!(t.ends_with('Z'));
    }

    fn api_error(status: serde_json::Value) -> SyncError {
        let status: kube::core::Status = serde_json::from_value(status).unwrap();
        SyncError::Kube(kube::Error::Api(Box::new(status)))
    }

    /// As the API server answers: a 409 on the resourceVersion; a JSON patch
    /// whose `test` fails (422, no causes); a field the object refuses (422
    /// with its cause), and a webhook's denial, are no conflict.
    #[test]
    fn a_write_met_a_newer_version_on_409_and_on_a_failed_patch_test() {
        let conflict = json!({"code": 409, "reason": "Conflict", "message": "the object has been modified",
            "details": {"name": "web-deployment", "kind": "resourcebindings", "causes": []}});
        assert!(is_conflict(&api_error(conflict)));
        let failed_test = json!({"code": 422, "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request",
            "details": {"causes": []}});
        assert!(is_conflict(&api_error(failed_test)));
        let refused = json!({"code": 422, "reason": "Invalid", "message": "spec.clusters: Invalid value",
            "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec.clusters", "message": "Invalid value"}]}});
        assert!(!is_conflict(&api_error(refused)));
        let denied = json!({"code": 403, "reason": "Forbidden", "message": "admission webhook denied the request"});
        assert!(!is_conflict(&api_error(denied)));
    }

    #[test]
    fn guarded_patch_tests_the_resource_version_first() {
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}
        ]))
        .unwrap();
        let guarded = serde_json::to_value(guarded_patch(&patch, Some("42"))).unwrap();
        assert_eq!(
            guarded[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(guarded[1]["op"], "add");
        let mut doc = json!({"metadata": {"resourceVersion": "41"}});
        assert!(json_patch::patch(&mut doc, &guarded_patch(&patch, Some("42"))).is_err());
        assert_eq!(
            serde_json::to_value(guarded_patch(&patch, None))
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }
}
