//! Tests of the `edgeprof-node-agent` binary's configuration surface, and
//! of continuous profiling with the agent in-process against a control
//! plane implemented in the test (`continuous`, `support`), and its
//! failover between control-plane replicas (`failover`). The agent's
//! serving and capture paths are tested end to end, with real processes,
//! in `e2e/tests/it/capture.rs`.

mod continuous;
mod failover;
mod support;

use std::path::Path;
use std::process::{Command, Output};

fn env_file() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/node-agent/node-agent.env.example");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn agent(env: &[(String, String)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeprof-node-agent"));
    c.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(args);
    c.output().expect("the agent binary runs")
}

#[test]
fn example_environment_passes_check_config() {
    let out = agent(&env_file(), &["--check-config"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "configuration ok: machine lhr-m01 in lhr"
    );
}

#[test]
fn bad_settings_name_the_flag_and_limit() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "EDGEPROF_SAMPLING_INTERVAL_MS",
            "0",
            "--sampling-interval-ms 0: must be 1–100",
        ),
        (
            "EDGEPROF_CONTROL_PLANE",
            "http://cp-1:9090, ftp://cp-2:9090",
            "--control-plane `ftp://cp-2:9090`: must be an http:// or https:// URL",
        ),
        (
            "EDGEPROF_ISOLATE_MEMORY_MIB",
            "0",
            "--isolate-memory-mib 0: must be 1–4096",
        ),
        (
            "EDGEPROF_AGENT_SECRET",
            "short",
            "--agent-secret: must be at least 8 characters",
        ),
        (
            "EDGEPROF_CONTROL_PLANE",
            "ftp://x",
            "--control-plane `ftp://x`: must be an http:// or https:// URL",
        ),
        ("EDGEPROF_DATA_CENTER", "l h r", "--data-center `l h r`"),
        (
            "EDGEPROF_CONTINUOUS_HZ",
            "101",
            "--continuous-hz 101: must be 0 (off) to 100",
        ),
        (
            "EDGEPROF_CONTINUOUS_WINDOW",
            "1500ms",
            "--continuous-window `1500ms`: must be whole seconds from 1s to 5min",
        ),
        (
            "EDGEPROF_CONTINUOUS_WINDOW",
            "6min",
            "--continuous-window `6min`: must be whole seconds from 1s to 5min",
        ),
        (
            "EDGEPROF_CONTINUOUS_BUFFER",
            "ten minutes",
            "--continuous-buffer `ten minutes`: must be 1s–24h",
        ),
        (
            "EDGEPROF_CONTINUOUS_QUEUE_BYTES",
            "1000",
            "--continuous-queue-bytes 1000: must be 1 MiB–64 GiB",
        ),
    ];
    for (key, value, expected) in cases {
        let mut env = env_file();
        let entry = env
            .iter_mut()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("node-agent.env.example lists {key}"));
        entry.1 = (*value).to_owned();
        let out = agent(&env, &["--check-config"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}={value}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{key}={value}: expected `{expected}` in: {stderr}"
        );
    }
}
