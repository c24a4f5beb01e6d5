//! Open Policy Agent over its REST API.

mod body;
mod config;
mod errors;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::engine::{EncodedJson, EngineError, PolicyEngine, QueryOutcome, path_segments};
use crate::retry::{Backoff, parse_retry_after, retry_until};
use body::{Body, PiecesBody, QueryBody};
use config::basic_auth;
pub use config::{OpaConfig, Token, redacted_url};
use errors::{error_chain, http_error};

/// The OPA REST client.
#[derive(Clone)]
pub struct Opa {
    http: reqwest::Client,
    base: Url,
    auth: Option<HeaderValue>,
    retry: Backoff,
    request_timeout: Duration,
}

impl fmt::Debug for Opa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opa")
            .field("base", &self.base.as_str())
            .field("token", &self.auth.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Opa {
    /// Build a client.
    pub fn new(config: OpaConfig) -> Result<Self, EngineError> {
        // Binaries install the provider in `main`; this covers library users. Only
        // `ring` is in the dependency tree, so this cannot pick a different one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true);
        // Images carry no system CA store: a plain-HTTP OPA (the usual one, on
        // the pod's loopback) must not need one, and a given CA is all we trust.
        let https = config.url.scheme() == "https";
        if let Some(pem) = &config.ca_pem {
            let cert = reqwest::Certificate::from_pem(pem)
                .map_err(|e| EngineError::Config(format!("OPA CA certificate: {e}")))?;
            builder = builder.tls_certs_only([cert]);
        } else if !https {
            builder = builder.tls_certs_only([]);
        }
        if config.insecure {
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
        let http = builder.build().map_err(|e| {
            let hint = if https && config.ca_pem.is_none() {
                " (an https OPA URL without a CA file needs the system's CA certificates; give the OPA's CA file instead)"
            } else {
                ""
            };
            EngineError::Config(format!(
                "HTTP client: {}{hint}",
                error_chain(&e.without_url())
            ))
        })?;
        let url_credentials = basic_auth(&config.url)?;
        let auth = match &config.token {
            Some(_) if url_credentials.is_some() => {
                return Err(EngineError::Config(
                    "give OPA either a bearer token or credentials in the URL, not both (both use the Authorization header)".to_owned(),
                ));
            }
            None => url_credentials,
            Some(token) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                    .map_err(|_| {
                        EngineError::Config(
                            "OPA token contains characters not allowed in an HTTP header"
                                .to_owned(),
                        )
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        if !matches!(config.url.scheme(), "http" | "https") {
            return Err(EngineError::Config(format!(
                "OPA URL must be http or https, got {:?}",
                config.url.scheme()
            )));
        }
        let mut base = config.url.clone();
        base.set_query(None);
        base.set_fragment(None);
        // The credentials live in `auth` only, so nothing that shows the base
        // URL (logs, errors, Debug) can show them.
        let _ = base.set_password(None);
        let _ = base.set_username("");
        Ok(Opa {
            http,
            base,
            auth,
            retry: config.retry,
            request_timeout: config.request_timeout,
        })
    }

    pub fn base_url(&self) -> &Url {
        &self.base
    }

    fn url(&self, prefix: &[&str], path: &str) -> Result<Url, EngineError> {
        let mut url = self.base.clone();
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|_| EngineError::Config("OPA URL cannot be a base URL".to_owned()))?;
            segments.pop_if_empty();
            segments.extend(prefix);
            segments.extend(path_segments(path)?);
        }
        Ok(url)
    }

    /// One HTTP exchange, mapped to the engine's error classes.
    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<Body>,
    ) -> Result<(StatusCode, bytes::Bytes), EngineError> {
        let endpoint = format!("{method} {}", url.path());
        let mut request = self.http.request(method, url);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        request = match body {
            Some(Body::Encoded(json)) => {
                let request = request.header(CONTENT_TYPE, "application/json");
                match json.pieces() {
                    [one] => request.body(one.clone()),
                    _ => request.body(reqwest::Body::wrap(PiecesBody::new(&json))),
                }
            }
            Some(Body::JsonPatch(value)) => request
                .header(CONTENT_TYPE, "application/json-patch+json")
                .body(value.to_string()),
            Some(Body::Text(text)) => request.header(CONTENT_TYPE, "text/plain").body(text),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|e| self.transport_error(&endpoint, e))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(&endpoint, e))?;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(EngineError::Unauthorized {
                status: status.as_u16(),
            });
        }
        if status.is_client_error() || status.is_server_error() {
            return Err(http_error(endpoint, status, &bytes, retry_after));
        }
        Ok((status, bytes))
    }

    fn transport_error(&self, endpoint: &str, e: reqwest::Error) -> EngineError {
        let endpoint = format!("{} ({endpoint})", self.base.origin().ascii_serialization());
        if e.is_timeout() {
            EngineError::Timeout {
                endpoint,
                timeout: self.request_timeout,
            }
        } else {
            // `without_url` keeps anything in the URL out of the message.
            let detail = error_chain(&e.without_url());
            EngineError::Unreachable { endpoint, detail }
        }
    }

    async fn query_once(
        &self,
        url: &Url,
        body: &bytes::Bytes,
    ) -> Result<QueryOutcome, EngineError> {
        let (_, bytes) = self
            .send(
                Method::POST,
                url.clone(),
                Some(Body::Encoded(body.clone().into())),
            )
            .await
            .map_err(|e| match e {
                // OPA refuses an input it cannot decode: the caller's fault.
                EngineError::Http {
                    status: 400 | 413,
                    message,
                    ..
                } => EngineError::InvalidInput(message),
                other => other,
            })?;
        let mut parsed: serde_json::Map<String, Value> = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::InvalidResponse(format!("decision response: {e}")))?;
        Ok(match parsed.remove("result") {
            Some(result) => QueryOutcome::Defined(result),
            None => QueryOutcome::Undefined,
        })
    }
}

#[async_trait]
impl PolicyEngine for Opa {
    fn name(&self) -> &'static str {
        "opa"
    }

    async fn query(
        &self,
        path: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        let url = self.url(&["v1", "data"], path)?;
        // Serialized once: retries resend the same bytes (a cheap `Bytes` clone).
        let body = serde_json::to_vec(&QueryBody { input })
            .map(bytes::Bytes::from)
            .map_err(|e| EngineError::InvalidResponse(format!("input is not JSON: {e}")))?;
        let endpoint = format!("POST {}", url.path());
        retry_until(self.retry, deadline, &endpoint, || {
            self.query_once(&url, &body)
        })
        .await
    }

    async fn put_data(&self, path: &str, value: &Value) -> Result<(), EngineError> {
        let json = serde_json::to_vec(value).map_err(|e| EngineError::InvalidPath {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        self.put_data_encoded(path, json.into()).await
    }

    async fn put_data_encoded(&self, path: &str, json: EncodedJson) -> Result<(), EngineError> {
        let url = self.url(&["v1", "data"], path)?;
        self.send(Method::PUT, url, Some(Body::Encoded(json)))
            .await
            .map(drop)
    }

    async fn patch_data(&self, path: &str, patch: &json_patch::Patch) -> Result<(), EngineError> {
        let url = self.url(&["v1", "data"], path)?;
        let body = serde_json::to_value(patch).map_err(|e| EngineError::InvalidPath {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        match self
            .send(Method::PATCH, url, Some(Body::JsonPatch(body)))
            .await
        {
            Err(EngineError::Http {
                status: 404,
                message,
                ..
            }) => Err(EngineError::NotFound {
                path: path.to_owned(),
                message,
            }),
            other => other.map(drop),
        }
    }

    async fn delete_data(&self, path: &str) -> Result<(), EngineError> {
        let url = self.url(&["v1", "data"], path)?;
        match self.send(Method::DELETE, url, None).await {
            Ok(_) | Err(EngineError::Http { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn put_policy(&self, id: &str, source: &str) -> Result<(), EngineError> {
        let url = self.url(&["v1", "policies"], id)?;
        self.send(Method::PUT, url, Some(Body::Text(source.to_owned())))
            .await
            .map(drop)
    }

    async fn delete_policy(&self, id: &str) -> Result<(), EngineError> {
        let url = self.url(&["v1", "policies"], id)?;
        match self.send(Method::DELETE, url, None).await {
            Ok(_) | Err(EngineError::Http { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn policies(&self) -> Result<BTreeMap<String, String>, EngineError> {
        #[derive(Deserialize)]
        struct Listing {
            #[serde(default)]
            result: Vec<Module>,
        }
        #[derive(Deserialize)]
        struct Module {
            id: String,
            #[serde(default)]
            raw: String,
        }
        let url = self.url(&["v1", "policies"], "")?;
        let (_, bytes) = self.send(Method::GET, url, None).await?;
        let listing: Listing = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::InvalidResponse(format!("policy listing: {e}")))?;
        Ok(listing.result.into_iter().map(|m| (m.id, m.raw)).collect())
    }

    async fn health(&self) -> Result<(), EngineError> {
        let url = self.url(&["health"], "")?;
        self.send(Method::GET, url, None).await.map(drop)
    }

    /// OPA's `labels.id` (`GET /v1/config`): a random id each start, unless
    /// the operator configured one (then `None`: a sentinel must tell).
    async fn instance_id(&self) -> Result<Option<String>, EngineError> {
        let url = self.url(&["v1", "config"], "")?;
        let (_, bytes) = match self.send(Method::GET, url, None).await {
            Ok(answer) => answer,
            // An OPA whose authorization hides its configuration.
            Err(EngineError::Http {
                status: 401 | 403 | 404,
                ..
            }) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let config: Value = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::InvalidResponse(format!("OPA configuration: {e}")))?;
        Ok(config
            .pointer("/result/labels/id")
            .and_then(Value::as_str)
            // A configured id survives restarts and tells nothing.
            .filter(|id| uuid_like(id))
            .map(str::to_owned))
    }
}

/// Whether `id` looks like the UUID OPA generates at start.
fn uuid_like(id: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    #[tokio::test]
    async fn a_document_in_pieces_is_sent_whole_with_its_length() {
        use http_body::Body as _;
        use http_body_util::BodyExt as _;
        let json = EncodedJson::from_pieces(vec![
            bytes::Bytes::from_static(b"{\"a\":"),
            bytes::Bytes::new(),
            bytes::Bytes::from_static(b"[1,2]"),
            bytes::Bytes::from_static(b"}"),
        ]);
        let body = PiecesBody::new(&json);
        assert_eq!(body.size_hint().exact(), Some(11));
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..], br#"{"a":[1,2]}"#);
        assert_eq!(sent.len(), json.len());
        assert_eq!(json.joined(), sent);
    }

    #[test]
    fn token_is_never_printed() {
        let token = Token::new("super-secret-token-value\n");
        assert_eq!(token.expose(), "super-secret-token-value");
        assert!(!format!("{token:?}").contains("secret"));
        let mut config = OpaConfig::new(Url::parse("http://127.0.0.1:1").unwrap());
        config.token = Some(token);
        let opa = Opa::new(config).unwrap();
        assert!(!format!("{opa:?}").contains("secret"));
    }

    #[test]
    fn urls_keep_the_base_prefix_and_escape_segments() {
        let opa = Opa::new(OpaConfig::new(
            Url::parse("http://opa:8181/proxy/").unwrap(),
        ))
        .unwrap();
        let url = opa.url(&["v1", "policies"], "ns/name/key 1.rego").unwrap();
        assert_eq!(
            url.as_str(),
            "http://opa:8181/proxy/v1/policies/ns/name/key%201.rego"
        );
        let url = opa
            .url(&["v1", "data"], "io/k8s/federation/admission")
            .unwrap();
        assert_eq!(url.path(), "/proxy/v1/data/io/k8s/federation/admission");
        let root = opa.url(&["v1", "data"], "").unwrap();
        assert_eq!(root.path(), "/proxy/v1/data");
    }

    #[test]
    fn compile_errors_are_structured() {
        let body = br#"{"code":"invalid_parameter","message":"error(s) occurred while compiling module(s)","errors":[{"code":"rego_parse_error","message":"unexpected eof token","location":{"file":"p/q","row":3,"col":5}}]}"#;
        match http_error(
            "PUT /v1/policies/p/q".into(),
            StatusCode::BAD_REQUEST,
            body,
            None,
        ) {
            EngineError::Compile(errors) => {
                assert_eq!(errors.len(), 1);
                assert_eq!(errors[0].file.as_deref(), Some("p/q"));
                assert_eq!(errors[0].row, Some(3));
                assert_eq!(errors[0].col, Some(5));
                assert_eq!(errors[0].code.as_deref(), Some("rego_parse_error"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn evaluation_errors_are_permanent_and_keep_the_policy_message() {
        // OPA v1's answer for a complete rule with two values.
        let body = br#"{"code":"internal_error","message":"error(s) occurred while evaluating query","errors":[{"code":"eval_conflict_error","message":"complete rules must not produce multiple outputs","location":{"file":"p.rego","row":3,"col":1}}]}"#;
        let err = http_error(
            "POST /v1/data/x".into(),
            StatusCode::INTERNAL_SERVER_ERROR,
            body,
            None,
        );
        assert!(!err.is_transient(), "{err:?}");
        assert!(
            err.to_string().contains(
                "p.rego:3:1: eval_conflict_error: complete rules must not produce multiple outputs"
            ),
            "{err}"
        );
        // Cancellation (OPA's own timeout or shutdown) may pass.
        let cancelled = br#"{"code":"internal_error","message":"error(s) occurred while evaluating query","errors":[{"code":"eval_cancel_error","message":"caller cancelled query execution"}]}"#;
        let err = http_error(
            "POST /v1/data/x".into(),
            StatusCode::INTERNAL_SERVER_ERROR,
            cancelled,
            None,
        );
        assert!(err.is_transient(), "{err:?}");
    }

    #[test]
    fn url_credentials_become_basic_auth_and_are_never_shown() {
        let url = Url::parse("http://opa-user:s3cr%40t-pass@127.0.0.1:8181/prefix").unwrap();
        let config = OpaConfig::new(url.clone());
        assert!(!format!("{config:?}").contains("s3cr"), "{config:?}");
        let opa = Opa::new(config).unwrap();
        assert!(!format!("{opa:?}").contains("s3cr"), "{opa:?}");
        assert!(!opa.base_url().as_str().contains("s3cr"));
        assert!(!opa.base_url().as_str().contains("opa-user"));
        let auth = opa.auth.as_ref().expect("basic auth");
        assert!(auth.is_sensitive());
        let expected = base64::engine::general_purpose::STANDARD.encode("opa-user:s3cr@t-pass");
        assert_eq!(auth.to_str().unwrap(), format!("Basic {expected}"));
        assert_eq!(redacted_url(&url), "http://redacted@127.0.0.1:8181/prefix");
        let mut both = OpaConfig::new(url);
        both.token = Some(Token::new("t"));
        assert!(matches!(Opa::new(both), Err(EngineError::Config(_))));
    }

    #[test]
    fn other_http_errors_keep_the_message() {
        let body = br#"{"code":"internal_error","message":"storage failure"}"#;
        let err = http_error(
            "POST /v1/data/x".into(),
            StatusCode::INTERNAL_SERVER_ERROR,
            body,
            None,
        );
        assert!(err.is_transient());
        assert!(err.to_string().contains("storage failure"), "{err}");
        let err = http_error(
            "POST /v1/data/x".into(),
            StatusCode::BAD_GATEWAY,
            b"<html>bad gateway</html>",
            Some(Duration::from_secs(2)),
        );
        assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
        assert!(err.to_string().contains("bad gateway"));
    }
}
