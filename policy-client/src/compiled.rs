//! Queries compiled to regorus's bytecode VM (RVM), the embedded engine's fast
//! path. The interpreter resolves every rule reference by building and looking
//! up path strings; the compiled form calls rules by index and keeps their
//! values in a table, at about a fifth of the instructions for the shipped
//! decision (BENCHMARKS.md, scenario 1).
//!
//! The interpreter stays the reference: a query whose modules the compiler
//! does not take (it refuses some forms, e.g. `annotations["key"] := value`),
//! or whose program has a form the VM is known to evaluate wrongly
//! ([`comprehension_in_a_loop`]), is interpreted; so is every query once its
//! compiled form failed, or answered otherwise than the interpreter in one of
//! the first [`CHECKED_ANSWERS`] checked; and an answer the VM leaves
//! undefined, wholly or in part, is the interpreter's to give (see [`run`]).
//!
//! A query is compiled as the one rule of a package of its own,
//! `result := data.<path>`, so that a package document (the decision) is one
//! entry point.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use regorus::languages::rego::compiler::Compiler;
use regorus::rvm::instructions::Instruction;
use regorus::rvm::program::Program;
use regorus::rvm::vm::{RegoVM, VmError};
use regorus::utils::limits::ExecutionTimerConfig;

/// Checks of the time limit happen every this many interpreter steps (or VM
/// instructions).
pub(crate) const TIMER_CHECK_INTERVAL: NonZeroU32 = NonZeroU32::new(64).unwrap();

/// The package of the rule a query is compiled as.
const QUERY_PACKAGE: &str = "placement_policy_embedded_query";

/// Answers of a compiled query checked against the interpreter's, for each
/// module set: regorus's VM is young, and a form it evaluates wrongly without
/// an error (as [`comprehension_in_a_loop`] was) is then caught on the first
/// decisions after a policy change rather than never.
const CHECKED_ANSWERS: usize = 64;

/// The compiled queries of one module set (data changes keep them: a program
/// reads data only when it runs).
#[derive(Debug)]
pub(crate) struct Programs {
    by_query: Mutex<HashMap<String, Entry>>,
    /// Whether forms the VM is known to evaluate wrongly are refused (off
    /// only in tests of the answer check).
    refuse_known_wrong_forms: bool,
}

#[derive(Debug)]
struct Entry {
    /// `None`: interpreted.
    program: Option<Arc<Program>>,
    /// Answers still to check against the interpreter's.
    checks_left: usize,
    /// Answers the VM left undefined in part (the interpreter gave them).
    undefined_answers: usize,
}

impl Default for Programs {
    fn default() -> Self {
        Programs {
            by_query: Mutex::default(),
            refuse_known_wrong_forms: true,
        }
    }
}

impl Programs {
    /// Programs compiled whatever their form, for tests of the answer check.
    #[cfg(test)]
    pub(crate) fn taking_known_wrong_forms() -> Self {
        Programs {
            by_query: Mutex::default(),
            refuse_known_wrong_forms: false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.by_query.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The program of `query` (`data...`) over the modules of `template`,
    /// compiled on first use; `None` when it is interpreted.
    pub(crate) fn get(&self, template: &regorus::Engine, query: &str) -> Option<Arc<Program>> {
        let mut programs = self.lock();
        if let Some(entry) = programs.get(query) {
            return entry.program.clone();
        }
        let program = compile(template, query, self.refuse_known_wrong_forms)
            .inspect_err(|reason| {
                tracing::warn!(
                    query,
                    %reason,
                    "the embedded engine interprets this query: its compiled form does not take the policy set (evaluations cost several times more)"
                );
            })
            .ok();
        programs.insert(
            query.to_owned(),
            Entry {
                program: program.clone(),
                checks_left: CHECKED_ANSWERS,
                undefined_answers: 0,
            },
        );
        program
    }

    #[cfg(test)]
    pub(crate) fn is_compiled(&self, query: &str) -> bool {
        self.lock()
            .get(query)
            .is_some_and(|entry| entry.program.is_some())
    }

    /// Whether the compiled answer at hand is to be checked against the
    /// interpreter's (one of the first [`CHECKED_ANSWERS`]).
    pub(crate) fn take_check(&self, query: &str) -> bool {
        self.lock().get_mut(query).is_some_and(|entry| {
            let check = entry.checks_left > 0;
            entry.checks_left = entry.checks_left.saturating_sub(1);
            check
        })
    }

    /// Count an answer of `query` that the VM left undefined, wholly or in
    /// part, so the interpreter gave it; the first is logged, since a
    /// decision member that is undefined for ordinary inputs (a rule without
    /// an `else` or `default`) makes every such decision cost the interpreter.
    pub(crate) fn left_undefined(&self, query: &str) {
        let mut programs = self.lock();
        let Some(entry) = programs.get_mut(query) else {
            return;
        };
        if entry.undefined_answers == 0 {
            tracing::warn!(
                query,
                "the compiled form of this query left the decision or one of its members undefined, so the interpreter answers it (several times the CPU); a member undefined for ordinary inputs costs this on every evaluation: give it a value with `else` or `default`"
            );
        }
        entry.undefined_answers += 1;
    }

    #[cfg(test)]
    pub(crate) fn undefined_answers(&self, query: &str) -> usize {
        self.lock()
            .get(query)
            .map_or(0, |entry| entry.undefined_answers)
    }

    /// Interpret `query` from now on, because its compiled form failed or
    /// answered otherwise where the interpreter answered.
    pub(crate) fn give_up(&self, query: &str, why: &dyn std::fmt::Display) {
        tracing::error!(
            query,
            %why,
            "the compiled form of this query failed or answered otherwise than the interpreter: the embedded engine interprets it until the policies change"
        );
        self.lock().insert(
            query.to_owned(),
            Entry {
                program: None,
                checks_left: 0,
                undefined_answers: 0,
            },
        );
    }
}

fn compile(
    template: &regorus::Engine,
    query: &str,
    refuse_known_wrong_forms: bool,
) -> Result<Arc<Program>, String> {
    if query == "data" {
        // The whole document would hold the query's own package.
        return Err("the whole data document is not compiled".to_owned());
    }
    let mut engine = template.clone();
    let own_package = format!("data.{QUERY_PACKAGE}");
    let packages = engine.get_packages().map_err(|e| e.to_string())?;
    if packages.iter().any(|p| p == &own_package) {
        return Err(format!("a module declares package {QUERY_PACKAGE}"));
    }
    engine
        .add_policy(
            format!("{QUERY_PACKAGE}.rego"),
            format!("package {QUERY_PACKAGE}\n\nresult := {query}\n"),
        )
        .map_err(|e| e.to_string())?;
    let entry_point = format!("{own_package}.result");
    let policy = engine
        .compile_with_entrypoint(&entry_point.as_str().into())
        .map_err(|e| e.to_string())?;
    let program = Compiler::compile_from_policy(&policy, &[entry_point.as_str()])
        .map_err(|e| e.to_string())?;
    match comprehension_in_a_loop(&program).filter(|_| refuse_known_wrong_forms) {
        Some(pc) => Err(format!(
            "a comprehension inside an iteration (instruction {pc}): regorus's VM takes a condition failing in it for the iteration's, where OPA yields an empty collection"
        )),
        None => Ok(program),
    }
}

/// The first comprehension that begins inside a loop of the same rule body,
/// if any. regorus 0.14's VM (run to completion) hands a condition failing in
/// such a comprehension to the innermost loop rather than to the
/// comprehension: `[x | false]` in a rule iterating `some name in s` fails the
/// iteration instead of being `[]`, a wrong answer rather than an error. Its
/// suspendable mode has one stack of frames, but fails on ordinary rules
/// (registers out of bounds) and answered one such rule wrongly as well, so a
/// policy set with this form is interpreted.
fn comprehension_in_a_loop(program: &Program) -> Option<usize> {
    let data = &program.instruction_data;
    let mut loops_end = Vec::new();
    for (pc, instruction) in program.instructions.iter().enumerate() {
        loops_end.retain(|&end| pc < end);
        match instruction {
            Instruction::LoopStart { params_index } => {
                if let Some(params) = data.get_loop_params(*params_index) {
                    loops_end.push(usize::from(params.loop_end));
                }
            }
            Instruction::ComprehensionBegin { .. } if !loops_end.is_empty() => return Some(pc),
            _ => {}
        }
    }
    None
}

/// A machine running `program` over `data`.
pub(crate) fn machine(program: Arc<Program>, data: regorus::Value) -> Result<RegoVM, VmError> {
    let mut vm = RegoVM::new();
    vm.load_program(program);
    // The time limit bounds an evaluation, not a count of instructions (the
    // VM's default stops at 25,000).
    vm.set_max_instructions(usize::MAX);
    vm.set_data(data)?;
    Ok(vm)
}

/// The value of the compiled query for `input`, stopped after `limit`;
/// `None` when it is undefined, or a document with an undefined member: the
/// VM has a rule whose definitions disagree, or whose body fails with an
/// error, undefined, where the interpreter (and OPA, for conflicts) reports
/// an error, so such an answer is the interpreter's to give.
pub(crate) fn run(
    vm: &mut RegoVM,
    input: regorus::Value,
    limit: Duration,
) -> Result<Option<regorus::Value>, VmError> {
    vm.set_execution_timer_config(Some(ExecutionTimerConfig {
        limit,
        check_interval: TIMER_CHECK_INTERVAL,
    }));
    vm.set_input(input);
    let value = vm.execute()?;
    Ok((value != regorus::Value::Undefined && !holds_undefined(&value)).then_some(value))
}

/// Whether an object in `value` (a package document the VM built) has an
/// undefined member: a rule that is undefined.
fn holds_undefined(value: &regorus::Value) -> bool {
    match value {
        regorus::Value::Object(object) => object
            .values()
            .any(|v| *v == regorus::Value::Undefined || holds_undefined(v)),
        _ => false,
    }
}
