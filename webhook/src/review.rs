//! `admission.k8s.io/v1` AdmissionReview on the wire.
//!
//! Our own serde types rather than kube-rs's: the object stays raw JSON exactly as
//! the API server sent it (it is the policy's input), and the patch goes out as a
//! base64 string, which kube-rs's `AdmissionResponse` does not produce.

use std::net::IpAddr;

use base64::Engine as _;
use policy_client::text::{bounded, truncate};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

pub(crate) const API_VERSION: &str = "admission.k8s.io/v1";
pub(crate) const KIND: &str = "AdmissionReview";

/// Longest warning: the API server shows each on one line of `kubectl` output.
const MAX_WARNING_BYTES: usize = 240;

/// A review that cannot be answered with a review.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    #[error("malformed AdmissionReview: body is not JSON: {0}")]
    NotJson(String),
    #[error(
        "unsupported AdmissionReview {api_version}/{kind}: this webhook speaks admission.k8s.io/v1 AdmissionReview (set admissionReviewVersions: [\"v1\"])"
    )]
    UnsupportedVersion { api_version: String, kind: String },
    #[error("malformed AdmissionReview: no request.uid")]
    MissingUid,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub(crate) struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub(crate) struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// Who sent a review: its peer and whether its certificate was verified (its
/// Events are limited by it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Caller {
    /// Its peer (`placement_endpoint::Peers::key`); `None`: not over the
    /// network (the offline `review`).
    pub(crate) peer: Option<IpAddr>,
    /// It presented a client certificate the TLS layer verified.
    pub(crate) verified: bool,
}

/// The fields of `AdmissionRequest` this webhook reads.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// Who sent it (not part of the review: set by whoever received it).
    #[serde(skip)]
    pub caller: Caller,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub(crate) enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// Status attached to a denial.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct Status {
    pub code: u16,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of the RFC 6902 patch, as the API server requires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    pub(crate) fn allow(uid: &str) -> Self {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: true,
            status: None,
            patch: None,
            patch_type: None,
            warnings: Vec::new(),
        }
    }

    /// A denial. The message is bounded: it can quote the client's own object
    /// (a policy error naming an annotation value, a parse error).
    pub(crate) fn deny(uid: &str, code: u16, reason: &str, message: String) -> Self {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: false,
            status: Some(Status {
                code,
                message: bounded(message),
                reason: Some(reason.to_owned()),
            }),
            patch: None,
            patch_type: None,
            warnings: Vec::new(),
        }
    }

    pub(crate) fn with_patch(mut self, patch: &json_patch::Patch) -> Self {
        let bytes = serde_json::to_vec(patch).unwrap_or_else(|_| b"[]".to_vec());
        self.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        self.patch_type = Some("JSONPatch");
        self
    }

    pub(crate) fn with_warning(mut self, warning: String) -> Self {
        self.warnings
            .push(truncate(&warning, MAX_WARNING_BYTES).into_owned());
        self
    }

    /// The decoded patch, if any.
    pub(crate) fn decoded_patch(&self) -> Option<json_patch::Patch> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(self.patch.as_ref()?)
            .ok()?;
        serde_json::from_slice(&raw).ok()
    }
}

/// The whole review sent back.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionReviewResponse {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub response: AdmissionResponse,
}

impl From<AdmissionResponse> for AdmissionReviewResponse {
    fn from(response: AdmissionResponse) -> Self {
        AdmissionReviewResponse {
            api_version: API_VERSION,
            kind: KIND,
            response,
        }
    }
}

/// A parsed review: either a request to answer, or a request whose uid we know but
/// whose other fields are broken (answered with a denial naming the problem).
#[derive(Debug)]
pub(crate) enum Parsed {
    Request(Box<AdmissionRequest>),
    Malformed { uid: String, message: String },
}

/// The review around the request, with the request left unparsed: the
/// request is parsed once, straight into [`AdmissionRequest`].
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: Value,
    #[serde(default)]
    kind: Value,
    #[serde(borrow, default)]
    request: Option<&'a RawValue>,
}

/// The review parsed whole, as a well-formed one is: one pass over the body.
#[derive(Deserialize)]
struct WholeReview {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    request: AdmissionRequest,
}

/// Only the uid of a request that does not parse, to answer it.
#[derive(Deserialize)]
struct UidOnly {
    #[serde(default)]
    uid: Value,
}

/// Parse a request body: a well-formed review in one pass; anything else
/// again, step by step, to say what is wrong with it.
pub(crate) fn parse(body: &[u8]) -> Result<Parsed, ReviewError> {
    match serde_json::from_slice::<WholeReview>(body) {
        Ok(review)
            if review.api_version == API_VERSION
                && review.kind == KIND
                && !review.request.uid.is_empty()
                && not_an_object(&review.request).is_none() =>
        {
            Ok(Parsed::Request(Box::new(review.request)))
        }
        _ => parse_in_steps(body),
    }
}

/// The envelope first, its version checked, then the request, so that each
/// fault is named (and a request that does not parse is answered by its uid).
fn parse_in_steps(body: &[u8]) -> Result<Parsed, ReviewError> {
    let envelope: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        // Valid JSON that is not a review object (an array, a string, a
        // duplicate field) has no version to accept.
        Err(e) if e.is_data() => Envelope {
            api_version: Value::Null,
            kind: Value::Null,
            request: None,
        },
        Err(e) => return Err(ReviewError::NotJson(e.to_string())),
    };
    let api_version = envelope.api_version.as_str().unwrap_or_default();
    let kind = envelope.kind.as_str().unwrap_or_default();
    if api_version != API_VERSION || kind != KIND {
        return Err(ReviewError::UnsupportedVersion {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        });
    }
    let raw = envelope.request.map_or("null", RawValue::get);
    let uid_of = |request: &str| -> Result<String, ReviewError> {
        serde_json::from_str::<UidOnly>(request)
            .ok()
            .and_then(|r| r.uid.as_str().filter(|u| !u.is_empty()).map(str::to_owned))
            .ok_or(ReviewError::MissingUid)
    };
    match serde_json::from_str::<AdmissionRequest>(raw) {
        Ok(request) if request.uid.is_empty() => Err(ReviewError::MissingUid),
        Ok(request) => match not_an_object(&request) {
            None => Ok(Parsed::Request(Box::new(request))),
            Some(message) => Ok(Parsed::Malformed {
                uid: request.uid,
                message,
            }),
        },
        Err(e) => Ok(Parsed::Malformed {
            uid: uid_of(raw)?,
            message: bounded(format!("malformed AdmissionReview request: {e}")),
        }),
    }
}

/// The objects under review are Kubernetes objects: JSON objects. Anything else
/// is the client's mistake, named here rather than handed to the engine.
fn not_an_object(request: &AdmissionRequest) -> Option<String> {
    [
        ("request.object", &request.object),
        ("request.oldObject", &request.old_object),
    ]
    .into_iter()
    .find_map(|(field, value)| {
        let kind = match value.as_ref()? {
            Value::Object(_) => return None,
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
        };
        Some(format!(
            "malformed AdmissionReview request: {field} must be a JSON object (the Kubernetes object under review), not {kind}"
        ))
    })
}

#[cfg(test)]
mod tests;
