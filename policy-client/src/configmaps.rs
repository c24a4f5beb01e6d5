//! Which ConfigMaps are policies and which are data: one selection for the sync
//! sidecar (which loads them) and the webhook (for which "policies exist" must
//! mean what an administrator sees).
//!
//! Two ways, both at once:
//! - **the policy namespace** (placement-policy's own): every ConfigMap there
//!   is a policy, whatever its labels, unless it carries the data label;
//! - **labelled ConfigMaps**, as kube-mgmt discovers them: in the `namespaces`
//!   listed (`*`: every namespace), a ConfigMap labelled `policy-label=policy-value`
//!   (default `openpolicyagent.org/policy=rego`) is a policy, one labelled
//!   `data-label=data-value` (default `openpolicyagent.org/data=opa`) is data;
//!   the data label wins when a ConfigMap carries both, as in kube-mgmt.

mod flags;
mod selection;

pub use flags::{ConfigMapFlags, ConfigMapFlagsEnv};
pub use selection::{
    ConfigMapKind, ConfigMapSelection, DEFAULT_DATA_LABEL, DEFAULT_DATA_VALUE,
    DEFAULT_POLICY_LABEL, DEFAULT_POLICY_NAMESPACE, DEFAULT_POLICY_VALUE, ROOT_CA_CONFIGMAP,
};
