//! Ownership keys kept in a Secret (data key [`SECRET_KEY`]), shared by the
//! webhook and the remediator: read at start, watched afterwards (a rotation
//! puts the new key first and keeps the old one on a later line), and, for the
//! webhook, created when the Secret holds none yet (any replica may; the API
//! server's optimistic concurrency lets one write win).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;

use crate::ownership_keys::{KeyError, OwnershipKeys, SharedKeys};

/// Data key of the Secret holding the keys.
pub const SECRET_KEY: &str = "ownership.keys";
const RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum SecretKeyError {
    #[error("ownership keys in Secret {namespace}/{name}: {source}")]
    Keys {
        namespace: String,
        name: String,
        source: KeyError,
    },
}

/// Where the keys live, and whether this process may create them.
#[derive(Debug, Clone)]
pub struct KeySecret {
    pub api: Api<Secret>,
    pub namespace: String,
    pub name: String,
    pub create: bool,
}

impl KeySecret {
    /// The keys, once the Secret holds them (creating them when allowed);
    /// afterwards they follow the Secret. Waits, saying why, while the Secret
    /// cannot be read or holds no key yet.
    pub async fn keys(self) -> Result<SharedKeys, SecretKeyError> {
        let keys = loop {
            match self.read_or_create().await {
                Ok(Some(keys)) => break keys,
                Ok(None) => {
                    tracing::info!(secret = %self.name, "waiting for the ownership key (the webhook creates it)")
                }
                Err(Retry::Api(e)) => {
                    tracing::warn!(namespace = %self.namespace, secret = %self.name, error = %e, "cannot read the ownership key; retrying")
                }
                Err(Retry::Keys(source)) => {
                    return Err(SecretKeyError::Keys {
                        namespace: self.namespace.clone(),
                        name: self.name.clone(),
                        source,
                    });
                }
            }
            tokio::time::sleep(RETRY).await;
        };
        let shared = SharedKeys::new(keys);
        tokio::spawn(self.follow(shared.clone()));
        Ok(shared)
    }

    async fn read_or_create(&self) -> Result<Option<OwnershipKeys>, Retry> {
        let secret = self.api.get_opt(&self.name).await.map_err(Retry::Api)?;
        if let Some(text) = secret.as_ref().and_then(keys_text) {
            return OwnershipKeys::from_text(&text)
                .map(Some)
                .map_err(Retry::Keys);
        }
        if !self.create {
            return Ok(None);
        }
        let text = OwnershipKeys::generate_text().map_err(Retry::Keys)?;
        let data = BTreeMap::from([(SECRET_KEY.to_owned(), ByteString(text.clone().into_bytes()))]);
        let written = match secret {
            Some(mut secret) => {
                secret.data.get_or_insert_with(BTreeMap::new).extend(data);
                self.api
                    .replace(&self.name, &PostParams::default(), &secret)
                    .await
            }
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    type_: Some("Opaque".to_owned()),
                    data: Some(data),
                    ..Default::default()
                };
                self.api.create(&PostParams::default(), &secret).await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(namespace = %self.namespace, secret = %self.name, "created the ownership key");
                OwnershipKeys::from_text(&text)
                    .map(Some)
                    .map_err(Retry::Keys)
            }
            // Another replica wrote first: read theirs.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(Retry::Api(e)),
        }
    }

    /// Replace the keys whenever the Secret's change.
    async fn follow(self, shared: SharedKeys) {
        let stream = watcher(
            self.api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", self.name)),
        );
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let secret = match event {
                Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => secret,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "watch of the ownership key interrupted");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let Some(text) = keys_text(&secret) else {
                continue;
            };
            match OwnershipKeys::from_text(&text) {
                Ok(keys) => shared.replace(keys),
                Err(e) => {
                    tracing::warn!(secret = %self.name, error = %e, "the Secret's ownership keys do not load; keeping the current ones")
                }
            }
        }
    }
}

enum Retry {
    Api(kube::Error),
    Keys(KeyError),
}

fn keys_text(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(SECRET_KEY)?;
    let text = String::from_utf8(bytes.0.clone()).ok()?;
    (!text.trim().is_empty()).then_some(text)
}
