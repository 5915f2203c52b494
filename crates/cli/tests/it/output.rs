//! `-o` onto what is not a regular file (a character device, a FIFO, a
//! link like `/dev/stdout`) is written in place and stays what it was; a regular file
//! is replaced whole. And `--duration` out of range is one line, exit 1.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use crate::errors::ok_profile;
use crate::support::edgeprof;

/// Two profiles to merge, in `dir`; the paths.
fn inputs(dir: &Path) -> [String; 2] {
    ["a.pprof", "b.pprof"].map(|name| {
        let p = dir.join(name);
        std::fs::write(&p, edgeprof_pprof::encode(&ok_profile())).unwrap();
        p.to_str().unwrap().to_owned()
    })
}

fn run_tool(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
        .success()
}

/// The merged profile of two one-sample profiles: 2 samples' worth.
fn assert_merged(bytes: &[u8], what: &str) {
    let p = edgeprof_pprof::decode(bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 2, "{what}: {p:?}");
}

#[test]
fn output_onto_a_character_device_writes_to_it_and_keeps_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = inputs(dir.path());
    // A device like /dev/null (1:3), made here so the test never touches
    // the real one; making device nodes needs root.
    let null = dir.path().join("null");
    let null_s = null.to_str().unwrap();
    if !run_tool("mknod", &[null_s, "c", "1", "3"]) {
        assert!(
            std::env::var_os("CI").is_none(),
            "mknod failed with CI set: this test needs root"
        );
        eprintln!("skipping: mknod needs root");
        return;
    }
    let run = edgeprof(&["merge", &a, &b, "-o", null_s]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("wrote"), "{}", run.stderr);
    let meta = std::fs::symlink_metadata(&null).unwrap();
    assert!(
        meta.file_type().is_char_device(),
        "{null_s} is no longer a character device: {meta:?}"
    );
    assert_eq!(meta.rdev(), std::fs::metadata("/dev/null").unwrap().rdev());
    // Nothing left beside it (no temporary file).
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn output_onto_a_fifo_streams_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = inputs(dir.path());
    let fifo = dir.path().join("fifo");
    assert!(run_tool("mkfifo", &[fifo.to_str().unwrap()]));
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            // Opening blocks until edgeprof opens the other end.
            std::fs::File::open(&fifo)
                .unwrap()
                .read_to_end(&mut bytes)
                .unwrap();
            bytes
        })
    };
    let run = edgeprof(&["merge", &a, &b, "-o", fifo.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let meta = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(
        meta.file_type().is_fifo(),
        "the FIFO was replaced: {meta:?}"
    );
    assert_merged(&reader.join().unwrap(), "read from the FIFO");
}

#[test]
fn output_onto_a_stdout_link_and_onto_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = inputs(dir.path());
    // A link like /dev/stdout, made here: a regression must never replace
    // the machine's own /dev/stdout (as root, renaming over it would).
    let stdout = dir.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &stdout).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgeprof"))
        .args(["merge", &a, &b, "-o", stdout.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_merged(&out.stdout, "stdout");
    assert!(std::fs::symlink_metadata(&stdout).unwrap().is_symlink());

    // A regular file is replaced whole, and a symlink to one stays a link.
    let file = dir.path().join("merged.pprof");
    std::fs::write(&file, vec![b'x'; 100_000]).unwrap();
    let link = dir.path().join("link.pprof");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    for target in [&file, &link] {
        let run = edgeprof(&["merge", &a, &b, "-o", target.to_str().unwrap()]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert_merged(&std::fs::read(&file).unwrap(), "the regular file");
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
}

#[test]
fn durations_out_of_range_are_one_line_and_exit_1() {
    let conn = [
        "--url",
        "http://127.0.0.1:9",
        "--token",
        "t",
        "--account",
        "acme",
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.pprof");
    for (value, cause) in [
        // Panicked (exit 101) when parsed as f64 and converted.
        ("100000000000000000000", "out of range, must be 1–50 s"),
        // Wrapped to an 8,384 ms capture when cast to milliseconds.
        ("18446744073709560", "out of range, must be 1–50 s"),
        ("18446744073709560ms", "out of range, must be 1–50 s"),
        ("99999999999999999999999h", "out of range, must be 1–50 s"),
        ("51s", "out of range, must be 1–50 s"),
        ("999ms", "out of range, must be 1–50 s"),
        ("10 parsecs", "unknown time unit"),
    ] {
        let mut args = vec![
            "profile",
            "api",
            "--duration",
            value,
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(conn);
        let run = edgeprof(&args);
        assert_eq!(run.code, Some(1), "--duration {value}: {}", run.stderr);
        let line = run.stderr.trim_end();
        assert_eq!(line.lines().count(), 1, "one line: {line}");
        assert!(
            line.contains(&format!("--duration `{value}`")) && line.contains(cause),
            "--duration {value}: {line}"
        );
    }
    assert!(!out.exists());
}
