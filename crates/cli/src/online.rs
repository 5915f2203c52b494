//! Commands that talk to a control plane over its REST API (`/v1/...`).
//!
//! Responses are read as JSON values and only the fields each command shows
//! are required, so a newer control plane with extra fields still works.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

/// Where the control plane is and who is asking; from flags or environment.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Control plane base URL.
    #[arg(
        long,
        env = "EDGEPROF_URL",
        global = true,
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// API token (bearer).
    #[arg(long, env = "EDGEPROF_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Account that owns the scripts.
    #[arg(long, env = "EDGEPROF_ACCOUNT", global = true)]
    pub account: Option<String>,
}

/// Flags of `edgeprof profile`.
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// Script to profile.
    pub script: String,
    /// Version: `latest`, a version id, or a unique prefix of ≥ 8 characters.
    #[arg(long, default_value = "latest")]
    pub version: String,
    /// What to profile.
    #[arg(long = "type", value_enum, default_value_t = Kind::Cpu)]
    pub kind: Kind,
    /// How long to capture (`10s`, `2500ms`; 1–50 s).
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// Profile one Durable Object: `NAMESPACE:ID` (ID = 64 hex characters).
    #[arg(long, value_name = "NAMESPACE:ID")]
    pub durable_object: Option<String>,
    /// Only isolates in this data center (e.g. `lhr`).
    #[arg(long, value_name = "CODE")]
    pub data_center: Option<String>,
    /// Write the gzip'd pprof here (default: stdout, when it is not a terminal).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the final session as JSON on stdout (requires -o).
    #[arg(long)]
    pub json: bool,
}

/// Profile kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Where CPU time goes.
    Cpu,
    /// What allocates memory and what stays live.
    Heap,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::Heap => "heap",
        }
    }
}

/// Shortest and longest capture the control plane accepts.
const DURATION_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1_000)..=Duration::from_millis(50_000);

/// `--duration`: `10s`, `2500ms`, `1m`, `1s 500ms`, or a bare number of
/// seconds, within 1–50 s. Parsed with checked arithmetic: a number too big
/// for any duration is out of range, never wrapped.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let parsed = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        // Seconds; `None` when it does not fit in a u64.
        t.parse::<u64>().ok().map(Duration::from_secs)
    } else {
        match humantime::parse_duration(t) {
            Ok(d) => Some(d),
            Err(humantime::DurationError::NumberOverflow) => None,
            Err(e) => bail!("--duration `{s}`: {e} (examples: 10s, 2500ms; 1–50 s)"),
        }
    };
    match parsed {
        Some(d) if DURATION_RANGE.contains(&d) => Ok(d),
        _ => bail!("--duration `{s}`: out of range, must be 1–50 s"),
    }
}

struct Client {
    http: reqwest::blocking::Client,
    base: String,
    token: String,
    account: String,
}

impl Client {
    fn new(c: &Connection) -> Result<Self> {
        let token = c
            .token
            .clone()
            .ok_or_else(|| anyhow!("no API token: pass --token or set EDGEPROF_TOKEN"))?;
        let account = c
            .account
            .clone()
            .ok_or_else(|| anyhow!("no account: pass --account or set EDGEPROF_ACCOUNT"))?;
        if c.url.starts_with("https://") {
            bail!(
                "{}: https is not supported by this build yet; use http:// (loopback or a TLS-terminating proxy)",
                c.url
            );
        }
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build()?;
        Ok(Client {
            http,
            base: c.url.trim_end_matches('/').to_owned(),
            token,
            account,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v1/accounts/{}{}", self.base, self.account, path)
    }

    fn send(
        &self,
        req: reqwest::blocking::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::blocking::Response> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .with_context(|| format!("{what}: cannot reach the control plane at {}", self.base))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.text().unwrap_or_default();
        let parsed: Option<Value> = serde_json::from_str(&body).ok();
        let message = parsed
            .as_ref()
            .and_then(|v| v["error"]["message"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| body.trim().chars().take(300).collect());
        let code = parsed
            .as_ref()
            .and_then(|v| v["error"]["code"].as_str())
            .unwrap_or("")
            .to_owned();
        let mut line = format!("{what}: {message} (HTTP {}", status.as_u16());
        if !code.is_empty() {
            line.push_str(&format!(", {code}"));
        }
        if let Some(r) = retry_after {
            line.push_str(&format!(", retry after {r} s"));
        }
        line.push(')');
        Err(anyhow!(line))
    }

    fn get_json(&self, path: &str, what: &str) -> Result<Value> {
        let resp = self.send(self.http.get(self.url(path)), what)?;
        resp.json()
            .with_context(|| format!("{what}: the control plane sent invalid JSON"))
    }
}

pub fn profile(conn: &Connection, args: &ProfileArgs, out: &mut impl Write) -> Result<ExitCode> {
    let duration = parse_duration(&args.duration)?;
    let client = Client::new(conn)?;
    let to_stdout = args.output.is_none();
    if to_stdout && std::io::stdout().is_terminal() {
        bail!(
            "refusing to write a binary profile to the terminal: pass -o FILE or redirect stdout"
        );
    }
    if args.json && to_stdout {
        bail!("--json prints the session on stdout, so the profile needs -o FILE");
    }
    let mut body = json!({
        "script": args.script,
        "version": args.version,
        "profile_type": args.kind.as_str(),
        "duration_ms": duration.as_millis() as u64,
    });
    if let Some(dobj) = &args.durable_object {
        let (ns, id) = dobj
            .split_once(':')
            .ok_or_else(|| anyhow!("--durable-object must be NAMESPACE:ID (got `{dobj}`)"))?;
        body["namespace_id"] = json!(ns);
        body["actor_id"] = json!(id);
    }
    if let Some(dc) = &args.data_center {
        body["data_center"] = json!(dc);
    }
    let what = format!("profile {}", args.script);
    let started: Value = client
        .send(client.http.post(client.url("/profiles")).json(&body), &what)?
        .json()
        .with_context(|| format!("{what}: the control plane sent invalid JSON"))?;
    let id = started["id"]
        .as_str()
        .ok_or_else(|| anyhow!("{what}: the control plane's answer has no session id"))?
        .to_owned();

    let bar = indicatif::ProgressBar::new(duration.as_millis() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {elapsed}/{prefix}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{:?}", duration));
    bar.set_message(format!(
        "capturing {} {} ({})",
        args.script,
        args.kind.as_str(),
        id
    ));
    let t0 = Instant::now();
    // The server bounds a capture by duration + slack; this bounds the wait
    // for a server that stops answering.
    let give_up = duration + Duration::from_secs(60);
    let session = loop {
        let s = client.get_json(&format!("/profiles/{id}"), &what)?;
        let status = s["status"].as_str().unwrap_or("").to_owned();
        let answered = s["progress"]["machines_answered"].as_u64();
        let total = s["progress"]["machines_total"].as_u64();
        if let (Some(a), Some(t)) = (answered, total) {
            bar.set_message(format!(
                "{status} {} — {a}/{t} machines answered",
                args.script
            ));
        } else {
            bar.set_message(format!("{status} {}", args.script));
        }
        bar.set_position((t0.elapsed().as_millis() as u64).min(duration.as_millis() as u64));
        if matches!(status.as_str(), "done" | "partial" | "failed") {
            break s;
        }
        if t0.elapsed() > give_up {
            bar.finish_and_clear();
            bail!(
                "{what}: session {id} still `{status}` after {:?}; giving up",
                give_up
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    bar.finish_and_clear();

    let status = session["status"].as_str().unwrap_or("");
    if status == "failed" {
        let reason = session["error"]
            .as_str()
            .or(session["reason"].as_str())
            .unwrap_or("no reason given");
        bail!("{what}: capture {id} failed: {reason}");
    }
    let bytes = client
        .send(
            client
                .http
                .get(client.url(&format!("/profiles/{id}/pprof"))),
            &what,
        )?
        .bytes()
        .with_context(|| format!("{what}: cannot download the profile"))?;
    let written_to = match &args.output {
        Some(path) => {
            crate::offline::write_output(path, &bytes)?;
            path.display().to_string()
        }
        None => {
            out.write_all(&bytes)?;
            "the profile to stdout".to_owned()
        }
    };
    eprintln!(
        "edgeprof: wrote {written_to} ({} bytes, session {id}, {status}); {}",
        bytes.len(),
        requests_summary(&session, duration)
    );
    if let Some(note) = empty_profile_note(&bytes, args.kind) {
        eprintln!("edgeprof: note: {note}");
    }
    if args.json {
        serde_json::to_writer(&mut *out, &session)?;
        writeln!(out)?;
    }
    if status == "partial" {
        let missing = session["missing_machines"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| {
                        m.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| m.to_string())
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        eprintln!("edgeprof: partial capture: no profile from {missing}");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// Why a capture that succeeded holds no sample, so an empty flamegraph
/// is not mistaken for a broken one; `None` when it has samples.
fn empty_profile_note(pprof: &[u8], kind: Kind) -> Option<String> {
    let profile = edgeprof_pprof::decode(pprof).ok()?;
    if !profile.sample.is_empty() {
        return None;
    }
    Some(match kind {
        Kind::Cpu => "the profile holds no samples: the profiled isolates used less CPU than one \
                     sampling interval during the capture; capture for longer or under more traffic"
            .to_owned(),
        Kind::Heap => {
            "the profile holds no samples: the profiled isolates allocated less than the \
                       heap sampling interval (512 KiB on average) during the capture and hold no \
                       sampled object; capture for longer or under more traffic"
                .to_owned()
        }
    })
}

/// What the summary says of the requests served during the capture: the
/// denominator of "CPU (or bytes) per request".
fn requests_summary(session: &Value, duration: Duration) -> String {
    match session["requests"].as_u64() {
        Some(n) => format!(
            "{n} request{} began on the profiled isolates during the {:?} capture",
            if n == 1 { "" } else { "s" },
            duration
        ),
        None => "requests during the capture: unknown (an agent did not count them)".to_owned(),
    }
}

/// Flags of `edgeprof targets`.
#[derive(Debug, clap::Args)]
pub struct TargetsArgs {
    /// Script whose isolates to list.
    pub script: String,
    /// Version selector (`latest`, id, prefix); default: every deployed version.
    #[arg(long)]
    pub version: Option<String>,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn targets(conn: &Connection, args: &TargetsArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let mut path = format!("/scripts/{}/targets", args.script);
    if let Some(v) = &args.version {
        path.push_str(&format!("?version={v}"));
    }
    let mut doc = client.get_json(&path, &format!("targets {}", args.script))?;
    // The memory view of the same versions (`…/memory`), under "memory".
    let mut memory_path = format!("/scripts/{}/memory", args.script);
    if let Some(v) = &args.version {
        memory_path.push_str(&format!("?version={v}"));
    }
    let memory = client.get_json(&memory_path, &format!("memory {}", args.script))?;
    let memory_of = memory_by_isolate(&memory);
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("memory".into(), memory.clone());
    }
    if args.json {
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows = doc["targets"]
        .as_array()
        .or(doc.as_array())
        .cloned()
        .unwrap_or_default();
    writeln!(
        out,
        "{:<6} {:<14} {:<38} {:<12} {:>8} {:>10}  durable objects",
        "dc", "machine", "isolate", "version", "req/min", "memory"
    )?;
    for t in &rows {
        let s = |k: &str| t[k].as_str().unwrap_or("").to_owned();
        let per_min = t["requests_per_minute"]
            .as_f64()
            .or_else(|| t["requests_last_60s"].as_f64())
            .unwrap_or(0.0);
        let dos = t["durable_objects"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let version: String = s("version_id").chars().take(12).collect();
        let mem = memory_of
            .get(&(s("machine"), s("isolate")))
            .copied()
            .or_else(|| t["memory_bytes"].as_u64())
            .map(mib)
            .unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{:<6} {:<14} {:<38} {:<12} {:>8.0} {:>10}  {}",
            s("data_center"),
            s("machine"),
            s("isolate"),
            version,
            per_min,
            mem,
            dos
        )?;
    }
    for line in memory_summary(&memory) {
        writeln!(out, "{line}")?;
    }
    if rows.is_empty() {
        eprintln!(
            "edgeprof: no isolates of {} served traffic in the last 60 s",
            args.script
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Memory in MiB with one decimal, e.g. `12.5 MiB`.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `(machine, isolate)` → memory in use, from a `…/memory` document.
fn memory_by_isolate(memory: &Value) -> std::collections::HashMap<(String, String), u64> {
    let mut m = std::collections::HashMap::new();
    for v in memory["versions"].as_array().into_iter().flatten() {
        for i in v["isolates"].as_array().into_iter().flatten() {
            if let (Some(machine), Some(isolate), Some(bytes)) = (
                i["machine"].as_str(),
                i["isolate"].as_str(),
                i["memory_bytes"].as_u64(),
            ) {
                m.insert((machine.to_owned(), isolate.to_owned()), bytes);
            }
        }
    }
    m
}

/// One line per version of a `…/memory` document: nearest-rank memory
/// percentiles over the window and "Exceeded Memory" evictions.
fn memory_summary(memory: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    for v in memory["versions"].as_array().into_iter().flatten() {
        let version: String = v["version_id"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(12)
            .collect();
        let m = &v["memory_bytes"];
        let p = |k: &str| m[k].as_u64().map(mib).unwrap_or_else(|| "-".into());
        let e = &v["evictions"];
        lines.push(format!(
            "version {version}: memory p50 {} p99 {} p99.9 {} max {} ({} readings, last {} s); Exceeded Memory evictions {} (of {})",
            p("p50"),
            p("p99"),
            p("p999"),
            p("max"),
            m["samples"].as_u64().unwrap_or(0),
            v["window_s"].as_u64().unwrap_or(0),
            e["exceeded_memory"].as_u64().unwrap_or(0),
            e["total"].as_u64().unwrap_or(0),
        ));
    }
    lines
}

/// Flags of `edgeprof deploy`.
#[derive(Debug, clap::Args)]
pub struct DeployArgs {
    /// Script to add a version to (created on first deploy).
    pub script: String,
    /// The worker module.
    pub wasm: PathBuf,
    /// Share of traffic for the new version (versions are weighted against each other).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn deploy(conn: &Connection, args: &DeployArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let bytes = std::fs::read(&args.wasm)
        .with_context(|| format!("{}: cannot read", args.wasm.display()))?;
    if !bytes.starts_with(b"\0asm") {
        bail!(
            "{}: not a WebAssembly module (no \\0asm header)",
            args.wasm.display()
        );
    }
    let mut url = client.url(&format!("/scripts/{}/versions", args.script));
    if let Some(w) = args.weight {
        url.push_str(&format!("?weight={w}"));
    }
    let doc: Value = client
        .send(
            client
                .http
                .post(url)
                .header("content-type", "application/wasm")
                .body(bytes),
            &format!("deploy {}", args.script),
        )?
        .json()?;
    if args.json {
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
    } else {
        let id = doc["id"]
            .as_str()
            .or(doc["version_id"].as_str())
            .unwrap_or("");
        writeln!(out, "{id}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `edgeprof sessions`.
#[derive(Debug, clap::Args)]
pub struct SessionsArgs {
    /// Only sessions of this script.
    #[arg(long)]
    pub script: Option<String>,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn sessions(conn: &Connection, args: &SessionsArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let mut path = "/profiles".to_owned();
    if let Some(s) = &args.script {
        path.push_str(&format!("?script={s}"));
    }
    let doc = client.get_json(&path, "sessions")?;
    if args.json {
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows = doc["profiles"]
        .as_array()
        .or(doc["sessions"].as_array())
        .or(doc.as_array())
        .cloned()
        .unwrap_or_default();
    writeln!(
        out,
        "{:<38} {:<20} {:<5} {:<9} {:>7}  created",
        "id", "script", "type", "status", "ms"
    )?;
    for s in &rows {
        let f = |k: &str| s[k].as_str().unwrap_or("").to_owned();
        writeln!(
            out,
            "{:<38} {:<20} {:<5} {:<9} {:>7}  {}",
            f("id"),
            f("script"),
            f("profile_type"),
            f("status"),
            s["duration_ms"].as_u64().unwrap_or(0),
            f("created_at")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `edgeprof versions`.
#[derive(Debug, clap::Args)]
pub struct VersionsArgs {
    /// Script whose versions to list.
    pub script: String,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn versions(conn: &Connection, args: &VersionsArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    print_versions(&client, &args.script, args.json, out)
}

/// Flags of `edgeprof rollout`.
#[derive(Debug, clap::Args)]
pub struct RolloutArgs {
    /// Script whose traffic split to set.
    pub script: String,
    /// `VERSION=WEIGHT` for every version that serves traffic (VERSION:
    /// `latest`, an id, or a unique prefix); versions left out get none.
    #[arg(required = true, value_name = "VERSION=WEIGHT", value_parser = parse_split)]
    pub split: Vec<(String, u32)>,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_split(s: &str) -> Result<(String, u32), String> {
    let (version, weight) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected VERSION=WEIGHT, e.g. 01a2b3c4=90"))?;
    let weight = weight
        .parse()
        .map_err(|_| format!("`{s}`: weight `{weight}` is not a whole number from 0 to 100"))?;
    Ok((version.to_owned(), weight))
}

pub fn rollout(conn: &Connection, args: &RolloutArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let versions: Vec<Value> = args
        .split
        .iter()
        .map(|(v, w)| json!({"version_id": v, "weight": w}))
        .collect();
    client.send(
        client
            .http
            .put(client.url(&format!("/scripts/{}/deployment", args.script)))
            .json(&json!({ "versions": versions })),
        &format!("rollout {}", args.script),
    )?;
    print_versions(&client, &args.script, args.json, out)
}

/// A script's versions as JSON or as a table with each version's share.
fn print_versions(
    client: &Client,
    script: &str,
    as_json: bool,
    out: &mut impl Write,
) -> Result<ExitCode> {
    let doc = client.get_json(
        &format!("/scripts/{script}/versions"),
        &format!("versions of {script}"),
    )?;
    if as_json {
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows = doc["versions"].as_array().cloned().unwrap_or_default();
    let total: u64 = rows.iter().filter_map(|v| v["weight"].as_u64()).sum();
    writeln!(
        out,
        "{:<38} {:>6} {:>6}  {:>10}",
        "version", "weight", "share", "bytes"
    )?;
    for v in &rows {
        let weight = v["weight"].as_u64().unwrap_or(0);
        let share = if total == 0 {
            0.0
        } else {
            100.0 * weight as f64 / total as f64
        };
        writeln!(
            out,
            "{:<38} {:>6} {:>5.1}%  {:>10}",
            v["id"].as_str().unwrap_or(""),
            weight,
            share,
            v["wasm_bytes"].as_u64().unwrap_or(0)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    fn doc() -> Value {
        serde_json::json!({"script": "api", "versions": [
            {"version_id": "01a236d7-aaa6-7317-b579-e297cd4062f8",
             "isolates": [{"machine": "m1", "data_center": "lhr", "isolate": "i1",
                           "memory_bytes": 3 << 20}],
             "memory_bytes": {"p50": 1 << 20, "p99": 130 << 20, "p999": 140 << 20,
                              "max": 141 << 20, "samples": 1000},
             "evictions": {"exceeded_memory": 4, "total": 6}, "window_s": 300},
            {"version_id": "01a236d7-aa84-75fd-ac9b-49b737d755b1", "isolates": [],
             "memory_bytes": {"p50": null, "p99": null, "p999": null, "max": null,
                              "samples": 0},
             "evictions": {"exceeded_memory": 0, "total": 0}, "window_s": 60}
        ]})
    }

    #[test]
    fn summary_line_per_version() {
        assert_eq!(
            memory_summary(&doc()),
            vec![
                "version 01a236d7-aaa: memory p50 1.0 MiB p99 130.0 MiB p99.9 140.0 MiB max 141.0 MiB (1000 readings, last 300 s); Exceeded Memory evictions 4 (of 6)",
                "version 01a236d7-aa8: memory p50 - p99 - p99.9 - max - (0 readings, last 60 s); Exceeded Memory evictions 0 (of 0)",
            ]
        );
        assert!(memory_summary(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn memory_per_isolate() {
        let m = memory_by_isolate(&doc());
        assert_eq!(m.len(), 1);
        assert_eq!(m[&("m1".to_owned(), "i1".to_owned())], 3 << 20);
        assert_eq!(mib(1536 * 1024), "1.5 MiB");
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn an_empty_profile_is_explained() {
        let types = [("samples", "count"), ("cpu", "nanoseconds")];
        let empty = edgeprof_pprof::encode(&edgeprof_pprof::ProfileBuilder::new(&types).build());
        let note = empty_profile_note(&empty, Kind::Cpu).unwrap();
        assert!(
            note.starts_with("the profile holds no samples: the profiled isolates used less CPU than one sampling interval"),
            "{note}"
        );
        assert!(
            empty_profile_note(&empty, Kind::Heap)
                .unwrap()
                .contains("512 KiB")
        );
        let mut b = edgeprof_pprof::ProfileBuilder::new(&types);
        let f = b.function("main", "main", "main.rs", 1);
        let l = b.location(
            0,
            0,
            &[edgeprof_pprof::LineSpec {
                function_id: f,
                line: 1,
                column: 0,
            }],
        );
        b.add_sample(&[l], &[1, 1_000_000], &[]);
        assert_eq!(
            empty_profile_note(&edgeprof_pprof::encode(&b.build()), Kind::Cpu),
            None
        );
    }

    #[test]
    fn requests_in_the_summary() {
        let d = Duration::from_secs(4);
        assert_eq!(
            requests_summary(&json!({"requests": 118}), d),
            "118 requests began on the profiled isolates during the 4s capture"
        );
        assert_eq!(
            requests_summary(&json!({"requests": 1}), d),
            "1 request began on the profiled isolates during the 4s capture"
        );
        assert_eq!(
            requests_summary(&json!({"requests": null}), d),
            "requests during the capture: unknown (an agent did not count them)"
        );
    }
}
