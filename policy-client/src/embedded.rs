//! The embedded Rego engine (`regorus`), for running without OPA and for offline
//! evaluation.
//!
//! Queries run compiled to regorus's bytecode VM where its compiler takes the
//! policy set, interpreted otherwise ([`crate::compiled`]); either way on the
//! part of the input the modules can read ([`InputReads::project`]), not a
//! copy of all of it.
//!
//! Evaluation runs on Tokio's blocking pool, at most one evaluation per core at a
//! time: evaluation is pure CPU, so more in parallel only time-slices them and
//! stretches every one (the tail latency under load); the others wait their turn
//! in order. Each blocking thread keeps its own machine (or copy of the prepared
//! interpreter) and reuses it until policies or data change, so concurrent
//! reviews do not contend on a lock or re-prepare the policy.
//!
//! Answers are remembered ([`crate::memo`]) by the values at the input paths
//! the modules read ([`crate::input_reads`]): a review that differs from an
//! earlier one only in what the policy never reads (names, uids, images) is
//! answered without evaluating.

mod directory;
mod evaluate;
mod refused_forms;
mod template;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::compiled::{CheckCounts, Programs};
use crate::engine::{
    AnswerChecks, DecisionCacheStats, EngineError, PolicyEngine, QueryOutcome, path_segments,
};
use crate::input::{InputRoot, PolicyInput};
use crate::input_reads::{InputReads, Uncacheable};
use crate::memo::DecisionMemo;
use crate::rego_value::to_rego;
pub use directory::LoadError;
use directory::ensure_object;
use evaluate::{compare_off_path, evaluate, package_paths, question};
use template::build_engine;

/// The decision cache's default size in bytes.
pub(crate) const DEFAULT_DECISION_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Distinguishes engines in the per-thread cache.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// An in-process Rego engine holding policy modules and a data document.
pub struct Embedded {
    instance: u64,
    state: RwLock<State>,
    /// One permit per core: the evaluations allowed to run at once.
    evaluators: Arc<Semaphore>,
    memo: DecisionMemo,
    /// Compiled answers compared with the interpreter's, over every module
    /// set.
    checks: Arc<CheckCounts>,
}

struct State {
    modules: BTreeMap<String, String>,
    data: Value,
    /// Engine with every module and the data loaded; cloned per thread.
    template: Arc<regorus::Engine>,
    /// The queries compiled for the modules (kept across data changes).
    programs: Arc<Programs>,
    generation: u64,
    /// What the modules read of the input, or why their answers are not
    /// remembered.
    reads: Result<Arc<InputReads>, Uncacheable>,
    /// The modules' package paths.
    packages: Arc<Vec<Vec<String>>>,
}

impl fmt::Debug for Embedded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.read();
        f.debug_struct("Embedded")
            .field("modules", &state.modules.keys().collect::<Vec<_>>())
            .field("generation", &state.generation)
            .finish()
    }
}

impl Default for Embedded {
    fn default() -> Self {
        Self::new()
    }
}

impl Embedded {
    /// An engine with no policies and empty data.
    pub fn new() -> Self {
        let checks = Arc::<CheckCounts>::default();
        Embedded {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            evaluators: evaluators(),
            memo: DecisionMemo::new(DEFAULT_DECISION_CACHE_BYTES),
            state: RwLock::new(State {
                reads: input_reads(&BTreeMap::new()),
                modules: BTreeMap::new(),
                data: Value::Object(Map::new()),
                template: Arc::new(regorus::Engine::new()),
                programs: Arc::new(Programs::new(Arc::clone(&checks))),
                generation: 0,
                packages: Arc::default(),
            }),
            checks,
        }
    }

    /// Load a directory the way `opa run DIR` does: every `*.rego` file except
    /// `*_test.rego` is a module (its id is the path relative to `dir`), and every
    /// `*.json` / `*.yaml` / `*.yml` file is a data document mounted at its
    /// folder's path (documents in one folder are merged).
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let (modules, data) = directory::read(dir)?;
        let template = build_engine(&modules, &data)?;
        let checks = Arc::<CheckCounts>::default();
        let packages = Arc::new(package_paths(&template));
        Ok(Embedded {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            evaluators: evaluators(),
            memo: DecisionMemo::new(DEFAULT_DECISION_CACHE_BYTES),
            state: RwLock::new(State {
                reads: input_reads(&modules),
                modules,
                data,
                template: Arc::new(template),
                programs: Arc::new(Programs::new(Arc::clone(&checks))),
                generation: 1,
                packages,
            }),
            checks,
        })
    }

    /// Remember at most about `bytes` of answers (0: none).
    pub fn with_decision_cache(mut self, bytes: usize) -> Self {
        self.memo = DecisionMemo::new(bytes);
        self
    }

    /// Number of loaded policy modules.
    pub fn module_count(&self) -> usize {
        self.state.read().modules.len()
    }

    /// The decision at `path` for the input read at `input`.
    async fn decide(
        &self,
        path: &str,
        input: InputRoot<'_>,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let timeout = || EngineError::Timeout {
            endpoint: "embedded".to_owned(),
            timeout: budget,
        };
        let (template, programs, generation, reads, packages) = {
            let state = self.state.read();
            let reads = state.reads.as_ref().ok().map(Arc::clone);
            (
                Arc::clone(&state.template),
                Arc::clone(&state.programs),
                state.generation,
                reads,
                Arc::clone(&state.packages),
            )
        };
        let question = question(path, &packages)?;
        // A query given up for the interpreter since an answer was
        // remembered must not get that answer again.
        let key = match &reads {
            Some(reads) if self.memo.enabled() => reads.key(path, input).map(|mut key| {
                key.extend_from_slice(&programs.give_ups().to_le_bytes());
                key
            }),
            _ => None,
        };
        if let Some(key) = &key
            && let Some(outcome) = self.memo.get(generation, key)
        {
            return Ok(outcome);
        }
        let instance = self.instance;
        // Straight from the borrowed JSON, and only what the modules can read
        // where that is known: no copy of the rest.
        let input = match &reads {
            Some(reads) => reads.project(input),
            None => input.to_rego(),
        };
        let permit =
            tokio::time::timeout_at(deadline, Arc::clone(&self.evaluators).acquire_owned())
                .await
                .map_err(|_| timeout())?
                .expect("the evaluator semaphore is never closed");
        let limit = deadline.saturating_duration_since(Instant::now());
        let (answer, answered) = tokio::sync::oneshot::channel();
        // The permit moves into the task, so it is held for as long as the
        // evaluation runs, even when this query stops waiting for it, and
        // for a comparison with the interpreter made once the answer is
        // given (its work counts against the cores like any evaluation's).
        tokio::task::spawn_blocking(move || {
            let (outcome, compare_later) = evaluate(
                instance, generation, &template, &programs, question, input, limit,
            );
            let _ = answer.send(outcome);
            if let Some(given) = compare_later {
                compare_off_path(instance, generation, &template, &programs, given);
            }
            drop(permit);
        });
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(outcome)) => {
                if let (Some(key), Ok(outcome)) = (&key, &outcome) {
                    self.memo.put(generation, key, outcome);
                }
                outcome
            }
            Ok(Err(_)) => Err(EngineError::Evaluation(
                "the evaluation task ended without an answer".to_owned(),
            )),
            Err(_) => Err(timeout()),
        }
    }

    /// Replace modules and data together, keeping the old state on error.
    fn update(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, String>, &mut Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let mut state = self.state.write();
        let mut modules = state.modules.clone();
        let mut data = state.data.clone();
        change(&mut modules, &mut data)?;
        let template = if modules == state.modules {
            // Data only: keep the parsed modules, swap the data document.
            let mut engine = (*state.template).clone();
            engine.clear_data();
            engine
                .add_data(to_rego(&data))
                .map_err(|e| EngineError::Evaluation(format!("loading data: {e}")))?;
            engine
        } else {
            let template = build_engine(&modules, &data)?;
            let reads = input_reads(&modules);
            if reads.is_ok() && state.reads.is_err() {
                tracing::info!(
                    "decision cache on: the policy set reads input only at constant paths"
                );
            }
            state.reads = reads;
            state.programs = Arc::new(Programs::new(Arc::clone(&self.checks)));
            state.packages = Arc::new(package_paths(&template));
            template
        };
        state.modules = modules;
        state.data = data;
        state.template = Arc::new(template);
        state.generation += 1;
        Ok(())
    }
}

/// Stop embedded evaluations once the process's heap exceeds `bytes` (`None`:
/// no ceiling).
///
/// regorus counts every allocation of the process (its allocator is the
/// process's), and checks the ceiling between interpreter steps and inside the
/// builtins that build collections (`numbers.range`, `array.concat`, ...). So
/// the ceiling is process-wide: an evaluation that starts while the rest of the
/// process is near it fails too. A single builtin call that builds one value in
/// one allocation (`sprintf` with a huge width, `concat` of huge strings) makes
/// that allocation before the next check; the evaluation stops right after it.
pub fn set_memory_limit(bytes: Option<u64>) {
    regorus::set_global_memory_limit(bytes);
}

/// The input paths `modules` read; a refusal is logged, since it costs every
/// review a full evaluation.
pub(crate) fn input_reads(
    modules: &BTreeMap<String, String>,
) -> Result<Arc<InputReads>, Uncacheable> {
    InputReads::of(modules)
        .map(Arc::new)
        .inspect_err(|refused| {
            tracing::warn!(
                %refused,
                "decision cache off for this policy set: every review is evaluated"
            );
        })
}

fn evaluators() -> Arc<Semaphore> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(Semaphore::new(cores))
}

#[async_trait]
impl PolicyEngine for Embedded {
    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn query(
        &self,
        path: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        self.decide(path, InputRoot::Value(input), deadline).await
    }

    async fn query_input(
        &self,
        path: &str,
        input: &PolicyInput<'_>,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        self.decide(path, input.root(), deadline).await
    }

    async fn put_data(&self, path: &str, value: &Value) -> Result<(), EngineError> {
        let segments: Vec<String> = path_segments(path)?
            .into_iter()
            .map(str::to_owned)
            .collect();
        if segments.is_empty() && !value.is_object() {
            return Err(EngineError::InvalidPath {
                path: path.to_owned(),
                reason: "the root data document must be an object".to_owned(),
            });
        }
        let value = value.clone();
        self.update(|_, data| {
            match segments.split_last() {
                None => *data = value,
                Some((last, parents)) => {
                    let mut node = data;
                    for segment in parents {
                        node = ensure_object(node)
                            .entry(segment.clone())
                            .or_insert_with(|| Value::Object(Map::new()));
                    }
                    ensure_object(node).insert(last.clone(), value);
                }
            }
            Ok(())
        })
    }

    async fn patch_data(&self, path: &str, patch: &json_patch::Patch) -> Result<(), EngineError> {
        let segments: Vec<String> = path_segments(path)?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let patch = patch.clone();
        let not_found = |message: String| EngineError::NotFound {
            path: path.to_owned(),
            message,
        };
        self.update(|_, data| {
            let mut node = Some(data);
            for segment in &segments {
                node = node.and_then(|n| n.get_mut(segment.as_str()));
            }
            let document =
                node.ok_or_else(|| not_found("the document does not exist".to_owned()))?;
            // json_patch applies all operations or none.
            json_patch::patch(document, &patch).map_err(|e| not_found(e.to_string()))
        })
    }

    async fn delete_data(&self, path: &str) -> Result<(), EngineError> {
        let segments: Vec<String> = path_segments(path)?
            .into_iter()
            .map(str::to_owned)
            .collect();
        self.update(|_, data| {
            match segments.split_last() {
                None => *data = Value::Object(Map::new()),
                Some((last, parents)) => {
                    let mut node = Some(data);
                    for segment in parents {
                        node = node.and_then(|n| n.get_mut(segment.as_str()));
                    }
                    if let Some(Value::Object(map)) = node {
                        map.remove(last.as_str());
                    }
                }
            }
            Ok(())
        })
    }

    async fn put_policy(&self, id: &str, source: &str) -> Result<(), EngineError> {
        let (id, source) = (id.to_owned(), source.to_owned());
        self.update(|modules, _| {
            modules.insert(id, source);
            Ok(())
        })
    }

    async fn delete_policy(&self, id: &str) -> Result<(), EngineError> {
        if !self.state.read().modules.contains_key(id) {
            return Ok(());
        }
        self.update(|modules, _| {
            modules.remove(id);
            Ok(())
        })
    }

    async fn policies(&self) -> Result<BTreeMap<String, String>, EngineError> {
        Ok(self.state.read().modules.clone())
    }

    async fn health(&self) -> Result<(), EngineError> {
        Ok(())
    }

    fn decision_cache(&self) -> Option<DecisionCacheStats> {
        let refused = self
            .state
            .read()
            .reads
            .as_ref()
            .err()
            .map(ToString::to_string);
        Some(self.memo.stats(refused))
    }

    fn answer_checks(&self) -> Option<AnswerChecks> {
        let (compared, disagreements) = self.checks.totals();
        Some(AnswerChecks {
            compared,
            disagreements,
        })
    }
}

#[cfg(test)]
mod tests;
