//! Events of a pass, published once its writes are done: each Event is a
//! write to the API server, and the writes that place objects go first.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use futures::StreamExt;

/// The reference an Event about `raw` (an object as stored) carries.
pub(crate) fn reference(raw: &Value) -> ObjectReference {
    let text = |pointer: &str| {
        raw.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    ObjectReference {
        api_version: text("/apiVersion"),
        kind: text("/kind"),
        name: text("/metadata/name"),
        namespace: text("/metadata/namespace"),
        uid: text("/metadata/uid"),
        ..ObjectReference::default()
    }
}

/// Events published at once at the end of a pass.
const EVENT_CONCURRENCY: usize = 8;

/// Longest Event note (the API server caps a note at 1 KiB).
const NOTE_LIMIT: usize = 1000;

pub(crate) struct PassEvents {
    recorder: Recorder,
    queued: parking_lot::Mutex<Vec<(ObjectReference, Event)>>,
}

impl PassEvents {
    pub(crate) fn new(recorder: Recorder) -> Self {
        PassEvents {
            recorder,
            queued: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Queue an Event about `reference` for the end of the pass.
    pub(crate) fn queue(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(policy_client::text::truncate(&note, NOTE_LIMIT).into_owned()),
            action: action.to_owned(),
            secondary: None,
        };
        self.queued.lock().push((reference, event));
    }

    pub(crate) async fn publish(&self, cancel: &CancellationToken) {
        let events = std::mem::take(&mut *self.queued.lock());
        let publish = futures::stream::iter(events).for_each_concurrent(
            EVENT_CONCURRENCY,
            |(reference, event)| async move {
                if let Err(e) = self.recorder.publish(&event, &reference).await {
                    let name = reference.name.as_deref().unwrap_or_default();
                    let namespace = reference.namespace.as_deref().unwrap_or_default();
                    tracing::warn!(%namespace, object = %name, reason = %event.reason, error = %e, "cannot publish event");
                }
            },
        );
        tokio::select! {
            _ = publish => {}
            _ = cancel.cancelled() => {}
        }
    }
}
