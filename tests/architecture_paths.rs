//! docs/architecture.md is the map contributors follow to add an op, a device, a family, a
//! dtype or a file format; a path it names that no longer exists sends them astray. Every
//! file and folder of its layout tree, and every repository path it quotes in backticks,
//! must exist (placeholders such as `models/src/<family>.rs` stand for new files; a `*`
//! pattern must match at least one file).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("flm-tests sits in the repository")
        .to_path_buf()
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).unwrap()
}

/// The paths of the layout tree (the first code block after `## Layout`): a line at column
/// 0 names top-level entries, one indented by two names entries of the last top-level
/// folder; the names are the words before the description (two spaces or more); deeper
/// lines continue a description.
fn layout_paths(doc: &str) -> Vec<String> {
    let tree = doc
        .split("## Layout")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("a layout tree in a code block after ## Layout");
    let mut base = String::new();
    let mut paths = Vec::new();
    for line in tree.lines().filter(|l| !l.trim().is_empty()) {
        let indent = line.len() - line.trim_start().len();
        if indent > 2 {
            continue;
        }
        let names = line.trim_start().split("  ").next().unwrap_or_default();
        for name in names.split_whitespace() {
            if indent == 0 {
                if name.ends_with('/') {
                    base = name.to_owned();
                }
                paths.push(name.to_owned());
            } else {
                paths.push(format!("{base}{name}"));
            }
        }
    }
    paths
}

/// The backticked words that are paths in the repository: they contain a `/` and start
/// with one of its top-level folders.
fn quoted_paths(doc: &str) -> Vec<String> {
    let top: Vec<String> = std::fs::read_dir(root())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| format!("{}/", e.file_name().to_string_lossy()))
        .collect();
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.contains(char::is_whitespace) && w.contains('/'))
        .filter(|w| top.iter().any(|t| w.starts_with(t.as_str())))
        .map(str::to_owned)
        .collect()
}

/// Whether `path` names something in the repository: a placeholder `<...>` needs its
/// folder, a `*` pattern a file of its folder with the pattern's suffix.
fn exists(path: &str) -> bool {
    let full = root().join(path.trim_end_matches('/'));
    let name = full.file_name().unwrap_or_default().to_string_lossy();
    let folder = full.parent().unwrap_or(&full);
    if path.contains('<') {
        let head = &path[..path.find('<').unwrap_or(0)];
        return root().join(head).is_dir();
    }
    if let Some((prefix, suffix)) = name.split_once('*') {
        return std::fs::read_dir(folder).is_ok_and(|mut entries| {
            entries.any(|e| {
                e.is_ok_and(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(prefix) && n.ends_with(suffix)
                })
            })
        });
    }
    full.exists()
}

#[test]
fn every_path_architecture_md_names_exists() {
    let doc = architecture();
    let layout = layout_paths(&doc);
    let quoted = quoted_paths(&doc);
    assert!(
        layout.len() > 30,
        "the layout tree was not read: {layout:?}"
    );
    assert!(
        quoted.len() > 30,
        "the quoted paths were not read: {quoted:?}"
    );
    let missing: Vec<&String> = layout
        .iter()
        .chain(&quoted)
        .filter(|p| !exists(p))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn a_missing_path_is_found() {
    let doc = "## Layout\n\n```\nmodels/src/\n  nowhere.rs    gone\n```\n\n\
               See `core/src/nowhere.rs` and `core/src/op.rs`.";
    let paths: Vec<String> = layout_paths(doc)
        .into_iter()
        .chain(quoted_paths(doc))
        .collect();
    assert_eq!(
        paths,
        [
            "models/src/",
            "models/src/nowhere.rs",
            "core/src/nowhere.rs",
            "core/src/op.rs"
        ]
    );
    let missing: Vec<&String> = paths.iter().filter(|p| !exists(p)).collect();
    assert_eq!(missing, ["models/src/nowhere.rs", "core/src/nowhere.rs"]);
}
