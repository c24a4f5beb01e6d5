//! One evaluation on a blocking thread: the compiled form of the query where
//! there is one (some of its answers compared with the interpreter's, see
//! [`crate::compiled`]), the interpreter otherwise, each kept per thread for
//! the generation it was prepared for.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use regorus::rvm::vm::{RegoVM, VmError};
use regorus::utils::limits::ExecutionTimerConfig;
use serde_json::Value;

use crate::compiled::{Check, Programs, TIMER_CHECK_INTERVAL};
use crate::engine::{EngineError, QueryOutcome, path_segments};

/// How long the interpreter may take on a comparison made once the answer
/// is given (about seven times a compiled answer's work, BENCHMARKS.md).
const OFF_PATH_LIMIT: Duration = Duration::from_secs(2);

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
    /// The queries given up for the interpreter when the machines were
    /// made (a query given up since must not run on its machine).
    give_ups: u64,
}

/// A compiled answer given before it was compared with the interpreter's.
pub(super) struct OffPath {
    question: Question,
    input: regorus::Value,
    answer: QueryOutcome,
}

/// `io/k8s/federation/admission` -> `data.io.k8s.federation.admission`.
pub(super) fn rego_query(path: &str) -> Result<String, EngineError> {
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

/// A query as the evaluators ask it: the document of a rule (or a package,
/// or data), then the path below it (see [`question`]).
#[derive(Debug, Clone)]
pub(super) struct Question {
    pub(super) query: String,
    below: Vec<String>,
}

/// The question for `path`, given the package paths of the policy set: a
/// path below a rule is asked as the rule's document, and the rest of the
/// path is looked up in it. regorus 0.14.1 answers some paths inside a
/// rule's document otherwise than the document holds them (a set rule
/// defined both by a general reference `p[q].r` and a plain one `p.b.r`:
/// `data.test.p.b.r` holds only the plain rule's members), where OPA reads
/// `data.a.b.c` as `data.a.b`'s `c`.
pub(super) fn question(path: &str, packages: &[Vec<String>]) -> Result<Question, EngineError> {
    let segments = path_segments(path)?;
    let rule_depth = packages
        .iter()
        .filter(|package| {
            package.len() < segments.len() && package.iter().zip(&segments).all(|(p, s)| p == s)
        })
        .map(|package| package.len() + 1)
        .max()
        .unwrap_or(segments.len());
    let (rule, below) = segments.split_at(rule_depth.min(segments.len()));
    Ok(Question {
        query: rego_query(&rule.join("/"))?,
        below: below.iter().map(|s| (*s).to_owned()).collect(),
    })
}

/// The package paths of `engine`'s modules, as path segments (a package
/// named with quoted segments is left out: it is only asked as data).
pub(super) fn package_paths(engine: &regorus::Engine) -> Vec<Vec<String>> {
    let Ok(packages) = engine.get_packages() else {
        return Vec::new();
    };
    packages
        .iter()
        .filter_map(|package| {
            let rest = package.strip_prefix("data.")?;
            (!rest.contains(['[', '"'])).then(|| rest.split('.').map(str::to_owned).collect())
        })
        .collect()
}

/// What `value` holds at `below`, as a Rego reference with string keys
/// reads it: an object's member, a set's element, undefined otherwise.
fn below(value: regorus::Value, path: &[String]) -> regorus::Value {
    let mut value = value;
    for segment in path {
        let key = regorus::Value::from(segment.as_str());
        value = match &value {
            regorus::Value::Object(object) => object
                .get(&key)
                .cloned()
                .unwrap_or(regorus::Value::Undefined),
            regorus::Value::Set(set) if set.contains(&key) => key,
            _ => regorus::Value::Undefined,
        };
        if value == regorus::Value::Undefined {
            break;
        }
    }
    value
}

/// The answer to `query` for `input`, and a compiled answer to compare with
/// the interpreter's once it is given ([`compare_off_path`]), if any. A
/// panic inside regorus is an error of this evaluation, never the process's.
pub(super) fn evaluate(
    instance: u64,
    generation: u64,
    template: &regorus::Engine,
    programs: &Programs,
    question: Question,
    input: regorus::Value,
    limit: Duration,
) -> (Result<QueryOutcome, EngineError>, Option<OffPath>) {
    let deadline = std::time::Instant::now() + limit;
    caught(|| {
        evaluate_here(
            instance, generation, template, programs, question, input, deadline,
        )
    })
    .unwrap_or_else(|panic| (Err(EngineError::Evaluation(panic)), None))
}

fn evaluate_here(
    instance: u64,
    generation: u64,
    template: &regorus::Engine,
    programs: &Programs,
    question: Question,
    input: regorus::Value,
    deadline: std::time::Instant,
) -> (Result<QueryOutcome, EngineError>, Option<OffPath>) {
    let limit = deadline.saturating_duration_since(std::time::Instant::now());
    let query = &question.query;
    with_prepared(instance, generation, |prepared| {
        let failed = match prepared.run_compiled(template, programs, &question, &input, limit) {
            Compiled::Answered(Ok(answer)) => match programs.check(query, generation) {
                Check::None => return (Ok(answer), None),
                Check::OffPath => {
                    let compare = OffPath {
                        question: question.clone(),
                        input,
                        answer: answer.clone(),
                    };
                    return (Ok(answer), Some(compare));
                }
                Check::OnPath => {
                    let limit = deadline.saturating_duration_since(std::time::Instant::now());
                    let reference = prepared.interpret(template, &question, input, limit);
                    let given = match compare(&answer, &reference) {
                        Comparison::Agree | Comparison::Inconclusive => Ok(answer),
                        Comparison::Disagree(why) => {
                            programs.compared(query, Some(&why));
                            return (reference, None);
                        }
                    };
                    programs.compared(query, None);
                    return (given, None);
                }
            },
            Compiled::Answered(outcome) => return (outcome, None),
            Compiled::Interpret => None,
            Compiled::Failed(error) => Some(error),
        };
        let limit = deadline.saturating_duration_since(std::time::Instant::now());
        let outcome = prepared.interpret(template, &question, input, limit);
        if let (Some(error), Ok(_)) = (&failed, &outcome) {
            programs.give_up(query, error);
        }
        (outcome, None)
    })
}

/// Compare a compiled answer already given with the interpreter's: one that
/// differs sends the query to the interpreter from then on (counted, and
/// logged with both answers).
pub(super) fn compare_off_path(
    instance: u64,
    generation: u64,
    template: &regorus::Engine,
    programs: &Programs,
    given: OffPath,
) {
    let OffPath {
        question,
        input,
        answer,
    } = given;
    let reference = caught(|| {
        with_prepared(instance, generation, |prepared| {
            prepared.interpret(template, &question, input, OFF_PATH_LIMIT)
        })
    })
    .unwrap_or_else(|panic| Err(EngineError::Evaluation(panic)));
    let query = &question.query;
    match compare(&answer, &reference) {
        Comparison::Agree => programs.compared(query, None),
        Comparison::Inconclusive => {}
        Comparison::Disagree(why) => programs.compared(query, Some(&why)),
    }
    programs.compared_off_path(query);
}

/// `f`'s result, or the message of a panic inside it (regorus panics on some
/// inputs, e.g. 0.14.1's `object.subset` of an empty array); what this
/// thread prepared is then dropped, since the panic may have left it
/// half-way.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        PREPARED.with(|cell| {
            if let Ok(mut prepared) = cell.try_borrow_mut() {
                *prepared = None;
            }
        });
        let message = panic
            .downcast_ref::<&str>()
            .map(|m| (*m).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        crate::text::bounded(format!(
            "the embedded engine failed (regorus panicked: {message})"
        ))
    })
}

/// Run `f` on this thread's evaluators for `generation` of engine `instance`.
fn with_prepared<T>(instance: u64, generation: u64, f: impl FnOnce(&mut Prepared) -> T) -> T {
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
            give_ups: 0,
        });
        f(prepared)
    })
}

/// How a compiled answer compares with the interpreter's.
enum Comparison {
    Agree,
    /// The interpreter ran out of time or memory: nothing learnt.
    Inconclusive,
    /// The interpreter answered otherwise, or failed where the VM answered
    /// (as OPA fails on a conflict the VM makes undefined or overwrites).
    Disagree(String),
}

fn compare(answer: &QueryOutcome, reference: &Result<QueryOutcome, EngineError>) -> Comparison {
    match reference {
        Ok(reference) if reference == answer => Comparison::Agree,
        Err(EngineError::Timeout { .. } | EngineError::MemoryLimit(_)) => Comparison::Inconclusive,
        Ok(reference) => Comparison::Disagree(crate::text::bounded(format!(
            "compiled: {answer:?}; interpreted: {reference:?}"
        ))),
        Err(error) => Comparison::Disagree(crate::text::bounded(format!(
            "compiled: {answer:?}; interpreted: error: {error}"
        ))),
    }
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
        question: &Question,
        input: &regorus::Value,
        limit: Duration,
    ) -> Compiled {
        let query = question.query.as_str();
        let give_ups = programs.give_ups();
        if give_ups != self.give_ups {
            self.machines.clear();
            self.give_ups = give_ups;
        }
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
            Ok(Some(value)) => Compiled::Answered(outcome_of(below(value, &question.below))),
            Ok(None) => {
                programs.left_undefined(query);
                Compiled::Interpret
            }
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
        question: &Question,
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
        let results = match engine.eval_query(question.query.clone(), false) {
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
        outcome_of(below(value, &question.below))
    }
}

/// The outcome of a query whose value is `value`.
pub(super) fn outcome_of(value: regorus::Value) -> Result<QueryOutcome, EngineError> {
    if value == regorus::Value::Undefined {
        return Ok(QueryOutcome::Undefined);
    }
    serde_json::to_value(&value)
        .map(QueryOutcome::Defined)
        .map_err(|e| EngineError::Evaluation(format!("result is not JSON: {e}")))
}
