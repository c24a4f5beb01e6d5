//! Where in `data` a Rego module writes: its package, and the path each of
//! its rules defines (the package and the rule's head: `package io.k8s` with
//! `federation.placement.allowed := {}` writes
//! `io.k8s.federation.placement.allowed`). Read with regorus's parser, so that
//! comments, strings, `["quoted"]` components and rule heads that are
//! references read as Rego reads them.

use regorus::Source;
use regorus::unstable::{Expr, Parser, Rule, RuleHead};

/// One path a module writes: its components up to the first that is not a
/// constant string (`allowed[name]` writes somewhere under `allowed`), and the
/// line it is declared on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub path: Vec<String>,
    pub line: u32,
}

/// What a module writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModuleWrites {
    /// Its package.
    pub package: Written,
    /// Each rule's path (the package's components first).
    pub rules: Vec<Written>,
}

/// The paths `source` writes; `Err` with the parser's message when it is not
/// a module regorus reads (in Rego v1, or failing that v0).
pub(crate) fn module_writes(id: &str, source: &str) -> Result<ModuleWrites, String> {
    let v1 = parse(id, source, true);
    if v1.is_ok() {
        return v1;
    }
    parse(id, source, false).or(v1)
}

fn parse(id: &str, source: &str, rego_v1: bool) -> Result<ModuleWrites, String> {
    let source =
        Source::from_contents(id.to_owned(), source.to_owned()).map_err(|e| e.to_string())?;
    // A module is a tenant's text: a panic in the parser must not take the
    // loader down with it.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut parser = Parser::new(&source).map_err(|e| e.to_string())?;
        if rego_v1 {
            parser.enable_rego_v1().map_err(|e| e.to_string())?;
        }
        let module = parser.parse().map_err(|e| e.to_string())?;
        let package = Written {
            path: static_prefix(&module.package.refr),
            line: module.package.span.line,
        };
        let rules = module
            .policy
            .iter()
            .map(|rule| {
                let (head, line) = match rule.as_ref() {
                    Rule::Spec { head, span, .. } => match head {
                        RuleHead::Compr { refr, .. }
                        | RuleHead::Set { refr, .. }
                        | RuleHead::Func { refr, .. } => (refr, span.line),
                    },
                    Rule::Default { refr, span, .. } => (refr, span.line),
                };
                let mut path = package.path.clone();
                path.extend(static_prefix(head));
                Written { path, line }
            })
            .collect();
        Ok(ModuleWrites { package, rules })
    }))
    .unwrap_or_else(|_| Err("the Rego parser failed on this module".to_owned()))
}

/// The leading components of a reference that are names or constant strings
/// (`a.b["c"][x].d`: `a`, `b`, `c`).
fn static_prefix(expr: &Expr) -> Vec<String> {
    let mut chain = Vec::new();
    let mut current = expr;
    let root = loop {
        match current {
            Expr::RefDot { refr, .. } | Expr::RefBrack { refr, .. } => {
                chain.push(current);
                current = refr.as_ref();
            }
            Expr::Var { span, .. } => break span.text().to_owned(),
            _ => return Vec::new(),
        }
    };
    let mut path = vec![root];
    while let Some(link) = chain.pop() {
        let component = match link {
            Expr::RefDot { field, .. } => field.0.text().to_owned(),
            Expr::RefBrack { index, .. } => match index.as_ref() {
                Expr::String { value, .. } => match value.as_string() {
                    Ok(text) => text.to_string(),
                    Err(_) => break,
                },
                _ => break,
            },
            _ => break,
        };
        path.push(component);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(source: &str) -> Vec<String> {
        let writes = module_writes("m", source).unwrap();
        std::iter::once(writes.package)
            .chain(writes.rules)
            .map(|w| w.path.join("."))
            .collect()
    }

    #[test]
    fn a_modules_package_and_rules_are_read_as_rego_reads_them() {
        let source = r#"# package io.k8s.federation.placement
package io.k8s

import data.io.k8s.federation.placement

msg := "package io.k8s.federation.placement"

federation.placement.jurisdiction_clusters contains "member-us-1"

federation["placement"].allowed := {}

default tenant.flag := false

tenant.limits[name] := 3 if some name in {"a"}

f(x) := x
"#;
        assert_eq!(
            paths(source),
            [
                "io.k8s",
                "io.k8s.msg",
                "io.k8s.federation.placement.jurisdiction_clusters",
                "io.k8s.federation.placement.allowed",
                "io.k8s.tenant.flag",
                "io.k8s.tenant.limits",
                "io.k8s.f",
            ]
        );
        let writes = module_writes("m", source).unwrap();
        assert_eq!(writes.package.line, 2);
        assert_eq!(writes.rules[1].line, 8);
    }

    #[test]
    fn a_dynamic_head_writes_under_its_constant_part() {
        assert_eq!(
            paths("package io.k8s\n\nfederation[kind].x := 1 if some kind in {\"placement\"}\n"),
            ["io.k8s", "io.k8s.federation"]
        );
        assert_eq!(
            paths("package a[\"b.c\"]\n\nd := 1\n"),
            ["a.b.c", "a.b.c.d"]
        );
    }

    #[test]
    fn rego_v0_modules_are_read_too_and_text_that_is_no_module_is_an_error() {
        assert_eq!(paths("package a\n\np[x] { x := 1 }\n"), ["a", "a.p"]);
        assert!(module_writes("m", "jurisdiction_clusters contains \"x\"\n").is_err());
        assert!(module_writes("m", "package a\n\nb := \n").is_err());
    }
}
