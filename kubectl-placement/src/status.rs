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
use crate::held::{Held, reported};
use crate::policy_set::{CHART_LABEL, LastGood, Selected, configmaps, last_good};
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

/// What `status` found, for either output.
struct Report<'a> {
    /// Which ConfigMaps were read, as `--help` words it.
    selection: String,
    policies: Vec<&'a Selected>,
    kept: Option<LastGood>,
    /// Modules whose source in force differs from the ConfigMap's (in error,
    /// refused, or not loaded yet).
    differing: Vec<String>,
    loaded: bool,
    in_force: bool,
    engines: Vec<EngineSync>,
    held: Vec<Held>,
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
    let differing = differing(&policies, kept.as_ref());
    let loaded = policies.iter().all(|cm| cm.status() == Some(Ok(())));
    let in_force = loaded && differing.is_empty();
    let mut engines = Vec::new();
    for url in &args.sync_url {
        engines.push(ask_url(url).await);
    }
    if args.sync_url.is_empty() {
        engines.extend(ask_pods(&client).await);
    }
    let report = Report {
        selection: selection.describe(),
        held: reported(&selected, &selection),
        policies,
        kept,
        differing,
        loaded,
        in_force,
        engines,
    };
    let synced = report.engines.iter().all(EngineSync::synced);
    if global.output == Output::Json {
        let doc = report.json();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", report.text());
    }
    Ok(if in_force && synced { 0 } else { NOT_IN_FORCE })
}

/// The modules (`namespace/name/key`) whose source in the last good set
/// differs from the ConfigMaps', either way; none without a last good set.
fn differing(policies: &[&Selected], kept: Option<&LastGood>) -> Vec<String> {
    let Some(kept) = kept else {
        return Vec::new();
    };
    let current: BTreeMap<String, String> = policies
        .iter()
        .flat_map(|cm| {
            cm.data
                .iter()
                .map(move |(key, source)| (format!("{}/{key}", cm.key), source.clone()))
        })
        .collect();
    current
        .keys()
        .chain(kept.modules.keys())
        .filter(|id| current.get(*id) != kept.modules.get(*id))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

impl Report<'_> {
    fn json(&self) -> Value {
        json!({
            "policyConfigMaps": self.policies.iter().map(|cm| json!({
                "configMap": cm.key,
                "modules": cm.data.keys().collect::<Vec<_>>(),
                "status": match cm.status() {
                    Some(Ok(())) => json!("ok"),
                    Some(Err(errors)) => json!({"errors": errors}),
                    None => Value::Null,
                },
            })).collect::<Vec<_>>(),
            "loaded": self.loaded,
            "inForce": self.in_force,
            "lastGood": self.kept.as_ref().map(|k| json!({
                "configMap": k.reference, "revision": k.revision,
                "modules": k.modules.keys().collect::<Vec<_>>(),
                "differsFromConfigMaps": self.differing,
            })),
            "engines": self.engines.iter().map(|e| json!({
                "source": e.source, "synced": e.synced(), "readyz": e.state, "detail": e.detail,
            })).collect::<Vec<_>>(),
            "held": self.held.iter().map(|h| &h.report).collect::<Vec<_>>(),
        })
    }

    fn text(&self) -> String {
        let mut out = self.policies_text();
        out.push_str(&self.last_good_text());
        out.push_str(&format!(
            "Policy set: {}\n",
            match (self.loaded, self.in_force) {
                (true, true) => "loaded and in force",
                (true, false) => "loaded; the set in force is the last good one",
                (false, _) =>
                    "NOT in force as written: see the status of each ConfigMap; the last good set stays in force",
            }
        ));
        out.push_str(&self.engines_text());
        out.push_str(&format!(
            "Held changes: {}\n",
            if self.held.is_empty() {
                "none".to_owned()
            } else {
                format!(
                    "{} ({}; kubectl placement held)",
                    self.held.len(),
                    self.held
                        .iter()
                        .map(|h| h.id())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        out
    }

    fn policies_text(&self) -> String {
        let mut out = format!("Policy ConfigMaps ({}):\n", self.selection);
        if self.policies.is_empty() {
            out.push_str(
                "  none: no policy exists, the webhook admits unchanged (with a warning)\n",
            );
            return out;
        }
        let mut rows = vec![vec![
            "CONFIGMAP".to_owned(),
            "MODULES".to_owned(),
            "STATUS".to_owned(),
        ]];
        for cm in &self.policies {
            let status = match cm.status() {
                Some(Ok(())) => "ok".to_owned(),
                Some(Err(errors)) => format!("error: {}", errors.join("; ")),
                None => "not loaded yet (no placement-policy.io/policy-status)".to_owned(),
            };
            rows.push(vec![cm.key.clone(), cm.data.len().to_string(), status]);
        }
        out.push_str(&indent(&table::render(&rows)));
        out
    }

    fn last_good_text(&self) -> String {
        let Some(kept) = &self.kept else {
            return "Last good set: none found (placement-sync's --last-good-policies; give --last-good-policies NAMESPACE/NAME)\n".to_owned();
        };
        let mut out = format!(
            "Last good set: ConfigMap {}, revision {}, {} module(s)",
            kept.reference,
            kept.revision,
            kept.modules.len()
        );
        if self.differing.is_empty() {
            out.push_str(": the ConfigMaps' modules\n");
        } else {
            out.push_str(&format!(
                "; differs from the ConfigMaps in {} (their last good version stays in force)\n",
                self.differing.join(", ")
            ));
        }
        out
    }

    fn engines_text(&self) -> String {
        let mut out = "Engines:\n".to_owned();
        if self.engines.is_empty() {
            out.push_str(
                "  none found (no pod of the chart with a sync-metrics port; give --sync-url)\n",
            );
            return out;
        }
        let mut rows = vec![vec![
            "PLACEMENT-SYNC".to_owned(),
            "SYNCED".to_owned(),
            "DETAIL".to_owned(),
        ]];
        for e in &self.engines {
            rows.push(vec![
                e.source.clone(),
                if e.synced() { "yes" } else { "no" }.to_owned(),
                e.detail.clone(),
            ]);
        }
        out.push_str(&indent(&table::render(&rows)));
        out
    }
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
