//! Bad input: exit 1 and one line on stderr naming the file and the cause.

use crate::support::edgeprof;

fn check(args: &[&str], file: &str, cause: &str) {
    let run = edgeprof(args);
    assert_eq!(
        run.code,
        Some(1),
        "edgeprof {args:?}: stderr {}",
        run.stderr
    );
    assert!(run.stdout.is_empty(), "no data on error: {}", run.stdout);
    let line = run.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "one line on stderr: {line}");
    assert!(line.contains(file), "{line:?} names {file}");
    assert!(line.contains(cause), "{line:?} says {cause:?}");
}

#[test]
fn bad_files_name_the_file_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let missing = dir.path().join("missing.pprof");
    let missing = missing.to_str().unwrap();
    check(&["top", missing], missing, "cannot read");

    let empty = path("empty.pprof", b"");
    check(&["top", &empty], &empty, "empty input");

    let gz = path(
        "bad.pprof.gz",
        &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3],
    );
    check(&["top", &gz], &gz, "bad gzip");

    let junk = path("junk.pprof", b"\xff\xff\xff\xff not a profile");
    check(&["collapse", &junk], &junk, "not a pprof protobuf");

    // string_table[0] must be "": field 6 (string_table), "x".
    let st = path("strings.pprof", &[0x32, 1, b'x']);
    check(&["top", &st], &st, "string_table[0]");

    let ok = path("ok.pprof", &edgeprof_pprof::encode(&ok_profile()));
    check(
        &["top", &ok, "--sample-index", "nope"],
        &ok,
        "sample index \"nope\" not found",
    );
    let out = dir.path().join("out.pprof");
    check(
        &["merge", &ok, &junk, "-o", out.to_str().unwrap()],
        &junk,
        "not a pprof protobuf",
    );
}

/// A one-sample profile.
pub fn ok_profile() -> edgeprof_pprof::Profile {
    let mut b = edgeprof_pprof::ProfileBuilder::new(&[("samples", "count")]);
    let f = b.function("main", "main", "", 0);
    let l = b.location(
        0,
        0,
        &[edgeprof_pprof::LineSpec {
            function_id: f,
            line: 1,
            column: 0,
        }],
    );
    b.add_sample(&[l], &[1], &[]);
    b.build()
}
