//! Ownership keys kept in a Secret (data key [`SECRET_KEY`]), shared by the
//! webhook and the remediator: read at start, watched afterwards (a rotation
//! puts the new key first and keeps the old one on a later line).
//!
//! The keys outlive accidents to the Secret, and a revocation holds. A
//! process allowed to write it (the webhook) creates a key when the Secret
//! holds none, and puts the keys it holds back when the Secret is deleted or
//! emptied and nobody fills it again within [`PUT_BACK_AFTER`]. When a
//! replica refilled it meanwhile with a key of its own (one that held none:
//! the Secret carries [`WRITTEN_BY_A_REPLICA`], the digest of what a replica
//! wrote), it appends its keys to verify with: records signed before keep
//! verifying, so no developer's request is lost to a new key. Keys anyone
//! else wrote (deleting the Secret and creating it again with a new key, to
//! revoke the old one) are the keys, alone: a running process never brings
//! back what was taken out. A process only allowed to read it (the
//! remediator) keeps the keys it holds until the Secret holds some again.
//! (Across a reinstall, the chart keeps the Secret.) The API server's
//! optimistic concurrency lets one write win; the others read the result.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;

use crate::ownership_keys::{KeyError, OwnershipKeys, SharedKeys, merged_text};
use crate::placement::digest;

/// Data key of the Secret holding the keys.
pub const SECRET_KEY: &str = "ownership.keys";
/// Annotation a replica puts on the Secret it writes: the digest of the key
/// text it wrote. Keys with it are a replica's (appended to, after a loss);
/// keys without it, or with another text, a person's (the keys, alone).
pub const WRITTEN_BY_A_REPLICA: &str = "placement-policy.io/keys-written-by-a-replica";
/// How long a deleted or emptied Secret is left for someone to fill again
/// (a revocation: deleted and created again with a new key) before the keys
/// in use are put back.
pub const PUT_BACK_AFTER: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_secs(2);

/// Where the keys live, and whether this process may write them.
#[derive(Debug, Clone)]
pub struct KeySecret {
    pub api: Api<Secret>,
    pub namespace: String,
    pub name: String,
    pub create: bool,
}

impl KeySecret {
    /// The keys, once the Secret holds them (making one when it holds none
    /// and this process may); afterwards they follow the Secret. Waits,
    /// saying why, while the Secret cannot be read, holds no key yet, or
    /// holds keys that do not load.
    pub async fn keys(self) -> SharedKeys {
        let (text, keys) = loop {
            match self.read_or_create().await {
                Ok(Some(found)) => break found,
                Ok(None) => {
                    tracing::info!(secret = %self.name, "waiting for the ownership key (the webhook creates it)")
                }
                Err(Retry::Api(e)) => {
                    tracing::warn!(namespace = %self.namespace, secret = %self.name, error = %e, "cannot read the ownership key; retrying")
                }
                Err(Retry::Keys(e)) => {
                    tracing::error!(namespace = %self.namespace, secret = %self.name, error = %e, "the Secret's ownership keys do not load; fix them (one base64 key of at least 32 bytes per line)")
                }
            }
            tokio::time::sleep(RETRY).await;
        };
        let shared = SharedKeys::new(keys);
        tokio::spawn(self.follow(shared.clone(), text));
        shared
    }

    async fn read_or_create(&self) -> Result<Option<(String, OwnershipKeys)>, Retry> {
        let secret = self.api.get_opt(&self.name).await.map_err(Retry::Api)?;
        if let Some(text) = secret.as_ref().and_then(keys_text) {
            return OwnershipKeys::from_text(&text)
                .map(|keys| Some((text, keys)))
                .map_err(Retry::Keys);
        }
        if !self.create {
            return Ok(None);
        }
        let text = OwnershipKeys::generate_text().map_err(Retry::Keys)?;
        match self.write(&text, secret).await {
            Ok(()) => {
                tracing::info!(namespace = %self.namespace, secret = %self.name, "created the ownership key");
                OwnershipKeys::from_text(&text)
                    .map(|keys| Some((text, keys)))
                    .map_err(Retry::Keys)
            }
            // Another replica wrote first: read theirs.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(Retry::Api(e)),
        }
    }

    /// Write `text` as the keys: into `existing`, or a new Secret; marked as
    /// a replica's.
    async fn write(&self, text: &str, existing: Option<Secret>) -> Result<(), kube::Error> {
        let data = BTreeMap::from([(SECRET_KEY.to_owned(), ByteString(text.as_bytes().to_vec()))]);
        let mark = BTreeMap::from([(WRITTEN_BY_A_REPLICA.to_owned(), digest(text))]);
        match existing {
            Some(mut secret) => {
                secret
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .extend(mark);
                secret.data.get_or_insert_with(BTreeMap::new).extend(data);
                self.api
                    .replace(&self.name, &PostParams::default(), &secret)
                    .await?;
            }
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        annotations: Some(mark),
                        ..Default::default()
                    },
                    type_: Some("Opaque".to_owned()),
                    data: Some(data),
                    ..Default::default()
                };
                self.api.create(&PostParams::default(), &secret).await?;
            }
        }
        Ok(())
    }

    /// Follow the Secret: its keys replace the ones in use; when it is
    /// deleted or emptied and nobody fills it again in time, a process that
    /// may write it puts them back.
    async fn follow(self, shared: SharedKeys, text: String) {
        let stream = watcher(
            self.api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", self.name)),
        );
        let mut stream = std::pin::pin!(stream);
        let mut state = Followed { text, lost: false };
        let mut listed = false;
        // When the keys in use are put back, unless the Secret is filled
        // again before.
        let mut put_back_at: Option<tokio::time::Instant> = None;
        loop {
            let event = match put_back_at {
                Some(at) => tokio::select! {
                    event = stream.next() => event,
                    () = tokio::time::sleep_until(at) => {
                        put_back_at = None;
                        self.put_back(&state).await;
                        continue;
                    }
                },
                None => stream.next().await,
            };
            let Some(event) = event else {
                return;
            };
            let secret = match event {
                Ok(watcher::Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                    listed = true;
                    Some(secret)
                }
                // A (re)list without it: it is gone.
                Ok(watcher::Event::InitDone) if !listed => None,
                Ok(watcher::Event::InitDone) => continue,
                Ok(watcher::Event::Delete(_)) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "watch of the ownership key interrupted");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if self.observe(secret, &shared, &mut state).await {
                put_back_at.get_or_insert_with(|| tokio::time::Instant::now() + PUT_BACK_AFTER);
            } else {
                put_back_at = None;
            }
        }
    }

    /// Put the keys in use back into the Secret, deleted or emptied (and
    /// left so).
    async fn put_back(&self, state: &Followed) {
        let secret = match self.api.get_opt(&self.name).await {
            // Filled again meanwhile: its event is on its way.
            Ok(Some(secret)) if keys_text(&secret).is_some() => return,
            Ok(secret) => secret,
            Err(e) => {
                tracing::warn!(secret = %self.name, error = %e, "cannot read the ownership key Secret to put the keys back; the next change of the Secret retries");
                return;
            }
        };
        match self.write(&state.text, secret).await {
            Ok(()) => {
                tracing::warn!(namespace = %self.namespace, secret = %self.name, "the ownership key Secret was deleted or emptied, and left so; put the keys in use back")
            }
            Err(e) => {
                tracing::warn!(secret = %self.name, error = %e, "cannot put the ownership keys back; the next change of the Secret retries")
            }
        }
    }

    /// One state of the Secret (`None`: deleted); whether the keys in use
    /// are to be put back (it holds none).
    async fn observe(
        &self,
        secret: Option<Secret>,
        shared: &SharedKeys,
        state: &mut Followed,
    ) -> bool {
        let Some(current) = secret.as_ref().and_then(keys_text) else {
            state.lost = true;
            if !self.create {
                tracing::warn!(secret = %self.name, "the ownership key Secret holds no key; keeping the keys in use");
                return false;
            }
            tracing::warn!(namespace = %self.namespace, secret = %self.name, after = ?PUT_BACK_AFTER, "the ownership key Secret was deleted or emptied; the keys in use are put back unless it is filled again before");
            return true;
        };
        if state.lost
            && self.create
            && secret
                .as_ref()
                .is_some_and(|s| written_by_a_replica(s, &current))
            && let Some(merged) = merged_text(&current, &state.text)
        {
            // Refilled by a replica that did not hold our keys (the Secret
            // was lost meanwhile): ours verify too, or their records would
            // not.
            match self.write(&merged, secret).await {
                Ok(()) => {
                    tracing::warn!(secret = %self.name, "the ownership key Secret was refilled by another replica without the keys in use; appended them to verify with");
                    return false;
                }
                Err(e) => {
                    tracing::warn!(secret = %self.name, error = %e, "cannot append the keys in use to the refilled Secret");
                }
            }
        }
        if state.lost && current != state.text {
            tracing::warn!(secret = %self.name, "the ownership key Secret was made again with other keys: they are the keys now, alone (the keys in use before are revoked)");
        }
        state.lost = false;
        match OwnershipKeys::from_text(&current) {
            Ok(keys) => {
                shared.replace(keys);
                state.text = current;
            }
            Err(e) => {
                tracing::warn!(secret = %self.name, error = %e, "the Secret's ownership keys do not load; keeping the current ones")
            }
        }
        false
    }
}

/// Whether `secret`'s keys (`text`) are what a replica wrote there.
fn written_by_a_replica(secret: &Secret, text: &str) -> bool {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WRITTEN_BY_A_REPLICA))
        .is_some_and(|mark| *mark == digest(text))
}

/// What [`KeySecret::follow`] knows.
struct Followed {
    /// The key text in use.
    text: String,
    /// The Secret was deleted or emptied since.
    lost: bool,
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
