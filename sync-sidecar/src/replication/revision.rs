//! The revision of what administrators configure: the policy set in force and
//! the configured part (not the status, not a cluster's health) of the
//! replicated data the policies read.
//!
//! The remediation leader records the revision it applied on its Lease after
//! every pass over everything that it applied. A replica that takes the lease
//! over (or starts) compares the revision now with the recorded one: the same
//! means no one edited the policy or the data since the last applied pass, so
//! what it saw change while another replica led was that leader's to apply,
//! and only health may have changed (a failover during an outage needs no
//! one); a different one, or a change held by the previous leader, is guarded.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use serde_json::Value;

use crate::hex::hex;
use crate::policies::rego_refs::PolicyReads;
use crate::replication::classify::configured;
use crate::replication::health::ClusterKind;
use crate::replication::watched::WatchedType;

/// A replicated type: its cluster kind, if it is one, and its objects.
type Replicated = (Option<&'static ClusterKind>, Arc<WatchedType>);

/// The replicated types, as their replicators found them.
#[derive(Default)]
pub(crate) struct ReplicatedTypes {
    types: Mutex<BTreeMap<String, Replicated>>,
}

impl ReplicatedTypes {
    pub(crate) fn register(&self, watched: Arc<WatchedType>, kind: Option<&'static ClusterKind>) {
        self.types
            .lock()
            .insert(watched.resource.plural.clone(), (kind, watched));
    }

    /// The revision of the configured part of the replicated data `reads`
    /// covers (every type, in name order).
    pub(crate) fn revision(&self, reads: &PolicyReads) -> String {
        let types: Vec<(String, Option<&'static ClusterKind>, Arc<WatchedType>)> = self
            .types
            .lock()
            .iter()
            .filter(|(plural, _)| reads.includes(plural))
            .map(|(plural, (kind, watched))| (plural.clone(), *kind, watched.clone()))
            .collect();
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for (plural, kind, watched) in types {
            context.update(plural.as_bytes());
            context.update(&[0]);
            context.update(type_revision(kind, &watched).as_bytes());
            context.update(&[0]);
        }
        hex(context.finish().as_ref(), 8)
    }
}

/// The revision of the configured part of one type's objects.
pub(crate) fn type_revision(kind: Option<&ClusterKind>, watched: &WatchedType) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    // In key order: one text per content.
    for (key, json) in watched.objects.snapshot(|_| true) {
        let Ok(object) = serde_json::from_slice::<Value>(&json) else {
            continue;
        };
        context.update(key.to_string().as_bytes());
        context.update(&[0]);
        context.update(configured(kind, &object).to_string().as_bytes());
        context.update(&[0]);
    }
    hex(context.finish().as_ref(), 8)
}

/// The revision of a policy set and the configured data it reads.
pub(crate) fn configured_revision(policy_revision: &str, data_revision: &str) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(policy_revision.as_bytes());
    context.update(&[0]);
    context.update(data_revision.as_bytes());
    hex(context.finish().as_ref(), 8)
}

#[cfg(test)]
mod tests;
