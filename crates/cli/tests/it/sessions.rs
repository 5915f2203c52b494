//! Captures through `edgeprof profile` against a real control plane and a
//! gRPC agent, then `edgeprof sessions` as a user reads it (the table, not
//! only `--json`), a query that cannot inject a parameter, and
//! `profile --session ID` downloading a past capture.

use std::time::{Duration, SystemTime};

use edgeprof_proto::rest;

use crate::cp::{Running, functions};

#[test]
fn sessions_table_and_past_captures() {
    let running = Running::start();
    running.serve_api();

    let before = SystemTime::now() - Duration::from_secs(1);
    let first_file = running.dir.path().join("first.pprof");
    let first = running.capture(&first_file);
    let second = running.capture(&running.dir.path().join("second.pprof"));
    let after = SystemTime::now() + Duration::from_secs(1);
    assert_eq!(first.status, rest::SessionStatus::Done);

    // The table: a row per session, newest first, with its creation time.
    let run = running.run(&["sessions"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(lines[0].ends_with("created"), "{}", lines[0]);
    for (line, session) in lines[1..].iter().zip([&second, &first]) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells[..5],
            [session.id.as_str(), "api", "cpu", "done", "1000"],
            "{line}"
        );
        let created = humantime::parse_rfc3339(cells[5])
            .unwrap_or_else(|e| panic!("created column {:?}: {e}", cells[5]));
        assert!(before <= created && created <= after, "{line}");
    }

    // A filter is one encoded parameter: the control plane sees the whole
    // `api&limit=1` as the script name (and refuses it by name), where a
    // glued query string gave it `script=api` and `limit=1`: one api row.
    let run = running.run(&["sessions", "--script", "api&limit=1"]);
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("script: `api&limit=1` must be a DNS label"),
        "{}",
        run.stderr
    );
    let run = running.run(&["sessions", "--script", "api", "-n", "1", "--json"]);
    let list: rest::SessionList = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(list.profiles.len(), 1, "{}", run.stdout);

    // A past capture downloaded by id: the same profile.
    let again = running.dir.path().join("again.pprof");
    let run = running.run(&[
        "profile",
        "--session",
        &first.id,
        "-o",
        again.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("session {}, done", first.id)),
        "{}",
        run.stderr
    );
    assert!(functions(&again).contains(&"work_i1".to_owned()));
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&first_file).unwrap()
    );

    // An unknown session: one line with the control plane's 404.
    let run = running.run(&[
        "profile",
        "--session",
        "no-such-session",
        "-o",
        again.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let line = run.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with("edgeprof: session no-such-session: ") && line.contains("HTTP 404"),
        "{line}"
    );
    // --session with capture flags is a usage error.
    let run = running.run(&["profile", "api", "--session", &first.id]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
}
