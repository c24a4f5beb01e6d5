//! Which workloads the remediator acts on: exactly those the webhook
//! configuration sends to the webhook (the chart renders both from one set of
//! values): not in an excluded namespace, in a namespace matching the
//! namespace selector, matching the object selector. Selectors are evaluated
//! by the API server (label-selected watches), so they mean what they mean in
//! the webhook configuration; only the object selector of a workload type
//! whose watch is shared with its replicator (which needs every object) is
//! matched here, by [`parse_label_selector`].

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;
use kube::core::{Expression, Selector};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

/// The configured set (`--scope-*` flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Scope {
    pub excluded_namespaces: BTreeSet<String>,
    /// A label selector on namespaces (`kubectl -l` syntax).
    pub namespace_selector: Option<String>,
    /// A label selector on the workloads themselves.
    pub object_selector: Option<String>,
}

/// A label selector in `kubectl -l` syntax, for matching objects here: the
/// remediator's object selector on a watch it shares with a replicator
/// (which needs every object, so the API server cannot filter it).
pub(crate) fn parse_label_selector(text: &str) -> Result<Selector, String> {
    let mut requirements = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                requirements.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    requirements.push(&text[start..]);
    let key = |k: &str| {
        let k = k.trim();
        if k.is_empty() || k.contains(char::is_whitespace) {
            Err(format!("label selector {text:?}: bad key {k:?}"))
        } else {
            Ok(k.to_owned())
        }
    };
    let mut expressions = Vec::new();
    for requirement in requirements.iter().map(|r| r.trim()) {
        if requirement.is_empty() {
            continue;
        }
        let expression = if let Some(rest) = requirement.strip_prefix('!') {
            Expression::DoesNotExist(key(rest)?)
        } else if let Some((head, values)) = requirement.split_once('(') {
            let values = values
                .strip_suffix(')')
                .ok_or_else(|| format!("label selector {text:?}: missing ')' in {requirement:?}"))?
                .split(',')
                .map(|v| v.trim().to_owned())
                .collect();
            match head.split_whitespace().collect::<Vec<_>>()[..] {
                [k, "in"] => Expression::In(key(k)?, values),
                [k, "notin"] => Expression::NotIn(key(k)?, values),
                _ => {
                    return Err(format!(
                        "label selector {text:?}: expected `key in (...)` or `key notin (...)`, got {requirement:?}"
                    ));
                }
            }
        } else if let Some((k, v)) = requirement.split_once("!=") {
            Expression::NotEqual(key(k)?, v.trim().to_owned())
        } else if let Some((k, v)) = requirement
            .split_once("==")
            .or_else(|| requirement.split_once('='))
        {
            Expression::Equal(key(k)?, v.trim().to_owned())
        } else if requirement.contains(['<', '>']) {
            return Err(format!(
                "label selector {text:?}: `<` and `>` do not apply to labels"
            ));
        } else {
            Expression::Exists(key(requirement)?)
        };
        expressions.push(expression);
    }
    Ok(expressions.into_iter().collect())
}

/// The scope, with the namespaces its selector admits (watched).
#[derive(Clone)]
pub(crate) struct ScopeFilter {
    excluded: BTreeSet<String>,
    /// `None`: every namespace not excluded.
    selected: Option<Store<Namespace>>,
}

impl ScopeFilter {
    /// Start watching the selected namespaces (when a selector is set) until
    /// `cancel`; ready once they are listed.
    pub(crate) async fn start(
        client: &Client,
        scope: &Scope,
        cancel: &CancellationToken,
    ) -> ScopeFilter {
        let Some(selector) = &scope.namespace_selector else {
            return ScopeFilter {
                excluded: scope.excluded_namespaces.clone(),
                selected: None,
            };
        };
        let (store, writer) = reflector::store();
        let stream = watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(selector),
        )
        .default_backoff()
        .reflect(writer);
        let cancel_watch = cancel.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    event = stream.next() => match event {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::warn!(error = %e, "namespace watch error; the watch recovers by itself"),
                        None => break,
                    },
                    _ = cancel_watch.cancelled() => break,
                }
            }
        });
        tokio::select! {
            _ = store.wait_until_ready() => {}
            _ = cancel.cancelled() => {}
        }
        ScopeFilter {
            excluded: scope.excluded_namespaces.clone(),
            selected: Some(store),
        }
    }

    /// Whether the remediator acts on objects of `namespace` (the object
    /// selector is applied apart).
    pub(crate) fn admits(&self, namespace: Option<&str>) -> bool {
        let namespace = namespace.unwrap_or_default();
        if self.excluded.contains(namespace) {
            return false;
        }
        match &self.selected {
            None => true,
            Some(store) => store
                .state()
                .iter()
                .any(|ns| ns.metadata.name.as_deref() == Some(namespace)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_match_as_kubectl_reads_them() {
        use kube::core::SelectorExt;
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let selector =
            parse_label_selector("team=a, tier in (web, api),!legacy,env!=dev,owner").unwrap();
        let matching = labels(&[("team", "a"), ("tier", "api"), ("owner", "x")]);
        assert!(selector.matches(&matching));
        for (k, v) in [
            ("team", "b"),
            ("tier", "db"),
            ("legacy", "1"),
            ("env", "dev"),
        ] {
            let mut other = matching.clone();
            other.insert(k.to_owned(), v.to_owned());
            assert!(!selector.matches(&other), "{k}={v} must not match");
        }
        let mut ownerless = matching.clone();
        ownerless.remove("owner");
        assert!(!selector.matches(&ownerless));
        let notin = parse_label_selector("tier notin (web),team==a").unwrap();
        assert!(notin.matches(&labels(&[("team", "a")])));
        assert!(!notin.matches(&labels(&[("team", "a"), ("tier", "web")])));
        assert!(parse_label_selector("").unwrap().selects_all());
        for bad in ["tier in (web", "a b=c", "replicas>3", "tier within (a)"] {
            assert!(
                parse_label_selector(bad).is_err(),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn excluded_namespaces_are_out_of_scope() {
        let filter = ScopeFilter {
            excluded: ["kube-system".to_owned()].into(),
            selected: None,
        };
        assert!(!filter.admits(Some("kube-system")));
        assert!(filter.admits(Some("team-a")));
    }
}
