//! Builtins of regorus 0.14.1 that answer unlike OPA, replaced by ours in
//! both of the embedded engine's evaluators: registered as extensions of the
//! interpreter (which looks extensions up before its builtins) and put in
//! place of regorus's in each compiled program's table of resolved builtins.
//! Each is written up for upstream in docs/regorus-upstream.md; drop it when
//! the pinned regorus has the fix.

mod glob;
mod sprintf;
mod strings;

use regorus::Value;
use regorus::rvm::program::Program;
use regorus::unstable::{Expr, ExprRef, Span};

/// A builtin as regorus calls it: the call's span, its argument
/// expressions (for messages), the argument values, and whether errors are
/// strict (otherwise the caller makes a failing call undefined).
type Builtin = fn(&Span, &[ExprRef], &[Value], bool) -> anyhow::Result<Value>;

/// The builtins replaced: name, number of arguments, ours.
const REPLACED: [(&str, u8, Builtin); 4] = [
    ("strings.replace_n", 2, strings::replace_n),
    ("strings.count", 2, strings::count),
    ("sprintf", 2, sprintf::sprintf),
    ("glob.match", 3, glob::glob_match),
];

/// Put ours in place of regorus's builtins in `program`.
pub(crate) fn patch_program(program: &mut Program) {
    let Program {
        builtin_info_table,
        resolved_builtins,
        ..
    } = program;
    for (info, resolved) in builtin_info_table.iter().zip(resolved_builtins.iter_mut()) {
        if let Some((_, args, ours)) = REPLACED.iter().find(|(name, ..)| *name == info.name) {
            *resolved = (*ours, *args);
        }
    }
}

/// Register ours as extensions of `engine`'s interpreter.
pub(crate) fn register(engine: &mut regorus::Engine) -> anyhow::Result<()> {
    for (name, args, ours) in REPLACED {
        engine.add_extension(
            name.to_owned(),
            args,
            Box::new(move |values: Vec<Value>| as_extension(ours, &values)),
        )?;
    }
    Ok(())
}

thread_local! {
    /// What regorus's builtins read for messages, for calls that come
    /// without them (as an extension's do).
    static PLACEHOLDERS: Option<(Span, Vec<ExprRef>)> = placeholders();
}

fn placeholders() -> Option<(Span, Vec<ExprRef>)> {
    let source = regorus::Source::from_contents("<builtin>".to_owned(), String::new()).ok()?;
    let span = Span {
        source,
        line: 1,
        col: 1,
        start: 0,
        end: 0,
    };
    let exprs = (0..3)
        .map(|_| {
            ExprRef::new(Expr::Null {
                span: span.clone(),
                value: Value::Null,
                eidx: 0,
            })
        })
        .collect();
    Some((span, exprs))
}

/// Call `ours` as the interpreter calls an extension, with strict builtin
/// errors (as the embedded engine evaluates, see embedded/template.rs).
fn as_extension(ours: Builtin, values: &[Value]) -> anyhow::Result<Value> {
    PLACEHOLDERS.with(|placeholders| {
        let Some((span, exprs)) = placeholders else {
            anyhow::bail!("the embedded engine could not prepare a builtin call");
        };
        let exprs = exprs.get(..values.len()).unwrap_or(exprs);
        ours(span, exprs, values, true)
    })
}

/// regorus's own implementation of builtin `name`.
fn regorus_builtin(name: &str) -> anyhow::Result<Builtin> {
    regorus::unstable::BUILTINS
        .get(name)
        .map(|(builtin, _)| *builtin)
        .ok_or_else(|| anyhow::anyhow!("regorus has no builtin {name}"))
}

#[cfg(test)]
mod tests;
