use super::*;
use serde_json::Value;

#[test]
fn status_annotations() {
    assert_eq!(PolicyStatus::Ok.to_annotation(), r#"{"status":"ok"}"#);
    let error = PolicyStatus::Error {
        errors: vec![CompileError {
            file: Some("ns/cm/key".into()),
            row: Some(3),
            col: Some(22),
            code: Some("rego_parse_error".into()),
            message: "unexpected eof token".into(),
        }],
    };
    assert_eq!(
        error.to_annotation(),
        r#"{"status":"error","errors":[{"file":"ns/cm/key","row":3,"col":22,"code":"rego_parse_error","message":"unexpected eof token"}]}"#
    );
    // kube-mgmt's shape: one error as itself, several as a list.
    let kube_mgmt: Value = serde_json::from_str(&error.to_kube_mgmt_annotation()).unwrap();
    assert_eq!(kube_mgmt["status"], "error");
    assert_eq!(kube_mgmt["error"]["code"], "rego_parse_error");
    let PolicyStatus::Error { errors } = &error else {
        unreachable!()
    };
    let two = PolicyStatus::Error {
        errors: vec![errors[0].clone(), errors[0].clone()],
    };
    let kube_mgmt: Value = serde_json::from_str(&two.to_kube_mgmt_annotation()).unwrap();
    assert_eq!(kube_mgmt["error"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        PolicyStatus::Ok.to_kube_mgmt_annotation(),
        r#"{"status":"ok"}"#
    );
    let ok: Result<(), Vec<CompileError>> = Ok(());
    assert_eq!(PolicyStatus::from_outcomes([&ok, &ok]), PolicyStatus::Ok);
    let bad: Result<(), Vec<CompileError>> = Err(vec![CompileError {
        file: None,
        row: None,
        col: None,
        code: None,
        message: "m".into(),
    }]);
    assert!(matches!(
        PolicyStatus::from_outcomes([&ok, &bad]),
        PolicyStatus::Error { errors } if errors.len() == 1
    ));
}
