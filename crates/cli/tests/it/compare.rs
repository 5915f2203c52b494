//! `edgeprof top --diff-base`, `tags`, `collapse --diff-base`, `view
//! --diff-base` (up to the terminal) and `--tag`
//! on profiles built by hand: their text and their errors.

use std::path::{Path, PathBuf};

use edgeprof_pprof::{LineSpec, ProfileBuilder};

use crate::support::{edgeprof, edgeprof_ok};

/// A CPU profile of `(stack (root first), cpu ms, data_center)` samples,
/// with an optional `requests: N` comment, written to `dir/name`.
fn write(dir: &Path, name: &str, samples: &[(&str, i64, &str)], requests: Option<u64>) -> PathBuf {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    for (stack, ms, dc) in samples {
        let mut ids: Vec<u64> = stack
            .split(';')
            .map(|f| {
                let id = b.function(f, f, "src/lib.rs", 1);
                b.location(
                    0,
                    0,
                    &[LineSpec {
                        function_id: id,
                        line: 1,
                        column: 0,
                    }],
                )
            })
            .collect();
        ids.reverse();
        let label = b.label_str("data_center", dc);
        b.add_sample(&ids, &[1, ms * 1_000_000], &[label]);
    }
    if let Some(n) = requests {
        b.comment(&format!("requests: {n}"));
    }
    let path = dir.join(name);
    std::fs::write(&path, edgeprof_pprof::encode(&b.build())).unwrap();
    path
}

struct Files {
    _dir: tempfile::TempDir,
    base: String,
    new: String,
    heap: String,
    no_requests: String,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let p = |p: PathBuf| p.to_str().unwrap().to_owned();
    let base = p(write(
        dir.path(),
        "base.pprof",
        &[("main;replacer", 80, "lhr"), ("main;serialize", 20, "sjc")],
        Some(10),
    ));
    let new = p(write(
        dir.path(),
        "new.pprof",
        &[
            ("main;replacer", 40, "lhr"),
            ("main;serialize", 160, "sjc"),
            ("main;serialize", 40, "lhr"),
        ],
        Some(40),
    ));
    let no_requests = p(write(dir.path(), "bare.pprof", &[("main", 1, "lhr")], None));
    let mut b = ProfileBuilder::new(&[("alloc_space", "bytes")]);
    let f = b.function("main", "main", "src/lib.rs", 1);
    let l = b.location(
        0,
        0,
        &[LineSpec {
            function_id: f,
            line: 1,
            column: 0,
        }],
    );
    b.add_sample(&[l], &[64], &[]);
    let heap = dir.path().join("heap.pprof");
    std::fs::write(&heap, edgeprof_pprof::encode(&b.build())).unwrap();
    Files {
        base,
        new,
        no_requests,
        heap: p(heap),
        _dir: dir,
    }
}

#[test]
fn tags_lists_each_value_with_its_share() {
    let f = files();
    assert_eq!(
        edgeprof_ok(&["tags", &f.new]),
        "data_center: Total 240ms (cpu)\n\
         \x20      160ms ( 66.67%): sjc\n\
         \x20       80ms ( 33.33%): lhr\n\n"
    );
    assert_eq!(
        edgeprof_ok(&["tags", &f.new, "--tag", "data_center=lhr"]),
        "data_center: Total 80ms (cpu)\n\
         \x20       80ms (100.00%): lhr\n\n"
    );
}

#[test]
fn collapse_diff_base_prints_both_columns() {
    let f = files();
    assert_eq!(
        edgeprof_ok(&["collapse", &f.new, "--diff-base", &f.base, "-i", "cpu"]),
        "main;replacer 80000000 40000000\nmain;serialize 20000000 200000000\n"
    );
    // Per request: the new side at the base's 10 requests (× 10/40).
    assert_eq!(
        edgeprof_ok(&[
            "collapse",
            &f.new,
            "--diff-base",
            &f.base,
            "--normalize",
            "requests"
        ]),
        "main;replacer 80000000 10000000\nmain;serialize 20000000 50000000\n"
    );
}

#[test]
fn top_diff_base_per_request_shows_both_sides() {
    let f = files();
    let out = edgeprof_ok(&[
        "top",
        &f.new,
        "--diff-base",
        &f.base,
        "--normalize",
        "requests",
    ]);
    assert_eq!(
        out,
        "New profile scaled by 0.2500 to the base's 10 requests (new: 40); per request = value / 10\n\
         Showing nodes accounting for -40ms, -40.00% of 100ms total (cpu, base)\n\
         \x20     flat   flat%    sum%        cum    cum%  base flat   new flat   base cum    new cum\n\
         \x20    -70ms -70.00% -70.00%      -70ms -70.00%       80ms       10ms       80ms       10ms  replacer\n\
         \x20     30ms  30.00% -40.00%       30ms  30.00%       20ms       50ms       20ms       50ms  serialize\n\
         \x20        0   0.00% -40.00%      -40ms -40.00%          0          0      100ms       60ms  main\n"
    );
}

#[test]
fn comparison_errors_are_one_line_naming_the_file_or_flag() {
    let f = files();
    for (args, needle) in [
        (vec!["top", &f.new, "--diff-base", &f.heap], "heap.pprof"),
        (
            vec!["top", &f.new, "--diff-base", &f.heap],
            "different kinds",
        ),
        (
            vec![
                "top",
                &f.new,
                "--diff-base",
                &f.no_requests,
                "--normalize",
                "requests",
            ],
            "bare.pprof: the base profile has no `requests: N` comment",
        ),
        (
            vec![
                "collapse",
                &f.no_requests,
                "--diff-base",
                &f.base,
                "--normalize",
                "requests",
            ],
            "bare.pprof: the new profile has no",
        ),
        // `view` checks the comparison before it needs a terminal.
        (
            vec!["view", &f.new, "--diff-base", &f.heap],
            "different kinds",
        ),
        (
            vec!["view", &f.new, "--diff-base", &f.base],
            "new.pprof: `edgeprof view` needs a terminal",
        ),
        (
            vec!["top", &f.new, "--tag", "data_center"],
            "--tag: \"data_center\" is not KEY=VALUE",
        ),
        (
            vec!["tags", &f.new, "--tag", "=lhr"],
            "--tag: \"=lhr\" is not KEY=VALUE",
        ),
    ] {
        let run = edgeprof(&args);
        assert_eq!(run.code, Some(1), "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
}
