//! The interpreter every evaluation of a generation starts from: the modules
//! and the data loaded into regorus, its errors read as [`CompileError`]s.
//!
//! A builtin that fails fails the evaluation (strict builtin errors, as the
//! compiled form runs too): OPA's server makes such a call undefined, but
//! regorus fails some builtins OPA answers (numbers beyond 64-bit floats,
//! operands OPA takes), and an undefined call there would be an answer
//! unlike OPA's rather than a refusal. The builtins regorus answers unlike
//! OPA are ours ([`crate::embedded_builtins`]), and a module with a form it
//! evaluates unlike OPA is refused ([`super::refused_forms`]).

use std::collections::BTreeMap;

use serde_json::Value;

use super::refused_forms::refused;
use crate::engine::{CompileError, EngineError};
use crate::rego_value::to_rego;

pub(super) fn build_engine(
    modules: &BTreeMap<String, String>,
    data: &Value,
) -> Result<regorus::Engine, EngineError> {
    let mut engine = regorus::Engine::new();
    crate::embedded_builtins::register(&mut engine)
        .map_err(|e| EngineError::Evaluation(format!("registering builtins: {e}")))?;
    let mut errors = Vec::new();
    for (id, source) in modules {
        if let Err(e) = engine.add_policy(id.clone(), source.clone()) {
            errors.push(compile_error(id, &e.to_string()));
            continue;
        }
        if let Some(module) = engine.get_modules().last() {
            errors.extend(refused(module).into_iter().map(|r| CompileError {
                file: Some(id.clone()),
                row: Some(r.line),
                col: Some(r.col),
                code: Some("rego_compile_error".to_owned()),
                message: r.message.to_owned(),
            }));
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
