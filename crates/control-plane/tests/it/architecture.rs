//! The module map of docs/architecture.md, checked: imports inside the
//! crate follow `store ← fleet ← {capture, history, replica} ← {api, registry}` (leaf modules
//! usable by all, `server` above `api`), so there is no circle and `fleet`
//! never imports `api`; and no file of the crate (sources and tests) is
//! over 600 lines.

use std::path::{Path, PathBuf};

/// A module's rank: it may import modules of lower rank only.
fn rank(module: &str) -> Option<u32> {
    Some(match module {
        "clock" | "auth" | "names" | "text" | "metrics" | "dashboard" => 0,
        "store" => 1,
        "fleet" => 2,
        "capture" | "history" | "replica" => 3,
        "api" | "registry" => 4,
        "server" => 5,
        _ => return None,
    })
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn test_files_stay_small_too() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = Vec::new();
    sources(&tests, &mut files);
    assert!(!files.is_empty());
    for f in &files {
        let lines = std::fs::read_to_string(f).unwrap().lines().count();
        assert!(
            lines <= 600,
            "{} has {lines} lines (at most 600)",
            f.strip_prefix(&tests).unwrap().display()
        );
    }
}

#[test]
fn modules_import_along_the_seams_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        let lines = text.lines().count();
        assert!(
            lines <= 600,
            "{} has {lines} lines (at most 600)",
            rel.display()
        );
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs");
        let Some(own) = rank(module) else {
            continue; // lib.rs and main.rs wire everything together
        };
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for part in code.split("crate::").skip(1) {
                let target: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let Some(theirs) = rank(&target) else {
                    continue;
                };
                if target != module && theirs >= own && theirs != 0 {
                    wrong.push(format!(
                        "{}:{}: {module} imports {target}",
                        rel.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the module order:\n{}",
        wrong.join("\n")
    );
}
