//! One evaluation on a blocking thread: the compiled form of the query where
//! there is one (its first answers checked against the interpreter's), the
//! interpreter otherwise, each kept per thread for the generation it was
//! prepared for.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use regorus::rvm::vm::{RegoVM, VmError};
use regorus::utils::limits::ExecutionTimerConfig;
use serde_json::Value;

use crate::compiled::{Programs, TIMER_CHECK_INTERVAL};
use crate::engine::{EngineError, QueryOutcome, path_segments};

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

pub(super) fn evaluate(
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
pub(super) fn outcome_of(value: regorus::Value) -> Result<QueryOutcome, EngineError> {
    if value == regorus::Value::Undefined {
        return Ok(QueryOutcome::Undefined);
    }
    serde_json::to_value(&value)
        .map(QueryOutcome::Defined)
        .map_err(|e| EngineError::Evaluation(format!("result is not JSON: {e}")))
}
