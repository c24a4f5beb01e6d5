//! `KIND/NAME` as kubectl reads it: the kind by its plural, singular, short
//! name or Kind, optionally `.group`, found through the API server's
//! discovery.

use kube::Client;
use kube::api::ApiResource;

use crate::error::PluginError;

/// A type the API server serves.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) resource: ApiResource,
    pub(crate) namespaced: bool,
}

/// `rs/web` -> ("rs", "web").
pub(crate) fn split_object(text: &str) -> Result<(&str, &str), PluginError> {
    match text.split_once('/') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((kind, name))
        }
        _ => Err(PluginError::Usage(format!(
            "{text:?} is not KIND/NAME (e.g. rs/web, deployment.apps/web, placement/web-eu)"
        ))),
    }
}

/// Whether the discovered `resource` is what `wanted` names (`rs`,
/// `replicasets`, `replicaset`, `ReplicaSet`, each optionally `.group`).
fn names(resource: &kube::discovery::ApiResource, short: &[String], wanted: &str) -> bool {
    let (name, group) = match wanted.split_once('.') {
        Some((name, group)) => (name, Some(group)),
        None => (wanted, None),
    };
    if group.is_some_and(|g| g != resource.group) {
        return false;
    }
    let name = name.to_ascii_lowercase();
    resource.plural == name || resource.kind.to_ascii_lowercase() == name || short.contains(&name)
}

/// The type `wanted` names, preferring the core group, the groups the API
/// server lists first and their preferred versions (as kubectl does).
pub(crate) async fn resolve(client: &Client, wanted: &str) -> Result<Served, PluginError> {
    let mut versions: Vec<String> = client
        .list_core_api_versions()
        .await
        .map_err(PluginError::api("discovering the API server's types"))?
        .versions
        .into_iter()
        .collect();
    let groups = client
        .list_api_groups()
        .await
        .map_err(PluginError::api("discovering the API server's types"))?;
    // Every version of a group, its preferred one first: a kind may be
    // served in another (OCM's Placement is v1beta1, its group prefers v1).
    for group in groups.groups {
        let preferred = group
            .preferred_version
            .map(|p| p.group_version)
            .or_else(|| group.versions.first().map(|v| v.group_version.clone()));
        versions.extend(preferred.clone());
        versions.extend(
            group
                .versions
                .into_iter()
                .map(|v| v.group_version)
                .filter(|v| Some(v) != preferred.as_ref()),
        );
    }
    for group_version in versions {
        let list = if group_version.contains('/') {
            client.list_api_group_resources(&group_version).await
        } else {
            client.list_core_api_resources(&group_version).await
        };
        // An aggregated API that is down fails its own group only.
        let Ok(list) = list else { continue };
        let (group, version) = group_version
            .split_once('/')
            .unwrap_or(("", group_version.as_str()));
        for r in list.resources.iter().filter(|r| !r.name.contains('/')) {
            let resource = ApiResource {
                group: group.to_owned(),
                version: version.to_owned(),
                api_version: group_version.clone(),
                kind: r.kind.clone(),
                plural: r.name.clone(),
            };
            if names(
                &resource,
                r.short_names.as_deref().unwrap_or_default(),
                wanted,
            ) {
                return Ok(Served {
                    resource,
                    namespaced: r.namespaced,
                });
            }
        }
    }
    Err(PluginError::Usage(format!(
        "the API server serves no type named {wanted:?} (try `kubectl api-resources`)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_as_kubectl_names_them() {
        let rs = ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            plural: "replicasets".into(),
        };
        let short = vec!["rs".to_owned()];
        for wanted in [
            "rs",
            "replicasets",
            "replicaset",
            "ReplicaSet",
            "rs.apps",
            "replicasets.apps",
        ] {
            assert!(names(&rs, &short, wanted), "{wanted}");
        }
        assert!(!names(&rs, &short, "rs.extensions"));
        assert!(!names(&rs, &short, "deploy"));
    }

    #[test]
    fn objects_are_kind_slash_name() {
        assert_eq!(split_object("rs/web").unwrap(), ("rs", "web"));
        assert!(split_object("web").is_err());
        assert!(split_object("rs/").is_err());
        assert!(split_object("a/b/c").is_err());
    }
}
