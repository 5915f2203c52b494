//! Table tests of [`merge_responses`]: each case is the agents' answers
//! and the outcome a user sees (status, failures, requests, merged
//! isolates).

use std::io::Write;
use std::time::Duration;

use edgeprof_pprof::{LineSpec, MappingSpec, ProfileBuilder};
use edgeprof_proto::rest::{ProfileKind, SessionStatus, Target};
use edgeprof_proto::v1;

use super::*;
use crate::names::{AccountId, ScriptName};

fn target(machine: &str, isolate: &str) -> Target {
    Target {
        data_center: if machine == "m2" { "sjc" } else { "lhr" }.into(),
        machine: machine.into(),
        grpc_address: "127.0.0.1:1".into(),
        isolate: isolate.into(),
        script: "api".into(),
        version_id: "v1".into(),
        requests_last_60s: 1,
        requests_per_minute: 1,
        last_request_unix_ms: 0,
        durable_objects: Vec::new(),
        memory_bytes: 0,
    }
}

fn spec() -> CaptureSpec {
    CaptureSpec {
        account: AccountId::parse("account", "acme").unwrap(),
        script: ScriptName::parse("script", "api").unwrap(),
        version_id: "v1".into(),
        version_selector: "latest".into(),
        kind: ProfileKind::Cpu,
        duration: Duration::from_secs(1),
        data_center: None,
        durable_object: None,
        targets: vec![target("m1", "i1"), target("m1", "i2"), target("m2", "i3")],
    }
}

fn profile(leaf: &str) -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("samples", "count")]);
    let m = b.mapping(&MappingSpec {
        filename: "worker.wasm",
        ..Default::default()
    });
    let f = b.function(leaf, "", "src/lib.rs", 1);
    let l = b.location(
        m,
        0x10,
        &[LineSpec {
            function_id: f,
            line: 1,
            column: 0,
        }],
    );
    b.add_sample(&[l], &[1], &[]);
    edgeprof_pprof::encode(&b.build())
}

/// A gzip stream that inflates to `n` zero bytes.
fn bomb(n: usize) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&vec![0u8; n]).unwrap();
    e.finish().unwrap()
}

fn ok(isolate: &str, requests: Option<u64>) -> v1::IsolateCapture {
    v1::IsolateCapture {
        isolate_id: isolate.into(),
        pprof: profile(&format!("work_{isolate}")),
        requests,
        ..Default::default()
    }
}

fn with(isolate: &str, f: impl FnOnce(&mut v1::IsolateCapture)) -> v1::IsolateCapture {
    let mut i = ok(isolate, Some(1));
    f(&mut i);
    i
}

fn answer(machine: &str, isolates: Vec<v1::IsolateCapture>) -> Answer {
    (
        machine.into(),
        Ok(v1::CaptureResponse {
            machine: None,
            isolates,
        }),
    )
}

/// `machine[/isolate]: reason` of each failure.
fn failures(o: &Outcome) -> Vec<String> {
    o.failures
        .iter()
        .map(|f| match &f.isolate {
            Some(i) => format!("{}/{i}: {}", f.machine, f.reason),
            None => format!("{}: {}", f.machine, f.reason),
        })
        .collect()
}

/// The isolates whose samples are in the merged profile.
fn merged(o: &Outcome) -> Vec<String> {
    let Some(bytes) = &o.profile else {
        return Vec::new();
    };
    let p = edgeprof_pprof::decode(bytes).unwrap();
    let mut out: Vec<String> = p
        .sample
        .iter()
        .flat_map(|s| s.label.iter())
        .filter(|l| edgeprof_pprof::string(&p, l.key) == "isolate")
        .map(|l| edgeprof_pprof::string(&p, l.str).to_owned())
        .collect();
    out.sort();
    out.dedup();
    out
}

struct Case {
    name: &'static str,
    answers: Vec<Answer>,
    status: SessionStatus,
    merged: &'static [&'static str],
    /// Substrings, one per failure, in order.
    failures: &'static [&'static str],
    requests: Option<u64>,
}

#[test]
fn outcomes() {
    let limits = Limits {
        max_profile_bytes: 64 << 10,
        max_inflated_bytes: 1 << 20,
        max_capture_bytes: 1 << 30,
    };
    let cases = vec![
        Case {
            name: "everyone answers",
            answers: vec![
                answer("m1", vec![ok("i1", Some(2)), ok("i2", Some(3))]),
                answer("m2", vec![ok("i3", Some(5))]),
            ],
            status: SessionStatus::Done,
            merged: &["i1", "i2", "i3"],
            failures: &[],
            requests: Some(10),
        },
        Case {
            name: "a machine fails: partial",
            answers: vec![
                answer("m1", vec![ok("i1", Some(2)), ok("i2", Some(3))]),
                ("m2".into(), Err("cannot connect to 127.0.0.1:1".into())),
            ],
            status: SessionStatus::Partial,
            merged: &["i1", "i2"],
            failures: &["m2: cannot connect"],
            requests: Some(5),
        },
        Case {
            name: "an agent that does not count requests",
            answers: vec![
                answer("m1", vec![ok("i1", None), ok("i2", Some(3))]),
                answer("m2", vec![ok("i3", Some(5))]),
            ],
            status: SessionStatus::Done,
            merged: &["i1", "i2", "i3"],
            failures: &[],
            requests: None,
        },
        Case {
            name: "isolates not asked for are ignored, missing ones named",
            answers: vec![
                answer("m1", vec![ok("i1", Some(1)), ok("stranger", Some(100))]),
                answer("m2", vec![ok("i3", Some(1))]),
            ],
            status: SessionStatus::Partial,
            merged: &["i1", "i3"],
            failures: &["m1/i2: the agent returned no profile"],
            requests: Some(2),
        },
        Case {
            name: "an isolate error, an unreadable profile",
            answers: vec![
                answer(
                    "m1",
                    vec![
                        with("i1", |i| i.error = "sampler crashed".into()),
                        with("i2", |i| i.pprof = b"garbage".to_vec()),
                    ],
                ),
                answer("m2", vec![ok("i3", Some(1))]),
            ],
            status: SessionStatus::Partial,
            merged: &["i3"],
            failures: &["m1/i1: sampler crashed", "m1/i2: unreadable profile"],
            requests: Some(1),
        },
        Case {
            name: "a profile over the compressed limit",
            answers: vec![answer(
                "m2",
                vec![with("i3", |i| i.pprof = vec![0x1f; (64 << 10) + 1])],
            )],
            status: SessionStatus::Failed,
            merged: &[],
            failures: &[
                "m2/i3: profile too large: 65537 bytes, over the limit of 65536 bytes per isolate",
            ],
            requests: None,
        },
        Case {
            name: "a gzip bomb is refused at the inflated limit",
            answers: vec![
                answer(
                    "m1",
                    vec![with("i1", |i| i.pprof = bomb(8 << 20)), ok("i2", Some(1))],
                ),
                answer("m2", vec![ok("i3", Some(1))]),
            ],
            status: SessionStatus::Partial,
            merged: &["i2", "i3"],
            failures: &["m1/i1: unreadable profile (at most 1048576 bytes inflated per isolate)"],
            requests: Some(2),
        },
        Case {
            name: "nobody answers: failed, every reason in the error",
            answers: vec![
                ("m1".into(), Err("did not answer within 3.0 s".into())),
                ("m2".into(), Err("Capture failed: boom (Internal)".into())),
            ],
            status: SessionStatus::Failed,
            merged: &[],
            failures: &["m1: did not answer", "m2: Capture failed: boom"],
            requests: None,
        },
    ];
    for c in cases {
        let o = merge_responses(&spec(), &c.answers, &limits);
        assert_eq!(o.status, c.status, "{}: {:?}", c.name, failures(&o));
        assert_eq!(merged(&o), c.merged, "{}", c.name);
        let got = failures(&o);
        assert_eq!(got.len(), c.failures.len(), "{}: {got:?}", c.name);
        for (g, want) in got.iter().zip(c.failures) {
            assert!(g.contains(*want), "{}: `{g}` lacks `{want}`", c.name);
        }
        assert_eq!(o.requests, c.requests, "{}", c.name);
        match c.status {
            SessionStatus::Failed => {
                let e = o.error.as_deref().unwrap();
                assert!(e.starts_with("no target returned a profile: "), "{e}");
                for f in &got {
                    let reason = f.split_once(": ").unwrap().1;
                    assert!(e.contains(reason), "{}: `{e}` lacks `{reason}`", c.name);
                }
            }
            SessionStatus::Partial => {
                assert!(
                    o.detail
                        .as_deref()
                        .unwrap()
                        .starts_with("no profile from m")
                );
            }
            _ => assert_eq!((o.error.as_deref(), o.detail.as_deref()), (None, None)),
        }
    }
}

#[test]
fn agent_errors_are_stored_truncated() {
    let huge = "x".repeat(8 << 20);
    let answers = vec![
        answer(
            "m1",
            vec![with("i1", |i| i.error = huge.clone()), ok("i2", None)],
        ),
        ("m2".into(), Err(huge.clone())),
    ];
    let o = merge_responses(&spec(), &answers, &Limits::default());
    assert_eq!(o.status, SessionStatus::Partial);
    for f in &o.failures {
        assert!(
            f.reason.len() <= MAX_STORED_ERROR_BYTES + 32,
            "{} bytes",
            f.reason.len()
        );
        assert!(
            f.reason.ends_with(&format!("({} bytes)", 8 << 20)),
            "{}",
            &f.reason[1000..]
        );
    }
}
