use super::*;
use serde_json::json;

fn reads(sources: &[&str]) -> Result<InputReads, Uncacheable> {
    let modules = sources
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("m{i}.rego"), (*s).to_owned()))
        .collect();
    InputReads::of(&modules)
}

fn paths(sources: &[&str]) -> Vec<String> {
    reads(sources).unwrap().paths()
}

fn refused(sources: &[&str]) -> String {
    reads(sources).unwrap_err().to_string()
}

#[test]
fn constant_references_are_read_up_to_their_first_variable() {
    assert_eq!(
        paths(&[r#"package p
x if input.metadata.labels["app.kubernetes.io/name"] == "a"
y contains k if some k, _ in input.spec.template.metadata.annotations
z := input.spec.containers[i].image
"#]),
        [
            "metadata.labels.app.kubernetes.io/name",
            "spec.containers",
            "spec.template.metadata.annotations"
        ]
    );
}

#[test]
fn a_prefix_covers_the_longer_paths_under_it() {
    assert_eq!(
        paths(&["package p\na := input.metadata\nb := input.metadata.name\n"]),
        ["metadata"]
    );
}

#[test]
fn object_get_reads_exactly_its_constant_key() {
    assert_eq!(
        paths(&[r#"package p
a := object.get(input, ["metadata", "annotations", "x/y"], "false")
b := object.get(input.spec, "replicas", 1)
c := object.get(input.status, [k], 1)
"#]),
        ["metadata.annotations.x/y", "spec.replicas", "status"]
    );
    // A module that names something `object` makes `object.get` its own.
    assert!(
        refused(&[r#"package p
import data.lib.object
a := object.get(input, ["metadata"], "false")
"#])
        .contains("whole input")
    );
}

#[test]
fn comments_strings_and_fields_named_input_are_not_reads() {
    assert_eq!(
        paths(&[r#"package p
# input is the object
msg := "input"
raw := `input`
a := data.x.input
b := input.kind
"#]),
        ["kind"]
    );
}

#[test]
fn imports_of_input_read_their_path() {
    assert_eq!(
        paths(&["package p\nimport input.metadata as meta\na := meta.name\n"]),
        ["metadata"]
    );
}

#[test]
fn the_whole_input_and_impure_builtins_refuse_the_set() {
    assert_eq!(
        refused(&["package p\n\nx := walk(input)\n"]),
        "m0.rego:3: reads the whole input (`input` without a constant path after it)"
    );
    assert!(refused(&["package p\nx := input[k]\n"]).contains("whole input"));
    assert!(refused(&["package p\nimport input\n"]).contains("whole input"));
    assert!(refused(&["package p\nx := f(input)\n"]).contains("whole input"));
    assert!(refused(&["package p\nx := time.now_ns()\n"]).contains("`time.now_ns`"));
    assert!(refused(&["package p\nx if print(input.a)\n"]).contains("`print`"));
    // A template string's expressions are read like any other.
    assert!(refused(&["package p\nx := $\"{input[k]}\"\n"]).contains("whole input"));
    // The second module refuses the set.
    assert!(
        refused(&[
            "package p\na := input.a\n",
            "package q\nb := rand.intn(\"x\", 2)\n"
        ])
        .starts_with("m1.rego:2")
    );
}

/// `with` replacing a function makes the calls it replaces read something
/// else (`object.get` reading the whole input through `f`, a pure-looking
/// `g` calling out through `http.send`): refused. Replacing `input` or
/// data is followed like any reference. (`with` modifies a literal of a
/// rule's body, so each is written in one.)
#[test]
fn with_replacing_a_function_refuses_the_set() {
    let replaced = refused(&[r#"package p
f(x, _, _) := x
a := v if v := object.get(input, ["metadata"], "") with object.get as f
"#]);
    assert!(replaced.contains("`with object.get as ...`"), "{replaced}");
    assert!(
        refused(&["package p
g(x) := x
b := v if v := g({\"url\": input.a}) with g as http.send\n"])
        .contains("`with g as ...`")
    );
    // A function of another module, replaced through data.
    assert!(
        refused(&[
            "package lib\n\nf(x) := x\n",
            "package p\nimport data.lib\na := v if v := lib.f(input.a) with data.lib.f as time.now_ns\n",
        ])
        .contains("`with data.lib.f as ...`")
    );
    // Replacing input or data is no function.
    assert_eq!(
        paths(&[
            "package p\nx := v if v := data.q.y with input.kind as \"Pod\" with data.clusters as input.spec\n"
        ]),
        ["kind", "spec"]
    );
    // `with` in a string or a comment is no replacement.
    assert_eq!(
        paths(&["package p\n# with object.get as f\nm := \"with g as http.send\"\na := input.a\n"]),
        ["a"]
    );
}

#[test]
fn signing_with_a_random_nonce_is_impure() {
    for call in ["io.jwt.encode_sign", "io.jwt.encode_sign_raw"] {
        let module = format!("package p\nt := {call}({{}}, {{\"a\": input.a}}, {{}})\n");
        assert!(refused(&[&module]).contains(call), "{call}");
    }
}

#[test]
fn the_key_holds_the_value_at_each_path_and_where_it_ends() {
    let reads = reads(&["package p\na := input.metadata.labels.app\nb := input.kind\n"]).unwrap();
    let key = |input: Value| reads.key("q", InputRoot::Value(&input)).unwrap();
    let base = json!({"kind": "ReplicaSet", "metadata": {"name": "a", "labels": {"app": "x", "tier": "y"}}});
    // What is not read does not change the key.
    let mut renamed = base.clone();
    renamed["metadata"]["name"] = json!("b");
    renamed["metadata"]["labels"]["tier"] = json!("z");
    assert_eq!(key(base.clone()), key(renamed));
    // Every read path does.
    let mut other_app = base.clone();
    other_app["metadata"]["labels"]["app"] = json!("w");
    assert_ne!(key(base.clone()), key(other_app));
    let mut other_kind = base.clone();
    other_kind["kind"] = json!("Deployment");
    assert_ne!(key(base.clone()), key(other_kind));
    // Absent, null and a non-object on the way are three different keys.
    let absent = key(json!({"kind": "ReplicaSet", "metadata": {"labels": {}}}));
    let null = key(json!({"kind": "ReplicaSet", "metadata": {"labels": {"app": null}}}));
    let scalar = key(json!({"kind": "ReplicaSet", "metadata": {"labels": "app"}}));
    let no_labels = key(json!({"kind": "ReplicaSet", "metadata": {}}));
    assert_ne!(absent, null);
    assert_ne!(absent, scalar);
    assert_ne!(null, scalar);
    assert_ne!(absent, no_labels);
    // The query is part of the key.
    assert_ne!(
        reads.key("q", InputRoot::Value(&base)),
        reads.key("r", InputRoot::Value(&base))
    );
}

#[test]
fn the_projection_keeps_what_is_read_and_where_each_path_ends() {
    let reads = reads(&[
        "package p\na := input.metadata.labels.app\nb := input.kind\nc := input.spec.template\n",
    ])
    .unwrap();
    let project = |input: Value| reads.project(InputRoot::Value(&input));
    let base = json!({
        "kind": "ReplicaSet",
        "metadata": {"name": "a", "labels": {"app": "x", "tier": "y"}},
        "spec": {"replicas": 3, "template": {"spec": {"containers": [{"image": "i"}]}}},
        "_admission": {"uid": "u"},
    });
    assert_eq!(
        project(base.clone()),
        to_rego(&json!({
            "kind": "ReplicaSet",
            "metadata": {"labels": {"app": "x"}},
            "spec": {"template": {"spec": {"containers": [{"image": "i"}]}}},
        }))
    );
    // Where a path ends early: an object without the key stays an
    // object, anything else is kept whole; an absent root key is absent.
    let early = json!({"metadata": {"labels": {}}, "spec": [1]});
    assert_eq!(
        project(early),
        to_rego(&json!({"metadata": {"labels": {}}, "spec": [1]}))
    );
    assert_eq!(project(json!("text")), to_rego(&json!("text")));
    // Inputs with one key have one projection, and the other way round.
    let inputs = [
        base.clone(),
        json!({"kind": "ReplicaSet", "metadata": {"labels": {"app": "x"}}, "spec": {"template": base["spec"]["template"]}}),
        json!({"kind": "ReplicaSet", "metadata": {"labels": {}}}),
        json!({"kind": "ReplicaSet", "metadata": {"labels": {"app": null}}}),
        json!({"kind": "ReplicaSet", "metadata": {"labels": "app"}}),
        json!({"kind": "ReplicaSet", "metadata": {}}),
        json!({"kind": "ReplicaSet"}),
    ];
    for a in &inputs {
        for b in &inputs {
            assert_eq!(
                reads.key("q", InputRoot::Value(a)) == reads.key("q", InputRoot::Value(b)),
                reads.project(InputRoot::Value(a)) == reads.project(InputRoot::Value(b)),
                "{a} / {b}"
            );
        }
    }
}

/// The webhook's input is read in its parts (the object, the request's
/// metadata beside it): keys and projections are those of the input put
/// together.
#[test]
fn the_parts_of_an_input_read_as_the_input() {
    let reads = reads(&[
        "package p\na := input.metadata.labels.app\nb := input._admission.operation\nc := input.kind\nd := input.absent.x\n",
    ])
    .unwrap();
    let keys = crate::ownership_keys::OwnershipKeys::ephemeral().unwrap();
    let (kind, resource, user) = (json!({"kind": "ReplicaSet"}), json!({}), json!({}));
    let meta = |operation| crate::input::RequestMeta {
        uid: "u",
        operation,
        kind: &kind,
        resource: &resource,
        namespace: None,
        name: None,
        user_info: &user,
        dry_run: false,
        old_object: None,
        keys: &keys,
    };
    let objects = [
        json!({"kind": "ReplicaSet", "metadata": {"labels": {"app": "a", "tier": "t"}}}),
        json!({"kind": "ReplicaSet", "metadata": {"labels": "app"}}),
        // Its own `_admission` is replaced by the request's.
        json!({"kind": "Deployment", "_admission": {"operation": "forged"}}),
        json!("not an object"),
    ];
    for object in &objects {
        for operation in ["CREATE", "UPDATE"] {
            let parts = crate::input::PolicyInput::new(object, &meta(operation));
            let whole = parts.clone().into_value();
            assert_eq!(
                reads.key("q", parts.root()),
                reads.key("q", InputRoot::Value(&whole)),
                "{whole}"
            );
            assert_eq!(
                reads.project(parts.root()),
                reads.project(InputRoot::Value(&whole)),
                "{whole}"
            );
            assert_eq!(parts.root().to_rego(), to_rego(&whole), "{whole}");
        }
    }
}

#[test]
fn a_key_too_large_is_not_made() {
    let reads = reads(&["package p\na := input.spec\n"]).unwrap();
    let big = json!({"spec": {"blob": "x".repeat(MAX_KEY_BYTES)}});
    assert_eq!(reads.key("q", InputRoot::Value(&big)), None);
}

#[test]
fn a_template_string_reads_what_its_expressions_read() {
    assert_eq!(
        paths(&[r#"package p
x := $"{input.kind} \{input.not_this} {object.get(input, ["metadata", "name"], "")}"
y := $`{input.spec.replicas}`
"#]),
        ["kind", "metadata.name", "spec.replicas"]
    );
}

#[test]
fn a_module_regorus_cannot_parse_refuses_the_set() {
    let refusal = refused(&["package p\na := input.a\n", "package q\n\nb := \n"]);
    assert!(refusal.starts_with("m1.rego:"), "{refusal}");
    assert!(refusal.contains("regorus cannot parse it"), "{refusal}");
}

/// The shipped policy's `workload` rule: any annotation under a prefix.
const PREFIXED_KEYS: &str = r#"package p
workload if {
	some key, _ in input.metadata.annotations
	startswith(key, "policy.example/")
}
eu := input.metadata.annotations["policy.example/eu"]
prefs := input.metadata.annotations["prefs"]
"#;

#[test]
fn an_iteration_filtered_by_key_prefix_reads_only_the_members_that_pass() {
    assert_eq!(
        paths(&[PREFIXED_KEYS]),
        [
            "metadata.annotations[policy.example/*]",
            "metadata.annotations.prefs"
        ]
    );
    // A read of the whole object covers the filter.
    assert_eq!(
        paths(&[PREFIXED_KEYS, "package q\nall := input.metadata\n"]),
        ["metadata"]
    );
    // Anything more said of the key or the value reads every member: the
    // key or value used elsewhere in the rule, a filter negated, through
    // `with`, on another variable, on a path that is not constant, or a
    // `startswith` of the modules' own.
    let whole = |rule: &str, extra: &str| {
        let module = format!("package p\n{rule}\n");
        let mut sources = vec![module.as_str()];
        if !extra.is_empty() {
            sources.push(extra);
        }
        paths(&sources)
    };
    let annotations = ["metadata.annotations"];
    for rule in [
        "k contains key if { some key, _ in input.metadata.annotations; startswith(key, \"p/\") }",
        "w if { some key, v in input.metadata.annotations; startswith(key, \"p/\"); v == \"x\" }",
        "w if { some key, _ in input.metadata.annotations; not startswith(key, \"p/\") }",
        "w if { some key, _ in input.metadata.annotations; startswith(key, \"p/\"); to_number(key) }",
        "w if { some key, _ in input.metadata.annotations; startswith(key, \"p/\") with input.x as 1 }",
        "w if { some key, _ in input.metadata.annotations; some other in [\"a\"]; startswith(other, \"p/\") }",
        "w if { some key, _ in input.metadata.annotations; startswith(key, input.kind) }",
        "w if { some _, _ in input.metadata.annotations }",
    ] {
        let found = whole(rule, "");
        assert!(
            found.iter().any(|p| p == annotations[0]),
            "{rule}: {found:?}"
        );
    }
    assert_eq!(
        whole(
            "w if { some key, _ in input.metadata[x]; startswith(key, \"p/\") }",
            ""
        ),
        ["metadata"]
    );
    assert_eq!(
        whole(
            "w if { some key, _ in input.metadata.annotations; startswith(key, \"p/\") }",
            "package lib\nstartswith(a, b) := true\n"
        ),
        annotations
    );
}

#[test]
fn a_key_prefix_keys_only_the_members_that_pass() {
    let reads = reads(&[PREFIXED_KEYS]).unwrap();
    let key = |annotations: Value| {
        let input = json!({"kind": "Deployment", "metadata": {"annotations": annotations}});
        reads.key("q", InputRoot::Value(&input)).unwrap()
    };
    let base = key(json!({"policy.example/eu": "true", "prefs": "{}"}));
    // Other members leave the key alone ...
    assert_eq!(
        base,
        key(json!({
            "policy.example/eu": "true",
            "prefs": "{}",
            "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            "propagationpolicy.karmada.io/name": "group-7",
        }))
    );
    // ... members that pass and those read by name change it ...
    for other in [
        json!({"policy.example/eu": "true", "prefs": "{}", "policy.example/typo": "1"}),
        json!({"policy.example/eu": "false", "prefs": "{}"}),
        json!({"policy.example/eu": "true", "prefs": "{\"a\": 1}"}),
        json!({"policy.example/eu": "true"}),
        json!({}),
    ] {
        assert_ne!(base, key(other.clone()), "{other}");
    }
    // ... and so does a value that is not an object, or none.
    assert_ne!(key(json!({})), key(json!([])));
    assert_ne!(key(json!({})), key(json!("policy.example/eu")));
    let none = json!({"kind": "Deployment", "metadata": {}});
    assert_ne!(
        key(json!({})),
        reads.key("q", InputRoot::Value(&none)).unwrap()
    );
}

#[test]
fn a_key_prefix_projects_the_members_that_pass() {
    let reads = reads(&[PREFIXED_KEYS]).unwrap();
    let input = json!({"kind": "Deployment", "metadata": {"name": "web", "annotations": {
        "policy.example/eu": "true",
        "policy.example/typo": "1",
        "prefs": "{}",
        "kubectl.kubernetes.io/last-applied-configuration": "{...}",
    }}});
    assert_eq!(
        reads.project(InputRoot::Value(&input)),
        to_rego(&json!({"metadata": {"annotations": {
            "policy.example/eu": "true",
            "policy.example/typo": "1",
            "prefs": "{}",
        }}}))
    );
    let listed = json!({"metadata": {"annotations": ["policy.example/eu"]}});
    assert_eq!(reads.project(InputRoot::Value(&listed)), to_rego(&listed));
}

/// What the shipped policy reads, as docs/webhook.md says: the kind and
/// apiVersion, its annotations by name and under its prefix, and the OCM
/// Placement placement-sync may give; nothing else of a workload.
#[test]
fn the_shipped_policy_reads_its_annotations_and_kind() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".rego") && !name.ends_with("_test.rego") {
            modules.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    assert_eq!(
        InputReads::of(&modules).unwrap().paths(),
        [
            "_placement",
            "apiVersion",
            "kind",
            "metadata.annotations[policy.federation.alpha.kubernetes.io/*]",
            "metadata.annotations.federation.kubernetes.io/replica-set-preferences",
        ]
    );
}
