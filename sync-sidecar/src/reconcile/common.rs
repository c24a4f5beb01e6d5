//! What every kind of target reads and writes through in a pass: the
//! context, the watched targets, the one write step, the objects due, the
//! scope, and who the reconciler is to the policy (its identity and the
//! ownership keys).

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use kube::api::ApiResource;
use policy_client::engine::{EngineError, QueryOutcome};
use policy_client::input::stored_input;
use policy_client::ownership_keys::SharedKeys;
use serde_json::Value;
use tokio::time::Instant;

use super::changes::{Changes, ItemKey};
use super::context::ReconcilerContext;
use super::target::Target;
use super::writer::Writer;
use crate::replication::document::ObjectKey;
use crate::scope::ScopeFilter;

pub(crate) struct Common {
    pub(crate) ctx: ReconcilerContext,
    pub(crate) targets: Vec<Target>,
    pub(crate) scope: ScopeFilter,
    /// Who this reconciler's writes come from, as the API server tells the
    /// webhook (`userInfo` of the policy input).
    pub(crate) user_info: Value,
    /// Sign and verify the ownership record.
    pub(crate) keys: SharedKeys,
    /// The one write step (in flight, rate limit, leadership, Events).
    pub(crate) writer: Writer,
    /// Objects created or changed since they were last evaluated.
    pub(crate) changes: Arc<Changes>,
}

impl Common {
    pub(crate) fn new(
        ctx: ReconcilerContext,
        targets: Vec<Target>,
        scope: ScopeFilter,
        user_info: Value,
        keys: SharedKeys,
        changes: Arc<Changes>,
    ) -> Common {
        let writer = Writer::new(
            ctx.rate,
            ctx.recorder.clone(),
            ctx.leader.clone(),
            ctx.state.clone(),
        );
        Common {
            ctx,
            targets,
            scope,
            user_info,
            keys,
            writer,
            changes,
        }
    }

    /// The policy input: what the webhook will be asked when this object is
    /// written (an UPDATE by this reconciler, the stored object as
    /// `oldObject`), so both get the same answer.
    pub(crate) fn update_input(&self, value: &Value, resource: &ApiResource) -> Value {
        stored_input(value, resource, &self.user_info, &self.keys.current())
    }

    /// Ask the decision about `input`, counted, within the query timeout.
    pub(crate) async fn query(&self, input: &Value) -> Result<QueryOutcome, EngineError> {
        let deadline = Instant::now() + self.ctx.query_timeout;
        self.ctx.metrics.remediation_queries.inc();
        self.ctx
            .engine
            .query(&self.ctx.decision, input, deadline)
            .await
    }

    /// The cached objects of the targets `takes` picks, `admitted` by key:
    /// every one, or only those of `only`; each as `decode` makes it an item
    /// (`None`: left out).
    pub(crate) fn cached_items<I>(
        &self,
        only: Option<&BTreeSet<ItemKey>>,
        takes: impl Fn(&Target) -> bool,
        admitted: impl Fn(&ObjectKey) -> bool,
        decode: impl Fn(usize, ObjectKey, &Bytes) -> Option<I>,
    ) -> Vec<I> {
        let takes = |i: usize| self.targets.get(i).is_some_and(&takes);
        let decode = &decode;
        match only {
            None => self
                .targets
                .iter()
                .enumerate()
                .filter(|(i, _)| takes(*i))
                .flat_map(|(i, t)| {
                    t.watched
                        .objects
                        .snapshot(&admitted)
                        .into_iter()
                        .filter_map(move |(key, json)| decode(i, key, &json))
                })
                .collect(),
            Some(keys) => keys
                .iter()
                .filter(|(i, key)| takes(*i) && admitted(key))
                .filter_map(|(i, key)| {
                    let json = self.targets[*i].watched.objects.get(key)?;
                    decode(*i, key.clone(), &json)
                })
                .collect(),
        }
    }
}
