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
//! compiled form failed, or answered otherwise than the interpreter (an error
//! of the interpreter's where the VM answered included) in a comparison; and
//! an answer the VM leaves undefined, wholly or in part, is the interpreter's
//! to give (see [`run`]).
//!
//! The comparisons ([`Programs::check`]): on the request path (an answer
//! unlike the interpreter's is not given, the interpreter's is), the first
//! [`CHECKED_ANSWERS`] after a policy change and the first answer after each
//! data change (at most one a [`DATA_SAMPLE_SPACING`] per query); off the
//! request path, once the answer is given, one answer in [`SAMPLE_EVERY`]
//! for as long as the policies stand. regorus's VM turns some conflicts into
//! an undefined value or a last write ([`run`]), which only the interpreter
//! reports (as OPA does), so a branch first reached after a data change (a
//! cluster relabelled) is compared too.
//!
//! A query is compiled as the one rule of a package of its own,
//! `result := data.<path>`, so that a package document (the decision) is one
//! entry point.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

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

/// Answers of a compiled query checked against the interpreter's on the
/// request path, for each module set: regorus's VM is young, and a form it
/// evaluates wrongly without an error (as [`comprehension_in_a_loop`] was) is
/// then caught on the first decisions after a policy change rather than never.
const CHECKED_ANSWERS: usize = 64;

/// One compiled answer of a query in this many is compared with the
/// interpreter's off the request path, for as long as the policies stand.
/// An interpreted answer costs about seven compiled ones (BENCHMARKS.md), so
/// this adds under 1% to the engine's work and nothing to a decision's wait.
pub(crate) const SAMPLE_EVERY: u64 = 1024;

/// The first compiled answer of a query after a data change is compared on
/// the request path, at most once in this time per query (the replicator may
/// change data many times a second; a compared answer waits for the
/// interpreter too).
pub(crate) const DATA_SAMPLE_SPACING: Duration = Duration::from_secs(1);

/// What the comparisons of compiled answers with the interpreter's found,
/// over the engine's life (every module set).
#[derive(Debug, Default)]
pub(crate) struct CheckCounts {
    compared: AtomicU64,
    disagreements: AtomicU64,
}

impl CheckCounts {
    /// Answers compared, and those the interpreter answered otherwise.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (
            self.compared.load(Ordering::Relaxed),
            self.disagreements.load(Ordering::Relaxed),
        )
    }
}

/// Whether, and where, a compiled answer is compared with the interpreter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    None,
    /// Before the answer is given: an answer unlike the interpreter's is
    /// not given (the interpreter's is), and the query goes to the
    /// interpreter from then on.
    OnPath,
    /// After the answer is given; a disagreement sends the query to the
    /// interpreter from then on.
    OffPath,
}

/// The compiled queries of one module set (data changes keep them: a program
/// reads data only when it runs).
#[derive(Debug)]
pub(crate) struct Programs {
    by_query: Mutex<HashMap<String, Entry>>,
    /// Whether forms the VM is known to evaluate wrongly are refused (off
    /// only in tests of the answer check).
    refuse_known_wrong_forms: bool,
    counts: Arc<CheckCounts>,
    /// Queries given up for the interpreter (answers remembered before a
    /// give-up are not given again: it is part of their key).
    give_ups: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    /// `None`: interpreted.
    program: Option<Arc<Program>>,
    /// Answers still to check against the interpreter's on the request path.
    checks_left: usize,
    /// Answers the VM left undefined in part (the interpreter gave them).
    undefined_answers: usize,
    /// Compiled answers given.
    answers: u64,
    /// The data generation whose first answer was compared.
    compared_generation: u64,
    /// When the first answer after a data change was last compared.
    last_data_check: Option<Instant>,
    /// An off-path comparison is running.
    comparing: bool,
}

impl Entry {
    fn new(program: Option<Arc<Program>>, checks_left: usize) -> Self {
        Entry {
            program,
            checks_left,
            undefined_answers: 0,
            answers: 0,
            compared_generation: 0,
            last_data_check: None,
            comparing: false,
        }
    }
}

impl Default for Programs {
    fn default() -> Self {
        Programs::new(Arc::default())
    }
}

impl Programs {
    /// No programs yet; comparisons counted in `counts`.
    pub(crate) fn new(counts: Arc<CheckCounts>) -> Self {
        Programs {
            by_query: Mutex::default(),
            refuse_known_wrong_forms: true,
            counts,
            give_ups: AtomicU64::new(0),
        }
    }

    /// Programs compiled whatever their form, for tests of the answer check.
    #[cfg(test)]
    pub(crate) fn taking_known_wrong_forms(counts: Arc<CheckCounts>) -> Self {
        Programs {
            refuse_known_wrong_forms: false,
            ..Programs::new(counts)
        }
    }

    /// The program of `query` (`data...`) over the modules of `template`,
    /// compiled on first use; `None` when it is interpreted.
    pub(crate) fn get(&self, template: &regorus::Engine, query: &str) -> Option<Arc<Program>> {
        let mut programs = self.by_query.lock();
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
            Entry::new(program.clone(), CHECKED_ANSWERS),
        );
        program
    }

    #[cfg(test)]
    pub(crate) fn is_compiled(&self, query: &str) -> bool {
        self.by_query
            .lock()
            .get(query)
            .is_some_and(|entry| entry.program.is_some())
    }

    /// Whether, and where, the compiled answer at hand, computed on the data
    /// of `generation`, is compared with the interpreter's: on the request
    /// path one of the first [`CHECKED_ANSWERS`], and the first after a data
    /// change (spaced by [`DATA_SAMPLE_SPACING`]); off it one in
    /// [`SAMPLE_EVERY`], one comparison of a query at a time.
    pub(crate) fn check(&self, query: &str, generation: u64) -> Check {
        let mut programs = self.by_query.lock();
        let Some(entry) = programs.get_mut(query) else {
            return Check::None;
        };
        entry.answers += 1;
        if entry.checks_left > 0 {
            entry.checks_left -= 1;
            entry.compared_generation = entry.compared_generation.max(generation);
            return Check::OnPath;
        }
        if generation > entry.compared_generation
            && entry
                .last_data_check
                .is_none_or(|last| last.elapsed() >= DATA_SAMPLE_SPACING)
        {
            entry.compared_generation = generation;
            entry.last_data_check = Some(Instant::now());
            return Check::OnPath;
        }
        if entry.answers % SAMPLE_EVERY != 0 || entry.comparing {
            return Check::None;
        }
        entry.comparing = true;
        Check::OffPath
    }

    /// An off-path comparison of `query` ended.
    pub(crate) fn compared_off_path(&self, query: &str) {
        if let Some(entry) = self.by_query.lock().get_mut(query) {
            entry.comparing = false;
        }
    }

    /// Count a comparison; `disagreement` says how the interpreter answered
    /// otherwise, which sends the query to the interpreter from then on.
    pub(crate) fn compared(&self, query: &str, disagreement: Option<&dyn std::fmt::Display>) {
        self.counts.compared.fetch_add(1, Ordering::Relaxed);
        if let Some(why) = disagreement {
            self.counts.disagreements.fetch_add(1, Ordering::Relaxed);
            self.give_up(query, why);
        }
    }

    /// Queries given up for the interpreter so far.
    pub(crate) fn give_ups(&self) -> u64 {
        self.give_ups.load(Ordering::Relaxed)
    }

    /// Count an answer of `query` that the VM left undefined, wholly or in
    /// part, so the interpreter gave it; the first is logged, since a
    /// decision member that is undefined for ordinary inputs (a rule without
    /// an `else` or `default`) makes every such decision cost the interpreter.
    pub(crate) fn left_undefined(&self, query: &str) {
        let mut programs = self.by_query.lock();
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
        self.by_query
            .lock()
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
        self.by_query
            .lock()
            .insert(query.to_owned(), Entry::new(None, 0));
        self.give_ups.fetch_add(1, Ordering::Relaxed);
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
    let mut program = Compiler::compile_from_policy(&policy, &[entry_point.as_str()])
        .map_err(|e| e.to_string())?;
    // The builtins the interpreter gets ours of (it is the reference).
    crate::embedded_builtins::patch_program(Arc::make_mut(&mut program));
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
    // As the interpreter: a failing builtin fails the evaluation (see
    // embedded/template.rs).
    vm.set_strict_builtin_errors(true);
    vm.set_data(data)?;
    Ok(vm)
}

/// The value of the compiled query for `input`, stopped after `limit`;
/// `None` when it is undefined, or a document holding an undefined value:
/// the VM makes a rule whose definitions disagree undefined, where the
/// interpreter (and OPA) reports a conflict, so such an answer is the
/// interpreter's to give. (A conflict the document does not show, in a rule
/// it only reads, is left to the comparisons, see [`Programs::check`].)
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

/// Whether `value` (a document the VM built) holds an undefined value at
/// any depth: a rule that is undefined, in a package, an object, an array or
/// a set.
fn holds_undefined(value: &regorus::Value) -> bool {
    let undefined = |v: &regorus::Value| *v == regorus::Value::Undefined || holds_undefined(v);
    match value {
        regorus::Value::Object(object) => object.iter().any(|(k, v)| undefined(k) || undefined(v)),
        regorus::Value::Array(items) => items.iter().any(undefined),
        regorus::Value::Set(items) => items.iter().any(undefined),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An undefined value at any depth of a document the VM built sends the
    /// answer to the interpreter: in a package, an object, an array, a set.
    #[test]
    fn undefined_is_found_at_any_depth() {
        let undefined = regorus::Value::Undefined;
        let one = regorus::Value::from(1u64);
        let in_array = regorus::Value::from(vec![one.clone(), undefined.clone()]);
        let in_set = regorus::Value::from(std::collections::BTreeSet::from([undefined.clone()]));
        let nested = |inner: regorus::Value| {
            regorus::Value::from(std::collections::BTreeMap::from([(
                regorus::Value::from("errors"),
                regorus::Value::from(vec![inner]),
            )]))
        };
        assert!(holds_undefined(&nested(in_array)));
        assert!(holds_undefined(&nested(in_set)));
        assert!(holds_undefined(&nested(undefined)));
        assert!(!holds_undefined(&nested(one)));
    }
}
