//! Forms regorus evaluates unlike OPA are refused at load, naming the form
//! and where it is; a path below a rule is looked up in the rule's document.

use super::*;

async fn load(module: &str) -> Result<(), EngineError> {
    Embedded::new().put_policy("m.rego", module).await
}

fn refusal(outcome: Result<(), EngineError>) -> (u32, String) {
    match outcome {
        Err(EngineError::Compile(errors)) => {
            let error = errors.first().expect("an error");
            assert_eq!(error.file.as_deref(), Some("m.rego"));
            (error.row.unwrap_or(0), error.message.clone())
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Each refused form (OPA's conformance cases `negation/not-body: ...`,
/// `aggregates/member check set with with both key and value`,
/// `walkbuiltin/array path not overwritten`) is refused on its line, and
/// the forms beside it that regorus evaluates as OPA does load.
#[tokio::test]
async fn forms_regorus_evaluates_unlike_opa_are_refused_at_load() {
    for (module, line, names) in [
        (
            "package t\n\np := a if {\n\tnot a = f(1)\n\ta = f(2)\n}\n\nf(x) := x\n",
            4,
            "`not x = y`",
        ),
        (
            "package t\n\nimport future.keywords.not\n\np if not {\n\tfalse\n}\n",
            5,
            "`not { ... }`",
        ),
        (
            "package t\n\np if {\n\t\"foo\", \"foo\" in {\"foo\", \"bar\"}\n}\n",
            4,
            "`key, value in collection`",
        ),
        (
            "package t\n\ns contains 1\n\np if 1, 1 in s\n",
            5,
            "`key, value in collection`",
        ),
        (
            "package t\n\np := {path: value |\n\t[path, value] := walk(input)\n\tcount(value) == 2\n}\n",
            4,
            "`[path, value] := walk(x)`",
        ),
    ] {
        let (row, message) = refusal(load(module).await);
        assert_eq!(row, line, "{module}: {message}");
        assert!(message.contains(names), "{module}: {message}");
        assert!(message.contains("regorus 0.14.1"), "{message}");
    }
    for module in [
        "package t\n\np if {\n\tx := 1\n\tnot x == 2\n}\n",
        "package t\n\np if not input.a = 1\n",
        "package t\n\np if {\n\tlocal = 2 + 3\n\tnot data.a[2] = local\n}\n",
        "package t\n\nf(x) if not x = 1\n\nallow := true\n\np if not allow = false\n",
        "package t\n\np if 0, \"a\" in [\"a\"]\n\nq if \"k\", 1 in {\"k\": 1}\n\nr if \"k\", 1 in input.o\n",
        "package t\n\np := [path | walk(input, [path, _])]\n",
        "package t\n\np := count(walk(input))\n",
    ] {
        load(module)
            .await
            .unwrap_or_else(|e| panic!("{module}: {e}"));
    }
}

/// OPA's conformance case `refheads/general, set leaf, deep query`: a set
/// defined both by a general reference (`p[q].r`) and a plain one
/// (`p.b.r`) holds both rules' members, which regorus keeps only in the
/// rule's whole document; a query below the rule is looked up there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_below_a_rule_is_looked_up_in_the_rules_document() {
    let engine = Embedded::new();
    engine
        .put_policy(
            "m.rego",
            "package test\n\np[q].r contains s if {\n\tx := [\"a\", \"b\", \"c\"]\n\tq := x[_]\n\ts := x[_]\n\tq != s\n}\n\np.b.r contains \"foo\"\n",
        )
        .await
        .unwrap();
    for (path, want) in [
        ("test/p/b/r/c", QueryOutcome::Defined(json!("c"))),
        (
            "test/p/b/r",
            QueryOutcome::Defined(json!(["a", "c", "foo"])),
        ),
        ("test/p/b/r/b", QueryOutcome::Undefined),
        ("test/p/x", QueryOutcome::Undefined),
    ] {
        assert_eq!(
            engine.query(path, &json!({}), soon()).await.unwrap(),
            want,
            "{path}"
        );
    }
}
