//! Forms that regorus 0.14.1 evaluates unlike OPA in both of its evaluators
//! (its interpreter and its VM), found in a module as it is loaded: the
//! module is refused with a compile error naming the form and what to write
//! instead, so that the policy set fails closed rather than answering
//! otherwise than OPA would. Each is written up for upstream in
//! docs/regorus-upstream.md.

use std::collections::BTreeSet;

use regorus::unstable::{AssignOp, Expr, Literal, Module, Query, Rule, RuleHead, Span};

/// A form refused, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) line: u32,
    pub(super) col: u32,
    pub(super) message: &'static str,
}

const NEGATED_UNIFICATION: &str = "`not x = y` with a variable: regorus 0.14.1 (the embedded engine) binds the variables of a negated unification instead of evaluating it once they are bound, as OPA does; compare with `!=` or `==` after the statements that bind them";

const NEGATED_BODY: &str = "`not { ... }`: regorus 0.14.1 (the embedded engine) reads it as `not` of a set or object, which is always defined, where OPA (with `future.keywords.not`) negates the body; negate a rule or a function holding the body instead";

const KEY_VALUE_MEMBERSHIP: &str = "`key, value in collection` as a test of a collection that may be a set: regorus 0.14.1 (the embedded engine) answers it undefined for a set, where OPA finds the member; test an array, an object or `input`, or write `some k, v in collection` and compare `k` and `v`";

const WALK_ASSIGNED: &str = "`[path, value] := walk(x)`: regorus 0.14.1 (the embedded engine) yields no pair from it, where OPA yields every one; write `walk(x, [path, value])`";

/// The refused forms of `module`, in order of appearance.
pub(super) fn refused(module: &Module) -> Vec<Refused> {
    // Names bound before any body runs: the roots, the module's rules and
    // its imports.
    let mut global: BTreeSet<String> = ["input", "data"].map(str::to_owned).into();
    for rule in &module.policy {
        let refr = match rule.as_ref() {
            Rule::Spec { head, .. } => match head {
                RuleHead::Compr { refr, .. }
                | RuleHead::Set { refr, .. }
                | RuleHead::Func { refr, .. } => refr,
            },
            Rule::Default { refr, .. } => refr,
        };
        global.extend(root_name(refr));
    }
    for import in &module.imports {
        match &import.r#as {
            Some(alias) => {
                global.insert(alias.text().to_string());
            }
            None => global.extend(last_name(&import.refr)),
        }
    }
    let mut walk = Walk::default();
    for rule in &module.policy {
        match rule.as_ref() {
            Rule::Spec { head, bodies, .. } => {
                let mut known = global.clone();
                match head {
                    RuleHead::Compr { refr, assign, .. } => {
                        walk.expr(refr, &known);
                        if let Some(assign) = assign {
                            walk.expr(&assign.value, &known);
                        }
                    }
                    RuleHead::Set { refr, key, .. } => {
                        walk.expr(refr, &known);
                        if let Some(key) = key {
                            walk.expr(key, &known);
                        }
                    }
                    RuleHead::Func {
                        refr, args, assign, ..
                    } => {
                        args.iter().for_each(|arg| vars(arg, &mut known));
                        walk.expr(refr, &known);
                        args.iter().for_each(|arg| walk.expr(arg, &known));
                        if let Some(assign) = assign {
                            walk.expr(&assign.value, &known);
                        }
                    }
                }
                for body in bodies {
                    if let Some(assign) = &body.assign {
                        walk.expr(&assign.value, &known);
                    }
                    walk.query(&body.query, &known);
                }
            }
            Rule::Default {
                refr, args, value, ..
            } => {
                walk.expr(refr, &global);
                args.iter().for_each(|arg| walk.expr(arg, &global));
                walk.expr(value, &global);
            }
        }
    }
    let mut found = walk.found;
    found.sort_by_key(|r| (r.line, r.col));
    found
}

/// The variable a reference starts from (`p` of `p[q].r`).
fn root_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Var { value, .. } => value.as_string().ok().map(|name| name.to_string()),
        Expr::RefDot { refr, .. } | Expr::RefBrack { refr, .. } => root_name(refr),
        _ => None,
    }
}

/// The name an import binds (`c` of `import data.a.c`).
fn last_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Var { value, .. } => value.as_string().ok().map(|name| name.to_string()),
        Expr::RefDot { field, .. } => field.1.as_string().ok().map(|name| name.to_string()),
        _ => None,
    }
}

/// Every variable named in `e`, into `names`.
fn vars(e: &Expr, names: &mut BTreeSet<String>) {
    let mut collect = Walk {
        found: Vec::new(),
        names: Some(std::mem::take(names)),
    };
    collect.expr(e, &BTreeSet::new());
    *names = collect.names.unwrap_or_default();
}

/// A walk over a module's expressions, collecting refused forms (and,
/// when `names` is set, the variables it meets instead).
#[derive(Default)]
struct Walk {
    found: Vec<Refused>,
    names: Option<BTreeSet<String>>,
}

impl Walk {
    fn refuse(&mut self, span: &Span, message: &'static str) {
        if self.names.is_none() {
            self.found.push(Refused {
                line: span.line,
                col: span.col,
                message,
            });
        }
    }

    /// A query whose variables in `known` are bound before it runs; a
    /// variable named in a statement is bound for the statements after it
    /// (OPA would refuse the body otherwise).
    fn query(&mut self, q: &Query, known: &BTreeSet<String>) {
        let mut bound = known.clone();
        for stmt in &q.stmts {
            let mut here = bound.clone();
            for with in &stmt.with_mods {
                vars(&with.refr, &mut here);
                vars(&with.r#as, &mut here);
            }
            match &stmt.literal {
                Literal::SomeVars { vars: names, .. } => {
                    here.extend(names.iter().map(|span| span.text().to_string()));
                }
                Literal::SomeIn {
                    key,
                    value,
                    collection,
                    ..
                } => {
                    for e in key.iter().chain([value, collection]) {
                        vars(e, &mut here);
                    }
                }
                Literal::Expr { expr, .. } | Literal::NotExpr { expr, .. } => vars(expr, &mut here),
                Literal::Every { domain, .. } => vars(domain, &mut here),
            }
            for with in &stmt.with_mods {
                self.expr(&with.refr, &here);
                self.expr(&with.r#as, &here);
            }
            match &stmt.literal {
                Literal::SomeVars { .. } => {}
                Literal::SomeIn {
                    key,
                    value,
                    collection,
                    ..
                } => {
                    for e in key.iter().chain([value, collection]) {
                        self.expr(e, &here);
                    }
                }
                Literal::Expr { expr, .. } => self.expr(expr, &here),
                Literal::NotExpr { span, expr } => {
                    match expr.as_ref() {
                        Expr::AssignExpr {
                            op: AssignOp::Eq,
                            lhs,
                            rhs,
                            ..
                        } if binds_a_variable(lhs, &bound) || binds_a_variable(rhs, &bound) => {
                            self.refuse(span, NEGATED_UNIFICATION);
                        }
                        Expr::Set { .. } | Expr::Object { .. } => self.refuse(span, NEGATED_BODY),
                        _ => {}
                    }
                    self.expr(expr, &here);
                }
                Literal::Every { domain, query, .. } => {
                    self.expr(domain, &here);
                    self.query(query, &here);
                }
            }
            bound = here;
        }
    }

    fn expr(&mut self, e: &Expr, known: &BTreeSet<String>) {
        match e {
            Expr::Var { value, .. } => {
                if let (Some(names), Ok(name)) = (&mut self.names, value.as_string()) {
                    names.insert(name.to_string());
                }
            }
            Expr::String { .. }
            | Expr::RawString { .. }
            | Expr::Number { .. }
            | Expr::Bool { .. }
            | Expr::Null { .. } => {}
            Expr::Array { items, .. } | Expr::Set { items, .. } => {
                items.iter().for_each(|item| self.expr(item, known));
            }
            Expr::Object { fields, .. } => {
                for (_, key, value) in fields {
                    self.expr(key, known);
                    self.expr(value, known);
                }
            }
            Expr::ArrayCompr { term, query, .. } | Expr::SetCompr { term, query, .. } => {
                self.expr(term, known);
                self.query(query, known);
            }
            Expr::ObjectCompr {
                key, value, query, ..
            } => {
                self.expr(key, known);
                self.expr(value, known);
                self.query(query, known);
            }
            Expr::Call { fcn, params, .. } => {
                self.expr(fcn, known);
                params.iter().for_each(|param| self.expr(param, known));
            }
            Expr::UnaryExpr { expr, .. } => self.expr(expr, known),
            Expr::RefDot { refr, .. } => self.expr(refr, known),
            Expr::RefBrack { refr, index, .. } => {
                self.expr(refr, known);
                self.expr(index, known);
            }
            Expr::BinExpr { lhs, rhs, .. }
            | Expr::BoolExpr { lhs, rhs, .. }
            | Expr::ArithExpr { lhs, rhs, .. } => {
                self.expr(lhs, known);
                self.expr(rhs, known);
            }
            Expr::AssignExpr { span, lhs, rhs, .. } => {
                if walk_of_one(lhs) || walk_of_one(rhs) {
                    self.refuse(span, WALK_ASSIGNED);
                }
                self.expr(lhs, known);
                self.expr(rhs, known);
            }
            Expr::Membership {
                span,
                key,
                value,
                collection,
                ..
            } => {
                if let Some(key) = key {
                    if may_be_a_set(collection) {
                        self.refuse(span, KEY_VALUE_MEMBERSHIP);
                    }
                    self.expr(key, known);
                }
                self.expr(value, known);
                self.expr(collection, known);
            }
        }
    }
}

/// Whether `e`, a side of a unification, is or holds a variable not bound
/// before (`known`) that the unification could bind: a variable, or one in
/// an array or object pattern.
fn binds_a_variable(e: &Expr, known: &BTreeSet<String>) -> bool {
    match e {
        Expr::Var { value, .. } => value
            .as_string()
            .is_ok_and(|name| name.as_ref() != "_" && !known.contains(name.as_ref())),
        Expr::Array { items, .. } => items.iter().any(|item| binds_a_variable(item, known)),
        Expr::Object { fields, .. } => fields.iter().any(|(_, _, v)| binds_a_variable(v, known)),
        _ => false,
    }
}

/// Whether `e` may be a set: anything but a scalar, array or object (or a
/// comprehension of one) written out, or a reference into `input` (JSON).
fn may_be_a_set(e: &Expr) -> bool {
    let mut root = e;
    while let Expr::RefDot { refr, .. } | Expr::RefBrack { refr, .. } = root {
        root = refr;
    }
    let from_input = !std::ptr::eq(root, e)
        && matches!(root, Expr::Var { value, .. } if value.as_string().is_ok_and(|name| name.as_ref() == "input"));
    !from_input
        && !matches!(
            e,
            Expr::String { .. }
                | Expr::RawString { .. }
                | Expr::Number { .. }
                | Expr::Bool { .. }
                | Expr::Null { .. }
                | Expr::Array { .. }
                | Expr::Object { .. }
                | Expr::ArrayCompr { .. }
                | Expr::ObjectCompr { .. }
        )
}

/// Whether `e` is a call of `walk` with its one argument.
fn walk_of_one(e: &Expr) -> bool {
    matches!(e, Expr::Call { fcn, params, .. }
        if params.len() == 1
            && matches!(fcn.as_ref(), Expr::Var { value, .. }
                if value.as_string().is_ok_and(|name| name.as_ref() == "walk")))
}
