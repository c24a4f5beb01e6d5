//! What Karmada made of a resource template: its ResourceBinding and the
//! Works that carry it to the members.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Karmada;

/// Prefix of a member's execution namespace in the Karmada API server.
const EXECUTION_SPACE_PREFIX: &str = "karmada-es-";

impl Karmada {
    /// The ResourceBinding of the namespaced template `kind` `namespace/name`
    /// (Karmada names it `<name>-<kind>`, lowercased), if it exists.
    pub fn resource_binding(&self, namespace: &str, kind: &str, name: &str) -> Option<Value> {
        let binding = format!("{name}-{kind}").replace(':', ".").to_lowercase();
        let out = self.kubectl(&[
            "get",
            "resourcebindings.work.karmada.io",
            &binding,
            "-n",
            namespace,
            "-o",
            "json",
        ]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("binding JSON"))
    }

    /// The manifests of the template `kind` `namespace/name` in Karmada's
    /// Works, by member (the Work's execution namespace `karmada-es-<member>`).
    pub fn works_for(&self, namespace: &str, kind: &str, name: &str) -> BTreeMap<String, Value> {
        let text = self.kubectl_ok(&["get", "works.work.karmada.io", "-A", "-o", "json"]);
        let list: Value = serde_json::from_str(&text).expect("work list JSON");
        let mut works = BTreeMap::new();
        for work in list["items"].as_array().into_iter().flatten() {
            let manifests = work["spec"]["workload"]["manifests"].as_array();
            for manifest in manifests.into_iter().flatten() {
                if manifest["kind"] == kind
                    && manifest["metadata"]["namespace"] == namespace
                    && manifest["metadata"]["name"] == name
                {
                    let space = work["metadata"]["namespace"].as_str().unwrap_or_default();
                    let member = space
                        .strip_prefix(EXECUTION_SPACE_PREFIX)
                        .unwrap_or_else(|| panic!("a Work outside an execution space: {work}"));
                    works.insert(member.to_owned(), manifest.clone());
                }
            }
        }
        works
    }
}
