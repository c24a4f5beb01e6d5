use super::*;

/// `module`'s `p`, interpreted and compiled (with the replacements each
/// evaluator gets), which must agree.
fn both(module: &str) -> Value {
    let mut engine = regorus::Engine::new();
    register(&mut engine).unwrap();
    engine
        .add_policy("t.rego".to_owned(), module.to_owned())
        .unwrap();
    let interpreted = engine
        .eval_query("data.t.p".to_owned(), false)
        .unwrap()
        .result
        .first()
        .and_then(|r| r.expressions.first())
        .map_or(Value::Undefined, |e| e.value.clone());
    let policy = engine.compile_with_entrypoint(&"data.t.p".into()).unwrap();
    let mut program = (*regorus::languages::rego::compiler::Compiler::compile_from_policy(
        &policy,
        &["data.t.p"],
    )
    .unwrap())
    .clone();
    patch_program(&mut program);
    let mut vm = regorus::rvm::vm::RegoVM::new();
    vm.load_program(std::sync::Arc::new(program));
    vm.set_strict_builtin_errors(true);
    let compiled = vm.execute().unwrap();
    assert_eq!(interpreted, compiled, "{module}");
    interpreted
}

fn string(s: &str) -> Value {
    Value::from(s)
}

/// OPA's conformance cases `replacen/semantics/*`: Go's replacer, not one
/// pattern after another.
#[test]
fn replace_n_replaces_as_go_does() {
    for (patterns, s, want) in [
        (r#"{"info": "X", "anotherinfo": "Y"}"#, "anotherinfo", "Y"),
        (r#"{"a": "YY", "bba": "bX"}"#, "bbab", "bXb"),
        (r#"{"ab": "b", "b": "Y"}"#, "baaabbbba", "YaabYYYa"),
        (r#"{"a": "b", "b": "a"}"#, "abba", "baab"),
        (
            r#"{"a": "Xa", "ab": "X", "ba": "bYa", "aaa": "X"}"#,
            "aaaaab",
            "XaXaXaXaXab",
        ),
        (r#"{"aab": "Y", "a": "", "b": ""}"#, "bbaab", ""),
        (r#"{"": "X"}"#, "", "X"),
        (r#"{"": "X"}"#, "ab", "XaXbX"),
        (r#"{"": "X", "a": "Y"}"#, "ab", "XYXbX"),
        (r#"{"": "-", "é": "e"}"#, "aéb", "-a-e-b-"),
    ] {
        let module = format!("package t\n\np := strings.replace_n({patterns}, {s:?})\n");
        assert_eq!(both(&module), string(want), "{patterns} on {s}");
    }
}

/// `strings.count` counts as Go's `strings.Count` (OPA's
/// `strings/count_odd_even_case`), and an empty substring is no panic.
#[test]
fn count_counts_as_go_does() {
    for (s, sub, want) in [
        ("11111", "11", 2u64),
        ("aaaa", "aa", 2),
        ("héllo", "", 6),
        ("", "", 1),
    ] {
        let module = format!("package t\n\np := strings.count({s:?}, {sub:?})\n");
        assert_eq!(both(&module), Value::from(want), "{s} / {sub}");
    }
}

/// A brace group with an empty alternative matches its other alternatives
/// and nothing (OPA's `globmatch/empty pattern alternative`).
#[test]
fn glob_match_takes_an_empty_alternative() {
    assert_eq!(
        glob::expand("{**/,}x"),
        vec!["x".to_owned(), "**/x".to_owned()]
    );
    assert_eq!(glob::expand("{a,b}x"), vec!["{a,b}x".to_owned()]);
    assert_eq!(glob::expand(r"\{a,}x"), vec![r"\{a,}x".to_owned()]);
    for (pattern, s, want) in [
        ("{**/,}x", "x", true),
        ("{**/,}x", "a/b/x", true),
        ("{a,}x", "x", true),
        ("{a,}x", "ax", true),
        ("{a,}x", "bx", false),
        ("{a,{b,}}x", "x", true),
        ("{a,b}x", "bx", true),
    ] {
        let module = format!("package t\n\np := glob.match({pattern:?}, null, {s:?})\n");
        assert_eq!(both(&module), Value::from(want), "{pattern} on {s}");
    }
}

/// Float verbs as Go's `fmt` writes a float64 (OPA's `sprintf/float/exponent`
/// and the like), other verbs as before.
#[test]
fn sprintf_writes_floats_as_go_does() {
    for (format, f, want) in [
        ("%f", 100.0, "100.000000"),
        ("%f", 1.5, "1.500000"),
        ("%.2f", 1.005, "1.00"),
        ("%8.3f", -1.23456, "  -1.235"),
        ("%-8.1f", 2.25, "2.2     "),
        ("%+.1f", 2.0, "+2.0"),
        ("%08.2f", -1.5, "-0001.50"),
        ("%e", 100.0, "1.000000e+02"),
        ("%.2E", 0.000123, "1.23E-04"),
        ("%g", 100.0, "100"),
        ("%g", 1e6, "1e+06"),
        ("%g", 123456.0, "123456"),
        ("%g", 0.0001, "0.0001"),
        ("%g", 0.00001, "1e-05"),
        ("%g", 1.5, "1.5"),
        ("%.3g", 1234.5, "1.23e+03"),
        ("%.3g", 1.0, "1"),
        ("%G", 1e-7, "1E-07"),
        ("%g", 0.0, "0"),
    ] {
        assert_eq!(sprintf::go(format, f), want, "{format} of {f}");
    }
    for (call, want) in [
        (r#"sprintf("%f", [1e2])"#, "100.000000"),
        (
            r#"sprintf("%s: %.1f%%, %d", ["cpu", 2.25, 3])"#,
            "cpu: 2.2%, 3",
        ),
        (r#"sprintf("%v and %s", [1, "x"])"#, "1 and x"),
        (r#"sprintf("%f %f", [1.5])"#, "1.500000 %!f(MISSING)"),
    ] {
        let module = format!("package t\n\np := {call}\n");
        assert_eq!(both(&module), string(want), "{call}");
    }
}
