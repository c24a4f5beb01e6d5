//! The placement decision a policy returns: `{"annotations": {k: v}, "errors": [..]}`.

use std::collections::BTreeMap;

use serde_json::Value;

/// A parsed placement decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Desired annotation values, already in their string form.
    pub annotations: BTreeMap<String, String>,
    /// Policy errors; non-empty means the request is denied.
    pub errors: Vec<String>,
    /// The weights of the policy's placement are deliberate (the optional
    /// `policy_weights: true`, e.g. weighting by free capacity): where a
    /// scheduler is also given weights (a Karmada binding's
    /// `staticWeightList`), the policy's win. Absent or false: the policy
    /// weighs evenly, and given weights replace its own.
    pub policy_weights: bool,
}

/// The policy's result does not have the decision's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    #[error("policy decision must be a JSON object with `annotations` and `errors`, got {0}")]
    NotAnObject(&'static str),
    /// The decision package is there but not this value: the policy set is
    /// incomplete (e.g. a module its rules live in is not loaded). Never "none".
    #[error(
        "policy decision has no `{0}`: the policy is incomplete (is a module it depends on missing?)"
    )]
    Missing(&'static str),
    #[error("policy decision field `annotations` must be an object, got {0}")]
    AnnotationsNotAnObject(&'static str),
    #[error("policy decision field `errors` must be an array (or a set) of messages, got {0}")]
    ErrorsNotAnArray(&'static str),
    #[error("policy decision field `policy_weights` must be a boolean, got {0}")]
    PolicyWeightsNotABoolean(&'static str),
}

impl Decision {
    /// Parse the result document of the decision query.
    ///
    /// Annotation values that are strings are used as they are; any other JSON value
    /// is serialized compactly, because Kubernetes annotations are strings. Both
    /// fields must be there (empty when there is nothing): a decision without one
    /// comes from an incomplete policy set and is never read as "nothing to
    /// place". Error entries that are not strings are serialized compactly so
    /// that no message is lost.
    pub fn from_result(result: &Value) -> Result<Self, DecisionError> {
        let Value::Object(fields) = result else {
            return Err(DecisionError::NotAnObject(json_type(result)));
        };
        let annotations = match fields.get("annotations") {
            None | Some(Value::Null) => return Err(DecisionError::Missing("annotations")),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| (k.clone(), annotation_value(v)))
                .collect(),
            Some(other) => return Err(DecisionError::AnnotationsNotAnObject(json_type(other))),
        };
        let errors = match fields.get("errors") {
            None | Some(Value::Null) => return Err(DecisionError::Missing("errors")),
            Some(Value::Array(items)) => items.iter().map(annotation_value).collect(),
            Some(other) => return Err(DecisionError::ErrorsNotAnArray(json_type(other))),
        };
        let policy_weights = match fields.get("policy_weights") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(DecisionError::PolicyWeightsNotABoolean(json_type(other))),
        };
        Ok(Decision {
            annotations,
            errors,
            policy_weights,
        })
    }

    pub fn is_denied(&self) -> bool {
        !self.errors.is_empty()
    }
}

/// The string form of a policy value.
pub fn annotation_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
