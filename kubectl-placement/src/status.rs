//! `kubectl placement status`: whether the policy set is loaded (each policy
//! ConfigMap's `placement-policy.io/policy-status`), in force (the last good
//! set placement-sync keeps holds the ConfigMaps' current modules), and each
//! engine in sync (placement-sync's `/readyz`), plus the held changes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use policy_client::configmaps::ConfigMapKind;
use serde_json::{Value, json};

use crate::cli::{Global, Output, StatusArgs};
use crate::error::PluginError;
use crate::held::reported;
use crate::policy_set::{CHART_LABEL, configmaps, last_good};
use crate::table;

/// Exit status when the set is not in force or an engine is not in sync.
const NOT_IN_FORCE: u8 = 3;
/// placement-sync's port in the chart's pods.
const SYNC_PORT_NAME: &str = "sync-metrics";

/// One engine's sync, from its placement-sync's `/readyz`.
#[derive(Debug, Clone)]
struct EngineSync {
    source: String,
    /// `None`: not reachable.
    state: Option<Value>,
    detail: String,
}

impl EngineSync {
    fn synced(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| s["synced"] == true && s["engine_up"] == true)
    }
}

pub(crate) async fn status(global: &Global, args: StatusArgs) -> Result<u8, PluginError> {
    let client = policy_client::kube_client::client(global.kubeconfig.as_deref()).await?;
    let selection = args
        .configmaps
        .selection(true)
        .map_err(PluginError::Usage)?;
    let selected = configmaps(&client, &selection).await?;
    let policies: Vec<_> = selected
        .iter()
        .filter(|c| c.kind == ConfigMapKind::Policy)
        .collect();
    let kept = last_good(&client, args.last_good_policies.as_deref()).await?;
    let current: BTreeMap<String, String> = policies
        .iter()
        .flat_map(|cm| {
            cm.data
                .iter()
                .map(move |(key, source)| (format!("{}/{key}", cm.key), source.clone()))
        })
        .collect();
    let loaded = policies.iter().all(|cm| cm.status() == Some(Ok(())));
    // Modules whose source in force differs from the ConfigMap's (in error,
    // refused, or not loaded yet).
    let differing: Vec<String> = match &kept {
        Some(kept) => current
            .keys()
            .chain(kept.modules.keys())
            .filter(|id| current.get(*id) != kept.modules.get(*id))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        None => Vec::new(),
    };
    let in_force = loaded && differing.is_empty();
    let mut engines = Vec::new();
    for url in &args.sync_url {
        engines.push(ask_url(url).await);
    }
    if args.sync_url.is_empty() {
        engines.extend(ask_pods(&client).await);
    }
    let held = reported(&selected, &selection);
    let synced = engines.iter().all(EngineSync::synced);
    if global.output == Output::Json {
        let doc = json!({
            "policyConfigMaps": policies.iter().map(|cm| json!({
                "configMap": cm.key,
                "modules": cm.data.keys().collect::<Vec<_>>(),
                "status": match cm.status() {
                    Some(Ok(())) => json!("ok"),
                    Some(Err(errors)) => json!({"errors": errors}),
                    None => Value::Null,
                },
            })).collect::<Vec<_>>(),
            "loaded": loaded,
            "inForce": in_force,
            "lastGood": kept.as_ref().map(|k| json!({
                "configMap": k.reference, "revision": k.revision,
                "modules": k.modules.keys().collect::<Vec<_>>(),
                "differsFromConfigMaps": differing,
            })),
            "engines": engines.iter().map(|e| json!({
                "source": e.source, "synced": e.synced(), "readyz": e.state, "detail": e.detail,
            })).collect::<Vec<_>>(),
            "held": held.iter().map(|h| &h.report).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        let mut out = format!("Policy ConfigMaps ({}):\n", selection.describe());
        if policies.is_empty() {
            out.push_str(
                "  none: no policy exists, the webhook admits unchanged (with a warning)\n",
            );
        } else {
            let mut rows = vec![vec![
                "CONFIGMAP".to_owned(),
                "MODULES".to_owned(),
                "STATUS".to_owned(),
            ]];
            for cm in &policies {
                let status = match cm.status() {
                    Some(Ok(())) => "ok".to_owned(),
                    Some(Err(errors)) => format!("error: {}", errors.join("; ")),
                    None => "not loaded yet (no placement-policy.io/policy-status)".to_owned(),
                };
                rows.push(vec![cm.key.clone(), cm.data.len().to_string(), status]);
            }
            out.push_str(&indent(&table::render(&rows)));
        }
        match &kept {
            Some(kept) => {
                out.push_str(&format!(
                    "Last good set: ConfigMap {}, revision {}, {} module(s)",
                    kept.reference,
                    kept.revision,
                    kept.modules.len()
                ));
                if differing.is_empty() {
                    out.push_str(": the ConfigMaps' modules\n");
                } else {
                    out.push_str(&format!(
                        "; differs from the ConfigMaps in {} (their last good version stays in force)\n",
                        differing.join(", ")
                    ));
                }
            }
            None => out.push_str(
                "Last good set: none found (placement-sync's --last-good-policies; give --last-good-policies NAMESPACE/NAME)\n",
            ),
        }
        out.push_str(&format!(
            "Policy set: {}\n",
            match (loaded, in_force) {
                (true, true) => "loaded and in force",
                (true, false) => "loaded; the set in force is the last good one",
                (false, _) =>
                    "NOT in force as written: see the status of each ConfigMap; the last good set stays in force",
            }
        ));
        out.push_str("Engines:\n");
        if engines.is_empty() {
            out.push_str(
                "  none found (no pod of the chart with a sync-metrics port; give --sync-url)\n",
            );
        } else {
            let mut rows = vec![vec![
                "PLACEMENT-SYNC".to_owned(),
                "SYNCED".to_owned(),
                "DETAIL".to_owned(),
            ]];
            for e in &engines {
                rows.push(vec![
                    e.source.clone(),
                    if e.synced() { "yes" } else { "no" }.to_owned(),
                    e.detail.clone(),
                ]);
            }
            out.push_str(&indent(&table::render(&rows)));
        }
        out.push_str(&format!(
            "Held changes: {}\n",
            if held.is_empty() {
                "none".to_owned()
            } else {
                format!(
                    "{} ({}; kubectl placement held)",
                    held.len(),
                    held.iter().map(|h| h.id()).collect::<Vec<_>>().join(", ")
                )
            }
        ));
        print!("{out}");
    }
    Ok(if in_force && synced { 0 } else { NOT_IN_FORCE })
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// What a `/readyz` body says.
fn describe(state: &Value) -> String {
    if state["synced"] == true && state["engine_up"] == true {
        return format!("in sync (epoch {})", state["epoch"]);
    }
    let pending: Vec<String> = state["pending"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
        .collect();
    format!(
        "engine {}; pending: {}",
        if state["engine_up"] == true {
            "up"
        } else {
            "down"
        },
        if pending.is_empty() {
            "-".to_owned()
        } else {
            pending.join(", ")
        }
    )
}

async fn ask_url(url: &str) -> EngineSync {
    let readyz = format!("{}/readyz", url.trim_end_matches('/'));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build();
    let answer = match http {
        Ok(http) => http.get(&readyz).send().await,
        Err(e) => {
            return EngineSync {
                source: url.to_owned(),
                state: None,
                detail: e.to_string(),
            };
        }
    };
    let body = match answer {
        Ok(response) => response.json::<Value>().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    engine_sync(url.to_owned(), body)
}

fn engine_sync(source: String, body: Result<Value, String>) -> EngineSync {
    match body {
        Ok(state) => EngineSync {
            source,
            detail: describe(&state),
            state: Some(state),
        },
        Err(e) => EngineSync {
            source,
            state: None,
            detail: format!("not reachable: {e}"),
        },
    }
}

/// The chart's pods with a placement-sync, asked through the API server's
/// pod proxy (needs get on pods/proxy).
async fn ask_pods(client: &Client) -> Vec<EngineSync> {
    let Ok(pods) = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(CHART_LABEL))
        .await
    else {
        return Vec::new();
    };
    let mut engines = Vec::new();
    for pod in pods.items {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let port = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(SYNC_PORT_NAME))
            .map(|p| p.container_port);
        let Some(port) = port else { continue };
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/readyz");
        let body = match http::Request::get(&path).body(Vec::new()) {
            Ok(request) => match client.request_text(request).await {
                Ok(text) => serde_json::from_str(&text).map_err(|e| e.to_string()),
                // 503 (not in sync) carries the state too.
                Err(kube::Error::Api(status)) => {
                    serde_json::from_str(&status.message).map_err(|_| status.message.clone())
                }
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        engines.push(engine_sync(format!("pod {namespace}/{name}"), body));
    }
    engines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_reads_as_in_sync_or_what_is_pending() {
        let synced = json!({"epoch": 2, "synced": true, "engine_up": true, "pending": []});
        assert_eq!(describe(&synced), "in sync (epoch 2)");
        let loading =
            json!({"epoch": 3, "synced": false, "engine_up": true, "pending": ["policies"]});
        assert_eq!(describe(&loading), "engine up; pending: policies");
        assert!(!engine_sync("x".into(), Err("refused".into())).synced());
        assert!(engine_sync("x".into(), Ok(synced)).synced());
    }
}
