//! `cargo xtask cluster` as a user meets it: `edgeprof-cluster` starts, the
//! commands it prints work when pasted into a shell, Ctrl-C (SIGINT to the
//! terminal's process group) or SIGTERM leaves no process behind, and
//! `--keep-state` brings back what the previous run left.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use edgeprof_e2e::cluster::default_bin_dir;

use crate::{root, state_dir, worker};

/// A running `edgeprof-cluster` in a process group of its own, and what it
/// printed up to its "Ctrl-C stops every process." line.
struct Run {
    child: Child,
    printed: Vec<String>,
}

impl Drop for Run {
    fn drop(&mut self) {
        // A failed test still must not leave the edge running.
        signal(&format!("-{}", self.child.id()), "KILL");
        let _ = self.child.wait();
    }
}

fn signal(target: &str, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), "--", target])
        .stderr(Stdio::null())
        .status();
}

fn start(state: &Path, args: &[&str]) -> Run {
    let mut child = Command::new(default_bin_dir().join("edgeprof-cluster"))
        .arg("--state-dir")
        .arg(state)
        .arg("--workers")
        .arg(root().join("target/workers"))
        .args(args)
        .env("EDGEPROF_BIN_DIR", default_bin_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .expect("edgeprof-cluster starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut printed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.starts_with("Ctrl-C stops every process");
                printed.push(line);
                if done {
                    break;
                }
            }
            Err(e) => panic!("edgeprof-cluster did not come up ({e:?}); it printed:\n{printed:#?}"),
        }
    }
    Run { child, printed }
}

/// Processes whose command line names `state` (the cluster and every child
/// it started: the control plane's database and the agents' ready files are
/// under it).
fn processes_using(state: &Path) -> Vec<String> {
    let needle = state.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// Waits for the cluster to exit after a signal; asserts nothing it started
/// is left.
fn assert_stops_cleanly(run: &mut Run, state: &Path, how: &str) {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = run.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "edgeprof-cluster still running 60 s after {how}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "edgeprof-cluster after {how}: {status}");
    // Children are reaped by the cluster before it exits; allow the kernel
    // a moment to drop their /proc entries.
    let start = Instant::now();
    loop {
        let left = processes_using(state);
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "processes left after {how}:\n{}",
            left.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs one printed command after the printed `export` line, in `cwd`, the
/// way a user pastes it into a shell. `edgeprof view` gets a terminal
/// (util-linux `script`) and a `q`.
fn paste(export: &str, command: &str, cwd: &Path) -> std::process::Output {
    let mut c = if command.starts_with("edgeprof view ") {
        let mut c = Command::new("script");
        c.args([
            "-qec",
            &format!("{export}; stty rows 24 cols 80; {command}"),
            "/dev/null",
        ]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-ec", &format!("{export}\n{command}")]);
        c
    };
    c.current_dir(cwd).env("TERM", "xterm-256color");
    for var in ["EDGEPROF_URL", "EDGEPROF_TOKEN", "EDGEPROF_ACCOUNT"] {
        c.env_remove(var);
    }
    if command.starts_with("edgeprof view ") {
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Write;
            // Let the viewer draw, then quit as a user would.
            std::thread::sleep(Duration::from_secs(2));
            let _ = stdin.write_all(b"q");
            std::thread::sleep(Duration::from_secs(30));
        });
        child.wait_with_output().unwrap()
    } else {
        c.output().unwrap()
    }
}

/// Waits until the first continuous-profiling window of json-gateway has
/// reached the control plane (one window, 10 s, after traffic began), as
/// the printed `history` command needs.
fn wait_for_history(export: &str, work: &Path) {
    let start = Instant::now();
    loop {
        let out = paste(
            export,
            "edgeprof timeline json-gateway --from -5m --json",
            work,
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if doc["series"].as_array().is_some_and(|s| !s.is_empty()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no continuous-profiling window of json-gateway after 90 s: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn printed_commands_work_and_ctrl_c_leaves_nothing_behind() {
    if worker("json-gateway").is_none() {
        return;
    }
    let state = state_dir("cluster-run");
    let _ = std::fs::remove_dir_all(&state);
    let work = state.with_file_name("cluster-run-cwd");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();

    let mut run = start(
        &state,
        &[
            "--data-centers",
            "2",
            "--machines-per-dc",
            "1",
            "--rate",
            "30",
        ],
    );
    let printed = run.printed.join("\n");
    assert!(
        printed.contains("dashboard:  http://127.0.0.1:"),
        "{printed}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("cluster.json")).unwrap())
            .unwrap();
    for key in [
        "url",
        "token",
        "account",
        "data_centers",
        "scripts",
        "commands",
        "continuous_profiling",
    ] {
        assert!(!doc[key].is_null(), "cluster.json has `{key}`: {doc}");
    }
    // The local edge profiles every isolate all the time, at the agents' defaults.
    assert_eq!(
        doc["continuous_profiling"],
        serde_json::json!({"enabled": true, "cpu_hz": 19, "window_s": 10, "heap": true}),
        "{doc}"
    );
    assert_eq!(doc["data_centers"].as_array().unwrap().len(), 2);
    // Each script says its account; each machine an example worker URL.
    assert_eq!(doc["scripts"][0]["account"], doc["account"], "{doc}");
    let url = doc["data_centers"][0]["machines"][0]["url"]
        .as_str()
        .unwrap();
    assert!(
        url.starts_with("http://json-gateway.dev.localhost:"),
        "{url}"
    );
    let weights: Vec<(String, u64)> = doc["scripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["wasm"].as_str().unwrap().to_owned(),
                s["weight"].as_u64().unwrap(),
            )
        })
        .collect();
    for (wasm, weight) in [
        ("json-gateway.wasm", 90),
        ("json-gateway-fixed.wasm", 10),
        ("metrics-twice-fixed.wasm", 0),
        ("leftover-instrumentation-fixed.wasm", 0),
    ] {
        assert!(
            weights.contains(&(wasm.to_owned(), weight)),
            "{wasm} deployed with weight {weight}: {weights:?}"
        );
    }

    let commands: Vec<&str> = run
        .printed
        .iter()
        .filter_map(|l| l.trim_start().strip_prefix("$ "))
        .collect();
    let (export, rest) = commands.split_first().expect("printed commands");
    assert!(export.starts_with("export "), "{export}");
    assert!(rest.len() >= 6, "{commands:#?}");
    let mut durable_object_stderr = String::new();
    for command in rest {
        if command.starts_with("edgeprof history") {
            wait_for_history(export, &work);
        }
        let out = paste(export, command, &work);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if command.contains("--durable-object") {
            durable_object_stderr = stderr.clone().into_owned();
        }
        assert!(
            out.status.success(),
            "`{command}` failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
        let expect = match command.split_whitespace().nth(1) {
            Some("targets") => "lhr-m01",
            Some("top") => "json_gateway::replacer",
            Some("view") => "json_gateway",
            Some("profile") if command.contains("--type heap") => "record_instrumentation",
            Some("rollout") => "50.0%",
            Some("history") => "json-gateway-5m.pprof",
            Some("timeline") => "cpu/request",
            _ => "",
        };
        assert!(
            stdout.contains(expect),
            "`{command}` shows `{expect}`:\n{stdout}\n{stderr}"
        );
    }
    for file in ["json-gateway.pprof", "heap.pprof", "json-gateway-5m.pprof"] {
        let bytes = std::fs::read(work.join(file)).unwrap();
        let profile = edgeprof_pprof::decode(&bytes).unwrap();
        assert!(!profile.sample.is_empty(), "{file} has samples");
    }
    // A young counter spends microseconds per request, so its capture may
    // hold no CPU sample; what it holds comes from that object alone.
    let counter =
        edgeprof_pprof::decode(&std::fs::read(work.join("counter.pprof")).unwrap()).unwrap();
    let objects = crate::capture::labels(&counter, "durable_object");
    if counter.sample.is_empty() {
        // …and the user is told why the flamegraph is empty.
        assert!(
            durable_object_stderr.contains("note: the profile holds no samples"),
            "{durable_object_stderr}"
        );
    } else {
        assert_eq!(objects, [format!("counter-object:{:064x}", 1)].into());
    }

    // Ctrl-C in a terminal: SIGINT to the whole foreground process group.
    signal(&format!("-{}", run.child.id()), "INT");
    assert_stops_cleanly(&mut run, &state, "Ctrl-C");

    // A second run with --keep-state: same versions, the rollout and the
    // captures of the first run are still there; SIGTERM to the cluster
    // process alone also stops every child.
    let mut again = start(
        &state,
        &[
            "--data-centers",
            "1",
            "--machines-per-dc",
            "1",
            "--rate",
            "0",
            "--keep-state",
        ],
    );
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("cluster.json")).unwrap())
            .unwrap();
    let versions = |doc: &serde_json::Value| -> Vec<(String, String, u64)> {
        doc["scripts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["wasm"].as_str().unwrap().to_owned(),
                    s["version"].as_str().unwrap().to_owned(),
                    s["weight"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    // Same modules, same versions; the weights as the rollout left them.
    let expected: Vec<(String, String, u64)> = versions(&doc)
        .into_iter()
        .map(|(wasm, id, weight)| {
            let weight = if wasm.starts_with("metrics-twice") {
                50
            } else {
                weight
            };
            (wasm, id, weight)
        })
        .collect();
    assert_eq!(versions(&kept), expected);
    let export = again
        .printed
        .iter()
        .find_map(|l| l.trim_start().strip_prefix("$ export "))
        .map(|e| format!("export {e}"))
        .unwrap();
    let out = paste(&export, "edgeprof sessions --json", &work);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sessions: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let scripts: Vec<&str> = sessions["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["script"].as_str())
        .collect();
    for script in ["json-gateway", "leftover-instrumentation", "counter-object"] {
        assert!(
            scripts.contains(&script),
            "kept session of {script}: {scripts:?}"
        );
    }
    signal(&again.child.id().to_string(), "TERM");
    assert_stops_cleanly(&mut again, &state, "SIGTERM");
}
