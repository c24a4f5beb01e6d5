//! `kubectl placement explain KIND/NAME`: per cluster, whether the object may
//! run there and the policy's reason.
//!
//! The object is read from the API server (or a file) and put through the one
//! policy-input function, as the remediator asks for it (an `UPDATE` of the
//! object as stored; a manifest from a file as the `CREATE` the webhook
//! sees). The policy set in force and the data the engines hold are read
//! from the API server and evaluated here, on the embedded engine (or a
//! folder's, offline). Beside the decision, the rules package answers
//! `selected` (where the object may run), `reasons` (why, for those) and
//! `exclusions` (why not, for the others). A Karmada binding is explained by
//! its resource template; an OCM Placement by itself and every workload its
//! ManifestWorkReplicaSets deliver, as placement-sync decides it (a cluster
//! is allowed when every answer allows it).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use policy_client::engine::{PolicyEngine, QueryOutcome};
use policy_client::input::{PLACEMENT_INPUT_KEY, object_input};
use policy_client::ownership_keys::OwnershipKeys;
use policy_client::placement::{OWNERSHIP_ANNOTATION, Ownership, requested_annotations};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cli::{ExplainArgs, Global, Output};
use crate::error::PluginError;
use crate::keys::ownership_keys;
use crate::policy_set::{self, LiveSources};
use crate::resources::{resolve, split_object};
use crate::table;

/// Exit status when the object may run nowhere (as `review` exits on a denial).
const NOWHERE: u8 = 3;

/// One question asked of the policy: an object's input, and whose it is.
struct Subject {
    label: String,
    input: Value,
}

/// The policy's answer to one subject.
#[derive(Debug, Default, Clone)]
struct Answer {
    label: String,
    annotations: Value,
    errors: Vec<String>,
    undefined: bool,
    clusters: BTreeSet<String>,
    selected: BTreeSet<String>,
    reasons: BTreeMap<String, String>,
    exclusions: BTreeMap<String, String>,
}

pub(crate) async fn explain(global: &Global, args: ExplainArgs) -> Result<u8, PluginError> {
    let offline = args.policy_dir.is_some() && args.filename.is_some();
    let client = if offline {
        None
    } else {
        Some(policy_client::kube_client::client(global.kubeconfig.as_deref()).await?)
    };
    let selection = args
        .configmaps
        .selection(true)
        .map_err(PluginError::Usage)?;
    let loaded = match (&args.policy_dir, &client) {
        (Some(dir), _) => policy_set::from_dir(dir)?,
        (None, Some(client)) => {
            policy_set::live(
                client,
                &selection,
                LiveSources {
                    last_good: args.last_good_policies.as_deref(),
                    replicate_cluster: &args.replicate_cluster,
                    replicate_path: &args.replicate_path,
                },
            )
            .await?
        }
        (None, None) => unreachable!("a client unless offline"),
    };
    let (keys, keys_origin) = ownership_keys(
        client.as_ref(),
        args.ownership_secret.as_deref(),
        args.ownership_key_file.as_deref(),
    )
    .await?;
    let verified = keys_origin.is_some();
    let (title, subjects, unverified) = subjects(client.as_ref(), &args, &keys, verified).await?;
    let mut answers = Vec::new();
    for subject in subjects {
        answers.push(ask(&loaded.engine, &args, subject).await?);
    }
    let verdicts = combine(&answers);
    let nowhere = verdicts.iter().all(|v| !v.allowed);
    match global.output {
        Output::Json => {
            let doc = json!({
                "object": title,
                "origin": loaded.origin,
                "ownershipKeys": keys_origin,
                "clusters": verdicts.iter().map(|v| json!({
                    "name": v.name, "allowed": v.allowed, "reason": v.reason,
                })).collect::<Vec<_>>(),
                "answers": answers.iter().map(|a| json!({
                    "subject": a.label, "annotations": a.annotations,
                    "errors": a.errors, "undefined": a.undefined,
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
        Output::Text => print!(
            "{}",
            render(
                &title,
                &loaded.origin,
                // A manifest from a file carries no record to verify.
                // No note when no record had to be read unverified.
                keys_origin.as_deref().or((!unverified).then_some("")),
                &verdicts,
                &answers
            )
        ),
    }
    Ok(if nowhere { NOWHERE } else { 0 })
}

/// The object's title and the subjects to ask about.
async fn subjects(
    client: Option<&Client>,
    args: &ExplainArgs,
    keys: &OwnershipKeys,
    verified: bool,
) -> Result<(String, Vec<Subject>, bool), PluginError> {
    if let Some(path) = &args.filename {
        if args.object.is_some() {
            return Err(PluginError::Usage(
                "give KIND/NAME or --filename, not both".to_owned(),
            ));
        }
        let object = read_manifest(path)?;
        let resource = manifest_type(&object);
        let title = describe(&resource.kind, &object);
        let input = input_for(&object, &resource, "CREATE", keys);
        return Ok((
            title.clone(),
            vec![Subject {
                label: title,
                input,
            }],
            false,
        ));
    }
    let Some(wanted) = &args.object else {
        return Err(PluginError::Usage(
            "name the object (KIND/NAME, e.g. rs/nginx-eu) or give --filename".to_owned(),
        ));
    };
    let client = client.expect("a client when the object is read from the API server");
    let (kind, name) = split_object(wanted)?;
    let served = resolve(client, kind).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let object = get(
        client,
        &served.resource,
        served.namespaced.then_some(&namespace),
        name,
    )
    .await?;
    let (object, unverified) = developer_view(object, verified);
    let title = describe(&served.resource.kind, &object);
    let resource = &served.resource;
    if policy_client::karmada::is_binding(&resource.group, &resource.kind) {
        let (title, subjects, template_unverified) =
            binding_subjects(client, &object, keys, verified, title).await?;
        return Ok((title, subjects, unverified || template_unverified));
    }
    if resource.kind == "Placement" && resource.group == "cluster.open-cluster-management.io" {
        let (title, subjects) =
            placement_subjects(client, &object, resource, &namespace, keys, title).await?;
        return Ok((title, subjects, unverified));
    }
    let input = input_for(&object, resource, "UPDATE", keys);
    Ok((
        title.clone(),
        vec![Subject {
            label: title,
            input,
        }],
        unverified,
    ))
}

/// A binding's resource template, as the guardrail and the scheduler ask.
async fn binding_subjects(
    client: &Client,
    binding: &Value,
    keys: &OwnershipKeys,
    verified: bool,
    title: String,
) -> Result<(String, Vec<Subject>, bool), PluginError> {
    let reference = &binding["spec"]["resource"];
    let text = |key: &str| reference[key].as_str().unwrap_or_default();
    let (group, version) = text("apiVersion")
        .split_once('/')
        .unwrap_or(("", text("apiVersion")));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, text("kind")));
    let namespace = Some(text("namespace")).filter(|n| !n.is_empty());
    let (template, unverified) = developer_view(
        get(client, &resource, namespace, text("name")).await?,
        verified,
    );
    let input = policy_client::karmada::template_input(&template, &resource, binding, keys);
    Ok((
        format!(
            "{title} (its template {})",
            describe(&resource.kind, &template)
        ),
        vec![Subject {
            label: describe(&resource.kind, &template),
            input,
        }],
        unverified,
    ))
}

/// An OCM Placement and each workload of the ManifestWorkReplicaSets that
/// name it, each with the Placement under `input._placement`, as
/// placement-sync decides it.
async fn placement_subjects(
    client: &Client,
    placement: &Value,
    resource: &ApiResource,
    namespace: &str,
    keys: &OwnershipKeys,
    title: String,
) -> Result<(String, Vec<Subject>), PluginError> {
    let view = policy_client::ocm::placement_view(placement);
    let with_placement = |mut input: Value| {
        if let Value::Object(map) = &mut input {
            map.insert(PLACEMENT_INPUT_KEY.to_owned(), view.clone());
        }
        input
    };
    let name = placement["metadata"]["name"].as_str().unwrap_or_default();
    let replica_sets = ApiResource {
        group: "work.open-cluster-management.io".into(),
        version: "v1alpha1".into(),
        api_version: "work.open-cluster-management.io/v1alpha1".into(),
        kind: "ManifestWorkReplicaSet".into(),
        plural: "manifestworkreplicasets".into(),
    };
    let listed = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &replica_sets)
        .list(&ListParams::default())
        .await;
    let mut subjects = Vec::new();
    // A hub without ManifestWorkReplicaSets: the Placement alone.
    for replica_set in listed.map(|l| l.items).unwrap_or_default() {
        let value = serde_json::to_value(&replica_set).unwrap_or_default();
        let names_it = value
            .pointer("/spec/placementRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|r| r["name"] == name);
        if !names_it {
            continue;
        }
        for manifest in policy_client::ocm::delivered_manifests(&value) {
            let manifest_resource = manifest_type(&manifest);
            subjects.push(Subject {
                label: describe(&manifest_resource.kind, &manifest),
                input: with_placement(input_for(&manifest, &manifest_resource, "CREATE", keys)),
            });
        }
    }
    subjects.push(Subject {
        label: title.clone(),
        input: with_placement(input_for(placement, resource, "UPDATE", keys)),
    });
    Ok((title, subjects))
}

/// `object` as the developer asked for it: with the keys, the policy-input
/// function verifies its ownership record (`verified`); without them, the
/// record is read unverified, for an explanation only (values the policy
/// wrote are given back their requests, as the webhook would).
fn developer_view(object: Value, verified: bool) -> (Value, bool) {
    if verified {
        return (object, false);
    }
    let Some(annotations) = object["metadata"]["annotations"].as_object() else {
        return (object, false);
    };
    let owned: Option<Ownership> = annotations
        .get(OWNERSHIP_ANNOTATION)
        .and_then(Value::as_str)
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|record| serde_json::from_value(record["owned"].clone()).ok());
    let Some(owned) = owned else {
        return (object, false);
    };
    let current: BTreeMap<String, String> = annotations
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    let mut view = object;
    view["metadata"]["annotations"] = json!(requested_annotations(&current, &owned));
    (view, true)
}

/// The one policy input of `object`: an `operation` by this tool; an
/// `UPDATE` of the object as stored.
fn input_for(
    object: &Value,
    resource: &ApiResource,
    operation: &str,
    keys: &OwnershipKeys,
) -> Value {
    let user_info = json!({"username": "kubectl-placement"});
    object_input(object, resource, operation, &user_info, true, keys)
}

async fn get(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
) -> Result<Value, PluginError> {
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let where_ = namespace
        .map(|ns| format!(" in namespace {ns}"))
        .unwrap_or_default();
    let mut object = api.get(name).await.map_err(PluginError::api(format!(
        "reading {} {name}{where_}",
        resource.kind
    )))?;
    object.metadata.managed_fields = None;
    let mut value = serde_json::to_value(&object).map_err(|e| PluginError::Invalid {
        what: format!("{} {name}", resource.kind),
        message: e.to_string(),
    })?;
    value["apiVersion"] = Value::String(resource.api_version.clone());
    value["kind"] = Value::String(resource.kind.clone());
    Ok(value)
}

fn read_manifest(path: &std::path::Path) -> Result<Value, PluginError> {
    let text = if path == std::path::Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map(|_| text)
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|source| PluginError::File {
        path: path.to_owned(),
        source,
    })?;
    let object: Value = yaml_serde::from_str(&text).map_err(|e| PluginError::Invalid {
        what: format!("the manifest {}", path.display()),
        message: e.to_string(),
    })?;
    if !object.is_object() {
        return Err(PluginError::Invalid {
            what: format!("the manifest {}", path.display()),
            message: "it holds no object (one document, a Kubernetes object)".to_owned(),
        });
    }
    Ok(object)
}

/// The type of a manifest, as kube names a kind's resource.
fn manifest_type(object: &Value) -> ApiResource {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        group,
        version,
        object["kind"].as_str().unwrap_or_default(),
    ))
}

/// `ReplicaSet default/nginx-eu`.
fn describe(kind: &str, object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// The decision and the explaining rules for one subject.
async fn ask(
    engine: &dyn PolicyEngine,
    args: &ExplainArgs,
    subject: Subject,
) -> Result<Answer, PluginError> {
    let deadline = || Instant::now() + Duration::from_secs(30);
    let query = |path: String| {
        let input = &subject.input;
        async move { engine.query(&path, input, deadline()).await }
    };
    let mut answer = Answer {
        label: subject.label.clone(),
        ..Answer::default()
    };
    match query(args.decision.clone()).await? {
        QueryOutcome::Defined(doc) => {
            answer.annotations = doc["annotations"].clone();
            answer.errors = doc["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
                .collect();
        }
        QueryOutcome::Undefined => answer.undefined = true,
    }
    let package = args.explain_package.trim_matches('/');
    let rule = |name: &str| format!("{package}/{name}");
    if let QueryOutcome::Defined(Value::Object(clusters)) = query(rule("clusters")).await? {
        answer.clusters = clusters.keys().cloned().collect();
    }
    if let QueryOutcome::Defined(Value::Array(selected)) = query(rule("selected")).await? {
        answer.selected = selected
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
    }
    for (name, into) in [
        ("reasons", &mut answer.reasons),
        ("exclusions", &mut answer.exclusions),
    ] {
        if let QueryOutcome::Defined(Value::Object(map)) = query(rule(name)).await? {
            *into = map
                .into_iter()
                .filter_map(|(k, v)| Some((k, v.as_str()?.to_owned())))
                .collect();
        }
    }
    Ok(answer)
}

/// One cluster's verdict over every answer.
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    name: String,
    allowed: bool,
    reason: String,
}

/// Whether an answer bounds where the object may run: it names clusters
/// (the placement annotation), reports errors, or is undefined. Answers for
/// kinds the policy does not place (a Namespace a ManifestWorkReplicaSet
/// delivers) do not, as placement-sync's decider reads them.
fn bounds(answer: &Answer) -> bool {
    answer.undefined
        || !answer.errors.is_empty()
        || answer
            .annotations
            .get(policy_client::karmada::PREFERENCES_ANNOTATION)
            .is_some()
}

/// Per cluster: allowed when every answer that bounds it selects it; the
/// reason of the first such answer that gives one when allowed, else every
/// bounding answer's exclusion (named by its subject when there are
/// several).
fn combine(answers: &[Answer]) -> Vec<Verdict> {
    let names: BTreeSet<&String> = answers.iter().flat_map(|a| &a.clusters).collect();
    let bounding: Vec<&Answer> = answers.iter().filter(|a| bounds(a)).collect();
    let several = bounding.len() > 1;
    names
        .into_iter()
        .map(|name| {
            let allowed = bounding
                .iter()
                .all(|a| a.selected.contains(name) && a.errors.is_empty() && !a.undefined);
            let reason = if bounding.is_empty() {
                "the policy does not bound this kind (no placement annotation)".to_owned()
            } else if allowed {
                bounding
                    .iter()
                    .find_map(|a| a.reasons.get(name).cloned())
                    .unwrap_or_else(|| "(the policy gives no reason)".to_owned())
            } else {
                let why: Vec<String> = bounding
                    .iter()
                    .filter(|a| !a.selected.contains(name) || a.undefined)
                    .map(|a| {
                        let text = a.exclusions.get(name).cloned().unwrap_or_else(|| {
                            if a.undefined {
                                "the decision is undefined".to_owned()
                            } else if !a.errors.is_empty() {
                                "the policy reports errors".to_owned()
                            } else {
                                "(the policy gives no reason)".to_owned()
                            }
                        });
                        if several {
                            format!("{}: {text}", a.label)
                        } else {
                            text
                        }
                    })
                    .collect();
                if why.is_empty() {
                    "the policy reports errors".to_owned()
                } else {
                    why.join("; ")
                }
            };
            Verdict {
                name: name.clone(),
                allowed,
                reason,
            }
        })
        .collect()
}

fn render(
    title: &str,
    origin: &[String],
    keys_origin: Option<&str>,
    verdicts: &[Verdict],
    answers: &[Answer],
) -> String {
    let mut out = format!("{title}\n");
    for line in origin {
        out.push_str(&format!("  {line}\n"));
    }
    match keys_origin {
        Some("") => {}
        Some(from) => out.push_str(&format!("  ownership records verified with the keys of {from}\n")),
        None => out.push_str(
            "  note: no ownership keys (--ownership-secret or --ownership-key-file): the ownership record is read unverified\n",
        ),
    }
    out.push('\n');
    if verdicts.is_empty() {
        out.push_str("no cluster in the data the policy reads (are the clusters replicated?)\n");
    } else {
        let mut rows = vec![vec![
            "CLUSTER".to_owned(),
            "ALLOWED".to_owned(),
            "REASON".to_owned(),
        ]];
        rows.extend(verdicts.iter().map(|v| {
            vec![
                v.name.clone(),
                if v.allowed { "yes" } else { "no" }.to_owned(),
                v.reason.clone(),
            ]
        }));
        out.push_str(&table::render(&rows));
    }
    out.push('\n');
    for answer in answers {
        let prefix = if answers.len() > 1 {
            format!("{}: ", answer.label)
        } else {
            String::new()
        };
        if answer.undefined {
            out.push_str(&format!(
                "{prefix}decision: undefined (the policy set in force has no decision at this path; see kubectl placement status)\n"
            ));
            continue;
        }
        let annotations = answer.annotations.as_object().cloned().unwrap_or_default();
        if annotations.is_empty() {
            out.push_str(&format!("{prefix}decision: no annotations\n"));
        }
        for (key, value) in annotations {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            out.push_str(&format!("{prefix}decision: {key}={value}\n"));
        }
        if answer.errors.is_empty() {
            out.push_str(&format!("{prefix}errors: none\n"));
        } else {
            for error in &answer.errors {
                out.push_str(&format!("{prefix}error: {error}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(label: &str, selected: &[&str], exclusions: &[(&str, &str)]) -> Answer {
        Answer {
            label: label.to_owned(),
            annotations: json!({policy_client::karmada::PREFERENCES_ANNOTATION: "{}"}),
            clusters: ["eu-1", "eu-2", "us-1"].map(str::to_owned).into(),
            selected: selected.iter().map(|s| (*s).to_owned()).collect(),
            reasons: selected
                .iter()
                .map(|s| ((*s).to_owned(), "running".to_owned()))
                .collect(),
            exclusions: exclusions
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Answer::default()
        }
    }

    #[test]
    fn one_answer_gives_each_cluster_its_reason() {
        let verdicts = combine(&[answer(
            "rs",
            &["eu-1", "eu-2"],
            &[("us-1", "not in the EU")],
        )]);
        assert_eq!(
            verdicts,
            vec![
                Verdict {
                    name: "eu-1".into(),
                    allowed: true,
                    reason: "running".into()
                },
                Verdict {
                    name: "eu-2".into(),
                    allowed: true,
                    reason: "running".into()
                },
                Verdict {
                    name: "us-1".into(),
                    allowed: false,
                    reason: "not in the EU".into()
                },
            ]
        );
    }

    #[test]
    fn several_answers_allow_what_every_one_allows_and_name_who_excludes() {
        let verdicts = combine(&[
            answer(
                "Deployment shop/web",
                &["eu-1"],
                &[("eu-2", "PCI 1 < 2"), ("us-1", "not in the EU")],
            ),
            answer("Placement shop/web", &["eu-1", "eu-2", "us-1"], &[]),
        ]);
        assert!(verdicts[0].allowed);
        assert!(!verdicts[1].allowed);
        assert_eq!(verdicts[1].reason, "Deployment shop/web: PCI 1 < 2");
    }

    /// Without the keys, a value the policy wrote is not read as the
    /// developer's request: the record, unverified, gives the request back.
    #[test]
    fn without_keys_the_record_is_read_unverified() {
        let prefs = "federation.kubernetes.io/replica-set-preferences";
        let written = r#"{"clusters":{"eu-1":{"weight":1}}}"#;
        let record = json!({"owned": {prefs: {
            "written": policy_client::placement::digest(written), "requested": null}},
            "mac": "hmac-sha256:x"});
        let object = json!({"metadata": {"annotations": {
            prefs: written, OWNERSHIP_ANNOTATION: record.to_string(), "team": "a"}}});
        let (view, unverified) = developer_view(object.clone(), false);
        assert!(unverified);
        assert_eq!(view["metadata"]["annotations"], json!({"team": "a"}));
        assert_eq!(developer_view(object.clone(), true), (object, false));
    }

    /// A Namespace delivered beside a workload names no clusters: it bounds
    /// nothing, and the workload's reasons are given.
    #[test]
    fn answers_that_name_no_clusters_bound_nothing() {
        let namespace = Answer {
            label: "Namespace shop".into(),
            clusters: ["eu-1", "us-1"].map(str::to_owned).into(),
            selected: ["eu-1", "us-1"].map(str::to_owned).into(),
            reasons: [("eu-1".to_owned(), "running".to_owned())].into(),
            ..Answer::default()
        };
        let mut web = answer(
            "Deployment shop/web",
            &["eu-1"],
            &[("us-1", "not in the EU")],
        );
        web.reasons = [("eu-1".to_owned(), "running, in the EU".to_owned())].into();
        let verdicts = combine(&[namespace.clone(), web]);
        let of = |name: &str| verdicts.iter().find(|v| v.name == name).unwrap();
        assert_eq!(of("eu-1").reason, "running, in the EU");
        assert_eq!(
            of("us-1").reason,
            "not in the EU",
            "one bounding answer: no subject named"
        );
        assert!(combine(&[namespace]).iter().all(|v| v.allowed));
    }

    #[test]
    fn errors_allow_nothing() {
        let mut denied = answer("rs", &["eu-1"], &[]);
        denied.errors = vec!["bad".into()];
        assert!(combine(&[denied]).iter().all(|v| !v.allowed));
    }
}
