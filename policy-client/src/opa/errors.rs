//! OPA's answers that are errors, in the engine's error classes: compile
//! errors located in their modules, evaluation errors of the policy
//! (permanent), everything else by HTTP status.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use crate::engine::{CompileError, EngineError};
use crate::text::bounded;

/// The subset of OPA's error body we use.
#[derive(Debug, Deserialize)]
struct OpaErrorBody {
    code: Option<String>,
    message: Option<String>,
    #[serde(default)]
    errors: Vec<OpaErrorDetail>,
}

#[derive(Debug, Deserialize)]
struct OpaErrorDetail {
    code: Option<String>,
    message: Option<String>,
    location: Option<OpaLocation>,
}

#[derive(Debug, Deserialize)]
struct OpaLocation {
    file: Option<String>,
    row: Option<u32>,
    col: Option<u32>,
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// OPA's located errors (compile and evaluation errors), in our shape.
fn located_errors(details: &[OpaErrorDetail]) -> Vec<CompileError> {
    details
        .iter()
        .map(|d| CompileError {
            file: d.location.as_ref().and_then(|l| l.file.clone()),
            row: d.location.as_ref().and_then(|l| l.row),
            col: d.location.as_ref().and_then(|l| l.col),
            code: d.code.clone(),
            message: d.message.clone().unwrap_or_default(),
        })
        .collect()
}

/// An evaluation error of the policy itself (`eval_conflict_error`,
/// `eval_type_error`, ...). Cancellation (`eval_cancel_error`: OPA's own
/// timeout or shutdown) is not the policy's fault and may pass.
fn is_policy_evaluation_error(code: Option<&str>) -> bool {
    code.is_some_and(|c| c.starts_with("eval_") && c != "eval_cancel_error")
}

pub(super) fn http_error(
    endpoint: String,
    status: StatusCode,
    body: &[u8],
    retry_after: Option<Duration>,
) -> EngineError {
    let parsed: Option<OpaErrorBody> = serde_json::from_slice(body).ok();
    if let Some(parsed) = &parsed {
        let codes = || parsed.errors.iter().map(|d| d.code.as_deref());
        if status == StatusCode::BAD_REQUEST
            && codes().any(|c| c.is_some_and(|c| c.starts_with("rego_")))
        {
            return EngineError::Compile(located_errors(&parsed.errors));
        }
        // OPA answers 500 for evaluation errors; they are permanent, unlike
        // the 5xx of an overloaded or restarting server.
        if status == StatusCode::INTERNAL_SERVER_ERROR && codes().any(is_policy_evaluation_error) {
            let located: Vec<String> = located_errors(&parsed.errors)
                .iter()
                .map(ToString::to_string)
                .collect();
            return EngineError::Evaluation(bounded(located.join("; ")));
        }
    }
    let message = match parsed {
        Some(OpaErrorBody {
            code,
            message,
            errors,
        }) => {
            let mut msg = match (code, message) {
                (Some(c), Some(m)) => format!("{c}: {m}"),
                (None, Some(m)) => m,
                (Some(c), None) => c,
                (None, None) => String::new(),
            };
            for d in errors {
                msg.push_str("; ");
                msg.push_str(d.message.as_deref().unwrap_or_default());
            }
            bounded(msg)
        }
        None => String::from_utf8_lossy(&body[..body.len().min(512)])
            .trim()
            .to_owned(),
    };
    EngineError::Http {
        endpoint,
        status: status.as_u16(),
        message,
        retry_after,
    }
}
