//! The modules and the data document of a policy directory, read the way
//! `opa run DIR` reads one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::engine::EngineError;

/// Errors loading a policy directory.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data file {path} is not valid {format}: {message}")]
    Data {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The modules and the data document of the policy directory `dir` (see
/// [`Embedded::from_dir`](super::Embedded::from_dir)).
pub(super) fn read(dir: &Path) -> Result<(BTreeMap<String, String>, Value), LoadError> {
    let mut modules = BTreeMap::new();
    let mut data = Value::Object(Map::new());
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    for path in files {
        let rel = path.strip_prefix(dir).unwrap_or(&path);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let read = || {
            std::fs::read_to_string(&path).map_err(|source| LoadError::Io {
                path: path.clone(),
                source,
            })
        };
        if name.ends_with(".rego") && !name.ends_with("_test.rego") {
            modules.insert(rel.to_string_lossy().into_owned(), read()?);
        } else if name.ends_with(".json") || name.ends_with(".yaml") || name.ends_with(".yml") {
            let text = read()?;
            let doc: Value = if name.ends_with(".json") {
                serde_json::from_str(&text).map_err(|e| LoadError::Data {
                    path: path.clone(),
                    format: "JSON",
                    message: e.to_string(),
                })?
            } else {
                yaml_serde::from_str(&text).map_err(|e| LoadError::Data {
                    path: path.clone(),
                    format: "YAML",
                    message: e.to_string(),
                })?
            };
            let mount: Vec<String> = rel
                .parent()
                .map(|p| {
                    p.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            merge_at(&mut data, &mount, doc);
        }
    }
    Ok((modules, data))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| LoadError::Io {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| LoadError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(|source| LoadError::Io {
            path: path.clone(),
            source,
        })?;
        // Hidden entries (editor files, `..data` symlinks of mounted ConfigMaps) are skipped.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if file_type.is_dir() || (file_type.is_symlink() && path.is_dir()) {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Put `doc` at `path` in `data`, merging objects so sibling documents survive.
fn merge_at(data: &mut Value, path: &[String], doc: Value) {
    let mut node = data;
    for segment in path {
        node = ensure_object(node)
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    merge(node, doc);
}

fn merge(target: &mut Value, doc: Value) {
    match (target, doc) {
        (Value::Object(t), Value::Object(d)) => {
            for (k, v) in d {
                match t.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (target, doc) => *target = doc,
    }
}

pub(super) fn ensure_object(node: &mut Value) -> &mut Map<String, Value> {
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    match node {
        Value::Object(map) => map,
        _ => unreachable!("just made an object"),
    }
}
