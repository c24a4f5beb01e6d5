//! One watch per resource type, shared by everything that needs the type: its
//! replicator and the remediator. Each type is found by discovery (retried
//! while it is missing: a CRD may come later), list/watched through the
//! dynamic API into one [`TypeObjects`] store, and every change is handed to
//! the subscribers, in order, after the store holds it.
//!
//! Selectors: a type only one part needs is watched with that part's
//! selector (the replicator's ignored namespaces, the remediator's object
//! selector, both evaluated by the API server). A type both need is watched
//! whole and each applies its own filter: the replicator skips ignored
//! namespaces, the remediator matches its object selector
//! ([`parse_label_selector`](crate::scope::parse_label_selector)).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;
use futures::StreamExt;
use kube::api::{Api, ApiResource};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::engine::ReplicaScope;
use crate::engine_sync::component::discover_until_found;
use crate::error::SyncError;
use crate::gvr::Gvr;
use crate::metrics::Metrics;
use crate::replication::document::{ObjectKey, WatchedObject};
use crate::replication::objects::TypeObjects;

/// A discovered type and its objects.
pub(crate) struct WatchedType {
    pub(crate) resource: ApiResource,
    pub(crate) namespaced: bool,
    /// The label selector the API server applies to the watch.
    pub(crate) labels: Option<String>,
    pub(crate) objects: TypeObjects,
}

/// One change of a watched type, handed to subscribers after the store
/// holds it.
#[derive(Debug)]
pub(crate) enum WatchChange {
    /// Added or updated; `listed`: part of a (re)list. `previous`: the
    /// object as the store held it before (a watched update; not for a list,
    /// which is collected aside).
    Applied {
        key: ObjectKey,
        json: Bytes,
        listed: bool,
        previous: Option<Bytes>,
    },
    /// Deleted; `previous`: the object as the store held it.
    Deleted {
        key: ObjectKey,
        previous: Option<Bytes>,
    },
    /// A (re)list is complete; `first`: the first one.
    ListDone { first: bool },
}

/// What one part needs of a type.
#[derive(Debug, Clone, Default)]
pub(crate) struct Need {
    /// The scope its flag declares (replication checks it).
    pub(crate) scope: Option<ReplicaScope>,
    /// Field selector the part would watch with.
    pub(crate) fields: Option<String>,
    /// Label selector the part would watch with.
    pub(crate) labels: Option<String>,
    /// Whether it wants the objects of each (re)list one by one.
    pub(crate) listed: bool,
}

struct Subscriber {
    tx: mpsc::UnboundedSender<WatchChange>,
    listed: bool,
}

struct Slot {
    needs: Vec<Need>,
    subscribers: Vec<Subscriber>,
    found: watch::Sender<Option<Arc<WatchedType>>>,
}

/// The watched types of one sidecar: every part declares what it needs
/// ([`TypeWatches::subscribe`]) before [`TypeWatches::spawn`] starts one
/// watch per type.
#[derive(Default)]
pub(crate) struct TypeWatches {
    slots: Mutex<BTreeMap<Gvr, Slot>>,
}

/// A part's view of one watched type.
pub(crate) struct Subscription {
    found: watch::Receiver<Option<Arc<WatchedType>>>,
    pub(crate) changes: mpsc::UnboundedReceiver<WatchChange>,
}

impl Subscription {
    /// The type once discovered; `None` when the sidecar stops first.
    pub(crate) async fn found(&mut self) -> Option<Arc<WatchedType>> {
        self.found
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|found| found.clone())
    }
}

impl TypeWatches {
    pub(crate) fn subscribe(&self, gvr: &Gvr, need: Need) -> Subscription {
        let (tx, changes) = mpsc::unbounded_channel();
        let mut slots = self.slots.lock();
        let slot = slots.entry(gvr.clone()).or_insert_with(|| Slot {
            needs: Vec::new(),
            subscribers: Vec::new(),
            found: watch::Sender::new(None),
        });
        slot.subscribers.push(Subscriber {
            tx,
            listed: need.listed,
        });
        slot.needs.push(need);
        Subscription {
            found: slot.found.subscribe(),
            changes,
        }
    }

    /// Start one watch per subscribed type in `tasks`, each until `cancel`.
    /// A type whose scope contradicts its flag ends its task with an error.
    pub(crate) fn spawn(
        self,
        tasks: &mut JoinSet<Result<(), SyncError>>,
        client: &Client,
        metrics: &Arc<Metrics>,
        cancel: &CancellationToken,
    ) {
        let slots = self.slots.into_inner();
        for (gvr, slot) in slots {
            tasks.spawn(watch_type(
                client.clone(),
                metrics.clone(),
                gvr,
                slot,
                cancel.clone(),
            ));
        }
    }
}

/// Objects per page of a (re)list, where the API server pages it (a list it
/// reads through etcd does; from its watch cache, kube-apiserver 1.34 sent
/// 10,000 ConfigMaps in one response, asked for pages of 2000). The page is decoded whole
/// before its objects are stored compactly, so large pages cost memory. First
/// sync of 100,000 ConfigMaps of 0.5 KB (one run each, pages read through
/// etcd): pages of 500 5.3 s and 125 MiB peak, 1000 4.2 s, 2000 3.4 s and
/// 126 MiB, 5000 3.0 s and 177 MiB.
const LIST_PAGE_SIZE: u32 = 2000;

/// The watch of a type: a selector only when every part watches with the
/// same one (otherwise each part filters for itself). Lists are read from the
/// API server's watch cache (`resourceVersion=0`, as client-go's informers
/// list), not through etcd: a first sync of 10,000 ConfigMaps listed in 408
/// instead of 476 ms, in one response instead of five pages (at 100,000,
/// placement-sync's peak was 132-150 MiB). Such a list may be a moment behind; the watch
/// resumes from the version it was read at, so no later change is missed.
fn watch_config(needs: &[Need]) -> watcher::Config {
    let common = |pick: fn(&Need) -> &Option<String>| {
        let first = needs.first().map(pick).cloned().flatten();
        needs.iter().all(|n| *pick(n) == first).then_some(first)?
    };
    let mut config = watcher::Config::default()
        .page_size(LIST_PAGE_SIZE)
        .any_semantic();
    if let Some(fields) = common(|n| &n.fields) {
        config = config.fields(&fields);
    }
    if let Some(labels) = common(|n| &n.labels) {
        config = config.labels(&labels);
    }
    config
}

async fn watch_type(
    client: Client,
    metrics: Arc<Metrics>,
    gvr: Gvr,
    slot: Slot,
    cancel: CancellationToken,
) -> Result<(), SyncError> {
    let expected = slot.needs.iter().find_map(|n| n.scope);
    let Some((resource, namespaced)) =
        discover_until_found(&client, &gvr, expected, &cancel).await?
    else {
        return Ok(());
    };
    let api: Api<WatchedObject> = Api::all_with(client, &resource);
    let config = watch_config(&slot.needs);
    let labels = config.label_selector.clone();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut WatchedObject| o.meta_mut().managed_fields = None);
    let watched = Arc::new(WatchedType {
        resource,
        namespaced,
        labels,
        objects: TypeObjects::default(),
    });
    slot.found.send_replace(Some(watched.clone()));
    let label = &watched.resource.plural;
    let mut feed = Feed {
        watched: &watched,
        subscribers: &slot.subscribers,
        listed_once: false,
        list_started: None,
    };
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = cancel.cancelled() => break,
        };
        match event {
            Some(Ok(event)) => feed.apply(event),
            Some(Err(e)) => {
                metrics.watch_error(label);
                tracing::warn!(resource = %label, error = %e, "watch error; the watch recovers by itself");
            }
            None => break,
        }
    }
    Ok(())
}

/// A type's watch events into its store, each change then handed to the
/// subscribers.
struct Feed<'a> {
    watched: &'a WatchedType,
    subscribers: &'a [Subscriber],
    /// A list has completed (the next one is a relist).
    listed_once: bool,
    /// When the list in progress began.
    list_started: Option<tokio::time::Instant>,
}

impl Feed<'_> {
    fn apply(&mut self, event: watcher::Event<WatchedObject>) {
        let objects = &self.watched.objects;
        match event {
            watcher::Event::Apply(object) => self.applied(&object, false),
            watcher::Event::Delete(object) => self.deleted(&object),
            watcher::Event::Init => {
                self.list_started = Some(tokio::time::Instant::now());
                objects.list_started();
            }
            watcher::Event::InitApply(object) => self.applied(&object, true),
            watcher::Event::InitDone => {
                objects.list_done();
                let took_ms = self.list_started.take().map(|t| t.elapsed().as_millis());
                tracing::info!(resource = %self.watched.resource.plural, objects = objects.len(), took_ms, "listed the whole type");
                let first = !self.listed_once;
                self.listed_once = true;
                self.send(&|| WatchChange::ListDone { first }, false);
            }
        }
    }

    /// An add or update (`listed`: part of a (re)list): stored, then handed on.
    fn applied(&self, object: &WatchedObject, listed: bool) {
        let Some(key) = ObjectKey::of(object.meta()) else {
            return;
        };
        let json = Bytes::from(object.json(&self.watched.resource));
        let objects = &self.watched.objects;
        let previous = if listed {
            objects.listed(key.clone(), json.clone());
            None
        } else {
            objects.apply(key.clone(), json.clone())
        };
        let change = || WatchChange::Applied {
            key: key.clone(),
            json: json.clone(),
            listed,
            previous: previous.clone(),
        };
        self.send(&change, listed);
    }

    fn deleted(&self, object: &WatchedObject) {
        if let Some(key) = ObjectKey::of(object.meta()) {
            let previous = self.watched.objects.delete(&key);
            self.send(
                &|| WatchChange::Deleted {
                    key: key.clone(),
                    previous: previous.clone(),
                },
                false,
            );
        }
    }

    /// `change` to every subscriber (`listed`: only to those that take lists).
    fn send(&self, change: &dyn Fn() -> WatchChange, listed: bool) {
        for s in self.subscribers {
            if !listed || s.listed {
                // A subscriber gone means the sidecar is stopping.
                let _ = s.tx.send(change());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(fields: Option<&str>, labels: Option<&str>) -> Need {
        Need {
            fields: fields.map(str::to_owned),
            labels: labels.map(str::to_owned),
            ..Need::default()
        }
    }

    #[test]
    fn a_shared_watch_keeps_only_the_selectors_every_part_uses() {
        let alone = watch_config(&[need(Some("metadata.namespace!=a"), None)]);
        assert_eq!(
            alone.field_selector.as_deref(),
            Some("metadata.namespace!=a")
        );
        let shared = watch_config(&[
            need(Some("metadata.namespace!=a"), None),
            need(None, Some("team=x")),
        ]);
        assert_eq!(shared.field_selector, None);
        assert_eq!(shared.label_selector, None);
        let same = watch_config(&[need(None, Some("team=x")), need(None, Some("team=x"))]);
        assert_eq!(same.label_selector.as_deref(), Some("team=x"));
    }
}
