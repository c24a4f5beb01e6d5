//! Which parts of `input` a policy set can read, from its source: the ground
//! the decision cache stands on. Two inputs that agree at every path found
//! here get the same decision from the same modules and data.
//!
//! Sound by over-approximation. Every read of `input` in Rego is a reference
//! whose root is `input` (an `import input.x as y` alias starts with it too);
//! the constant prefix of that reference (`.name`, `["key"]`) covers
//! everything the rest of it can reach, whatever the variables in it take. A
//! reference with no constant prefix (`input`, `input[x]`, `walk(input)`, a
//! function given the whole input) would cover the whole input, so the set is
//! refused rather than cached on everything. `object.get(input.p, "k", d)` and
//! `object.get(input.p, ["k1", "k2"], d)` read exactly `p.k` / `p.k1.k2`.
//! `some k, _ in input.p` beside `startswith(k, "x/")`, in a rule that names
//! `k` nowhere else, reads only the members of `p` whose keys start with
//! `x/`: a workload's other annotations (`kubectl apply`'s last applied
//! configuration, Karmada's policy names) then leave its decision
//! remembered.
//! Builtins whose answer is not a function of their arguments (time, random,
//! network, printing, signing with a random nonce) refuse the set too, and so
//! does replacing a function with `with` (`... with object.get as f`,
//! `with g as http.send`, `with data.lib.f as ...`): the call it replaces
//! would no longer read what its name says. Replacing `input` or data with
//! `with` is followed like any other reference.
//!
//! The references are read from regorus's parse ([`crate::rego_analysis`]):
//! comments and strings are no reads, the expressions of a template string
//! are. A module regorus cannot parse refuses the set.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::input::InputRoot;
use crate::rego_analysis::{ModuleAnalysis, SetAnalysis};
use crate::rego_value::to_rego;

/// The input paths a policy set reads (none under a path read whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputReads {
    reads: Vec<Read>,
}

/// The value at `path`: whole, or, with `key_prefix`, only the members whose
/// keys start with it (when it is an object; anything else is taken whole).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Read {
    path: Vec<String>,
    key_prefix: Option<String>,
}

/// Why a policy set's decisions cannot be cached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{module}:{line}: {reason}")]
pub(crate) struct Uncacheable {
    pub(crate) module: String,
    pub(crate) line: usize,
    pub(crate) reason: String,
}

/// Builtins whose result is not a function of their arguments, or that act.
const IMPURE_CALLS: &[&str] = &[
    "time.now_ns",
    "rand.intn",
    "uuid.rfc4122",
    "http.send",
    "net.lookup_ip_addr",
    "opa.runtime",
    "io.jwt.decode_verify",
    "io.jwt.encode_sign",
    "io.jwt.encode_sign_raw",
    "crypto.x509.parse_and_verify_certificates",
    "crypto.x509.parse_and_verify_certificates_with_options",
    "print",
    "trace",
];

/// A key longer than this is not cached: the review is evaluated instead.
pub(crate) const MAX_KEY_BYTES: usize = 64 * 1024;

impl InputReads {
    /// The paths `modules` (id -> source) read, or why they cannot be pinned.
    pub(crate) fn of(modules: &BTreeMap<String, String>) -> Result<Self, Uncacheable> {
        Self::from_analysis(&SetAnalysis::of(modules))
    }

    /// The paths the modules of `set` read, or why they cannot be pinned.
    pub(crate) fn from_analysis(set: &SetAnalysis) -> Result<Self, Uncacheable> {
        let mut parsed = Vec::with_capacity(set.modules.len());
        for (id, module) in &set.modules {
            let module = module.as_ref().map_err(|e| Uncacheable {
                module: id.clone(),
                line: e.line as usize,
                reason: format!(
                    "regorus cannot parse it, so what it reads is unknown: {}",
                    e.message
                ),
            })?;
            parsed.push((id, module));
        }
        // `object.get` is the builtin only when no module redefines `object`.
        let context = Context {
            object_is_builtin: !parsed.iter().any(|(_, m)| m.names_object),
            startswith_is_builtin: !parsed
                .iter()
                .flat_map(|(_, m)| &m.functions)
                .any(|f| f.ends_with(".startswith")),
            functions: parsed
                .iter()
                .flat_map(|(_, m)| m.functions.iter().cloned())
                .collect(),
        };
        let mut reads = BTreeSet::new();
        for (id, module) in parsed {
            scan(module, &context, &mut reads).map_err(|(line, reason)| Uncacheable {
                module: id.clone(),
                line: line as usize,
                reason,
            })?;
        }
        // Sorted, a path's prefixes come before it, and a path read whole
        // before its members filtered by key.
        let mut kept: Vec<Read> = Vec::new();
        for read in reads {
            let covered = kept.iter().any(|k| k.covers(&read));
            if !covered {
                kept.push(read);
            }
        }
        Ok(InputReads { reads: kept })
    }

    /// The cache key of `input` under these reads: the value at each path, or
    /// where and how the path ends before it. `None` when it would exceed
    /// [`MAX_KEY_BYTES`].
    pub(crate) fn key(&self, query: &str, input: InputRoot<'_>) -> Option<Vec<u8>> {
        let mut key = Vec::with_capacity(128);
        key.extend_from_slice(query.as_bytes());
        for read in &self.reads {
            key.push(0);
            // The depth reached says which prefix the value belongs to; an
            // object that lacks the next key is marked absent (its other keys
            // are not read), an object filtered by key prefix is written as
            // its members that pass (each a JSON string and value, so the
            // sequence reads one way only), anything else is written whole.
            let (depth, reached) = reach(input, &read.path);
            key.extend_from_slice(&(depth as u32).to_le_bytes());
            match (reached, &read.key_prefix) {
                (None, _) => key.push(b'-'),
                (Some(Value::Object(map)), Some(prefix)) if depth == read.path.len() => {
                    key.push(b'~');
                    for (name, value) in map
                        .iter()
                        .filter(|(name, _)| name.starts_with(prefix.as_str()))
                    {
                        serde_json::to_writer(&mut key, name).ok()?;
                        serde_json::to_writer(&mut key, value).ok()?;
                    }
                }
                (Some(node), _) => {
                    key.push(b'=');
                    serde_json::to_writer(&mut key, node).ok()?;
                }
            }
            if key.len() > MAX_KEY_BYTES {
                return None;
            }
        }
        Some(key)
    }

    /// The part of `input` these reads can reach, as the engine's value:
    /// along each path an object keeps only the keys on a path; where a path
    /// ends, or meets anything but an object, the value is taken whole. So an
    /// input and its projection agree at every path (the policy decides both
    /// alike), and two inputs with the same [`Self::key`] project alike.
    pub(crate) fn project(&self, input: InputRoot<'_>) -> regorus::Value {
        let reads: Vec<Rest<'_>> = self.reads.iter().map(Rest::of).collect();
        match input {
            InputRoot::Value(value) => project(value, &reads),
            // A read path is never empty (reading the whole input refuses
            // the set), so the root's members are always reduced.
            InputRoot::Parts { .. } => regorus::Value::from(project_members(
                |key| input.member(key).ok().flatten(),
                &reads,
            )),
        }
    }

    #[cfg(test)]
    fn paths(&self) -> Vec<String> {
        self.reads
            .iter()
            .map(|read| match &read.key_prefix {
                None => read.path.join("."),
                Some(prefix) => format!("{}[{prefix}*]", read.path.join(".")),
            })
            .collect()
    }
}

impl Read {
    /// Everything `other` reads, this reads too.
    fn covers(&self, other: &Read) -> bool {
        let Some(below) = other.path.strip_prefix(self.path.as_slice()) else {
            return false;
        };
        match (&self.key_prefix, below.first()) {
            (None, _) => true,
            (Some(prefix), Some(member)) => member.starts_with(prefix.as_str()),
            (Some(_), None) => false,
        }
    }
}

/// What is left of a [`Read`] below some node.
#[derive(Clone, Copy)]
struct Rest<'a> {
    path: &'a [String],
    key_prefix: Option<&'a str>,
}

impl<'a> Rest<'a> {
    fn of(read: &'a Read) -> Self {
        Rest {
            path: &read.path,
            key_prefix: read.key_prefix.as_deref(),
        }
    }

    /// The node it has reached is read whole.
    fn whole(&self) -> bool {
        self.path.is_empty() && self.key_prefix.is_none()
    }
}

/// How far `path` reaches into `input`, and what is there: `None` for an
/// object without the next key, else the value to take whole (where the path
/// ends, or a non-object on the way).
fn reach<'a>(input: InputRoot<'a>, path: &[String]) -> (usize, Option<&'a Value>) {
    let Some((first, rest)) = path.split_first() else {
        unreachable!("a read path is never empty: reading the whole input refuses the set")
    };
    let mut node = match input.member(first) {
        Err(not_an_object) => return (0, Some(not_an_object)),
        Ok(None) => return (0, None),
        Ok(Some(child)) => child,
    };
    let mut depth = 1;
    for segment in rest {
        match node {
            Value::Object(map) => match map.get(segment) {
                Some(next) => {
                    node = next;
                    depth += 1;
                }
                None => return (depth, None),
            },
            _ => break,
        }
    }
    (depth, Some(node))
}

/// `node` reduced to `reads` (sorted by path): an object keeps the members
/// whose keys a read filters by prefix, whole, and the members on a read's
/// path, reduced; anything else, or a node read whole, is taken whole.
fn project(node: &Value, reads: &[Rest<'_>]) -> regorus::Value {
    match node {
        Value::Object(map) if !reads.iter().any(Rest::whole) => {
            let (filters, paths): (Vec<Rest<'_>>, Vec<Rest<'_>>) =
                reads.iter().partition(|read| read.path.is_empty());
            let mut kept = project_members(|key| map.get(key), &paths);
            for (name, value) in map {
                let passes = |read: &Rest<'_>| read.key_prefix.is_some_and(|p| name.starts_with(p));
                if filters.iter().any(passes) {
                    kept.insert(regorus::Value::from(name.as_str()), to_rego(value));
                }
            }
            regorus::Value::from(kept)
        }
        _ => to_rego(node),
    }
}

/// The members `member` gives, each reduced to the rest of the `reads`
/// (sorted by path, none with an empty path) that start with it.
fn project_members<'a>(
    member: impl Fn(&str) -> Option<&'a Value>,
    reads: &[Rest<'_>],
) -> BTreeMap<regorus::Value, regorus::Value> {
    let mut kept = BTreeMap::new();
    for group in reads.chunk_by(|a, b| a.path[0] == b.path[0]) {
        let segment = &group[0].path[0];
        if let Some(child) = member(segment) {
            let rest: Vec<Rest<'_>> = group
                .iter()
                .map(|read| Rest {
                    path: &read.path[1..],
                    ..*read
                })
                .collect();
            kept.insert(
                regorus::Value::from(segment.as_str()),
                project(child, &rest),
            );
        }
    }
    kept
}

/// What every module's scan needs to know of the whole set.
struct Context {
    /// No module names something `object`: `object.get` is the builtin.
    object_is_builtin: bool,
    /// No module defines a function `startswith`.
    startswith_is_builtin: bool,
    /// The functions the modules define (`data.<package>.<name>`).
    functions: BTreeSet<String>,
}

/// The paths `module` reads, added to `paths`; or the first line (and why)
/// that refuses the set.
fn scan(
    module: &ModuleAnalysis,
    context: &Context,
    reads: &mut BTreeSet<Read>,
) -> Result<(), (u32, String)> {
    let mut refusals = Vec::new();
    for (name, line) in &module.calls {
        if IMPURE_CALLS.contains(&name.as_str()) {
            let reason = format!("`{name}` does not answer the same for the same input");
            refusals.push((*line, reason));
        }
    }
    for (target, line) in &module.with_targets {
        if let Some(reason) = with_replaces_a_function(target, &context.functions) {
            refusals.push((*line, reason));
        }
    }
    for read in &module.input_reads {
        let mut path = read.reference.path.clone();
        if context.object_is_builtin
            && let Some(key) = &read.object_get_key
        {
            path.extend(key.iter().cloned());
        }
        if path.is_empty() {
            let reason = "reads the whole input (`input` without a constant path after it)";
            refusals.push((read.reference.line, reason.to_owned()));
        } else {
            // `startswith` is the builtin only when no module defines one.
            let key_prefix = read
                .key_prefix
                .clone()
                .filter(|_| context.startswith_is_builtin);
            reads.insert(Read { path, key_prefix });
        }
    }
    match refusals.into_iter().min_by_key(|(line, _)| *line) {
        Some(first) => Err(first),
        None => Ok(()),
    }
}

/// Why `with <target> as ...` (the target as written: root and constant
/// path) refuses the set: it replaces a function (a builtin, a function named
/// without `data.`, or a function the modules define).
fn with_replaces_a_function(target: &str, functions: &BTreeSet<String>) -> Option<String> {
    let head = target.split('.').next().unwrap_or_default();
    let replaces = match head {
        "input" => false,
        "data" => {
            let prefix = format!("{target}.");
            functions
                .iter()
                .any(|f| f == target || f.starts_with(&prefix))
        }
        _ => true,
    };
    replaces.then(|| {
        format!(
            "`with {target} as ...` replaces a function: the calls it replaces no longer read what their names say"
        )
    })
}

#[cfg(test)]
mod tests;
