//! OPA's own conformance cases (`v1/test/cases/testdata/v1` of the OPA Go
//! module, at the version the test bed builds) put through the embedded
//! engine the way a policy author's modules go: `put_data` of the case's
//! data, `put_policy` of each module, `query` of the decision path with the
//! case's input; with the decision memory on and off.
//!
//! The cases asked are the `data.<path> = x` queries (what a decision is);
//! a case whose modules read `input` is asked only where it gives one as
//! JSON (the product always sends a JSON input). Each answer is compared
//! with the case's expectation as OPA's runner reads it
//! (`v1/topdown/exported_test.go`): `want_result` (`[]`: undefined), or an
//! error (`want_error`, `want_error_code`). A case marked `strict_error`
//! expects the error of a builtin with strict builtin errors, which OPA's
//! server does not use by default (nor does the embedded engine: a failing
//! builtin is undefined): such a case is asked of a real OPA, and its answer
//! is the expectation.
//!
//! - *agree*: the same value, or both fail;
//! - *refused*: OPA answers, the embedded engine fails (closed): allowed only
//!   for the cases listed in `refused.txt` beside this file, with the reason;
//! - *unlike OPA*: the embedded engine answers, and OPA answers otherwise or
//!   fails: never allowed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt as _;
use placement_tests::OpaServer;
use policy_client::embedded::Embedded;
use policy_client::engine::{PolicyEngine, QueryOutcome};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::time::Instant;

/// Where the cases lie in the OPA module.
const CASES_IN_MODULE: &str = "v1/test/cases/testdata/v1";

/// The refusals allowed, one case a line: `<note>\t<reason>` (a line
/// without a tab that starts with `#` is a comment).
const REFUSED: &str = include_str!("refused.txt");

#[derive(Debug, Deserialize)]
struct CaseFile {
    #[serde(default)]
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    note: String,
    query: String,
    #[serde(default)]
    modules: Vec<String>,
    #[serde(default)]
    data: Option<Map<String, Value>>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    input_term: Option<String>,
    #[serde(default)]
    want_result: Option<Vec<Map<String, Value>>>,
    #[serde(default)]
    want_error_code: Option<String>,
    #[serde(default)]
    want_error: Option<String>,
    #[serde(default)]
    sort_bindings: bool,
    #[serde(default)]
    strict_error: bool,
}

/// What OPA's runner expects of a case.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// The value of `x`; `None`: undefined.
    Answer(Option<Value>),
    /// An evaluation error (of a builtin's, where `strict`).
    Error { strict: bool, text: String },
}

/// What the embedded engine did.
#[derive(Debug, Clone)]
enum Got {
    Answer(Option<Value>),
    Failed(String),
}

/// One case as the embedded engine is asked it.
#[derive(Debug)]
struct Asked {
    note: String,
    path: String,
    modules: Vec<String>,
    data: Value,
    input: Value,
    expected: Expected,
    sort_bindings: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Agree,
    Refused,
    Unlike,
}

/// The folder of the cases: `PLACEMENT_OPA_CASES` (set by `scripts/test`),
/// else what `scripts/testbed opa-cases` prints.
fn cases_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLACEMENT_OPA_CASES") {
        return PathBuf::from(dir);
    }
    let output = std::process::Command::new(placement_tests::repo_root().join("scripts/testbed"))
        .arg("opa-cases")
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/testbed opa-cases");
    assert!(
        output.status.success(),
        "OPA's conformance cases are missing: `scripts/testbed opa-cases` (which downloads the OPA Go module of the test bed's version) failed; see its message above"
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

fn load_cases(dir: &Path) -> Vec<Case> {
    assert!(
        dir.ends_with(CASES_IN_MODULE) && dir.is_dir(),
        "{} is not OPA's conformance folder ({CASES_IN_MODULE} of the OPA module)",
        dir.display()
    );
    let mut files = Vec::new();
    let mut folders = vec![dir.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read the cases folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path
                .extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a case file");
        for document in yaml_serde::Deserializer::from_str(&text) {
            let parsed = CaseFile::deserialize(document)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            cases.extend(parsed.cases);
        }
    }
    // A stable sort: cases of one note (a few notes name more than one case)
    // keep the order of their files, and the second is `<note> (#2)`.
    cases.sort_by(|a, b| a.note.cmp(&b.note));
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for case in &mut cases {
        let n = seen.entry(case.note.clone()).or_default();
        *n += 1;
        if *n > 1 {
            case.note = format!("{} (#{n})", case.note);
        }
    }
    cases
}

/// `data.a.b = x` -> `a/b`; `None` for any other query.
fn decision_path(query: &str) -> Option<String> {
    let reference = query.trim().strip_suffix("= x")?.trim_end();
    let rest = reference.strip_prefix("data.")?;
    let segments: Vec<&str> = rest.split('.').collect();
    let ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    segments
        .iter()
        .all(|s| ident(s))
        .then(|| segments.join("/"))
}

/// Whether a module mentions `input` (a read of it, or a name that looks so).
fn reads_input(modules: &[String]) -> bool {
    modules.iter().any(|m| {
        m.match_indices("input").any(|(at, _)| {
            let before = m[..at].chars().next_back();
            let after = m[at + "input".len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            !word(before) && !word(after)
        })
    })
}

/// Cases not asked: regorus computes for minutes inside `units.parse` of
/// a huge exponent (the embedded engine gives up at its deadline, but no
/// deadline reaches inside a builtin: the thread runs on, and a test
/// asking them would run on a machine kept busy for as long).
const RUNAWAY: [&str; 2] = [
    "units_parse/exponent too large",
    "units_parse_bytes/exponent too large",
];

/// The case as asked, or why it is not asked.
fn asked(case: Case) -> Result<Asked, &'static str> {
    if RUNAWAY
        .iter()
        .any(|note| case.note == *note || case.note.starts_with(&format!("{note} (#")))
    {
        return Err("regorus runs for minutes inside units.parse, where no deadline reaches");
    }
    let path = decision_path(&case.query).ok_or("the query is not `data.<path> = x`")?;
    let input = match (&case.input, &case.input_term) {
        (_, Some(term)) => Some(
            serde_json::from_str::<Value>(term)
                .map_err(|_| "the input is a Rego term, not JSON")?,
        ),
        (Some(input), None) => Some(input.clone()),
        (None, None) => None,
    };
    if input.is_none() && reads_input(&case.modules) {
        return Err("the modules read an input the case does not give");
    }
    let expected = if case.want_error.is_some() || case.want_error_code.is_some() {
        Expected::Error {
            strict: case.strict_error,
            text: case.want_error.or(case.want_error_code).unwrap_or_default(),
        }
    } else {
        let results = case.want_result.ok_or("the case expects nothing")?;
        match results.as_slice() {
            [] => Expected::Answer(None),
            [one] if one.len() == 1 && one.contains_key("x") => {
                Expected::Answer(one.get("x").cloned())
            }
            _ => return Err("the case expects bindings other than x"),
        }
    };
    Ok(Asked {
        note: case.note,
        path,
        modules: case.modules,
        data: Value::Object(case.data.unwrap_or_default()),
        input: input.unwrap_or_else(|| Value::Object(Map::new())),
        expected,
        sort_bindings: case.sort_bindings,
    })
}

/// How long one case may take (the slowest take seconds in a debug build
/// on a busy machine).
const CASE_DEADLINE: Duration = Duration::from_secs(30);

/// Put the case's data and modules into `engine` (a module refused while
/// another it needs is missing is put again after the others) and ask it;
/// modules are named `<prefix>test-<n>.rego`.
async fn ask(engine: &dyn PolicyEngine, case: &Asked, prefix: &str) -> Got {
    if let Err(e) = engine.put_data("", &case.data).await {
        return Got::Failed(format!("data: {e}"));
    }
    let mut pending: Vec<(String, &str)> = case
        .modules
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("{prefix}test-{i}.rego"), m.as_str()))
        .collect();
    while !pending.is_empty() {
        let mut refused = Vec::new();
        let mut last = None;
        for (id, source) in &pending {
            if let Err(e) = engine.put_policy(id, source).await {
                refused.push((id.clone(), *source));
                last = Some(e);
            }
        }
        if refused.len() == pending.len() {
            return Got::Failed(format!(
                "load: {}",
                last.map(|e| e.to_string()).unwrap_or_default()
            ));
        }
        pending = refused;
    }
    let deadline = Instant::now() + CASE_DEADLINE;
    match engine.query(&case.path, &case.input, deadline).await {
        Ok(QueryOutcome::Defined(value)) => Got::Answer(Some(value)),
        Ok(QueryOutcome::Undefined) => Got::Answer(None),
        Err(e) => Got::Failed(e.to_string()),
    }
}

/// What a real OPA, with its server's default of builtin errors that are
/// not strict, answers the cases whose expectation assumes strict ones.
async fn strict_cases_asked_of_opa(cases: &mut [Asked]) -> usize {
    let strict: Vec<usize> = (0..cases.len())
        .filter(|&i| matches!(cases[i].expected, Expected::Error { strict: true, .. }))
        .collect();
    if strict.is_empty() {
        return 0;
    }
    let opa = OpaServer::start();
    let client = opa.client();
    for (n, &i) in strict.iter().enumerate() {
        let prefix = format!("conformance/{n}/");
        let got = ask(&client, &cases[i], &prefix).await;
        for id in client
            .policies()
            .await
            .expect("OPA lists its policies")
            .keys()
        {
            if id.starts_with(&prefix) {
                client
                    .delete_policy(id)
                    .await
                    .expect("OPA deletes a policy");
            }
        }
        cases[i].expected = match got {
            Got::Answer(value) => Expected::Answer(value),
            Got::Failed(text) => Expected::Error {
                strict: false,
                text,
            },
        };
    }
    strict.len()
}

/// Equal as OPA compares JSON results: numbers by value.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// An array's elements in one order (OPA's runner sorts them where the
/// case says `sort_bindings`).
fn sorted(value: &Value) -> Value {
    match value {
        Value::Array(items) => {
            let mut items = items.clone();
            items.sort_by_key(|v| v.to_string());
            Value::Array(items)
        }
        other => other.clone(),
    }
}

fn verdict(case: &Asked, got: &Got) -> Verdict {
    match (&case.expected, got) {
        (Expected::Error { .. }, Got::Failed(_)) => Verdict::Agree,
        (Expected::Error { .. }, Got::Answer(_)) => Verdict::Unlike,
        (Expected::Answer(_), Got::Failed(_)) => Verdict::Refused,
        (Expected::Answer(want), Got::Answer(got)) => {
            let equal = match (want, got) {
                (None, None) => true,
                (Some(want), Some(got)) if case.sort_bindings => same(&sorted(want), &sorted(got)),
                (Some(want), Some(got)) => same(want, got),
                _ => false,
            };
            if equal {
                Verdict::Agree
            } else {
                Verdict::Unlike
            }
        }
    }
}

/// A failure's message in one short line, for grouping.
fn reason(message: &str) -> String {
    let line = message
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(message)
        .trim();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    line.chars().take(160).collect()
}

fn show(got: &Got) -> String {
    match got {
        Got::Answer(Some(v)) => v.to_string(),
        Got::Answer(None) => "undefined".to_owned(),
        Got::Failed(e) => format!("error: {}", reason(e)),
    }
}

fn shown_expected(expected: &Expected) -> String {
    match expected {
        Expected::Answer(Some(v)) => v.to_string(),
        Expected::Answer(None) => "undefined".to_owned(),
        Expected::Error { strict, text } => {
            format!("error{}: {text}", if *strict { " (strict)" } else { "" })
        }
    }
}

/// The allowed refusals: note -> reason.
fn allowed_refusals() -> BTreeMap<&'static str, &'static str> {
    REFUSED
        .lines()
        // A comment has no tab (a case's note may start with `#`).
        .filter(|l| !l.trim().is_empty() && (!l.starts_with('#') || l.contains('\t')))
        .map(|l| {
            let (note, why) = l
                .split_once('\t')
                .unwrap_or_else(|| panic!("refused.txt: `{l}` has no tab before its reason"));
            (note, why)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_engine_answers_opas_conformance_cases_as_opa_does() {
    let dir = cases_dir();
    let cases = load_cases(&dir);
    let mut not_asked: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut asked_cases = Vec::new();
    for case in cases {
        match asked(case) {
            Ok(case) => asked_cases.push(case),
            Err(why) => *not_asked.entry(why).or_default() += 1,
        }
    }
    let of_opa = strict_cases_asked_of_opa(&mut asked_cases).await;
    let allowed = allowed_refusals();
    let mut report = String::new();
    let mut failures = Vec::new();
    let mut slowest = Vec::new();
    for (memory, bytes) in [("on", 16 * 1024 * 1024), ("off", 0)] {
        let mut counts: BTreeMap<Verdict, usize> = BTreeMap::new();
        let mut refused_now = BTreeSet::new();
        // A few at a time: the engine evaluates on the blocking pool, one
        // evaluation per core.
        let answers: Vec<(Got, Duration)> = futures::stream::iter(&asked_cases)
            .map(|case| async move {
                let engine = Embedded::new().with_decision_cache(bytes);
                let started = std::time::Instant::now();
                let got = ask(&engine, case, "").await;
                (got, started.elapsed())
            })
            .buffered(4)
            .collect()
            .await;
        for (case, (got, took)) in asked_cases.iter().zip(answers) {
            slowest.push((took, case.note.as_str()));
            let verdict = verdict(case, &got);
            *counts.entry(verdict).or_default() += 1;
            match verdict {
                Verdict::Agree => {}
                Verdict::Unlike => failures.push(format!(
                    "memory {memory}: {}: answered {} where OPA {}",
                    case.note,
                    show(&got),
                    shown_expected(&case.expected)
                )),
                Verdict::Refused => {
                    refused_now.insert(case.note.as_str());
                    if !allowed.contains_key(case.note.as_str()) {
                        failures.push(format!(
                            "memory {memory}: {}: refused ({}) where OPA answers {}; not listed in refused.txt",
                            case.note,
                            show(&got),
                            shown_expected(&case.expected)
                        ));
                    }
                }
            }
        }
        for note in allowed.keys() {
            if !refused_now.contains(note) {
                failures.push(format!(
                    "memory {memory}: {note} is listed in refused.txt but no longer refused: remove it"
                ));
            }
        }
        let _ = writeln!(
            report,
            "decision memory {memory}: {} cases asked: {} agree, {} refused, {} unlike OPA",
            asked_cases.len(),
            counts.get(&Verdict::Agree).unwrap_or(&0),
            counts.get(&Verdict::Refused).unwrap_or(&0),
            counts.get(&Verdict::Unlike).unwrap_or(&0),
        );
    }
    slowest.sort_by(|a, b| b.cmp(a));
    let total: Duration = slowest.iter().map(|(d, _)| *d).sum();
    let _ = writeln!(
        report,
        "asked in {total:?}; the slowest: {:?}",
        &slowest[..slowest.len().min(15)]
    );
    let _ = writeln!(
        report,
        "{of_opa} cases expecting strict builtin errors: their expectation is a real OPA's answer (its server's default)"
    );
    for (why, n) in &not_asked {
        let _ = writeln!(report, "not asked: {n}: {why}");
    }
    println!("OPA conformance cases from {}:\n{report}", dir.display());
    assert!(
        failures.is_empty(),
        "{report}\n{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
