//! `kubectl placement held` and `confirm ID`: the changes placement-sync's
//! blast-radius guard holds, as it reports them on the policy ConfigMaps of
//! the policy namespace (annotation `placement-policy.io/remediation-held`),
//! and the confirmation it takes there
//! (`placement-policy.io/confirm-remediation=<id>`, used once).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use policy_client::configmaps::{ConfigMapFlags, ConfigMapKind, ConfigMapSelection};
use serde_json::{Value, json};

use crate::cli::{ConfirmArgs, Global, HeldArgs, Output, PluginEnv};
use crate::error::PluginError;
use crate::policy_set::{Selected, configmaps};
use crate::table;

/// The report of a held change.
const HELD_ANNOTATION: &str = "placement-policy.io/remediation-held";
/// An administrator's confirmation of one held change.
const CONFIRM_ANNOTATION: &str = "placement-policy.io/confirm-remediation";

/// A held change, as reported, and the ConfigMap it is reported on.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) report: Value,
    pub(crate) configmap: String,
}

impl Held {
    pub(crate) fn id(&self) -> &str {
        self.report["id"].as_str().unwrap_or_default()
    }
}

/// The held changes reported on the policy namespace's ConfigMaps (one per
/// id: every ConfigMap carries the same report).
pub(crate) fn reported(configmaps: &[Selected], selection: &ConfigMapSelection) -> Vec<Held> {
    let Some(namespace) = &selection.policy_namespace else {
        return Vec::new();
    };
    let mut held: Vec<Held> = Vec::new();
    for cm in configmaps
        .iter()
        .filter(|c| c.kind == ConfigMapKind::Policy && c.key.starts_with(&format!("{namespace}/")))
    {
        let Some(report) = cm
            .annotation(HELD_ANNOTATION)
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
        else {
            continue;
        };
        if held.iter().all(|h| h.report["id"] != report["id"]) {
            held.push(Held {
                report,
                configmap: cm.key.clone(),
            });
        }
    }
    held
}

/// A client of the cluster and the changes held now in the ConfigMaps
/// `flags` select.
async fn held_now(
    global: &Global,
    flags: &ConfigMapFlags<PluginEnv>,
) -> Result<(kube::Client, Vec<Held>), PluginError> {
    let client = policy_client::kube_client::client(global.kubeconfig.as_deref()).await?;
    let selection = flags.selection(true).map_err(PluginError::Usage)?;
    let held = reported(&configmaps(&client, &selection).await?, &selection);
    Ok((client, held))
}

pub(crate) async fn held(global: &Global, args: HeldArgs) -> Result<u8, PluginError> {
    let (_, held) = held_now(global, &args.configmaps).await?;
    if global.output == Output::Json {
        let reports: Vec<&Value> = held.iter().map(|h| &h.report).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
        return Ok(0);
    }
    print!("{}", render(&held));
    Ok(0)
}

fn render(held: &[Held]) -> String {
    if held.is_empty() {
        return "no change is held\n".to_owned();
    }
    let mut out = String::new();
    let mut rows = vec![vec![
        "ID".to_owned(),
        "AFFECTED".to_owned(),
        "CAUSE".to_owned(),
    ]];
    rows.extend(held.iter().map(|h| {
        vec![
            h.id().to_owned(),
            format!("{} of {} placed", h.report["affected"], h.report["placed"]),
            h.report["cause"].as_str().unwrap_or_default().to_owned(),
        ]
    }));
    out.push_str(&table::render(&rows));
    for h in held {
        out.push_str(&format!("\n{} would move:\n", h.id()));
        let moves = h.report["moves"].as_array();
        match moves {
            Some(moves) => {
                for m in moves {
                    let off: Vec<&str> = m["off"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    let what = if off.is_empty() {
                        "placement rewritten".to_owned()
                    } else {
                        format!("taken off {}", off.join(", "))
                    };
                    out.push_str(&format!(
                        "  {}: {what}\n",
                        m["object"].as_str().unwrap_or_default()
                    ));
                }
            }
            // A report of a placement-sync that does not list moves.
            None => {
                for o in h.report["objects"].as_array().into_iter().flatten() {
                    out.push_str(&format!("  {}\n", o.as_str().unwrap_or_default()));
                }
            }
        }
        let listed = h.report["objects"].as_array().map_or(0, Vec::len);
        let affected = h.report["affected"].as_u64().unwrap_or(0) as usize;
        if affected > listed {
            out.push_str(&format!("  ... and {} more\n", affected - listed));
        }
        out.push_str(&format!(
            "  (reported on ConfigMap {}) confirm with: kubectl placement confirm {}\n",
            h.configmap,
            h.id()
        ));
    }
    out
}

pub(crate) async fn confirm(global: &Global, args: ConfirmArgs) -> Result<u8, PluginError> {
    let (client, held) = held_now(global, &args.configmaps).await?;
    let id = args.id.trim();
    let Some(change) = held.iter().find(|h| h.id() == id) else {
        let now: Vec<&str> = held.iter().map(Held::id).collect();
        return Err(PluginError::Usage(if now.is_empty() {
            format!("no change is held now, so {id:?} confirms nothing")
        } else {
            format!(
                "no held change has the id {id:?}; held now: {} (kubectl placement held)",
                now.join(", ")
            )
        }));
    };
    let (namespace, name) = change
        .configmap
        .split_once('/')
        .expect("a ConfigMap key is namespace/name");
    let patch = json!({"metadata": {"annotations": {CONFIRM_ANNOTATION: id}}});
    Api::<ConfigMap>::namespaced(client, namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(PluginError::api(format!(
            "annotating ConfigMap {} with {CONFIRM_ANNOTATION}={id} (needs patch on ConfigMaps of the policy namespace)",
            change.configmap
        )))?;
    println!(
        "confirmed {id} on ConfigMap {}: placement-sync applies the change at its next pass and then removes the report (kubectl placement held)",
        change.configmap
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn cm(key: &str, report: Option<Value>) -> Selected {
        Selected {
            key: key.to_owned(),
            kind: ConfigMapKind::Policy,
            data: BTreeMap::new(),
            annotations: report
                .map(|r| (HELD_ANNOTATION.to_owned(), r.to_string()))
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn one_held_change_per_id_from_the_policy_namespace_only() {
        let report = json!({"id": "abc", "cause": "the policy set", "affected": 12, "placed": 20,
            "objects": ["replicasets/default/web"],
            "moves": [{"object": "replicasets/default/web", "off": ["eu-2"]}]});
        let selection = ConfigMapSelection {
            policy_namespace: Some("policies".into()),
            ..ConfigMapSelection::default()
        };
        let held = reported(
            &[
                cm("policies/a", Some(report.clone())),
                cm("policies/b", Some(report.clone())),
                cm("tenant/c", Some(json!({"id": "forged"}))),
                cm("policies/d", None),
            ],
            &selection,
        );
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].id(), "abc");
        let text = render(&held);
        assert!(
            text.contains("replicasets/default/web: taken off eu-2"),
            "{text}"
        );
        assert!(text.contains("... and 11 more"), "{text}");
        assert!(text.contains("kubectl placement confirm abc"), "{text}");
    }
}
