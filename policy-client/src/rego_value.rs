//! JSON to Rego values, for the embedded engine's input and data.

use std::collections::BTreeMap;

use serde_json::Value;

/// JSON to a Rego value, structurally. Unlike regorus's serde path this cannot
/// fail: that path reads an object with the key `$serde_json::private::Number`
/// as a number and fails when its value is not one, which let any client turn
/// its own input into an engine error.
pub(crate) fn to_rego(value: &Value) -> regorus::Value {
    match value {
        Value::Null => regorus::Value::Null,
        Value::Bool(b) => regorus::Value::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                regorus::Value::from(i)
            } else if let Some(u) = n.as_u64() {
                regorus::Value::from(u)
            } else {
                // Without serde_json's arbitrary precision every other number is
                // a finite f64.
                regorus::Value::from(n.as_f64().unwrap_or_default())
            }
        }
        Value::String(s) => regorus::Value::from(s.as_str()),
        Value::Array(items) => regorus::Value::from(items.iter().map(to_rego).collect::<Vec<_>>()),
        Value::Object(map) => regorus::Value::from(
            map.iter()
                .map(|(k, v)| (regorus::Value::from(k.as_str()), to_rego(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}
