//! How to reach OPA: its URL (credentials in it become basic authentication,
//! never shown), its bearer token, timeouts, retries and TLS trust.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use reqwest::Url;
use reqwest::header::HeaderValue;

use crate::engine::EngineError;
use crate::retry::{Backoff, ENGINE_CALL_BACKOFF};

/// A bearer token. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(value: impl Into<String>) -> Self {
        Token(value.into().trim().to_owned())
    }
    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// How to reach OPA.
#[derive(Clone)]
pub struct OpaConfig {
    /// Base URL, e.g. `http://127.0.0.1:8181` (anything after the authority is kept
    /// as a prefix, so OPA behind a path-routing proxy works too). Credentials in
    /// it (`user:password@`) are sent as HTTP basic authentication and never shown.
    pub url: Url,
    pub token: Option<Token>,
    /// Limit for one HTTP request.
    pub request_timeout: Duration,
    pub retry: Backoff,
    /// CA (PEM) to trust for an `https` OPA: the only one trusted when given;
    /// without it, the system's CA certificates are.
    pub ca_pem: Option<Vec<u8>>,
    /// Accept any certificate from an `https` OPA (kube-mgmt's
    /// `--opa-allow-insecure`; for tests only).
    pub insecure: bool,
}

impl fmt::Debug for OpaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpaConfig")
            .field("url", &redacted_url(&self.url))
            .field("token", &self.token)
            .field("request_timeout", &self.request_timeout)
            .field("retry", &self.retry)
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

/// `url` as it may be shown: without the password, with the user name replaced.
pub fn redacted_url(url: &Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        return url.to_string();
    }
    let mut shown = url.clone();
    // Cannot fail: a URL with credentials has a host.
    let _ = shown.set_password(None);
    let _ = shown.set_username("redacted");
    shown.to_string()
}

impl OpaConfig {
    pub fn new(url: Url) -> Self {
        OpaConfig {
            url,
            token: None,
            request_timeout: Duration::from_secs(2),
            retry: ENGINE_CALL_BACKOFF,
            ca_pem: None,
            insecure: false,
        }
    }
}

/// `Basic` credentials from `user:password@` in the URL, as a header that is
/// never printed.
pub(super) fn basic_auth(url: &Url) -> Result<Option<HeaderValue>, EngineError> {
    if url.username().is_empty() && url.password().is_none() {
        return Ok(None);
    }
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| EngineError::Config("OPA URL credentials are not UTF-8".to_owned()))
    };
    let pair = format!(
        "{}:{}",
        decode(url.username())?,
        decode(url.password().unwrap_or_default())?
    );
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))
        .map_err(|_| EngineError::Config("OPA URL credentials do not fit a header".to_owned()))?;
    value.set_sensitive(true);
    Ok(Some(value))
}
