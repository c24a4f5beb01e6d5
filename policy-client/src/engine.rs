//! The engine abstraction shared by the OPA REST client and the embedded Rego engine.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::input::PolicyInput;

/// What a query returned: a document, or nothing at all.
///
/// `Undefined` is its own outcome on purpose: an engine that has not (yet) loaded
/// the policy answers "undefined", and reading that as "no annotations" would let
/// objects through unplaced.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryOutcome {
    Defined(Value),
    Undefined,
}

/// A JSON document already encoded, kept as the pieces it was assembled from
/// (each object's own buffer, the separators between them), in order. A
/// whole replicated type is sent piece by piece, so its document is never
/// joined into one more copy of every object.
#[derive(Debug, Clone, Default)]
pub struct EncodedJson {
    pieces: Arc<[Bytes]>,
    len: usize,
}

impl EncodedJson {
    pub fn from_pieces(pieces: Vec<Bytes>) -> Self {
        let len = pieces.iter().map(Bytes::len).sum();
        EncodedJson {
            pieces: pieces.into(),
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// The pieces shared with the caller (a cheap clone), to send them.
    pub(crate) fn shared_pieces(&self) -> Arc<[Bytes]> {
        Arc::clone(&self.pieces)
    }

    /// The whole document in one buffer (a copy, unless it is one piece).
    pub fn joined(&self) -> Bytes {
        match &*self.pieces {
            [one] => one.clone(),
            pieces => {
                let mut out = Vec::with_capacity(self.len);
                for piece in pieces {
                    out.extend_from_slice(piece);
                }
                out.into()
            }
        }
    }
}

impl From<Bytes> for EncodedJson {
    fn from(json: Bytes) -> Self {
        EncodedJson::from_pieces(vec![json])
    }
}

impl From<Vec<u8>> for EncodedJson {
    fn from(json: Vec<u8>) -> Self {
        Bytes::from(json).into()
    }
}

/// A Rego compile (or parse) error, located in a module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompileError {
    /// Module id (OPA) or file name (embedded) the error is in, when known.
    pub file: Option<String>,
    pub row: Option<u32>,
    pub col: Option<u32>,
    /// OPA's error code (`rego_parse_error`, `rego_type_error`, ...), when known.
    pub code: Option<String>,
    pub message: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}")?;
            if let Some(row) = self.row {
                write!(f, ":{row}")?;
                if let Some(col) = self.col {
                    write!(f, ":{col}")?;
                }
            }
            write!(f, ": ")?;
        }
        if let Some(code) = &self.code {
            write!(f, "{code}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// Whether retrying the same call may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Connect failures, timeouts, 429 and 5xx: retry with backoff.
    Transient,
    /// Everything else: retrying cannot help.
    Permanent,
}

/// Errors from a policy engine. Messages never contain the bearer token.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("policy engine unreachable at {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    #[error("policy engine did not answer within {timeout:?} ({endpoint})")]
    Timeout { endpoint: String, timeout: Duration },
    #[error("policy engine answered HTTP {status} for {endpoint}: {message}")]
    Http {
        endpoint: String,
        status: u16,
        message: String,
        /// Server's `Retry-After`, when it sent one.
        retry_after: Option<Duration>,
    },
    #[error("policy engine rejected the credentials (HTTP {status}); check the token")]
    Unauthorized { status: u16 },
    #[error("policy failed to compile: {}", join_compile_errors(.0))]
    Compile(Vec<CompileError>),
    /// The policy itself failed (a rule with two values, a type error, ...):
    /// asking again gives the same answer.
    #[error("policy evaluation failed: {0}")]
    Evaluation(String),
    /// The engine cannot take this input (it is the caller's fault, not the
    /// engine's): asking again gives the same answer.
    #[error("the policy engine cannot evaluate this input: {0}")]
    InvalidInput(String),
    /// The embedded engine stopped an evaluation at its memory ceiling.
    #[error("policy evaluation stopped at the engine's memory limit: {0}")]
    MemoryLimit(String),
    #[error("policy engine sent a response that is not valid JSON: {0}")]
    InvalidResponse(String),
    #[error("no document at {path:?} in the policy engine: {message}")]
    NotFound { path: String, message: String },
    #[error("invalid engine path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error(
        "policy engine gave up after {attempts} attempts within {deadline:?}; last error: {last}"
    )]
    DeadlineExceeded {
        attempts: u32,
        deadline: Duration,
        last: Box<EngineError>,
    },
    #[error("policy engine configuration: {0}")]
    Config(String),
}

fn join_compile_errors(errors: &[CompileError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl EngineError {
    pub fn class(&self) -> ErrorClass {
        match self {
            EngineError::Unreachable { .. } | EngineError::Timeout { .. } => ErrorClass::Transient,
            EngineError::Http { status, .. } if *status == 429 || *status >= 500 => {
                ErrorClass::Transient
            }
            _ => ErrorClass::Permanent,
        }
    }

    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// Whether a write that failed with this error may still take effect in
    /// the engine: no answer came (a timeout, a connection lost after the
    /// request went out, an unreadable answer) or the engine failed
    /// mid-way (5xx). A refusal the engine answered (a compile error, any
    /// other 4xx) left its state as it was.
    pub fn write_in_doubt(&self) -> bool {
        match self {
            EngineError::Unreachable { .. }
            | EngineError::Timeout { .. }
            | EngineError::InvalidResponse(_) => true,
            EngineError::Http { status, .. } => *status >= 500,
            EngineError::DeadlineExceeded { last, .. } => last.write_in_doubt(),
            _ => false,
        }
    }

    /// The delay the engine asked for, if it asked.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            EngineError::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Unreachable { .. } => "unreachable",
            EngineError::Timeout { .. } => "timeout",
            EngineError::Http { .. } => "http",
            EngineError::Unauthorized { .. } => "unauthorized",
            EngineError::Compile(_) => "compile",
            EngineError::Evaluation(_) => "evaluation",
            EngineError::InvalidInput(_) => "invalid_input",
            EngineError::MemoryLimit(_) => "memory_limit",
            EngineError::InvalidResponse(_) => "invalid_response",
            EngineError::NotFound { .. } => "not_found",
            EngineError::InvalidPath { .. } => "invalid_path",
            EngineError::DeadlineExceeded { last, .. } => last.kind(),
            EngineError::Config(_) => "config",
        }
    }
}

/// What the decision cache did, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionCacheStats {
    /// Why the loaded policy set is not cached (`None`: it is, when the
    /// budget is above zero).
    pub refused: Option<String>,
    pub budget_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub entries: u64,
    pub bytes: u64,
}

/// How the embedded engine's compiled answers compared with its
/// interpreter's (the reference), for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnswerChecks {
    /// Answers compared.
    pub compared: u64,
    /// Answers the interpreter gave otherwise (or failed on, as OPA does on
    /// a conflict); each sent its query to the interpreter.
    pub disagreements: u64,
}

/// A policy engine: evaluates decisions and stores data and policy modules.
///
/// Paths are slash-separated document paths below `data`, e.g.
/// `io/k8s/federation/admission` or `kubernetes/clusters/eu-west-1`.
/// Each method is a single attempt except [`PolicyEngine::query`], which retries
/// transient failures until `deadline`.
#[async_trait]
pub trait PolicyEngine: Send + Sync + fmt::Debug {
    /// A short name for logs and metrics ("opa", "embedded").
    fn name(&self) -> &'static str;

    /// Evaluate the document at `path` with `input`, retrying transient failures
    /// with jittered exponential backoff until `deadline`.
    async fn query(
        &self,
        path: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError>;

    /// [`PolicyEngine::query`] with the policy input of an object
    /// ([`PolicyInput`]), put together here; an engine that reads only some
    /// paths of it (the embedded one, a decision memory) reads them in place
    /// instead, with no copy of the object.
    async fn query_input(
        &self,
        path: &str,
        input: &PolicyInput<'_>,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        self.query(path, &input.clone().into_value(), deadline)
            .await
    }

    /// Create or replace the data document at `path`.
    async fn put_data(&self, path: &str, value: &Value) -> Result<(), EngineError>;

    /// [`PolicyEngine::put_data`] with the document already encoded as JSON:
    /// a large document (a whole replicated type) is written from its pieces,
    /// with neither a value tree nor a joined copy of it in memory where the
    /// engine is remote.
    async fn put_data_encoded(&self, path: &str, json: EncodedJson) -> Result<(), EngineError> {
        let value: Value =
            serde_json::from_slice(&json.joined()).map_err(|e| EngineError::InvalidPath {
                path: path.to_owned(),
                reason: format!("the document is not JSON: {e}"),
            })?;
        self.put_data(path, &value).await
    }

    /// Apply an RFC 6902 patch to the existing data document at `path`.
    /// A missing document, or an operation on a missing member, is
    /// [`EngineError::NotFound`]; nothing is changed then.
    async fn patch_data(&self, path: &str, patch: &json_patch::Patch) -> Result<(), EngineError>;

    /// Remove the data document at `path`; removing an absent document succeeds.
    async fn delete_data(&self, path: &str) -> Result<(), EngineError>;

    /// Create or replace the policy module `id`. Compile errors come back as
    /// [`EngineError::Compile`] and leave the previously loaded modules in place.
    async fn put_policy(&self, id: &str, source: &str) -> Result<(), EngineError>;

    /// Remove the policy module `id`; removing an absent module succeeds.
    async fn delete_policy(&self, id: &str) -> Result<(), EngineError>;

    /// The loaded policy modules: id to source. Sources let a caller analyse
    /// modules that somebody else loaded (an authorization policy given to OPA
    /// as a file, another tool's rules) instead of guessing what they read.
    async fn policies(&self) -> Result<BTreeMap<String, String>, EngineError>;

    /// Whether the engine is up and answering.
    async fn health(&self) -> Result<(), EngineError>;

    /// An id of the running engine that changes whenever it restarts (and so
    /// loses what it held), without writing anything into it; `None` when the
    /// engine has none to offer (then a sentinel document tells).
    async fn instance_id(&self) -> Result<Option<String>, EngineError> {
        Ok(None)
    }

    /// What the engine's decision cache did; `None` when it has none.
    fn decision_cache(&self) -> Option<DecisionCacheStats> {
        None
    }

    /// How the engine's compiled answers compared with its interpreter's;
    /// `None` when it has no compiled form (OPA).
    fn answer_checks(&self) -> Option<AnswerChecks> {
        None
    }
}

/// Split and check a slash-separated document path.
pub(crate) fn path_segments(path: &str) -> Result<Vec<&str>, EngineError> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let segments: Vec<&str> = trimmed.split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(EngineError::InvalidPath {
            path: path.to_owned(),
            reason: "empty path segment".to_owned(),
        });
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_classification() {
        let http = |status| EngineError::Http {
            endpoint: "x".into(),
            status,
            message: String::new(),
            retry_after: None,
        };
        assert!(http(503).is_transient());
        assert!(http(500).is_transient());
        assert!(http(429).is_transient());
        assert!(!http(400).is_transient());
        assert!(!http(404).is_transient());
        assert!(!EngineError::Unauthorized { status: 401 }.is_transient());
        assert!(
            EngineError::Unreachable {
                endpoint: "x".into(),
                detail: "refused".into()
            }
            .is_transient()
        );
        assert!(!EngineError::Compile(vec![]).is_transient());
        assert!(!EngineError::Evaluation("conflict".into()).is_transient());
        assert!(!EngineError::InvalidInput("x".into()).is_transient());
    }

    #[test]
    fn compile_error_display_names_location() {
        let e = CompileError {
            file: Some("placement.rego".into()),
            row: Some(3),
            col: Some(7),
            code: Some("rego_parse_error".into()),
            message: "unexpected eof".into(),
        };
        assert_eq!(
            e.to_string(),
            "placement.rego:3:7: rego_parse_error: unexpected eof"
        );
    }

    #[test]
    fn path_segments_rejects_empty_segments() {
        assert_eq!(path_segments("/a/b/").unwrap(), vec!["a", "b"]);
        assert!(path_segments("").unwrap().is_empty());
        assert!(path_segments("a//b").is_err());
    }
}
