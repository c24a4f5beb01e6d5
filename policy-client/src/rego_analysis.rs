//! What a Rego module declares, reads and refers to, from regorus's own
//! parser: each module is parsed once, and one walk of its syntax tree answers
//! both questions the project asks of policy text. Which `input` paths a policy
//! set can read (the decision cache: [`crate::input_reads`]), and which
//! packages it declares and which `data` documents it refers to (placement-sync's
//! load order, missing-package check and replicated types).
//!
//! A reference is read as Rego reads it: comments and strings are none, a
//! bracketed string key (`data["a"].b`) is a name like `.a`, and references in
//! rule heads and bodies, `with` clauses, `some x in ...`, `every`,
//! comprehensions, imports (aliased or not) and template strings all count.
//! regorus 0.14.1 does not read template strings: [`template`] rewrites each
//! into an array of its expressions, in place, before the parse.

mod template;

use std::collections::BTreeMap;

use regorus::Source;
use regorus::unstable::{Expr, Literal, Module, Parser, Query, Ref, Rule, RuleAssign, RuleHead};

/// A reference to `input` or `data`: the constant path after the root (names
/// and string keys, up to the first part that is not constant: `data.a[x].b`
/// is `["a"]`), and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub path: Vec<String>,
    pub line: u32,
}

/// A read of `input`; when it is the first argument of `object.get` with two
/// more, the key argument's constant path (`"k"` or `["k1", "k2"]`; empty when
/// the key is not written out). `key_prefix`: the reference is iterated only
/// for the members whose keys start with it, as in
/// `some key, _ in input.metadata.annotations; startswith(key, "p/")`, where
/// the rule mentions `key` nowhere else and the value not at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputRead {
    pub(crate) reference: Reference,
    pub(crate) object_get_key: Option<Vec<String>>,
    pub(crate) key_prefix: Option<String>,
}

/// What one module declares and refers to, from one parse.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleAnalysis {
    /// Its package: `package a.b` is `["a", "b"]`.
    pub package: Vec<String>,
    /// `import data.<path>` (aliased or not), `data` left off; `import data`
    /// is the empty path.
    pub data_imports: Vec<Reference>,
    /// Every other reference to `data`.
    pub data_references: Vec<Reference>,
    /// Every reference to `input`, `import input.<path>` included.
    pub(crate) input_reads: Vec<InputRead>,
    /// Calls of a function named by a dotted name (`time.now_ns`,
    /// `data.lib.f`), and their lines.
    pub(crate) calls: Vec<(String, u32)>,
    /// What each `with` replaces, as written (`object.get`, `input.kind`,
    /// `data.lib.f`: its root and constant path), and its line.
    pub(crate) with_targets: Vec<(String, u32)>,
    /// The functions it defines, as `data.<package>.<name>`.
    pub(crate) functions: Vec<String>,
    /// It may make `object` name something other than the builtins: a rule
    /// named `object...`, an import named `object`, a package with an
    /// `object` in its path.
    pub(crate) names_object: bool,
}

/// A module regorus parses neither as Rego v1 nor as v0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{module}:{line}: regorus cannot parse it: {message}")]
pub struct ParseError {
    pub module: String,
    pub line: u32,
    pub message: String,
}

/// A policy set (module id -> source), each module parsed once.
#[derive(Debug, Clone, Default)]
pub struct SetAnalysis {
    pub modules: BTreeMap<String, Result<ModuleAnalysis, ParseError>>,
}

impl SetAnalysis {
    pub fn of(modules: &BTreeMap<String, String>) -> Self {
        let modules = modules
            .iter()
            .map(|(id, source)| (id.clone(), ModuleAnalysis::parse(id, source)))
            .collect();
        SetAnalysis { modules }
    }
}

impl ModuleAnalysis {
    /// Parse module `id` (Rego v1, or failing that v0) and walk it.
    pub fn parse(id: &str, source: &str) -> Result<Self, ParseError> {
        note_parse();
        let source = template::to_arrays(source);
        let module = parse_module(id, &source, true)
            .or_else(|v1| parse_module(id, &source, false).map_err(|_| v1))?;
        let mut walk = Walk::default();
        walk.module(&module);
        Ok(walk.found)
    }

    /// The package of a module that does not parse, from its `package`
    /// line alone (which comes first in every module).
    pub fn package_line(id: &str, source: &str) -> Option<Vec<String>> {
        let source = Source::from_contents(id.to_owned(), source.to_owned()).ok()?;
        let package = guarded(|| Parser::new(&source)?.parse_package()).ok()?;
        full_path(&package.refr)
    }
}

/// `f`'s result; a panic in the parser (a module is a tenant's text) is an
/// error, never the process's end.
fn guarded<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the Rego parser failed on this module")))
}

fn parse_module(id: &str, source: &str, rego_v1: bool) -> Result<Module, ParseError> {
    let error = |e: anyhow::Error| {
        let message = e.to_string();
        // regorus writes `--> <id>:<line>:<col>` above the line in error.
        let line = message
            .split_once(&format!("--> {id}:"))
            .and_then(|(_, rest)| rest.split(':').next()?.parse().ok())
            .unwrap_or(0);
        let last = message.lines().last().unwrap_or_default().trim();
        ParseError {
            module: id.to_owned(),
            line,
            message: last.to_owned(),
        }
    };
    let source = Source::from_contents(id.to_owned(), source.to_owned()).map_err(error)?;
    guarded(|| {
        let mut parser = Parser::new(&source)?;
        if rego_v1 {
            parser.enable_rego_v1()?;
        }
        parser.parse()
    })
    .map_err(error)
}

/// The root name and constant path of a reference (`a.b["c"][x].d`: `a`,
/// `["b", "c"]`); `None` when its root is not a name.
fn name_and_path(expr: &Expr) -> Option<(String, Vec<String>)> {
    let (root, links) = unchain(expr);
    let Expr::Var { span, .. } = root else {
        return None;
    };
    Some((span.text().to_owned(), constant_path(&links)))
}

/// A reference's root and constant path as one path (`a.b[x]`: `["a", "b"]`).
fn full_path(expr: &Expr) -> Option<Vec<String>> {
    let (root, mut path) = name_and_path(expr)?;
    path.insert(0, root);
    Some(path)
}

/// A reference's root and its links, from the root outwards.
fn unchain(expr: &Expr) -> (&Expr, Vec<&Expr>) {
    let mut links = Vec::new();
    let mut current = expr;
    while let Expr::RefDot { refr, .. } | Expr::RefBrack { refr, .. } = current {
        links.push(current);
        current = refr.as_ref();
    }
    links.reverse();
    (current, links)
}

/// The names and string keys of `links` up to the first that is neither.
fn constant_path(links: &[&Expr]) -> Vec<String> {
    links.iter().map_while(|link| constant_link(link)).collect()
}

fn constant_link(link: &Expr) -> Option<String> {
    match link {
        Expr::RefDot { field, .. } => Some(field.0.text().to_owned()),
        Expr::RefBrack { index, .. } => string(index),
        _ => None,
    }
}

fn string(expr: &Expr) -> Option<String> {
    match expr {
        Expr::String { value, .. } | Expr::RawString { value, .. } => {
            value.as_string().ok().map(|s| s.to_string())
        }
        _ => None,
    }
}

/// The dotted name of a called function (`time.now_ns`), when it is one.
fn dotted_name(expr: &Expr) -> Option<String> {
    let (root, links) = unchain(expr);
    let Expr::Var { span, .. } = root else {
        return None;
    };
    let mut name = span.text().to_owned();
    for link in links {
        let Expr::RefDot { field, .. } = link else {
            return None;
        };
        name.push('.');
        name.push_str(field.0.text());
    }
    Some(name)
}

/// `object.get`'s key argument as a path: a string, or an array of strings
/// written out; empty otherwise.
fn object_get_key(key: &Expr) -> Vec<String> {
    match key {
        Expr::Array { items, .. } => items
            .iter()
            .map(|item| string(item))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default(),
        other => string(other).into_iter().collect(),
    }
}

/// `some key, value in input.<constant path>` (`collection`, recorded as
/// `input_reads[read]`) whose `query` also says `startswith(key, "<prefix>")`,
/// without `with`: the filter. `None` for any other iteration.
fn key_filter(
    query: &Query,
    key: Option<&Expr>,
    value: &Expr,
    collection: &Expr,
    read: usize,
) -> Option<KeyFilter> {
    let (Some(Expr::Var { span: key, .. }), Expr::Var { span: value, .. }) = (key, value) else {
        return None;
    };
    let (root, links) = unchain(collection);
    let constant = matches!(root, Expr::Var { span, .. } if span.text() == "input")
        && !links.is_empty()
        && constant_path(&links).len() == links.len();
    if !constant || key.text() == "_" {
        return None;
    }
    let prefix = query.stmts.iter().find_map(|stmt| {
        let Literal::Expr { expr, .. } = &stmt.literal else {
            return None;
        };
        let Expr::Call { fcn, params, .. } = expr.as_ref() else {
            return None;
        };
        let [arg, literal] = &params[..] else {
            return None;
        };
        let on_key = matches!(arg.as_ref(), Expr::Var { span, .. } if span.text() == key.text());
        let is_startswith = dotted_name(fcn).as_deref() == Some("startswith");
        (is_startswith && on_key && stmt.with_mods.is_empty()).then(|| string(literal))?
    })?;
    Some(KeyFilter {
        read,
        key: key.text().to_owned(),
        value: value.text().to_owned(),
        prefix,
    })
}

/// One walk over a module's syntax tree, collecting what it finds.
#[derive(Default)]
struct Walk {
    found: ModuleAnalysis,
    /// How often each name occurs in the rule being walked.
    mentions: BTreeMap<String, usize>,
    /// Iterations of `input` filtered by a key prefix in the rule being
    /// walked, to be confirmed once its mentions are counted.
    filtered: Vec<KeyFilter>,
}

/// `some <key>, <value> in input.<path>` beside `startswith(<key>, "<prefix>")`
/// in one query: the `input_reads` entry of the iterated reference.
struct KeyFilter {
    read: usize,
    key: String,
    value: String,
    prefix: String,
}

impl Walk {
    fn module(&mut self, module: &Module) {
        self.found.package = full_path(&module.package.refr).unwrap_or_default();
        self.found.names_object = self.found.package.iter().any(|s| s == "object");
        for import in &module.imports {
            let Some((root, path)) = name_and_path(&import.refr) else {
                continue;
            };
            let alias = import.r#as.as_ref().map(|a| a.text().to_owned());
            let named = alias.or_else(|| path.last().cloned());
            self.found.names_object |= named.as_deref() == Some("object");
            let reference = Reference {
                path,
                line: import.span.line,
            };
            match root.as_str() {
                "data" => self.found.data_imports.push(reference),
                "input" => self.found.input_reads.push(InputRead {
                    reference,
                    object_get_key: None,
                    key_prefix: None,
                }),
                _ => {}
            }
        }
        for rule in &module.policy {
            self.rule(rule);
        }
    }

    /// A rule, then the key filters in it that hold: its iteration's key is
    /// named only there and in the `startswith`, its value nowhere else (so
    /// every other member leaves the rule's bodies undefined, whatever
    /// else they say).
    fn rule(&mut self, rule: &Rule) {
        self.mentions.clear();
        self.rule_parts(rule);
        for filter in std::mem::take(&mut self.filtered) {
            let key_only_there = self.mentions.get(&filter.key) == Some(&2);
            let value_unused = filter.value == "_" || self.mentions.get(&filter.value) == Some(&1);
            if key_only_there && value_unused {
                self.found.input_reads[filter.read].key_prefix = Some(filter.prefix);
            }
        }
    }

    fn rule_parts(&mut self, rule: &Rule) {
        match rule {
            Rule::Spec { head, bodies, .. } => {
                self.head(head);
                for body in bodies {
                    self.assign(body.assign.as_ref());
                    self.query(&body.query);
                }
            }
            Rule::Default {
                refr, args, value, ..
            } => {
                self.defines(refr, !args.is_empty());
                args.iter().for_each(|arg| self.expr(arg));
                self.expr(value);
            }
        }
    }

    fn head(&mut self, head: &RuleHead) {
        match head {
            RuleHead::Compr { refr, assign, .. } => {
                self.defines(refr, false);
                self.assign(assign.as_ref());
            }
            RuleHead::Set { refr, key, .. } => {
                self.defines(refr, false);
                key.iter().for_each(|key| self.expr(key));
            }
            RuleHead::Func {
                refr, args, assign, ..
            } => {
                self.defines(refr, true);
                args.iter().for_each(|arg| self.expr(arg));
                self.assign(assign.as_ref());
            }
        }
    }

    fn assign(&mut self, assign: Option<&RuleAssign>) {
        if let Some(assign) = assign {
            self.expr(&assign.value);
        }
    }

    /// A rule head `refr` defines a rule (or, `function`, a function); the
    /// expressions in its brackets are read.
    fn defines(&mut self, refr: &Expr, function: bool) {
        for link in unchain(refr).1 {
            if let Expr::RefBrack { index, .. } = link {
                self.expr(index);
            }
        }
        let Some(name) = full_path(refr) else {
            return;
        };
        self.found.names_object |= name[0] == "object";
        if function {
            let package = self.found.package.join(".");
            let name = name.join(".");
            self.found.functions.push(format!("data.{package}.{name}"));
        }
    }

    fn query(&mut self, query: &Query) {
        for stmt in &query.stmts {
            match &stmt.literal {
                Literal::SomeVars { vars, .. } => vars.iter().for_each(|v| self.mention(v.text())),
                Literal::SomeIn {
                    key,
                    value,
                    collection,
                    ..
                } => {
                    key.iter().for_each(|key| self.expr(key));
                    self.expr(value);
                    self.expr(collection);
                    // An `input` collection is the read just recorded.
                    let read = self.found.input_reads.len().saturating_sub(1);
                    if stmt.with_mods.is_empty()
                        && let Some(filter) =
                            key_filter(query, key.as_deref(), value, collection, read)
                    {
                        self.filtered.push(filter);
                    }
                }
                Literal::Expr { expr, .. } | Literal::NotExpr { expr, .. } => self.expr(expr),
                Literal::Every {
                    key,
                    value,
                    domain,
                    query,
                    ..
                } => {
                    key.iter().for_each(|k| self.mention(k.text()));
                    self.mention(value.text());
                    self.expr(domain);
                    self.query(query);
                }
            }
            for with in &stmt.with_mods {
                if let Some(target) = full_path(&with.refr) {
                    let target = target.join(".");
                    self.found.with_targets.push((target, with.span.line));
                }
                self.expr(&with.refr);
                self.expr(&with.r#as);
            }
        }
    }

    fn expr(&mut self, expr: &Expr) {
        match expr {
            Expr::String { .. }
            | Expr::RawString { .. }
            | Expr::Number { .. }
            | Expr::Bool { .. }
            | Expr::Null { .. } => {}
            Expr::Var { .. } | Expr::RefDot { .. } | Expr::RefBrack { .. } => {
                self.reference(expr);
            }
            Expr::Array { items, .. } | Expr::Set { items, .. } => {
                items.iter().for_each(|item| self.expr(item));
            }
            Expr::Object { fields, .. } => {
                for (_, key, value) in fields {
                    self.expr(key);
                    self.expr(value);
                }
            }
            Expr::ArrayCompr { term, query, .. } | Expr::SetCompr { term, query, .. } => {
                self.expr(term);
                self.query(query);
            }
            Expr::ObjectCompr {
                key, value, query, ..
            } => {
                self.expr(key);
                self.expr(value);
                self.query(query);
            }
            Expr::Call {
                span, fcn, params, ..
            } => self.call(span.line, fcn, params),
            Expr::UnaryExpr { expr, .. } => self.expr(expr),
            Expr::BinExpr { lhs, rhs, .. }
            | Expr::BoolExpr { lhs, rhs, .. }
            | Expr::ArithExpr { lhs, rhs, .. }
            | Expr::AssignExpr { lhs, rhs, .. } => {
                self.expr(lhs);
                self.expr(rhs);
            }
            Expr::Membership {
                key,
                value,
                collection,
                ..
            } => {
                key.iter().for_each(|key| self.expr(key));
                self.expr(value);
                self.expr(collection);
            }
        }
    }

    /// A reference (or a name): the expressions in its brackets are read
    /// first, then, when its root is `input` or `data`, the reference itself
    /// is recorded (last, so that a caller finds it at the end).
    fn reference(&mut self, expr: &Expr) {
        let (root, links) = unchain(expr);
        for link in &links {
            if let Expr::RefBrack { index, .. } = link {
                self.expr(index);
            }
        }
        let Expr::Var { span, .. } = root else {
            self.expr(root);
            return;
        };
        self.mention(span.text());
        let reference = Reference {
            path: constant_path(&links),
            line: span.line,
        };
        match span.text() {
            "input" => self.found.input_reads.push(InputRead {
                reference,
                object_get_key: None,
                key_prefix: None,
            }),
            "data" => self.found.data_references.push(reference),
            _ => {}
        }
    }

    fn mention(&mut self, name: &str) {
        *self.mentions.entry(name.to_owned()).or_default() += 1;
    }

    fn call(&mut self, line: u32, fcn: &Expr, params: &[Ref<Expr>]) {
        let name = dotted_name(fcn);
        self.expr(fcn);
        if let Some(name) = &name {
            self.found.calls.push((name.clone(), line));
        }
        let input_first = params.first().is_some_and(
            |first| matches!(unchain(first).0, Expr::Var { span, .. } if span.text() == "input"),
        );
        let [first, key, default] = params else {
            params.iter().for_each(|param| self.expr(param));
            return;
        };
        self.expr(first);
        if name.as_deref() == Some("object.get")
            && input_first
            && let Some(read) = self.found.input_reads.last_mut()
        {
            read.object_get_key = Some(object_get_key(key));
        }
        self.expr(key);
        self.expr(default);
    }
}

/// Counts parses in tests (one parse a module is asserted); nothing else.
#[cfg(not(test))]
fn note_parse() {}

#[cfg(test)]
mod tests;
#[cfg(test)]
use tests::note_parse;
