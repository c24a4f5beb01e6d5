use super::*;

thread_local! {
    /// Modules parsed on this thread.
    static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

pub(super) fn note_parse() {
    PARSES.with(|n| n.set(n.get() + 1));
}

fn parses() -> usize {
    PARSES.with(std::cell::Cell::get)
}

fn set(modules: &[(&str, &str)]) -> BTreeMap<String, String> {
    modules
        .iter()
        .map(|(id, source)| ((*id).to_owned(), (*source).to_owned()))
        .collect()
}

fn paths(references: &[Reference]) -> Vec<String> {
    references.iter().map(|r| r.path.join(".")).collect()
}

/// The input the decision cache pins and the packages the loader orders by
/// are read from the same parse: each module parsed once answers both.
#[test]
fn one_parse_answers_both_questions() {
    let modules = set(&[
        (
            "main.rego",
            "package app.main\nimport data.app.lib as l\nallow if l.ok[input.kind]\nmsg := $\"{data.app.lib.why} {input.metadata.name}\"\n",
        ),
        (
            "lib.rego",
            "package app.lib\nok[k] := true if some k in data.kinds\nwhy := \"w\"\n",
        ),
    ]);
    let before = parses();
    let analysis = SetAnalysis::of(&modules);
    assert_eq!(parses() - before, 2, "one parse a module");
    let reads = crate::input_reads::InputReads::from_analysis(&analysis).unwrap();
    let main = analysis.modules["main.rego"].as_ref().unwrap();
    let lib = analysis.modules["lib.rego"].as_ref().unwrap();
    assert_eq!(parses() - before, 2, "both answers from that parse");
    assert_eq!(
        reads,
        crate::input_reads::InputReads::of(&modules).unwrap(),
        "the same answer as a fresh analysis"
    );
    assert_eq!(main.package, ["app", "main"]);
    assert_eq!(paths(&main.data_imports), ["app.lib"]);
    assert_eq!(paths(&main.data_references), ["app.lib.why"]);
    assert_eq!(lib.package, ["app", "lib"]);
    assert_eq!(paths(&lib.data_references), ["kinds"]);
}

#[test]
fn references_are_read_wherever_rego_has_them() {
    let module = ModuleAnalysis::parse(
        "m",
        r#"package a.b
# data.comment.only
import data.x.imported
import data.y.aliased as z
import input.metadata as meta
default f(_) := false
s := "data.not.a.reference"
r := data["q"]["w"][k].e if some k in data.coll.items
t := $"{data.tmpl.value} \{data.not.this}"
u if every v in data.every.domain { v }
w := v if v := data.p.q with data.with.target as 1 with input.kind as "Pod"
"#,
    )
    .unwrap();
    assert_eq!(module.package, ["a", "b"]);
    assert_eq!(paths(&module.data_imports), ["x.imported", "y.aliased"]);
    assert_eq!(
        paths(&module.data_references),
        [
            "q.w",
            "coll.items",
            "tmpl.value",
            "every.domain",
            "p.q",
            "with.target",
        ]
    );
    let input: Vec<String> = module
        .input_reads
        .iter()
        .map(|r| r.reference.path.join("."))
        .collect();
    assert_eq!(input, ["metadata", "kind"]);
    assert_eq!(module.functions, ["data.a.b.f"]);
    assert_eq!(
        module.with_targets,
        [
            ("data.with.target".to_owned(), 11),
            ("input.kind".to_owned(), 11)
        ]
    );
    let lines: Vec<u32> = module.data_references.iter().map(|r| r.line).collect();
    assert_eq!(lines, [8, 8, 9, 10, 11, 11]);
}

#[test]
fn a_module_that_does_not_parse_says_where_and_keeps_its_package() {
    let broken = "package io.k8s.rules\n\nallowed := \n";
    let error = ModuleAnalysis::parse("cm/key", broken).unwrap_err();
    assert_eq!(
        (error.module.as_str(), error.line),
        ("cm/key", 4),
        "{error}"
    );
    assert_eq!(
        ModuleAnalysis::package_line("cm/key", broken),
        Some(vec!["io".to_owned(), "k8s".to_owned(), "rules".to_owned()])
    );
    assert_eq!(
        ModuleAnalysis::package_line("cm/key", "no package here"),
        None
    );
}

#[test]
fn rego_v0_modules_parse_too() {
    let v0 = "package p\n\ndeny[msg] {\n  input.kind == \"Pod\"\n  msg := data.lib.message\n}\n";
    let module = ModuleAnalysis::parse("m", v0).unwrap();
    assert_eq!(paths(&module.data_references), ["lib.message"]);
    assert_eq!(module.input_reads[0].reference.path, ["kind"]);
}
