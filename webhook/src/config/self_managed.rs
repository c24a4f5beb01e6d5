//! The flags of self-managed certificates and the references they name.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;

/// Flags of self-managed certificates.
#[derive(Debug, Clone, Args)]
pub(crate) struct SelfManagedTlsArgs {
    /// Keep the CA and serving certificate in this Secret (`NAMESPACE/NAME`):
    /// create them, renew them before they expire and serve them. Excludes
    /// --tls-cert/--tls-key.
    #[arg(long, env = "PLACEMENT_TLS_SECRET", conflicts_with_all = ["tls_cert", "tls_key", "cert_dir"])]
    pub tls_secret: Option<SecretRef>,
    /// DNS names of the serving certificate (the webhook's Service, e.g.
    /// `placement-webhook.placement-system.svc`); repeatable.
    #[arg(
        long = "tls-dns-name",
        env = "PLACEMENT_TLS_DNS_NAMES",
        value_delimiter = ',',
        requires = "tls_secret"
    )]
    pub tls_dns_names: Vec<String>,
    /// Webhook configuration whose `caBundle` the webhook keeps equal to its CA
    /// bundle: `mutatingwebhookconfigurations/NAME` or
    /// `validatingwebhookconfigurations/NAME`; repeatable.
    #[arg(
        long = "inject-ca-into",
        env = "PLACEMENT_INJECT_CA_INTO",
        value_delimiter = ',',
        requires = "tls_secret"
    )]
    pub inject_ca_into: Vec<ConfigurationRef>,
    /// Webhook configuration manifest (YAML or JSON file) to create in the
    /// API server at start, and again whenever it is missing, with its
    /// `caBundle` kept like --inject-ca-into's: for an API server Helm does
    /// not reach, such as Karmada's; repeatable.
    #[arg(
        long = "register-configuration",
        env = "PLACEMENT_REGISTER_CONFIGURATIONS",
        value_delimiter = ',',
        requires = "tls_secret"
    )]
    pub register_configurations: Vec<std::path::PathBuf>,
    /// Lifetime of a new CA (renewed when a third is left).
    #[arg(long, env = "PLACEMENT_CA_VALIDITY", default_value = "8760h", value_parser = humantime::parse_duration)]
    pub ca_validity: Duration,
    /// Lifetime of a new serving certificate (renewed when a third is left).
    #[arg(long, env = "PLACEMENT_CERT_VALIDITY", default_value = "2160h", value_parser = humantime::parse_duration)]
    pub cert_validity: Duration,
}

/// `NAMESPACE/NAME` of a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl FromStr for SecretRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(SecretRef {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
        }
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A webhook configuration to inject the CA bundle into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigurationRef {
    Mutating(String),
    Validating(String),
}

impl FromStr for ConfigurationRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some(("mutatingwebhookconfigurations", name)) if !name.is_empty() => {
                Ok(ConfigurationRef::Mutating(name.to_owned()))
            }
            Some(("validatingwebhookconfigurations", name)) if !name.is_empty() => {
                Ok(ConfigurationRef::Validating(name.to_owned()))
            }
            _ => Err(format!(
                "expected mutatingwebhookconfigurations/NAME or validatingwebhookconfigurations/NAME, got {s:?}"
            )),
        }
    }
}

impl fmt::Display for ConfigurationRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigurationRef::Mutating(name) => write!(f, "mutatingwebhookconfigurations/{name}"),
            ConfigurationRef::Validating(name) => {
                write!(f, "validatingwebhookconfigurations/{name}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_print() {
        let secret: SecretRef = "placement-system/placement-policy-webhook-tls"
            .parse()
            .unwrap();
        assert_eq!(
            secret.to_string(),
            "placement-system/placement-policy-webhook-tls"
        );
        assert!("no-namespace".parse::<SecretRef>().is_err());
        assert!("a/b/c".parse::<SecretRef>().is_err());
        let mutating: ConfigurationRef = "mutatingwebhookconfigurations/placement-policy"
            .parse()
            .unwrap();
        assert_eq!(
            mutating,
            ConfigurationRef::Mutating("placement-policy".into())
        );
        assert_eq!(
            mutating.to_string(),
            "mutatingwebhookconfigurations/placement-policy"
        );
        assert!("services/x".parse::<ConfigurationRef>().is_err());
    }
}
