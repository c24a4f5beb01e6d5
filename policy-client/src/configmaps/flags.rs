//! The flags that choose the [`ConfigMapSelection`], kube-mgmt's names with
//! kube-mgmt's meaning, declared once for both components. Each component
//! reads them from environment variables of its own prefix
//! ([`ConfigMapFlagsEnv`]).

use std::fmt;
use std::marker::PhantomData;

use super::selection::{
    ConfigMapSelection, DEFAULT_DATA_LABEL, DEFAULT_DATA_VALUE, DEFAULT_POLICY_LABEL,
    DEFAULT_POLICY_VALUE,
};

/// The environment variable of each flag of [`ConfigMapFlags`].
pub trait ConfigMapFlagsEnv {
    const POLICY_NAMESPACE: &'static str;
    const NAMESPACES: &'static str;
    const ENABLE_POLICIES: &'static str;
    const POLICY_LABEL: &'static str;
    const POLICY_VALUE: &'static str;
    const DATA_LABEL: &'static str;
    const DATA_VALUE: &'static str;
}

/// Which ConfigMaps are policies and which data (`--enable-data`, which only
/// the loader has, is its own flag).
#[derive(clap::Args)]
pub struct ConfigMapFlags<E: ConfigMapFlagsEnv> {
    /// Namespace whose ConfigMaps are all policies (unless labelled as data)
    /// [default: kube-federation-scheduling-policy, unless --namespaces is given].
    #[arg(long, env = E::POLICY_NAMESPACE)]
    pub policy_namespace: Option<String>,

    /// Namespaces of labelled policy and data ConfigMaps, as kube-mgmt
    /// discovers them (comma-separated; `*` for all).
    #[arg(long, env = E::NAMESPACES, value_delimiter = ',')]
    pub namespaces: Vec<String>,

    /// Whether ConfigMaps are policies at all.
    #[arg(long, env = E::ENABLE_POLICIES, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_policies: bool,

    /// Label name of policy ConfigMaps in --namespaces.
    #[arg(long, env = E::POLICY_LABEL, default_value = DEFAULT_POLICY_LABEL)]
    pub policy_label: String,

    /// Label value of policy ConfigMaps.
    #[arg(long, env = E::POLICY_VALUE, default_value = DEFAULT_POLICY_VALUE)]
    pub policy_value: String,

    /// Label name of data ConfigMaps (in --namespaces and the policy
    /// namespace; never policies).
    #[arg(long, env = E::DATA_LABEL, default_value = DEFAULT_DATA_LABEL)]
    pub data_label: String,

    /// Label value of data ConfigMaps.
    #[arg(long, env = E::DATA_VALUE, default_value = DEFAULT_DATA_VALUE)]
    pub data_value: String,

    #[arg(skip)]
    env: PhantomData<E>,
}

impl<E: ConfigMapFlagsEnv> Clone for ConfigMapFlags<E> {
    fn clone(&self) -> Self {
        ConfigMapFlags {
            policy_namespace: self.policy_namespace.clone(),
            namespaces: self.namespaces.clone(),
            enable_policies: self.enable_policies,
            policy_label: self.policy_label.clone(),
            policy_value: self.policy_value.clone(),
            data_label: self.data_label.clone(),
            data_value: self.data_value.clone(),
            env: PhantomData,
        }
    }
}

impl<E: ConfigMapFlagsEnv> fmt::Debug for ConfigMapFlags<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigMapFlags")
            .field("policy_namespace", &self.policy_namespace)
            .field("namespaces", &self.namespaces)
            .field("enable_policies", &self.enable_policies)
            .field("policy_label", &self.policy_label)
            .field("policy_value", &self.policy_value)
            .field("data_label", &self.data_label)
            .field("data_value", &self.data_value)
            .finish()
    }
}

impl<E: ConfigMapFlagsEnv> ConfigMapFlags<E> {
    /// The selection, its labels checked so that a typo fails at start, not
    /// as a watch that never matches; `enable_data` is the loader's
    /// `--enable-data` (always on where there is no such flag).
    pub fn selection(&self, enable_data: bool) -> Result<ConfigMapSelection, String> {
        check_label("--policy-label", &self.policy_label, false)?;
        check_label("--policy-value", &self.policy_value, true)?;
        check_label("--data-label", &self.data_label, false)?;
        check_label("--data-value", &self.data_value, true)?;
        Ok(ConfigMapSelection::resolve(
            self.policy_namespace.clone(),
            self.namespaces.clone(),
            ConfigMapSelection {
                enable_policies: self.enable_policies,
                enable_data,
                policy_label: self.policy_label.clone(),
                policy_value: self.policy_value.clone(),
                data_label: self.data_label.clone(),
                data_value: self.data_value.clone(),
                ..ConfigMapSelection::default()
            },
        ))
    }
}

/// `text` is a label name (`is_value` false: an optional `prefix/` and a
/// name) or a label value; the error names `flag`.
fn check_label(flag: &str, text: &str, is_value: bool) -> Result<(), String> {
    let segment_ok = |s: &str| {
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    let ok = if is_value {
        segment_ok(text)
    } else {
        match text.split_once('/') {
            Some((prefix, name)) => {
                !prefix.is_empty() && !name.is_empty() && segment_ok(prefix) && segment_ok(name)
            }
            None => !text.is_empty() && segment_ok(text),
        }
    };
    if ok {
        Ok(())
    } else {
        let what = if is_value {
            "a label value"
        } else {
            "a label name"
        };
        Err(format!(
            "{flag} {text:?} is not {what} (letters, digits, '-', '_', '.'{})",
            if is_value {
                ""
            } else {
                ", one optional 'prefix/'"
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_and_values_are_checked() {
        assert!(check_label("--policy-label", "openpolicyagent.org/policy", false).is_ok());
        assert!(check_label("--policy-label", "placement-policy", false).is_ok());
        assert!(check_label("--policy-label", "", false).is_err());
        assert!(check_label("--policy-label", "a=b", false).is_err());
        assert!(check_label("--policy-label", "a b", false).is_err());
        assert!(check_label("--policy-value", "rego", true).is_ok());
        assert!(check_label("--policy-value", "", true).is_ok());
        assert!(check_label("--policy-value", "a/b", true).is_err());
    }
}
