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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use regorus::rvm::vm::{RegoVM, VmError};
use regorus::utils::limits::ExecutionTimerConfig;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::compiled::{Programs, TIMER_CHECK_INTERVAL};
use crate::engine::{
    CompileError, DecisionCacheStats, EngineError, PolicyEngine, QueryOutcome, path_segments,
};
use crate::input::{InputRoot, PolicyInput};
use crate::input_reads::{InputReads, Uncacheable};
use crate::memo::DecisionMemo;
use crate::rego_value::to_rego;

/// The decision cache's default size in bytes.
pub const DEFAULT_DECISION_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Distinguishes engines in the per-thread cache.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// What the last evaluation on this thread prepared.
    static PREPARED: RefCell<Option<Prepared>> = const { RefCell::new(None) };
}

/// A blocking thread's evaluators for one generation of one engine.
struct Prepared {
    instance: u64,
    generation: u64,
    /// The interpreter, copied from the template when first needed.
    interpreter: Option<regorus::Engine>,
    /// A machine per compiled query.
    machines: HashMap<String, RegoVM>,
}

/// An in-process Rego engine holding policy modules and a data document.
pub struct Embedded {
    instance: u64,
    state: RwLock<State>,
    /// One permit per core: the evaluations allowed to run at once.
    evaluators: Arc<Semaphore>,
    memo: DecisionMemo,
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
}

impl fmt::Debug for Embedded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Embedded")
            .field("modules", &state.modules.keys().collect::<Vec<_>>())
            .field("generation", &state.generation)
            .finish()
    }
}

/// Errors loading a policy directory.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data file {path} is not valid {format}: {message}")]
    Data {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl Default for Embedded {
    fn default() -> Self {
        Self::new()
    }
}

impl Embedded {
    /// An engine with no policies and empty data.
    pub fn new() -> Self {
        Embedded {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            evaluators: evaluators(),
            memo: DecisionMemo::new(DEFAULT_DECISION_CACHE_BYTES),
            state: RwLock::new(State {
                reads: input_reads(&BTreeMap::new()),
                modules: BTreeMap::new(),
                data: Value::Object(Map::new()),
                template: Arc::new(regorus::Engine::new()),
                programs: Arc::default(),
                generation: 0,
            }),
        }
    }

    /// Load a directory the way `opa run DIR` does: every `*.rego` file except
    /// `*_test.rego` is a module (its id is the path relative to `dir`), and every
    /// `*.json` / `*.yaml` / `*.yml` file is a data document mounted at its
    /// folder's path (documents in one folder are merged).
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let mut modules = BTreeMap::new();
        let mut data = Value::Object(Map::new());
        let mut files = Vec::new();
        walk(dir, &mut files)?;
        files.sort();
        for path in files {
            let rel = path.strip_prefix(dir).unwrap_or(&path);
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let read = || {
                std::fs::read_to_string(&path).map_err(|source| LoadError::Io {
                    path: path.clone(),
                    source,
                })
            };
            if name.ends_with(".rego") && !name.ends_with("_test.rego") {
                modules.insert(rel.to_string_lossy().into_owned(), read()?);
            } else if name.ends_with(".json") || name.ends_with(".yaml") || name.ends_with(".yml") {
                let text = read()?;
                let doc: Value = if name.ends_with(".json") {
                    serde_json::from_str(&text).map_err(|e| LoadError::Data {
                        path: path.clone(),
                        format: "JSON",
                        message: e.to_string(),
                    })?
                } else {
                    yaml_serde::from_str(&text).map_err(|e| LoadError::Data {
                        path: path.clone(),
                        format: "YAML",
                        message: e.to_string(),
                    })?
                };
                let mount: Vec<String> = rel
                    .parent()
                    .map(|p| {
                        p.components()
                            .map(|c| c.as_os_str().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                merge_at(&mut data, &mount, doc);
            }
        }
        let template = build_engine(&modules, &data)?;
        Ok(Embedded {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            evaluators: evaluators(),
            memo: DecisionMemo::new(DEFAULT_DECISION_CACHE_BYTES),
            state: RwLock::new(State {
                reads: input_reads(&modules),
                modules,
                data,
                template: Arc::new(template),
                programs: Arc::default(),
                generation: 1,
            }),
        })
    }

    /// Remember at most about `bytes` of answers (0: none).
    pub fn with_decision_cache(mut self, bytes: usize) -> Self {
        self.memo = DecisionMemo::new(bytes);
        self
    }

    /// Number of loaded policy modules.
    pub fn module_count(&self) -> usize {
        self.read().modules.len()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
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
        let query = rego_query(path)?;
        let (template, programs, generation, reads) = {
            let state = self.read();
            let reads = state.reads.as_ref().ok().map(Arc::clone);
            (
                Arc::clone(&state.template),
                Arc::clone(&state.programs),
                state.generation,
                reads,
            )
        };
        let key = match &reads {
            Some(reads) if self.memo.enabled() => reads.key(path, input),
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
        // The permit moves into the task, so it is held for as long as the
        // evaluation runs, even when this query stops waiting for it.
        let task = tokio::task::spawn_blocking(move || {
            let outcome = evaluate(
                instance, generation, &template, &programs, query, input, limit,
            );
            drop(permit);
            outcome
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(outcome)) => {
                if let (Some(key), Ok(outcome)) = (&key, &outcome) {
                    self.memo.put(generation, key, outcome);
                }
                outcome
            }
            Ok(Err(join)) => Err(EngineError::Evaluation(format!(
                "evaluation task failed: {join}"
            ))),
            Err(_) => Err(timeout()),
        }
    }

    /// Replace modules and data together, keeping the old state on error.
    fn update(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, String>, &mut Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let mut state = self.write();
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
            state.programs = Arc::default();
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

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| LoadError::Io {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| LoadError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(|source| LoadError::Io {
            path: path.clone(),
            source,
        })?;
        // Hidden entries (editor files, `..data` symlinks of mounted ConfigMaps) are skipped.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if file_type.is_dir() || (file_type.is_symlink() && path.is_dir()) {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Put `doc` at `path` in `data`, merging objects so sibling documents survive.
fn merge_at(data: &mut Value, path: &[String], doc: Value) {
    let mut node = data;
    for segment in path {
        node = ensure_object(node)
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    merge(node, doc);
}

fn merge(target: &mut Value, doc: Value) {
    match (target, doc) {
        (Value::Object(t), Value::Object(d)) => {
            for (k, v) in d {
                match t.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (target, doc) => *target = doc,
    }
}

fn ensure_object(node: &mut Value) -> &mut Map<String, Value> {
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    match node {
        Value::Object(map) => map,
        _ => unreachable!("just made an object"),
    }
}

fn build_engine(
    modules: &BTreeMap<String, String>,
    data: &Value,
) -> Result<regorus::Engine, EngineError> {
    let mut engine = regorus::Engine::new();
    let mut errors = Vec::new();
    for (id, source) in modules {
        if let Err(e) = engine.add_policy(id.clone(), source.clone()) {
            errors.push(compile_error(id, &e.to_string()));
        }
    }
    if !errors.is_empty() {
        return Err(EngineError::Compile(errors));
    }
    engine
        .add_data(to_rego(data))
        .map_err(|e| EngineError::Evaluation(format!("loading data: {e}")))?;
    // Preparing the engine runs the analysis that finds errors beyond syntax.
    if !modules.is_empty() {
        engine
            .eval_query("true".to_owned(), false)
            .map_err(|e| EngineError::Compile(vec![compile_error("", &e.to_string())]))?;
    }
    Ok(engine)
}

/// Turn regorus's "--> file:row:col ... error: message" text into a [`CompileError`].
fn compile_error(default_file: &str, text: &str) -> CompileError {
    let mut file = (!default_file.is_empty()).then(|| default_file.to_owned());
    let (mut row, mut col) = (None, None);
    if let Some(location) = text.lines().find_map(|l| l.trim().strip_prefix("--> ")) {
        let mut parts = location.rsplitn(3, ':');
        col = parts.next().and_then(|c| c.parse().ok());
        row = parts.next().and_then(|r| r.parse().ok());
        if let Some(f) = parts.next() {
            file = Some(f.to_owned());
        }
    }
    let message = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim()
                .strip_prefix("error: ")
                .unwrap_or(l.trim())
                .to_owned()
        })
        .unwrap_or_else(|| text.trim().to_owned());
    CompileError {
        file,
        row,
        col,
        code: Some("rego_compile_error".to_owned()),
        message,
    }
}

/// `io/k8s/federation/admission` -> `data.io.k8s.federation.admission`.
fn rego_query(path: &str) -> Result<String, EngineError> {
    let mut query = String::from("data");
    for segment in path_segments(path)? {
        let is_ident = segment
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_ident {
            query.push('.');
            query.push_str(segment);
        } else {
            query.push('[');
            query.push_str(&Value::String(segment.to_owned()).to_string());
            query.push(']');
        }
    }
    Ok(query)
}

fn evaluate(
    instance: u64,
    generation: u64,
    template: &regorus::Engine,
    programs: &Programs,
    query: String,
    input: regorus::Value,
    limit: Duration,
) -> Result<QueryOutcome, EngineError> {
    let deadline = std::time::Instant::now() + limit;
    PREPARED.with(|cell| {
        let mut cell = cell.borrow_mut();
        if !matches!(&*cell, Some(p) if p.instance == instance && p.generation == generation) {
            *cell = None;
        }
        let prepared = cell.get_or_insert_with(|| Prepared {
            instance,
            generation,
            interpreter: None,
            machines: HashMap::new(),
        });
        let failed = match prepared.run_compiled(template, programs, &query, &input, limit) {
            Compiled::Answered(Ok(answer)) if programs.take_check(&query) => {
                let limit = deadline.saturating_duration_since(std::time::Instant::now());
                return match prepared.interpret(template, query.clone(), input, limit) {
                    Ok(reference) if reference != answer => {
                        programs.give_up(
                            &query,
                            &format!("compiled: {answer:?}; interpreted: {reference:?}"),
                        );
                        Ok(reference)
                    }
                    // Agreed; or an error of the interpreter's where the VM,
                    // like OPA, makes a failing builtin undefined.
                    _ => Ok(answer),
                };
            }
            Compiled::Answered(outcome) => return outcome,
            Compiled::Interpret => None,
            Compiled::Failed(error) => Some(error),
        };
        let limit = deadline.saturating_duration_since(std::time::Instant::now());
        let outcome = prepared.interpret(template, query.clone(), input, limit);
        if let (Some(error), Ok(_)) = (&failed, &outcome) {
            programs.give_up(&query, error);
        }
        outcome
    })
}

/// What the compiled form of a query did.
enum Compiled {
    Answered(Result<QueryOutcome, EngineError>),
    /// Not compiled, or an answer undefined in part: the interpreter decides.
    Interpret,
    /// Failed with an error other than a limit: the interpreter decides.
    Failed(VmError),
}

impl Prepared {
    fn run_compiled(
        &mut self,
        template: &regorus::Engine,
        programs: &Programs,
        query: &str,
        input: &regorus::Value,
        limit: Duration,
    ) -> Compiled {
        if !self.machines.contains_key(query) {
            let Some(program) = programs.get(template, query) else {
                return Compiled::Interpret;
            };
            match crate::compiled::machine(program, template.get_data()) {
                Ok(vm) => self.machines.insert(query.to_owned(), vm),
                Err(error) => return Compiled::Failed(error),
            };
        }
        let Some(vm) = self.machines.get_mut(query) else {
            unreachable!("inserted above")
        };
        match crate::compiled::run(vm, input.clone(), limit) {
            Ok(Some(value)) => Compiled::Answered(outcome_of(value)),
            Ok(None) => Compiled::Interpret,
            Err(error) => {
                // A run cut short may leave state behind: the next one
                // starts on a fresh machine.
                self.machines.remove(query);
                match error {
                    VmError::TimeLimitExceeded { .. } => {
                        Compiled::Answered(Err(EngineError::Timeout {
                            endpoint: "embedded".to_owned(),
                            timeout: limit,
                        }))
                    }
                    VmError::MemoryLimitExceeded { .. } => {
                        Compiled::Answered(Err(EngineError::MemoryLimit(error.to_string())))
                    }
                    other => Compiled::Failed(other),
                }
            }
        }
    }

    fn interpret(
        &mut self,
        template: &regorus::Engine,
        query: String,
        input: regorus::Value,
        limit: Duration,
    ) -> Result<QueryOutcome, EngineError> {
        let engine = self.interpreter.get_or_insert_with(|| template.clone());
        // The deadline also bounds the evaluation itself: a runaway policy stops
        // here instead of burning a core after its caller has given up.
        engine.set_execution_timer_config(ExecutionTimerConfig {
            limit,
            check_interval: TIMER_CHECK_INTERVAL,
        });
        engine.set_input(input);
        let results = match engine.eval_query(query, false) {
            Ok(results) => results,
            Err(e) => {
                // An evaluation cut short may leave state behind: the next one
                // starts from a fresh copy.
                self.interpreter = None;
                return Err(match e.downcast_ref::<regorus::LimitError>() {
                    Some(regorus::LimitError::TimeLimitExceeded { .. }) => EngineError::Timeout {
                        endpoint: "embedded".to_owned(),
                        timeout: limit,
                    },
                    Some(limit @ regorus::LimitError::MemoryLimitExceeded { .. }) => {
                        EngineError::MemoryLimit(limit.to_string())
                    }
                    _ => EngineError::Evaluation(crate::text::bounded(e.to_string())),
                });
            }
        };
        let value = results
            .result
            .into_iter()
            .next()
            .and_then(|first| first.expressions.into_iter().next())
            .map_or(regorus::Value::Undefined, |expression| expression.value);
        outcome_of(value)
    }
}

/// The outcome of a query whose value is `value`.
fn outcome_of(value: regorus::Value) -> Result<QueryOutcome, EngineError> {
    if value == regorus::Value::Undefined {
        return Ok(QueryOutcome::Undefined);
    }
    serde_json::to_value(&value)
        .map(QueryOutcome::Defined)
        .map_err(|e| EngineError::Evaluation(format!("result is not JSON: {e}")))
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
        if !self.read().modules.contains_key(id) {
            return Ok(());
        }
        self.update(|modules, _| {
            modules.remove(id);
            Ok(())
        })
    }

    async fn policies(&self) -> Result<BTreeMap<String, String>, EngineError> {
        Ok(self.read().modules.clone())
    }

    async fn health(&self) -> Result<(), EngineError> {
        Ok(())
    }

    fn decision_cache(&self) -> Option<DecisionCacheStats> {
        let refused = self.read().reads.as_ref().err().map(ToString::to_string);
        Some(self.memo.stats(refused))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    const POLICY: &str = r#"
package io.k8s.federation.admission

annotations["example.com/region"] := data.regions[input.metadata.labels.app]

errors contains msg if {
    input.metadata.labels.app == "forbidden"
    msg := "app forbidden"
}
"#;

    #[tokio::test]
    async fn undefined_without_policy() {
        let engine = Embedded::new();
        let out = engine
            .query("io/k8s/federation/admission", &json!({}), soon())
            .await
            .unwrap();
        assert_eq!(out, QueryOutcome::Undefined);
    }

    #[tokio::test]
    async fn evaluates_package_document_with_data() {
        let engine = Embedded::new();
        engine.put_policy("p.rego", POLICY).await.unwrap();
        engine
            .put_data("regions", &json!({"web": "eu"}))
            .await
            .unwrap();
        let input = json!({"metadata": {"labels": {"app": "web"}}});
        let out = engine
            .query("io/k8s/federation/admission", &input, soon())
            .await
            .unwrap();
        assert_eq!(
            out,
            QueryOutcome::Defined(
                json!({"annotations": {"example.com/region": "eu"}, "errors": []})
            )
        );
        let input = json!({"metadata": {"labels": {"app": "forbidden"}}});
        let out = engine
            .query("io/k8s/federation/admission", &input, soon())
            .await
            .unwrap();
        assert_eq!(
            out,
            QueryOutcome::Defined(json!({"annotations": {}, "errors": ["app forbidden"]}))
        );
    }

    // The memory ceiling is process-wide (regorus counts every thread's
    // allocations), so its test runs in a process of its own:
    // tests/memory_limit.rs.

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deadline_stops_a_runaway_evaluation() {
        let engine = Embedded::new();
        engine
            .put_policy(
                "slow.rego",
                "package slow\n\npairs := count([a | some a in numbers.range(1, 4000); some b in numbers.range(1, 4000); a == b])\n",
            )
            .await
            .unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // More runaway queries than cores: each must give up at its deadline.
        let empty = json!({});
        let runaway = (0..cores + 1).map(|_| {
            engine.query(
                "slow/pairs",
                &empty,
                Instant::now() + Duration::from_millis(200),
            )
        });
        for outcome in futures::future::join_all(runaway).await {
            assert!(
                matches!(outcome, Err(EngineError::Timeout { .. })),
                "{outcome:?}"
            );
        }
        // The evaluations themselves stopped at the deadline and gave their cores
        // back; otherwise this query would wait behind them (16 M steps) and miss
        // its own deadline.
        engine.put_policy("p.rego", POLICY).await.unwrap();
        let out = engine
            .query(
                "io/k8s/federation/admission/errors",
                &json!({"metadata": {"labels": {"app": "forbidden"}}}),
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(out, QueryOutcome::Defined(json!(["app forbidden"])));
    }

    #[tokio::test]
    async fn every_json_input_converts() {
        let engine = Embedded::new();
        engine
            .put_policy("probe.rego", "package probe\n\nv := input.x\n")
            .await
            .unwrap();
        // serde's private number marker, as any client can send it.
        let marker = json!({"$serde_json::private::Number": "not a number"});
        let input = json!({"x": [marker, 18446744073709551615u64, -1, 1.5]});
        let out = engine.query("probe/v", &input, soon()).await.unwrap();
        assert_eq!(out, QueryOutcome::Defined(input["x"].clone()));
    }

    #[tokio::test]
    async fn data_changes_are_seen_by_later_queries() {
        let engine = Embedded::new();
        engine.put_policy("p.rego", POLICY).await.unwrap();
        let input = json!({"metadata": {"labels": {"app": "web"}}});
        engine.put_data("regions/web", &json!("eu")).await.unwrap();
        let first = engine
            .query("io/k8s/federation/admission/annotations", &input, soon())
            .await
            .unwrap();
        assert_eq!(
            first,
            QueryOutcome::Defined(json!({"example.com/region": "eu"}))
        );
        engine.put_data("regions/web", &json!("us")).await.unwrap();
        let second = engine
            .query("io/k8s/federation/admission/annotations", &input, soon())
            .await
            .unwrap();
        assert_eq!(
            second,
            QueryOutcome::Defined(json!({"example.com/region": "us"}))
        );
        engine.delete_data("regions/web").await.unwrap();
        engine.delete_data("regions/absent/deeper").await.unwrap();
        let third = engine
            .query("io/k8s/federation/admission/annotations", &input, soon())
            .await
            .unwrap();
        assert_eq!(third, QueryOutcome::Defined(json!({})));
    }

    #[tokio::test]
    async fn compile_error_keeps_previous_modules() {
        let engine = Embedded::new();
        engine.put_policy("p.rego", POLICY).await.unwrap();
        let err = engine
            .put_policy(
                "p.rego",
                "package io.k8s.federation.admission\n\nannotations[x] := {\n",
            )
            .await
            .unwrap_err();
        match &err {
            EngineError::Compile(errors) => {
                assert_eq!(errors[0].file.as_deref(), Some("p.rego"));
                assert!(errors[0].row.is_some(), "{errors:?}");
            }
            other => panic!("unexpected {other:?}"),
        }
        engine
            .put_data("regions", &json!({"web": "eu"}))
            .await
            .unwrap();
        let input = json!({"metadata": {"labels": {"app": "web"}}});
        let out = engine
            .query("io/k8s/federation/admission/annotations", &input, soon())
            .await
            .unwrap();
        assert_eq!(
            out,
            QueryOutcome::Defined(json!({"example.com/region": "eu"}))
        );
        assert_eq!(
            engine.policies().await.unwrap().keys().collect::<Vec<_>>(),
            ["p.rego"]
        );
        engine.delete_policy("p.rego").await.unwrap();
        engine.delete_policy("p.rego").await.unwrap();
        assert!(engine.policies().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn patches_data_atomically() {
        let engine = Embedded::new();
        engine
            .put_data("regions", &json!({"web": "eu"}))
            .await
            .unwrap();
        let patch: json_patch::Patch =
            serde_json::from_value(json!([{"op": "add", "path": "/api", "value": "us"}])).unwrap();
        engine.patch_data("regions", &patch).await.unwrap();
        assert_eq!(
            engine.read().data,
            json!({"regions": {"web": "eu", "api": "us"}})
        );
        let failing: json_patch::Patch = serde_json::from_value(
            json!([{"op": "add", "path": "/db", "value": "x"}, {"op": "remove", "path": "/absent"}]),
        )
        .unwrap();
        let err = engine.patch_data("regions", &failing).await.unwrap_err();
        assert!(matches!(err, EngineError::NotFound { .. }), "{err:?}");
        assert_eq!(
            engine.read().data["regions"],
            json!({"web": "eu", "api": "us"}),
            "all or nothing"
        );
        let err = engine.patch_data("nowhere", &patch).await.unwrap_err();
        assert!(matches!(err, EngineError::NotFound { .. }), "{err:?}");
    }

    #[test]
    fn loads_directory_like_opa() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.rego"), POLICY).unwrap();
        std::fs::write(
            dir.path().join("p_test.rego"),
            "package x\n\ntest_x if { false }\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("regions")).unwrap();
        std::fs::write(dir.path().join("regions/data.json"), r#"{"web": "eu"}"#).unwrap();
        std::fs::create_dir_all(dir.path().join("other")).unwrap();
        std::fs::write(dir.path().join("other/data.yaml"), "a: 1\n").unwrap();
        let engine = Embedded::from_dir(dir.path()).unwrap();
        assert_eq!(engine.module_count(), 1);
        let state = engine.read();
        assert_eq!(
            state.data,
            json!({"regions": {"web": "eu"}, "other": {"a": 1}})
        );
    }

    #[test]
    fn bad_data_file_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data.json"), "{").unwrap();
        let err = Embedded::from_dir(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("data.json is not valid JSON"),
            "{err}"
        );
    }

    /// The shipped policies and example clusters of the repository.
    fn shipped() -> Embedded {
        Embedded::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")).unwrap()
    }

    /// Workloads differing in every way a placement policy may care about,
    /// and in ways it should not (names, images, replicas).
    fn varied_inputs() -> Vec<Value> {
        let mut inputs = Vec::new();
        let kinds = ["ReplicaSet", "Deployment", "ConfigMap"];
        let eu = [None, Some("true"), Some("false"), Some("yes")];
        let pci = [None, Some("0"), Some("1"), Some("2"), Some("3"), Some("x")];
        let preferences = [
            None,
            Some(
                r#"{"rebalance": true, "clusters": {"gce-europe-west1": {"weight": 2}, "*": {"weight": 1}}}"#,
            ),
            Some(r#"{"clusters": {"gce-us-central1": {"weight": 1}}}"#),
            Some(r#"{"rebalance": false, "clusters": {"member-eu-1": {}, "member-us-1": {}}}"#),
            Some(r#"{"clusters": []}"#),
            Some("not json"),
        ];
        let mut n = 0;
        for kind in kinds {
            for eu in eu {
                for pci in pci {
                    for preference in preferences {
                        for copy in 0..2 {
                            n += 1;
                            let mut annotations = Map::new();
                            let mut put = |k: &str, v: Option<&str>| {
                                if let Some(v) = v {
                                    annotations.insert(k.to_owned(), json!(v));
                                }
                            };
                            put(
                                "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required",
                                eu,
                            );
                            put(
                                "policy.federation.alpha.kubernetes.io/pci-compliance-level",
                                pci,
                            );
                            put(
                                "federation.kubernetes.io/replica-set-preferences",
                                preference,
                            );
                            put("team", Some(if copy == 0 { "a" } else { "b" }));
                            inputs.push(json!({
                                "apiVersion": "apps/v1",
                                "kind": kind,
                                "metadata": {"name": format!("w-{n}"), "namespace": format!("ns-{copy}"), "uid": format!("uid-{n}"), "annotations": annotations},
                                "spec": {"replicas": n % 7, "template": {"spec": {"containers": [{"name": "app", "image": format!("registry.example/app:{n}")}]}}},
                                "_admission": {"uid": format!("req-{n}"), "operation": "CREATE"},
                            }));
                        }
                    }
                }
            }
        }
        inputs
    }

    async fn answers(engine: &Embedded, inputs: &[Value]) -> Vec<QueryOutcome> {
        let mut out = Vec::new();
        for input in inputs {
            out.push(
                engine
                    .query(crate::DEFAULT_DECISION_PATH, input, soon())
                    .await
                    .unwrap(),
            );
        }
        out
    }

    /// The interpreter over `engine`'s modules and data, deciding on the whole
    /// input: the reference of the compiled form (and of the input the engine
    /// evaluates, reduced to what the modules read).
    fn reference(engine: &Embedded, path: &str) -> impl FnMut(&Value) -> QueryOutcome {
        let (modules, data) = {
            let state = engine.read();
            (state.modules.clone(), state.data.clone())
        };
        let mut interpreter = build_engine(&modules, &data).unwrap();
        let query = rego_query(path).unwrap();
        move |input| {
            interpreter.set_input(to_rego(input));
            let results = interpreter.eval_query(query.clone(), false).unwrap();
            let value = results
                .result
                .into_iter()
                .next()
                .and_then(|r| r.expressions.into_iter().next())
                .map_or(regorus::Value::Undefined, |e| e.value);
            outcome_of(value).unwrap()
        }
    }

    fn compiled(engine: &Embedded, path: &str) -> bool {
        let state = engine.read();
        state.programs.is_compiled(&rego_query(path).unwrap())
    }

    /// Karmada members: ready, tainted, not ready, labelled out of or into
    /// the EU against their region, with and without free CPU.
    fn karmada_members() -> Value {
        let member = |region: &str,
                      labels: Value,
                      ready: &str,
                      taints: Value,
                      cpu: (&str, &str)| {
            json!({
                "apiVersion": "cluster.karmada.io/v1alpha1",
                "kind": "Cluster",
                "metadata": {"labels": labels},
                "spec": {"region": region, "taints": taints},
                "status": {
                    "conditions": [{"type": "Ready", "status": ready}],
                    "resourceSummary": {"allocatable": {"cpu": cpu.0}, "allocated": {"cpu": cpu.1}},
                },
            })
        };
        let pci = |level: &str| json!({"placement-policy.io/pci-compliance-level": level});
        json!({
            "member-eu-1": member("europe-west1", pci("2"), "True", json!([]), ("8", "2")),
            "member-eu-2": member("europe-west2", pci("3"), "True", json!([{"effect": "NoSchedule"}]), ("8", "1")),
            "member-eu-3": member("eu-central-1", pci("03"), "True", json!([{"effect": "PreferNoSchedule"}]), ("4", "500m")),
            "member-eu-4": member("europe-north1", pci("3"), "False", json!([]), ("8", "0")),
            "member-ch-1": member("europe-west6", json!({"placement-policy.io/jurisdiction": "non-eu", "placement-policy.io/pci-compliance-level": "3"}), "True", json!([]), ("16", "1")),
            "member-us-1": member("us-central1", json!({"placement-policy.io/jurisdiction": "eu", "placement-policy.io/pci-compliance-level": "x"}), "True", json!([]), ("8", "9")),
        })
    }

    /// OCM ManagedClusters: available or not, by their region claim, with
    /// PCI levels of every kind.
    fn ocm_managed_clusters() -> Value {
        let managed = |region: &str, level: &str, available: &str| {
            json!({
                "apiVersion": "cluster.open-cluster-management.io/v1",
                "kind": "ManagedCluster",
                "metadata": {"labels": {"placement-policy.io/pci-compliance-level": level}},
                "spec": {"hubAcceptsClient": true},
                "status": {
                    "conditions": [
                        {"type": "ManagedClusterJoined", "status": "True"},
                        {"type": "ManagedClusterConditionAvailable", "status": available},
                    ],
                    "clusterClaims": [{"name": "region.open-cluster-management.io", "value": region}],
                },
            })
        };
        json!({
            "ocm-eu-1": managed("europe-west1", "2", "True"),
            "ocm-eu-2": managed("europe-west2", "3", "True"),
            "ocm-eu-3": managed("eu-central-1", "3", "False"),
            "ocm-us-1": managed("us-central1", "3", "True"),
        })
    }

    /// Every third input as placement-sync asks for an OCM Placement's
    /// workload (the Placement under `_placement`: the reasons are part of the
    /// answer), every fifth as the guardrail asks for a Karmada binding's
    /// template (the binding under `_binding`).
    fn asked_by_placement_sync(mut inputs: Vec<Value>) -> Vec<Value> {
        for (n, input) in inputs.iter_mut().enumerate() {
            let Value::Object(map) = input else { continue };
            if n % 3 == 0 {
                map.insert(
                    crate::PLACEMENT_INPUT_KEY.to_owned(),
                    json!({
                        "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                        "kind": "Placement",
                        "metadata": {"name": format!("p-{n}"), "namespace": "shop", "annotations": {}},
                        "spec": {},
                    }),
                );
            } else if n % 5 == 0 {
                map.insert(
                    crate::BINDING_INPUT_KEY.to_owned(),
                    json!({"name": format!("b-{n}"), "namespace": "shop", "spec": {"replicas": n % 4}}),
                );
            }
        }
        inputs
    }

    /// The compiled form decides as the interpreter does, over the shipped
    /// policy and the example clusters, over Karmada members weighted by free
    /// CPU, with a weighting the policy refuses, and over OCM's
    /// ManagedClusters; for the webhook's inputs and placement-sync's (OCM
    /// Placements, Karmada bindings); on the part of the input the policy
    /// reads as on all of it.
    #[tokio::test]
    async fn compiled_decisions_equal_interpreted_ones_on_the_shipped_policy() {
        let settings = |weighting: &str| {
            format!("package io.k8s.federation.settings\n\nweighting := \"{weighting}\"\n")
        };
        let inputs = asked_by_placement_sync(varied_inputs());
        for case in [
            "example clusters",
            "least-loaded members",
            "unknown weighting",
            "ocm managed clusters",
        ] {
            let engine = shipped().with_decision_cache(0);
            if case == "ocm managed clusters" {
                engine
                    .put_data("kubernetes/managedclusters", &ocm_managed_clusters())
                    .await
                    .unwrap();
            } else if case != "example clusters" {
                engine
                    .put_data("kubernetes/clusters", &karmada_members())
                    .await
                    .unwrap();
                let weighting = if case == "unknown weighting" {
                    "most-loaded"
                } else {
                    "least-loaded"
                };
                engine
                    .put_policy("placement_settings.rego", &settings(weighting))
                    .await
                    .unwrap();
            }
            let mut interpreted = reference(&engine, crate::DEFAULT_DECISION_PATH);
            let truth: Vec<QueryOutcome> = inputs.iter().map(&mut interpreted).collect();
            let distinct: std::collections::BTreeSet<String> =
                truth.iter().map(|t| format!("{t:?}")).collect();
            assert!(
                distinct.len() > 10,
                "{case}: the inputs must get many different answers"
            );
            let decided = answers(&engine, &inputs).await;
            for ((input, decided), truth) in inputs.iter().zip(&decided).zip(&truth) {
                assert_eq!(decided, truth, "{case}: {input}");
            }
            assert!(
                compiled(&engine, crate::DEFAULT_DECISION_PATH),
                "{case}: the shipped decision must run compiled"
            );
        }
    }

    /// A comprehension that yields nothing inside a rule iterating over a
    /// collection is an empty value, as in OPA: such a policy set is
    /// interpreted, because regorus's VM failed the iteration instead (an OCM
    /// Placement's reasons came back `{}` for the clusters it selected).
    #[tokio::test]
    async fn a_comprehension_yielding_nothing_inside_an_iteration_is_empty() {
        let engine = Embedded::new();
        engine
            .put_policy(
                "p.rego",
                "package io.k8s.federation.admission\n\n\
                 annotations[name] := concat(\",\", parts) if {\n\
                 \tsome name in {\"a\", \"b\"}\n\
                 \teu := [\"eu\" | input.eu == true]\n\
                 \tbig := [sprintf(\"%d > 5\", [input.size]) | input.size > 5]\n\
                 \tparts := array.concat(array.concat([\"running\"], eu), big)\n\
                 }\n\nerrors := []\n",
            )
            .await
            .unwrap();
        for (input, parts) in [
            (json!({"eu": false, "size": 1}), "running"),
            (json!({"eu": true, "size": 7}), "running,eu,7 > 5"),
        ] {
            let expected = QueryOutcome::Defined(
                json!({"annotations": {"a": parts, "b": parts}, "errors": []}),
            );
            assert_eq!(
                reference(&engine, crate::DEFAULT_DECISION_PATH)(&input),
                expected,
                "{input}"
            );
            assert_eq!(
                engine
                    .query(crate::DEFAULT_DECISION_PATH, &input, soon())
                    .await
                    .unwrap(),
                expected,
                "{input}"
            );
        }
        assert!(!compiled(&engine, crate::DEFAULT_DECISION_PATH));
    }

    /// The first answers of a compiled query after a policy change are
    /// checked against the interpreter's: a form the VM evaluates wrongly
    /// without an error is answered as the interpreter answers, and the query
    /// is interpreted from then on. Shown with the comprehension inside an
    /// iteration, compiled here despite its form.
    #[tokio::test]
    async fn a_compiled_answer_unlike_the_interpreters_is_not_given() {
        let engine = Embedded::new();
        engine
            .put_policy(
                "p.rego",
                "package io.k8s.federation.admission\n\n\
                 annotations[name] := concat(\",\", parts) if {\n\
                 \tsome name in {\"a\", \"b\"}\n\
                 \tparts := array.concat([\"running\"], [\"eu\" | input.eu == true])\n\
                 }\n\nerrors := []\n",
            )
            .await
            .unwrap();
        engine.write().programs = Arc::new(Programs::taking_known_wrong_forms());
        let eu = json!({"eu": true});
        let not_eu = json!({"eu": false});
        // Agreeing answers keep the compiled form.
        assert_eq!(
            engine
                .query(crate::DEFAULT_DECISION_PATH, &eu, soon())
                .await
                .unwrap(),
            QueryOutcome::Defined(
                json!({"annotations": {"a": "running,eu", "b": "running,eu"}, "errors": []})
            )
        );
        assert!(compiled(&engine, crate::DEFAULT_DECISION_PATH));
        // The VM's `{}` for this one is not given.
        let expected = QueryOutcome::Defined(
            json!({"annotations": {"a": "running", "b": "running"}, "errors": []}),
        );
        assert_eq!(
            engine
                .query(crate::DEFAULT_DECISION_PATH, &not_eu, soon())
                .await
                .unwrap(),
            expected
        );
        assert!(!compiled(&engine, crate::DEFAULT_DECISION_PATH));
    }

    /// Where the compiled form leaves the decision or a member of it undefined
    /// (a rule with two values, a missing module), the interpreter answers:
    /// the conflict is an error, as in OPA, and a package without its rules
    /// is what the interpreter makes of it.
    #[tokio::test]
    async fn what_the_compiled_form_leaves_undefined_the_interpreter_decides() {
        let engine = Embedded::new();
        engine
            .put_policy(
                "p.rego",
                "package io.k8s.federation.admission\n\nerrors := []\n\nannotations = {\"a\": \"1\"} if input.metadata.name\n\nannotations = {\"a\": \"2\"} if input.kind\n",
            )
            .await
            .unwrap();
        let input = json!({"kind": "ReplicaSet", "metadata": {"name": "rs"}});
        let err = engine
            .query(crate::DEFAULT_DECISION_PATH, &input, soon())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, EngineError::Evaluation(m) if m.contains("rule conflicts")),
            "{err:?}"
        );
        assert!(compiled(&engine, crate::DEFAULT_DECISION_PATH));
        // One value: answered compiled.
        let one = json!({"kind": "ReplicaSet", "metadata": {}});
        assert_eq!(
            engine
                .query(crate::DEFAULT_DECISION_PATH, &one, soon())
                .await
                .unwrap(),
            QueryOutcome::Defined(json!({"annotations": {"a": "2"}, "errors": []}))
        );

        // The shipped admission package without the rules it draws on.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let alone = Embedded::new();
        alone
            .put_policy(
                "placement.rego",
                &std::fs::read_to_string(dir.join("placement.rego")).unwrap(),
            )
            .await
            .unwrap();
        let workload = json!({"kind": "ReplicaSet", "metadata": {"name": "rs"}});
        assert_eq!(
            alone
                .query(crate::DEFAULT_DECISION_PATH, &workload, soon())
                .await
                .unwrap(),
            reference(&alone, crate::DEFAULT_DECISION_PATH)(&workload)
        );
        assert!(compiled(&alone, crate::DEFAULT_DECISION_PATH));
    }

    /// A compiled form that fails where the interpreter answers is given up
    /// until the policies change (here the VM refuses data at a rule's path,
    /// which the interpreter reads as the data).
    #[tokio::test]
    async fn a_compiled_form_that_fails_is_given_up_for_the_interpreter() {
        let engine = Embedded::new();
        engine
            .put_policy("x.rego", "package x\n\ny := 1\n")
            .await
            .unwrap();
        engine.put_data("x/y", &json!(2)).await.unwrap();
        let reference = reference(&engine, "x/y")(&json!({}));
        for _ in 0..2 {
            let out = engine.query("x/y", &json!({}), soon()).await.unwrap();
            assert_eq!(out, reference);
            assert!(!compiled(&engine, "x/y"));
        }
        engine
            .put_policy("x.rego", "package x\n\nz := 1\n")
            .await
            .unwrap();
        engine.query("x/z", &json!({}), soon()).await.unwrap();
        assert!(
            compiled(&engine, "x/z"),
            "new policies, a new compiled form"
        );
    }

    /// The cache's soundness on the shipped policy: cached answers equal
    /// evaluated ones over inputs varying each path the policy reads (it fails
    /// when the key leaves one out: the answer of a neighbour comes back).
    #[tokio::test]
    async fn cached_decisions_equal_evaluated_ones_on_the_shipped_policy() {
        let cached = shipped();
        let evaluated = shipped().with_decision_cache(0);
        let stats = cached.decision_cache().unwrap();
        assert_eq!(stats.refused, None, "the shipped policy must be cacheable");
        let inputs = varied_inputs();
        let truth = answers(&evaluated, &inputs).await;
        assert!(
            truth
                .iter()
                .map(|t| format!("{t:?}"))
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 10,
            "the inputs must get many different answers for this to test anything"
        );
        // Twice over, so that the second round is answered from the cache.
        assert_eq!(answers(&cached, &inputs).await, truth);
        assert_eq!(answers(&cached, &inputs).await, truth);
        let stats = cached.decision_cache().unwrap();
        assert!(stats.hits >= inputs.len() as u64, "{stats:?}");
        assert_eq!(evaluated.decision_cache().unwrap().hits, 0);
    }

    /// An input given in its parts (the object and the request's metadata,
    /// as the webhook gives it) is decided as the same input put together,
    /// evaluated and remembered alike.
    #[tokio::test]
    async fn an_input_in_parts_is_decided_as_the_whole_input() {
        let keys = crate::OwnershipKeys::ephemeral().unwrap();
        let (kind, resource, user) = (json!({"kind": "ReplicaSet"}), json!({}), json!({}));
        let objects: Vec<Value> = varied_inputs()
            .into_iter()
            .map(|mut input| {
                input
                    .as_object_mut()
                    .unwrap()
                    .remove(crate::ADMISSION_INPUT_KEY);
                input
            })
            .collect();
        for memory in [0, DEFAULT_DECISION_CACHE_BYTES] {
            let engine = shipped().with_decision_cache(memory);
            for (n, object) in objects.iter().enumerate() {
                let meta = crate::RequestMeta {
                    uid: "u",
                    operation: if n % 2 == 0 { "CREATE" } else { "UPDATE" },
                    kind: &kind,
                    resource: &resource,
                    namespace: None,
                    name: None,
                    user_info: &user,
                    dry_run: false,
                    old_object: None,
                    keys: &keys,
                };
                let parts = PolicyInput::new(object, &meta);
                let whole = parts.clone().into_value();
                let path = crate::DEFAULT_DECISION_PATH;
                assert_eq!(
                    engine.query_input(path, &parts, soon()).await.unwrap(),
                    engine.query(path, &whole, soon()).await.unwrap(),
                    "memory {memory}: {whole}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_change_of_policy_data_or_a_read_path_changes_the_answer() {
        let engine = Embedded::new();
        engine.put_policy("p.rego", POLICY).await.unwrap();
        engine
            .put_data("regions", &json!({"web": "eu", "api": "us"}))
            .await
            .unwrap();
        let web = json!({"metadata": {"name": "a", "labels": {"app": "web"}}});
        let region = |outcome: QueryOutcome| match outcome {
            QueryOutcome::Defined(v) => v["annotations"]["example.com/region"].clone(),
            QueryOutcome::Undefined => Value::Null,
        };
        let ask = |input: Value| {
            let engine = &engine;
            async move {
                region(
                    engine
                        .query("io/k8s/federation/admission", &input, soon())
                        .await
                        .unwrap(),
                )
            }
        };
        assert_eq!(ask(web.clone()).await, "eu");
        // What the policy does not read: answered from the cache.
        let renamed = json!({"metadata": {"name": "b", "labels": {"app": "web", "tier": "x"}}});
        assert_eq!(ask(renamed).await, "eu");
        assert_eq!(engine.decision_cache().unwrap().hits, 1);
        // A read path.
        assert_eq!(
            ask(json!({"metadata": {"labels": {"app": "api"}}})).await,
            "us"
        );
        // Data.
        engine
            .put_data("regions", &json!({"web": "ch"}))
            .await
            .unwrap();
        assert_eq!(ask(web.clone()).await, "ch");
        // Policy.
        let policy = POLICY.replace(
            "data.regions[input.metadata.labels.app]",
            "concat(\"-\", [\"fixed\", data.regions[input.metadata.labels.app]])",
        );
        engine.put_policy("p.rego", &policy).await.unwrap();
        assert_eq!(ask(web).await, "fixed-ch");
    }

    #[tokio::test]
    async fn a_policy_set_reading_the_whole_input_is_evaluated_every_time() {
        let engine = Embedded::new();
        let policy =
            "package io.k8s.federation.admission\n\nannotations[\"n\"] := count(walk(input))\n";
        engine.put_policy("p.rego", policy).await.unwrap();
        for _ in 0..3 {
            engine
                .query("io/k8s/federation/admission", &json!({"a": 1}), soon())
                .await
                .unwrap();
        }
        let stats = engine.decision_cache().unwrap();
        assert_eq!(
            stats.refused.as_deref(),
            Some("p.rego:3: reads the whole input (`input` without a constant path after it)")
        );
        assert_eq!((stats.hits, stats.entries), (0, 0), "{stats:?}");
    }

    #[test]
    fn queries_quote_unusual_segments() {
        assert_eq!(
            rego_query("io/k8s/admission").unwrap(),
            "data.io.k8s.admission"
        );
        assert_eq!(
            rego_query("kubernetes/clusters/eu-west-1").unwrap(),
            r#"data.kubernetes.clusters["eu-west-1"]"#
        );
        assert_eq!(rego_query("").unwrap(), "data");
    }
}
