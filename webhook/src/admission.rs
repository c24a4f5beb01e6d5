//! Answering AdmissionReviews: ask the engine, merge the decision, or fail by the
//! fail-closed-iff-policies-exist rule.

mod delivery;
mod guardrail;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use policy_client::decision::Decision;
use policy_client::delivery::Carrier;
use policy_client::engine::{PolicyEngine, QueryOutcome};
use policy_client::input::{PolicyInput, RequestMeta};
use policy_client::karmada::is_binding;
use policy_client::ownership_keys::{LoadingKeys, OwnershipKeys};
use policy_client::text::bounded;
use policy_client::verdict::{Plan, plan, request_changed};
use serde_json::{Value, json};
use tokio::time::Instant;

pub(crate) use self::guardrail::Guardrail;
use crate::events::EventSink;
use crate::failure::PlacementFailure;
use crate::metrics::{Metrics, Outcome};
use crate::presence::PolicyPresence;
use crate::review::{
    AdmissionRequest, AdmissionResponse, AdmissionReviewResponse, Caller, Operation, Parsed,
    ReviewError, parse,
};

/// Which endpoint a review came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `/mutate`: merge the policy's annotations as a patch.
    Mutate,
    /// `/validate`: only enforce the policy's `errors`; never patch.
    Validate,
}

/// Settings of the admission handler.
#[derive(Debug, Clone)]
pub(crate) struct AdmissionSettings {
    /// Decision path below `data`, slash-separated.
    pub decision_path: String,
    /// Total time for the engine, retries included; keep it below the webhook's
    /// `timeoutSeconds`.
    pub engine_deadline: Duration,
    /// Sign and verify the ownership record (shared with the remediator);
    /// until they are loaded, reviews fail closed iff policies exist.
    pub ownership_keys: LoadingKeys,
}

/// Answers AdmissionReviews.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    engine: Arc<dyn PolicyEngine>,
    settings: AdmissionSettings,
    presence: PolicyPresence,
    events: EventSink,
    metrics: Arc<Metrics>,
    guardrail: Guardrail,
}

impl Admission {
    pub(crate) fn new(
        engine: Arc<dyn PolicyEngine>,
        settings: AdmissionSettings,
        presence: PolicyPresence,
        events: EventSink,
        metrics: Arc<Metrics>,
        guardrail: Guardrail,
    ) -> Self {
        Admission {
            engine,
            settings,
            presence,
            events,
            metrics,
            guardrail,
        }
    }

    pub(crate) fn engine(&self) -> &Arc<dyn PolicyEngine> {
        &self.engine
    }

    pub(crate) fn presence(&self) -> &PolicyPresence {
        &self.presence
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Answer a raw review body that `caller` sent. Errors are reviews we
    /// cannot answer with a review (no uid to echo); the caller turns them
    /// into an HTTP 400.
    pub(crate) async fn review_body(
        &self,
        body: &[u8],
        mode: Mode,
        caller: Caller,
    ) -> Result<AdmissionReviewResponse, ReviewError> {
        let started = std::time::Instant::now();
        let parsed = match parse(body) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.metrics
                    .observe("UNKNOWN", Outcome::Malformed, started.elapsed());
                return Err(e);
            }
        };
        let response = match parsed {
            Parsed::Request(mut request) => {
                request.caller = caller;
                self.review(&request, mode).await
            }
            Parsed::Malformed { uid, message } => {
                self.metrics
                    .observe("UNKNOWN", Outcome::Malformed, started.elapsed());
                AdmissionResponse::deny(&uid, 400, "BadRequest", message)
            }
        };
        Ok(response.into())
    }

    /// Answer one request.
    pub(crate) async fn review(&self, request: &AdmissionRequest, mode: Mode) -> AdmissionResponse {
        let started = std::time::Instant::now();
        let (response, outcome) = self.decide(request, mode).await;
        self.metrics
            .observe(request.operation.as_str(), outcome, started.elapsed());
        response
    }

    async fn decide(&self, request: &AdmissionRequest, mode: Mode) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        // A status update keeps metadata changes: the annotations stay as
        // stored (see `keep_stored_annotations`).
        if request.operation == Operation::Update
            && request.sub_resource.as_deref() == Some("status")
        {
            return self.keep_stored_annotations(request, mode);
        }
        // DELETE and CONNECT carry nothing to place; the other subresources
        // (scale) cannot change annotations.
        if !matches!(request.operation, Operation::Create | Operation::Update)
            || request
                .sub_resource
                .as_deref()
                .is_some_and(|s| !s.is_empty())
        {
            return (AdmissionResponse::allow(uid), Outcome::Skipped);
        }
        let Some(object) = request.object.as_ref() else {
            return (
                AdmissionResponse::deny(
                    uid,
                    400,
                    "BadRequest",
                    format!(
                        "malformed AdmissionReview request: {} without an object",
                        request.operation.as_str()
                    ),
                ),
                Outcome::Malformed,
            );
        };
        // An object being deleted only loses finalizers and owners: deletions
        // always complete (the webhook configurations skip these too).
        if object
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
        {
            return (AdmissionResponse::allow(uid), Outcome::Skipped);
        }
        if let Some(carrier) = Carrier::of(&request.kind.group, &request.kind.kind) {
            return self.guard_delivery(request, object, carrier).await;
        }
        if is_binding(&request.kind.group, &request.kind.kind) {
            return match mode {
                Mode::Mutate => self.guard_binding(request, object).await,
                Mode::Validate => self.guard_binding_delivery(request, object).await,
            };
        }
        let placed = self.place(request, object).await;
        self.answer_placement(request, mode, placed)
    }

    /// The answer for a workload's placement: denied (with an Event), tolerated
    /// (a warning and an Event), patched on `/mutate`, or the failure guarded.
    fn answer_placement(
        &self,
        request: &AdmissionRequest,
        mode: Mode,
        placed: Result<Placement, PlacementFailure>,
    ) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        match placed {
            Ok(Placement::Denied { new, existing }) => {
                let mut message =
                    format!("placement policy denied the request: {}", new.join("; "));
                if !existing.is_empty() {
                    message.push_str(&format!(
                        " (already reported for the stored object: {})",
                        existing.join("; ")
                    ));
                }
                self.events.emit(request, "PlacementDenied", &message);
                (
                    AdmissionResponse::deny(uid, 403, "Forbidden", message),
                    Outcome::Denied,
                )
            }
            Ok(Placement::Tolerated { patch, existing }) => {
                let message = format!(
                    "placement-policy: admitted with the stored placement kept, although the policy reports, as it did before this update: {}",
                    existing.join("; ")
                );
                self.events.emit(request, "PlacementViolation", &message);
                let response = AdmissionResponse::allow(uid).with_warning(message);
                let response = match patch {
                    Some(patch) if mode == Mode::Mutate => response.with_patch(&patch),
                    _ => response,
                };
                (response, Outcome::Tolerated)
            }
            Ok(Placement::Patch(Some(patch))) if mode == Mode::Mutate => (
                AdmissionResponse::allow(uid).with_patch(&patch),
                Outcome::Patched,
            ),
            Ok(Placement::Patch(Some(_))) => (AdmissionResponse::allow(uid), Outcome::Unchanged),
            Ok(Placement::Patch(None)) => (AdmissionResponse::allow(uid), Outcome::Unchanged),
            Err(failure) => self.guard(request, failure),
        }
    }

    /// An update through the `status` subresource: annotations cannot be
    /// changed there (no placement, no developer request past the policy),
    /// nor a Karmada binding's narrowed placement, so they are put back as
    /// stored (`/mutate`) or the update is denied
    /// (`/validate`). No engine is asked: a status update never waits for
    /// one, nor fails with it.
    fn keep_stored_annotations(
        &self,
        request: &AdmissionRequest,
        mode: Mode,
    ) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        let (Some(object), Some(stored)) = (&request.object, &request.old_object) else {
            return (
                AdmissionResponse::deny(
                    uid,
                    400,
                    "BadRequest",
                    "malformed AdmissionReview request: a status UPDATE without object and oldObject"
                        .to_owned(),
                ),
                Outcome::Malformed,
            );
        };
        const KEPT: &str = "placement-policy: annotations are not changed through the status subresource (kept as stored); change them on the object itself";
        // A Karmada binding's record is its annotations and its narrowed
        // placement (a binding's status update changes neither).
        let kept = if is_binding(&request.kind.group, &request.kind.kind) {
            guardrail::keep_stored_record(object, stored)
        } else {
            policy_client::verdict::keep_stored_annotations(object, stored)
        };
        match kept {
            Ok(None) => (AdmissionResponse::allow(uid), Outcome::Unchanged),
            Ok(Some(patch)) if mode == Mode::Mutate => (
                AdmissionResponse::allow(uid)
                    .with_patch(&patch)
                    .with_warning(KEPT.to_owned()),
                Outcome::Patched,
            ),
            Ok(Some(_)) => (
                AdmissionResponse::deny(uid, 403, "Forbidden", KEPT.to_owned()),
                Outcome::Denied,
            ),
            Err(e) => (
                AdmissionResponse::deny(
                    uid,
                    400,
                    "BadRequest",
                    format!("malformed AdmissionReview request: {e}"),
                ),
                Outcome::Malformed,
            ),
        }
    }

    /// Fail closed iff policies exist.
    fn guard(
        &self,
        request: &AdmissionRequest,
        failure: PlacementFailure,
    ) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        // Bad input is the client's own: no Event, no engine-error metric.
        if let PlacementFailure::InvalidInput(_) = &failure {
            let message = format!("malformed AdmissionReview request: {failure}");
            return (
                AdmissionResponse::deny(uid, failure.status_code(), failure.reason(), message),
                Outcome::Malformed,
            );
        }
        self.count_engine_error(&failure);
        let where_ = self.presence.describe();
        if self.presence.policies_exist() {
            let message = bounded(format!(
                "placement-policy: denied because placement policies exist ({where_}) and {failure}"
            ));
            tracing::warn!(uid, reason = failure.reason(), "{message}");
            self.events.emit(request, failure.reason(), &message);
            (
                AdmissionResponse::deny(uid, failure.status_code(), failure.reason(), message),
                Outcome::FailedClosed,
            )
        } else {
            let message = bounded(format!(
                "placement-policy: admitted unchanged because no placement policy exists ({where_}), although {failure}"
            ));
            tracing::warn!(uid, reason = failure.reason(), "{message}");
            self.events.emit(request, failure.reason(), &message);
            (
                AdmissionResponse::allow(uid).with_warning(message),
                Outcome::FailedOpen,
            )
        }
    }

    /// Count a failure of the engine or the policy itself.
    fn count_engine_error(&self, failure: &PlacementFailure) {
        match failure {
            PlacementFailure::EngineUnavailable(e) => self.metrics.engine_error(e.kind()),
            PlacementFailure::PolicyError(_) => self.metrics.engine_error("evaluation"),
            _ => {}
        }
    }

    async fn place(
        &self,
        request: &AdmissionRequest,
        object: &Value,
    ) -> Result<Placement, PlacementFailure> {
        let object = &*identified(request, object);
        let deadline = Instant::now() + self.settings.engine_deadline;
        let keys = self.keys()?;
        let decision = self.decision(request, object, deadline).await?;
        let stored = match request.operation {
            Operation::Update => request.old_object.as_ref(),
            _ => None,
        };
        let (restore, errors) = match plan(object, stored, &decision, &keys)? {
            Plan::Place(patch) => return Ok(Placement::Patch(patch)),
            Plan::Keep { restore, errors } => (restore, errors),
        };
        // An UPDATE that leaves the developer's request as it was and adds no
        // violation is not denied (Kyverno's allowExistingViolations): the
        // controllers that scale, roll out and finalize a workload whose
        // placement became invalid must go on. One that changes the request is
        // judged on the new object alone.
        let existing = match stored {
            Some(old) if !request_changed(object, old, &keys) => {
                self.decision(request, old, deadline).await?.errors
            }
            _ => Vec::new(),
        };
        let (existing, new): (Vec<String>, Vec<String>) = errors
            .into_iter()
            .partition(|error| existing.contains(error));
        if new.is_empty() {
            // The stored placement stays (a decision with errors never
            // removes or replaces one), restored where the update lacks it.
            return Ok(Placement::Tolerated {
                patch: restore,
                existing,
            });
        }
        Ok(Placement::Denied { new, existing })
    }

    fn keys(&self) -> Result<Arc<OwnershipKeys>, PlacementFailure> {
        self.settings
            .ownership_keys
            .current()
            .ok_or(PlacementFailure::KeysUnavailable)
    }

    /// The policy's decision for `object` under `request`'s metadata.
    async fn decision(
        &self,
        request: &AdmissionRequest,
        object: &Value,
        deadline: Instant,
    ) -> Result<Decision, PlacementFailure> {
        let keys = self.keys()?;
        let input = request_input(request, object, &keys);
        self.query(&input, deadline).await
    }

    /// Ask the engine for the decision on `input`.
    async fn query(
        &self,
        input: &PolicyInput<'_>,
        deadline: Instant,
    ) -> Result<Decision, PlacementFailure> {
        let outcome = self
            .engine
            .query_input(&self.settings.decision_path, input, deadline)
            .await
            .map_err(PlacementFailure::from_engine)?;
        let QueryOutcome::Defined(result) = outcome else {
            return Err(PlacementFailure::Undefined {
                path: self.settings.decision_path.replace('/', "."),
            });
        };
        Ok(Decision::from_result(&result)?)
    }
}

/// `object` with what identifies it as the API server stores it, which its
/// ownership record is bound to: on an UPDATE the stored object's uid and
/// creation time (the API server keeps both; a client's own are refused or
/// replaced), on a CREATE none (the API server assigns them once admission
/// is done; a client's own, copied from another object, are not this
/// object's). Copied only when the request's differ.
fn identified<'a>(request: &AdmissionRequest, object: &'a Value) -> Cow<'a, Value> {
    const FIELDS: [&str; 2] = ["uid", "creationTimestamp"];
    let stored = match request.operation {
        Operation::Update => request.old_object.as_ref().and_then(|o| o.get("metadata")),
        _ => None,
    };
    let wanted = |field: &str| stored.and_then(|meta| meta.get(field));
    let Some(meta) = object.get("metadata").and_then(Value::as_object) else {
        return Cow::Borrowed(object);
    };
    if FIELDS.iter().all(|f| meta.get(*f) == wanted(f)) {
        return Cow::Borrowed(object);
    }
    let mut object = object.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in FIELDS {
            match wanted(field) {
                Some(value) => meta.insert(field.to_owned(), value.clone()),
                None => meta.remove(field),
            };
        }
    }
    Cow::Owned(object)
}

enum Placement {
    /// The policy's errors, those this request introduces first.
    Denied {
        new: Vec<String>,
        existing: Vec<String>,
    },
    /// An UPDATE of an unchanged request whose errors the stored object
    /// already had: admitted, keeping the stored placement.
    Tolerated {
        patch: Option<json_patch::Patch>,
        existing: Vec<String>,
    },
    Patch(Option<json_patch::Patch>),
}

/// The policy input for `object` under `request` (one function for the
/// webhook and the remediator: [`policy_client::input::PolicyInput`]).
pub(crate) fn request_input<'a>(
    request: &AdmissionRequest,
    object: &'a Value,
    keys: &OwnershipKeys,
) -> PolicyInput<'a> {
    let kind = json!(request.kind);
    let resource = json!(request.resource);
    PolicyInput::new(
        object,
        &RequestMeta {
            uid: &request.uid,
            operation: request.operation.as_str(),
            kind: &kind,
            resource: &resource,
            namespace: request.namespace.as_deref(),
            name: request.name.as_deref(),
            user_info: &request.user_info,
            dry_run: request.dry_run.unwrap_or(false),
            old_object: request.old_object.as_ref(),
            keys,
        },
    )
}
