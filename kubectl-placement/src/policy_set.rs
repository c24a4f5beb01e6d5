//! The policy set and the data an engine holds, read as placement-sync reads
//! them (the same ConfigMap selection, module ids and data paths), or from a
//! folder, into an embedded engine that evaluates here.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectList};
use policy_client::configmaps::{ConfigMapKind, ConfigMapSelection};
use policy_client::embedded::Embedded;
use policy_client::engine::PolicyEngine;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::PluginError;

/// The chart's label on every object of a release.
pub(crate) const CHART_LABEL: &str = "app.kubernetes.io/name=placement-policy";
/// placement-sync's annotation with a policy ConfigMap's load outcome.
pub(crate) const STATUS_ANNOTATION: &str = "placement-policy.io/policy-status";
/// Data key of the last good set (placement-sync's `--last-good-policies`).
const LAST_GOOD_KEY: &str = "policy-set.json";
/// The chart's name of the last good set's ConfigMap ends so.
const LAST_GOOD_SUFFIX: &str = "-last-good-policies";

/// The cluster types the shipped policy reads, replicated by placement-sync
/// in each mode (those the API server serves are read).
const CLUSTER_TYPES: [&str; 3] = [
    "placement-policy.io/v1alpha1/clusters",
    "cluster.karmada.io/v1alpha1/clusters",
    "cluster.open-cluster-management.io/v1/managedclusters",
];

/// `NAMESPACE/NAME` of `flag`.
pub(crate) fn namespaced_name(flag: &str, text: &str) -> Result<(String, String), PluginError> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(PluginError::Usage(format!(
            "{flag} must be NAMESPACE/NAME, got {text:?}"
        ))),
    }
}

/// A policy or data ConfigMap.
#[derive(Debug, Clone)]
pub(crate) struct Selected {
    /// `namespace/name`, the prefix of its module ids and data paths.
    pub(crate) key: String,
    pub(crate) kind: ConfigMapKind,
    pub(crate) data: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
}

impl Selected {
    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// Its load status: `Ok(())`, the errors' messages, or `None` before
    /// placement-sync wrote one.
    pub(crate) fn status(&self) -> Option<Result<(), Vec<String>>> {
        let status: Value = serde_json::from_str(self.annotation(STATUS_ANNOTATION)?).ok()?;
        if status["status"] == "ok" {
            return Some(Ok(()));
        }
        let errors = status["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let at = match (e["file"].as_str(), e["row"].as_u64()) {
                    (Some(file), Some(row)) => format!("{file}:{row}: "),
                    (Some(file), None) => format!("{file}: "),
                    _ => String::new(),
                };
                format!("{at}{}", e["message"].as_str().unwrap_or_default())
            })
            .collect();
        Some(Err(errors))
    }
}

/// The policy and data ConfigMaps of `selection`.
pub(crate) async fn configmaps(
    client: &Client,
    selection: &ConfigMapSelection,
) -> Result<Vec<Selected>, PluginError> {
    let lists = match selection.watched_namespaces() {
        None => vec![Api::<ConfigMap>::all(client.clone())],
        Some(namespaces) => namespaces
            .iter()
            .map(|ns| Api::<ConfigMap>::namespaced(client.clone(), ns))
            .collect(),
    };
    let mut selected = Vec::new();
    for api in lists {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(PluginError::api(format!(
                "listing the ConfigMaps of {}",
                selection.describe()
            )))?;
        for cm in list.items {
            let namespace = cm.metadata.namespace.clone().unwrap_or_default();
            let name = cm.metadata.name.clone().unwrap_or_default();
            let Some(kind) = selection.classify(&namespace, &name, cm.metadata.labels.as_ref())
            else {
                continue;
            };
            selected.push(Selected {
                key: format!("{namespace}/{name}"),
                kind,
                data: cm.data.unwrap_or_default(),
                annotations: cm.metadata.annotations.unwrap_or_default(),
            });
        }
    }
    selected.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(selected)
}

/// The last good set placement-sync keeps.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct LastGood {
    #[serde(skip)]
    pub(crate) reference: String,
    pub(crate) revision: String,
    pub(crate) modules: BTreeMap<String, String>,
}

/// The last good set: of `reference` (`NAMESPACE/NAME`), else of the chart's
/// ConfigMap found by its labels; `None` when there is none (yet).
pub(crate) async fn last_good(
    client: &Client,
    reference: Option<&str>,
) -> Result<Option<LastGood>, PluginError> {
    let configmaps = match reference {
        Some(reference) => {
            let (namespace, name) = namespaced_name("--last-good-policies", reference)?;
            Api::<ConfigMap>::namespaced(client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(PluginError::api(format!(
                    "reading the last good policy set {reference}"
                )))?
                .into_iter()
                .collect()
        }
        // Not allowed to list them everywhere: none found.
        None => Api::<ConfigMap>::all(client.clone())
            .list(&ListParams::default().labels(CHART_LABEL))
            .await
            .map(|list| list.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|cm| {
                cm.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with(LAST_GOOD_SUFFIX))
            })
            .collect::<Vec<_>>(),
    };
    for cm in configmaps {
        let reference = format!(
            "{}/{}",
            cm.metadata.namespace.unwrap_or_default(),
            cm.metadata.name.unwrap_or_default()
        );
        let Some(text) = cm.data.and_then(|mut d| d.remove(LAST_GOOD_KEY)) else {
            continue;
        };
        let mut kept: LastGood = serde_json::from_str(&text).map_err(|e| PluginError::Invalid {
            what: format!("the last good policy set in ConfigMap {reference}"),
            message: e.to_string(),
        })?;
        kept.reference = reference;
        return Ok(Some(kept));
    }
    Ok(None)
}

/// An engine holding a policy set and data, and what it was loaded from.
pub(crate) struct Loaded {
    pub(crate) engine: Embedded,
    /// Where the modules and the data came from, for the reader.
    pub(crate) origin: Vec<String>,
}

/// What `live` reads besides the ConfigMaps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveSources<'a> {
    pub(crate) last_good: Option<&'a str>,
    pub(crate) replicate_cluster: &'a [String],
    pub(crate) replicate_path: &'a str,
}

/// The policy set in force and the data of the cluster, as placement-sync
/// puts them into its engine: the last good set when there is one (exactly
/// the modules in force), else the modules of the policy ConfigMaps that
/// loaded; the data ConfigMaps at `namespace/name/key`; the replicated
/// cluster objects at `<replicate path>/<resource>/<name>`.
pub(crate) async fn live(
    client: &Client,
    selection: &ConfigMapSelection,
    sources: LiveSources<'_>,
) -> Result<Loaded, PluginError> {
    let engine = Embedded::new();
    let mut origin = Vec::new();
    let configmaps = configmaps(client, selection).await?;
    let kept = last_good(client, sources.last_good).await?;
    match kept.filter(|k| !k.modules.is_empty()) {
        Some(kept) => {
            for (id, source) in &kept.modules {
                engine.put_policy(id, source).await?;
            }
            origin.push(format!(
                "policy: the set in force, {} module(s) of revision {} (ConfigMap {})",
                kept.modules.len(),
                kept.revision,
                kept.reference
            ));
        }
        None => put_loaded_policies(&engine, &configmaps, selection, &mut origin).await?,
    }
    put_data_configmaps(&engine, &configmaps).await?;
    put_cluster_objects(client, &engine, sources, &mut origin).await?;
    Ok(Loaded { engine, origin })
}

/// Without a last good set: the modules of the policy ConfigMaps not in
/// error (each one in error is named in `origin`).
async fn put_loaded_policies(
    engine: &Embedded,
    configmaps: &[Selected],
    selection: &ConfigMapSelection,
    origin: &mut Vec<String>,
) -> Result<(), PluginError> {
    let mut count = 0;
    for cm in configmaps
        .iter()
        .filter(|c| c.kind == ConfigMapKind::Policy)
    {
        if let Some(Err(_)) = cm.status() {
            origin.push(format!(
                "note: ConfigMap {} is in error; its last good version is in force in the engines but not readable here (give --last-good-policies)",
                cm.key
            ));
            continue;
        }
        for (key, source) in &cm.data {
            engine
                .put_policy(&format!("{}/{key}", cm.key), source)
                .await?;
            count += 1;
        }
    }
    origin.push(format!(
        "policy: {count} module(s) of the policy ConfigMaps in {}",
        selection.describe()
    ));
    Ok(())
}

/// The data ConfigMaps' keys (JSON or YAML) at `namespace/name/key`.
async fn put_data_configmaps(
    engine: &Embedded,
    configmaps: &[Selected],
) -> Result<(), PluginError> {
    for cm in configmaps.iter().filter(|c| c.kind == ConfigMapKind::Data) {
        for (key, text) in &cm.data {
            let document: Value = serde_json::from_str(text)
                .or_else(|_| yaml_serde::from_str(text))
                .map_err(|e: yaml_serde::Error| PluginError::Invalid {
                    what: format!("data key {key} of ConfigMap {}", cm.key),
                    message: e.to_string(),
                })?;
            engine
                .put_data(&format!("{}/{key}", cm.key), &document)
                .await?;
        }
    }
    Ok(())
}

/// The replicated cluster objects at `<replicate path>/<resource>/<name>`:
/// the types given, or placement-sync's defaults (those the cluster does not
/// serve skipped).
async fn put_cluster_objects(
    client: &Client,
    engine: &Embedded,
    sources: LiveSources<'_>,
    origin: &mut Vec<String>,
) -> Result<(), PluginError> {
    let explicit = !sources.replicate_cluster.is_empty();
    let types: Vec<&str> = if explicit {
        sources
            .replicate_cluster
            .iter()
            .map(String::as_str)
            .collect()
    } else {
        CLUSTER_TYPES.to_vec()
    };
    let mut by_resource: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for gvr in types {
        let resource = parse_gvr(gvr)?;
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(kube::Error::Api(status)) if status.code == 404 && !explicit => continue,
            Err(e) => {
                return Err(PluginError::api(format!("listing {gvr}"))(e));
            }
        };
        let objects = by_resource.entry(resource.plural.clone()).or_default();
        let added = insert_objects(objects, list, gvr, &resource)?;
        origin.push(format!(
            "data: {added} {gvr} at data.{}.{}",
            sources.replicate_path.replace('/', "."),
            resource.plural
        ));
    }
    for (plural, objects) in by_resource {
        engine
            .put_data(
                &format!("{}/{plural}", sources.replicate_path),
                &Value::Object(objects),
            )
            .await?;
    }
    Ok(())
}

/// `list`'s objects by name into `objects`, as placement-sync replicates
/// them (no managed fields; `apiVersion` and `kind` set); how many were new.
fn insert_objects(
    objects: &mut Map<String, Value>,
    list: ObjectList<DynamicObject>,
    gvr: &str,
    resource: &ApiResource,
) -> Result<usize, PluginError> {
    let kind = list.types.kind.trim_end_matches("List").to_owned();
    let before = objects.len();
    for mut object in list.items {
        object.metadata.managed_fields = None;
        let name = object.metadata.name.clone().unwrap_or_default();
        let mut value = serde_json::to_value(&object).map_err(|e| PluginError::Invalid {
            what: format!("{gvr} {name}"),
            message: e.to_string(),
        })?;
        value["apiVersion"] = Value::String(resource.api_version.clone());
        value["kind"] = Value::String(kind.clone());
        objects.insert(name, value);
    }
    Ok(objects.len() - before)
}

/// The modules and data of `dir`, as `opa run DIR` and `placement-webhook
/// review` read it.
pub(crate) fn from_dir(dir: &Path) -> Result<Loaded, PluginError> {
    let engine = Embedded::from_dir(dir).map_err(|source| PluginError::PolicyDir {
        dir: dir.to_owned(),
        source,
    })?;
    let origin = vec![format!(
        "policy and data: {} module(s) and the data files of {} (offline)",
        engine.module_count(),
        dir.display()
    )];
    Ok(Loaded { engine, origin })
}

/// `[group/]version/resource`.
fn parse_gvr(text: &str) -> Result<ApiResource, PluginError> {
    let parts: Vec<&str> = text.split('/').collect();
    let (group, version, plural) = match parts.as_slice() {
        [version, plural] => ("", *version, *plural),
        [group, version, plural] => (*group, *version, *plural),
        _ => {
            return Err(PluginError::Usage(format!(
                "--replicate-cluster wants [group/]version/resource, got {text:?}"
            )));
        }
    };
    Ok(ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        },
        kind: String::new(),
        plural: plural.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_group_version_resource() {
        let r = parse_gvr("cluster.karmada.io/v1alpha1/clusters").unwrap();
        assert_eq!(
            (r.group.as_str(), r.api_version.as_str(), r.plural.as_str()),
            (
                "cluster.karmada.io",
                "cluster.karmada.io/v1alpha1",
                "clusters"
            )
        );
        assert_eq!(parse_gvr("v1/nodes").unwrap().api_version, "v1");
        assert!(parse_gvr("clusters").is_err());
    }

    #[test]
    fn a_status_annotation_reads_as_ok_or_its_errors() {
        let cm = |status: &str| Selected {
            key: "ns/p".into(),
            kind: ConfigMapKind::Policy,
            data: BTreeMap::new(),
            annotations: [(STATUS_ANNOTATION.to_owned(), status.to_owned())].into(),
        };
        assert_eq!(cm(r#"{"status":"ok"}"#).status(), Some(Ok(())));
        assert_eq!(
            cm(r#"{"status":"error","errors":[{"file":"ns/p/a.rego","row":4,"message":"unexpected eof token"}]}"#).status(),
            Some(Err(vec!["ns/p/a.rego:4: unexpected eof token".to_owned()]))
        );
        assert_eq!(cm("").status(), None);
    }
}
