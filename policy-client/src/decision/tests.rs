use super::*;
use serde_json::json;

#[test]
fn strings_are_used_as_is_and_other_values_serialized_compactly() {
    let d = Decision::from_result(&json!({
        "annotations": {
            "a": "plain",
            "b": {"clusters": {"eu-1": {"weight": 1}}, "rebalance": true},
            "c": 3,
            "d": true,
            "e": null,
            "f": ["x", "y"]
        },
        "errors": []
    }))
    .unwrap();
    assert_eq!(d.annotations["a"], "plain");
    assert_eq!(
        d.annotations["b"],
        r#"{"clusters":{"eu-1":{"weight":1}},"rebalance":true}"#
    );
    assert_eq!(d.annotations["c"], "3");
    assert_eq!(d.annotations["d"], "true");
    assert_eq!(d.annotations["e"], "null");
    assert_eq!(d.annotations["f"], r#"["x","y"]"#);
    assert!(d.errors.is_empty());
    assert!(!d.is_denied());
}

#[test]
fn missing_fields_are_an_incomplete_policy_not_none() {
    // What OPA answers for the shipped decision package without its rules.
    assert_eq!(
        Decision::from_result(&json!({})),
        Err(DecisionError::Missing("annotations"))
    );
    assert_eq!(
        Decision::from_result(&json!({"annotations": {}, "errors": null})),
        Err(DecisionError::Missing("errors"))
    );
    let d = Decision::from_result(&json!({"annotations": {}, "errors": []})).unwrap();
    assert_eq!(d, Decision::default());
}

#[test]
fn errors_are_kept_in_order_and_deny() {
    let d = Decision::from_result(&json!({
        "errors": ["first", "second", {"code": 7}],
        "annotations": {"a": "b"}
    }))
    .unwrap();
    assert_eq!(d.errors, vec!["first", "second", r#"{"code":7}"#]);
    assert!(d.is_denied());
    assert_eq!(d.annotations.len(), 1);
}

#[test]
fn wrong_shapes_are_named_errors() {
    assert_eq!(
        Decision::from_result(&json!("x")),
        Err(DecisionError::NotAnObject("a string"))
    );
    assert_eq!(
        Decision::from_result(&json!({"annotations": ["a"], "errors": []})),
        Err(DecisionError::AnnotationsNotAnObject("an array"))
    );
    assert_eq!(
        Decision::from_result(&json!({"annotations": {}, "errors": "bad"})),
        Err(DecisionError::ErrorsNotAnArray("a string"))
    );
    let msg = Decision::from_result(&json!({"annotations": {}, "errors": {"a": 1}}))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`errors` must be an array"), "{msg}");
}
