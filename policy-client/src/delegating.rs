//! Engines that wrap another engine: a wrapper implements [`Delegating`],
//! writes only the methods it changes, and is a [`PolicyEngine`] that hands
//! every other call to the engine it wraps.
//!
//! Implement it by path (`impl delegating::Delegating for ...`), without
//! importing the trait, so that its methods never compete with
//! [`PolicyEngine`]'s at a call.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use serde_json::Value;
use tokio::time::Instant;

use crate::engine::{
    AnswerChecks, DecisionCacheStats, EncodedJson, EngineError, PolicyEngine, QueryOutcome,
};
use crate::input::PolicyInput;

/// A [`PolicyEngine`] made of the engine it wraps and the methods it changes;
/// each method here is [`PolicyEngine`]'s, handed to [`Delegating::inner`].
#[async_trait]
pub(crate) trait Delegating: Send + Sync + fmt::Debug {
    /// The engine every call not changed here goes to.
    fn inner(&self) -> &dyn PolicyEngine;

    fn name(&self) -> &'static str {
        self.inner().name()
    }

    async fn query(
        &self,
        path: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        self.inner().query(path, input, deadline).await
    }

    async fn query_input(
        &self,
        path: &str,
        input: &PolicyInput<'_>,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        self.inner().query_input(path, input, deadline).await
    }

    async fn put_data(&self, path: &str, value: &Value) -> Result<(), EngineError> {
        self.inner().put_data(path, value).await
    }

    async fn put_data_encoded(&self, path: &str, json: EncodedJson) -> Result<(), EngineError> {
        self.inner().put_data_encoded(path, json).await
    }

    async fn patch_data(&self, path: &str, patch: &json_patch::Patch) -> Result<(), EngineError> {
        self.inner().patch_data(path, patch).await
    }

    async fn delete_data(&self, path: &str) -> Result<(), EngineError> {
        self.inner().delete_data(path).await
    }

    async fn put_policy(&self, id: &str, source: &str) -> Result<(), EngineError> {
        self.inner().put_policy(id, source).await
    }

    async fn delete_policy(&self, id: &str) -> Result<(), EngineError> {
        self.inner().delete_policy(id).await
    }

    async fn policies(&self) -> Result<BTreeMap<String, String>, EngineError> {
        self.inner().policies().await
    }

    async fn health(&self) -> Result<(), EngineError> {
        self.inner().health().await
    }

    async fn instance_id(&self) -> Result<Option<String>, EngineError> {
        self.inner().instance_id().await
    }

    fn decision_cache(&self) -> Option<DecisionCacheStats> {
        self.inner().decision_cache()
    }

    fn answer_checks(&self) -> Option<AnswerChecks> {
        self.inner().answer_checks()
    }
}

#[async_trait]
impl<T: Delegating> PolicyEngine for T {
    fn name(&self) -> &'static str {
        Delegating::name(self)
    }

    async fn query(
        &self,
        path: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        Delegating::query(self, path, input, deadline).await
    }

    async fn query_input(
        &self,
        path: &str,
        input: &PolicyInput<'_>,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        Delegating::query_input(self, path, input, deadline).await
    }

    async fn put_data(&self, path: &str, value: &Value) -> Result<(), EngineError> {
        Delegating::put_data(self, path, value).await
    }

    async fn put_data_encoded(&self, path: &str, json: EncodedJson) -> Result<(), EngineError> {
        Delegating::put_data_encoded(self, path, json).await
    }

    async fn patch_data(&self, path: &str, patch: &json_patch::Patch) -> Result<(), EngineError> {
        Delegating::patch_data(self, path, patch).await
    }

    async fn delete_data(&self, path: &str) -> Result<(), EngineError> {
        Delegating::delete_data(self, path).await
    }

    async fn put_policy(&self, id: &str, source: &str) -> Result<(), EngineError> {
        Delegating::put_policy(self, id, source).await
    }

    async fn delete_policy(&self, id: &str) -> Result<(), EngineError> {
        Delegating::delete_policy(self, id).await
    }

    async fn policies(&self) -> Result<BTreeMap<String, String>, EngineError> {
        Delegating::policies(self).await
    }

    async fn health(&self) -> Result<(), EngineError> {
        Delegating::health(self).await
    }

    async fn instance_id(&self) -> Result<Option<String>, EngineError> {
        Delegating::instance_id(self).await
    }

    fn decision_cache(&self) -> Option<DecisionCacheStats> {
        Delegating::decision_cache(self)
    }

    fn answer_checks(&self) -> Option<AnswerChecks> {
        Delegating::answer_checks(self)
    }
}
