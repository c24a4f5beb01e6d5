//! `placement-webhook review`: answer each document of a file (manifests or
//! AdmissionReviews) offline, as the webhook would, and print the answers.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use kube::api::{ApiResource, GroupVersionKind};
use policy_client::ownership_keys::{LoadingKeys, OwnershipKeys, SharedKeys};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::admission::{Admission, AdmissionSettings, Guardrail, Mode};
use crate::config::{EngineKind, OutputFormat, ReviewArgs};
use crate::events::EventSink;
use crate::metrics::Metrics;
use crate::presence::PolicyPresence;
use crate::review::Caller;
use crate::run::{RunError, ownership_error};

/// What `review` found, for the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReviewSummary {
    pub documents: usize,
    pub denied: usize,
}

/// `placement-webhook review`: answer each document of FILE and print the
/// AdmissionReview response (and, for manifests, the object after the patch).
pub async fn review(args: ReviewArgs) -> Result<ReviewSummary, RunError> {
    let text = read_input(&args.file)?;
    let admission = offline_admission(&args)?;
    let mut summary = ReviewSummary {
        documents: 0,
        denied: 0,
    };
    let mut outputs = Vec::new();
    for (index, document) in yaml_serde::Deserializer::from_str(&text).enumerate() {
        let index = index + 1;
        let value = Value::deserialize(document).map_err(|e| RunError::Manifest {
            path: args.file.clone(),
            index,
            message: e.to_string(),
        })?;
        if value.is_null() {
            continue;
        }
        summary.documents += 1;
        let (out, allowed) = answer_document(&admission, &args.file, index, value).await?;
        if !allowed {
            summary.denied += 1;
        }
        outputs.push(out);
    }
    print_outputs(args.output, outputs);
    Ok(summary)
}

/// The webhook's admission, offline: no API server, no Events, keys of its own.
fn offline_admission(args: &ReviewArgs) -> Result<Admission, RunError> {
    let resolved = args.engine.resolve()?;
    let presence = match &resolved.kind {
        EngineKind::Embedded { dir, modules } => PolicyPresence::fixed(
            *modules > 0,
            format!("{modules} Rego module(s) in {}", dir.display()),
        ),
        EngineKind::Opa { .. } => {
            PolicyPresence::fixed(true, "offline review; policies assumed to exist".to_owned())
        }
    };
    Ok(Admission::new(
        resolved.engine,
        AdmissionSettings {
            decision_path: resolved.decision_path,
            engine_deadline: args.engine.engine_deadline,
            // Offline: nothing to share the records with.
            ownership_keys: LoadingKeys::loaded(SharedKeys::new(
                OwnershipKeys::ephemeral().map_err(ownership_error)?,
            )),
        },
        presence,
        EventSink::disabled(),
        Arc::new(Metrics::new()),
        // Offline: no API server to read a binding's template from.
        Guardrail::new(None, String::new()),
    ))
}

/// One document's answer (`{"review": ..}`, plus `"object"` after the patch
/// for a manifest) and whether it was allowed.
async fn answer_document(
    admission: &Admission,
    file: &Path,
    index: usize,
    value: Value,
) -> Result<(Value, bool), RunError> {
    let error = |message: String| RunError::Review {
        path: file.to_owned(),
        index,
        message,
    };
    let is_review = value.get("kind").and_then(Value::as_str) == Some("AdmissionReview");
    let body = if is_review {
        value.clone()
    } else {
        wrap_manifest(&value, index)
    };
    let bytes = serde_json::to_vec(&body).map_err(|e| error(e.to_string()))?;
    let answer = admission
        .review_body(&bytes, Mode::Mutate, Caller::default())
        .await
        .map_err(|e| error(e.to_string()))?;
    let allowed = answer.response.allowed;
    let mut out = json!({"review": answer});
    if !is_review {
        let mut object = value;
        if let Some(patch) = answer.response.decoded_patch() {
            json_patch::patch(&mut object, &patch)
                .map_err(|e| error(format!("the webhook's patch does not apply: {e}")))?;
        }
        out["object"] = object;
    }
    Ok((out, allowed))
}

fn print_outputs(format: OutputFormat, mut outputs: Vec<Value>) {
    match format {
        OutputFormat::Json => {
            let doc = if outputs.len() == 1 {
                outputs.remove(0)
            } else {
                Value::Array(outputs)
            };
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
        OutputFormat::Yaml => {
            for out in outputs {
                println!("---\n# AdmissionReview response");
                print!(
                    "{}",
                    yaml_serde::to_string(&out["review"]).unwrap_or_default()
                );
                if let Some(object) = out.get("object") {
                    println!("---\n# object after the patch");
                    print!("{}", yaml_serde::to_string(object).unwrap_or_default());
                }
            }
        }
    }
}

fn read_input(path: &Path) -> Result<String, RunError> {
    let err = |source| RunError::Input {
        path: path.to_owned(),
        source,
    };
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(err)?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).map_err(err)
    }
}

/// Wrap a manifest as the CREATE AdmissionReview the API server would send.
pub(crate) fn wrap_manifest(object: &Value, index: usize) -> Value {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let meta = object.get("metadata");
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    // The resource as kube names a kind's (its lower-case plural, with the
    // irregular ones of the built-in types); no API server to ask offline.
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)).plural;
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("offline-review-{index}"),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "namespace": namespace,
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "placement-webhook-review"},
            "object": object,
            "dryRun": true,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_names_its_resource_by_the_kinds_plural() {
        let resource = |kind: &str| {
            wrap_manifest(&json!({"apiVersion": "x.io/v1", "kind": kind}), 0)["request"]["resource"]
                ["resource"]
                .clone()
        };
        assert_eq!(resource("ReplicaSet"), "replicasets");
        assert_eq!(resource("Policy"), "policies");
        assert_eq!(resource("Gateway"), "gateways");
        assert_eq!(resource("Ingress"), "ingresses");
        assert_eq!(resource("Endpoints"), "endpoints");
    }

    #[test]
    fn manifest_is_wrapped_as_a_create() {
        let rs =
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web"}});
        let review = wrap_manifest(&rs, 1);
        assert_eq!(review["request"]["operation"], "CREATE");
        assert_eq!(review["request"]["kind"]["group"], "apps");
        assert_eq!(review["request"]["resource"]["resource"], "replicasets");
        assert_eq!(review["request"]["namespace"], "default");
        assert_eq!(review["request"]["object"], rs);
    }
}
