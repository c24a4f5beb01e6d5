//! The ownership keys, to read an object in the developer's view as the
//! webhook and the remediator do: values the policy wrote are not the
//! developer's requests. Without them, those values read as requests (a
//! note says so).

use std::path::Path;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ListParams};
use policy_client::ownership_keys::OwnershipKeys;
use policy_client::ownership_secret::SECRET_KEY;

use crate::error::PluginError;
use crate::policy_set::{CHART_LABEL, namespaced_name};

/// The keys, and where they came from (`None`: not found; ephemeral keys
/// that verify nothing).
pub(crate) async fn ownership_keys(
    client: Option<&Client>,
    secret: Option<&str>,
    file: Option<&Path>,
) -> Result<(OwnershipKeys, Option<String>), PluginError> {
    let invalid = |what: String| {
        move |e: policy_client::ownership_keys::KeyError| PluginError::Invalid {
            what,
            message: e.to_string(),
        }
    };
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| PluginError::File {
            path: path.to_owned(),
            source,
        })?;
        let keys = OwnershipKeys::from_text(&text).map_err(invalid(format!(
            "the ownership key file {}",
            path.display()
        )))?;
        return Ok((keys, Some(format!("file {}", path.display()))));
    }
    let Some(client) = client else {
        return Ok((ephemeral()?, None));
    };
    let secrets: Vec<Secret> = match secret {
        Some(reference) => {
            let (namespace, name) = namespaced_name("--ownership-secret", reference)?;
            let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
                .get(&name)
                .await
                .map_err(PluginError::api(format!(
                    "reading the ownership Secret {reference} (needs get on secrets there)"
                )))?;
            vec![secret]
        }
        // Found by the chart's labels; not allowed to list Secrets: none.
        None => Api::<Secret>::all(client.clone())
            .list(&ListParams::default().labels(CHART_LABEL))
            .await
            .map(|list| list.items)
            .unwrap_or_default(),
    };
    for secret in secrets {
        let text = secret
            .data
            .as_ref()
            .and_then(|d| d.get(SECRET_KEY))
            .and_then(|b| String::from_utf8(b.0.clone()).ok());
        let Some(text) = text else { continue };
        let name = format!(
            "Secret {}/{}",
            secret.metadata.namespace.unwrap_or_default(),
            secret.metadata.name.unwrap_or_default()
        );
        let keys =
            OwnershipKeys::from_text(&text).map_err(invalid(format!("the keys of {name}")))?;
        return Ok((keys, Some(name)));
    }
    if secret.is_some() {
        return Err(PluginError::Invalid {
            what: "the ownership Secret".to_owned(),
            message: format!("it has no data key {SECRET_KEY}"),
        });
    }
    Ok((ephemeral()?, None))
}

fn ephemeral() -> Result<OwnershipKeys, PluginError> {
    OwnershipKeys::ephemeral().map_err(|e| PluginError::Invalid {
        what: "a key of this process".to_owned(),
        message: e.to_string(),
    })
}
