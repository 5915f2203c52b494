//! Commands that talk to a control plane over its REST API (`/v1/...`).
//!
//! Every request and response body is a type of `edgeprof_proto::rest`, the
//! contract the control plane serves; responses tolerate fields added later,
//! so a newer control plane still works. URLs are built by segment and query
//! strings encoded by the HTTP client, so a script name or a filter can never
//! add a parameter. `https://` URLs are verified with rustls (the system's
//! roots, or only `--ca-cert` for a private CA).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use edgeprof_proto::rest::{self, ProfileKind, SessionStatus};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Where the control plane is and who is asking; from flags or environment.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Control plane base URL (`http://` or `https://`).
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
    /// PEM file of the CA (or CAs) that signed the control plane's
    /// certificate, for a private CA: then only these are trusted.
    #[arg(long, env = "EDGEPROF_CA_CERT", global = true, value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,
}

/// Flags of `edgeprof profile`.
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// Script to profile.
    #[arg(required_unless_present = "session")]
    pub script: Option<String>,
    /// Download the profile of a past (or running) capture session instead
    /// of starting one.
    #[arg(long, value_name = "ID", conflicts_with_all = [
        "script", "version", "kind", "duration", "durable_object", "data_center",
    ])]
    pub session: Option<String>,
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

impl From<Kind> for ProfileKind {
    fn from(k: Kind) -> ProfileKind {
        match k {
            Kind::Cpu => ProfileKind::Cpu,
            Kind::Heap => ProfileKind::Heap,
        }
    }
}

/// Shortest and longest capture the control plane accepts.
const DURATION_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(rest::MIN_DURATION_MS)..=Duration::from_millis(rest::MAX_DURATION_MS);

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

/// Largest response read: a merged profile of a large fleet, with room.
const MAX_RESPONSE_BYTES: u64 = 512 << 20;

type Response = ureq::http::Response<ureq::Body>;

/// The REST client every online command uses (also `history`).
pub(crate) struct Client {
    http: ureq::Agent,
    base: url::Url,
    token: String,
    account: String,
}

impl Client {
    pub(crate) fn new(c: &Connection) -> Result<Self> {
        let token = c
            .token
            .clone()
            .ok_or_else(|| anyhow!("no API token: pass --token or set EDGEPROF_TOKEN"))?;
        let account = c
            .account
            .clone()
            .ok_or_else(|| anyhow!("no account: pass --account or set EDGEPROF_ACCOUNT"))?;
        let base =
            url::Url::parse(&c.url).map_err(|e| anyhow!("--url `{}`: not a URL ({e})", c.url))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            bail!("--url `{}`: must be an http:// or https:// URL", c.url);
        }
        // Certificates are always verified: against Mozilla's roots, or
        // with `--ca-cert` against those CAs only.
        let roots = match &c.ca_cert {
            Some(path) => ureq::tls::RootCerts::new_with_certs(&read_ca_certs(path)?),
            None => ureq::tls::RootCerts::WebPki,
        };
        // Statuses are answers to read (the error body), not transport
        // errors; the control plane never redirects, so a 3xx is shown
        // rather than followed; no proxy from the environment (as before:
        // the control plane is addressed directly).
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(Duration::from_secs(120)))
            .tls_config(
                ureq::tls::TlsConfig::builder()
                    .provider(ureq::tls::TlsProvider::Rustls)
                    .root_certs(roots)
                    .build(),
            )
            .build();
        Ok(Client {
            http: config.into(),
            base,
            token,
            account,
        })
    }

    /// `BASE/v1/accounts/ACCOUNT/SEGMENTS…?QUERY`, each segment
    /// percent-encoded and the query encoded from `query`'s fields.
    pub(crate) fn url(&self, segments: &[&str], query: &impl Serialize) -> Result<String> {
        // `.` and `..` would be resolved away (`--session ..` would name
        // another resource), and an empty segment names none.
        let account = self.account.as_str();
        if let Some(bad) = std::iter::once(&account)
            .chain(segments)
            .find(|s| matches!(**s, "" | "." | ".."))
        {
            bail!("`{bad}` is not a valid name (account, script, version or session id)");
        }
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("checked in Client::new: an http(s) URL has a path")
            .pop_if_empty()
            .extend(["v1", "accounts", &self.account])
            .extend(segments);
        let query = serde_urlencoded::to_string(query).context("cannot encode the query")?;
        url.set_query((!query.is_empty()).then_some(query.as_str()));
        Ok(url.into())
    }

    /// A request to `segments` with `query` and the token.
    pub(crate) fn request<B>(
        &self,
        method: fn(&ureq::Agent, String) -> ureq::RequestBuilder<B>,
        segments: &[&str],
        query: &impl Serialize,
    ) -> Result<ureq::RequestBuilder<B>> {
        Ok(method(&self.http, self.url(segments, query)?)
            .header("authorization", format!("Bearer {}", self.token)))
    }

    /// The response if it is a success; otherwise one line with the
    /// control plane's message, status and code.
    pub(crate) fn check(
        &self,
        sent: Result<Response, ureq::Error>,
        what: &str,
    ) -> Result<Response> {
        let mut resp = sent.map_err(|e| {
            // Names a certificate problem, a refused connection or a timeout.
            anyhow!(
                "{what}: cannot reach the control plane at {}: {}",
                self.base,
                error_chain(&e)
            )
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 << 10)
            .read_to_vec()
            .unwrap_or_default();
        let mut line = match serde_json::from_slice::<rest::ErrorBody>(&body) {
            Ok(e) => format!(
                "{what}: {} (HTTP {}, {}",
                e.error.message,
                status.as_u16(),
                e.error.code
            ),
            Err(_) => format!(
                "{what}: {} (HTTP {}",
                String::from_utf8_lossy(&body)
                    .trim()
                    .chars()
                    .take(300)
                    .collect::<String>(),
                status.as_u16()
            ),
        };
        if let Some(r) = retry_after {
            line.push_str(&format!(", retry after {r} s"));
        }
        line.push(')');
        Err(anyhow!(line))
    }

    /// GET `segments` with `query` encoded, read as `T`.
    pub(crate) fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &impl Serialize,
        what: &str,
    ) -> Result<T> {
        let sent = self.request(ureq::Agent::get, segments, query)?.call();
        read_json(self.check(sent, what)?, what)
    }

    /// GET `segments` as bytes (a profile).
    fn get_bytes(&self, segments: &[&str], what: &str) -> Result<Vec<u8>> {
        let sent = self.request(ureq::Agent::get, segments, &())?.call();
        read_bytes(self.check(sent, what)?, what)
    }
}

/// A response body, bounded by [`MAX_RESPONSE_BYTES`].
pub(crate) fn read_bytes(mut resp: Response, what: &str) -> Result<Vec<u8>> {
    resp.body_mut()
        .with_config()
        .limit(MAX_RESPONSE_BYTES)
        .read_to_vec()
        .map_err(|e| anyhow!("{what}: cannot read the control plane's answer: {e}"))
}

/// A response body as `T`; the error names the command and serde's cause.
fn read_json<T: DeserializeOwned>(resp: Response, what: &str) -> Result<T> {
    serde_json::from_slice(&read_bytes(resp, what)?).map_err(|e| {
        anyhow!("{what}: the control plane's answer does not match the REST contract: {e}")
    })
}

/// The PEM certificates of `--ca-cert`.
fn read_ca_certs(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>> {
    let name = path.display();
    let pem = std::fs::read(path).with_context(|| format!("--ca-cert {name}: cannot read"))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => bail!("--ca-cert {name}: not PEM certificates ({e})"),
        }
    }
    if certs.is_empty() {
        bail!("--ca-cert {name}: holds no PEM certificate");
    }
    Ok(certs)
}

/// An error and its causes on one line: `a: b: c`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
    line
}

/// Stdout only when no `-o` and it is not a terminal; `--json` needs `-o`.
fn check_output(args: &ProfileArgs) -> Result<()> {
    if args.output.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "refusing to write a binary profile to the terminal: pass -o FILE or redirect stdout"
        );
    }
    if args.json && args.output.is_none() {
        bail!("--json prints the session on stdout, so the profile needs -o FILE");
    }
    Ok(())
}

/// Starts a capture; the session id.
fn start_capture(
    client: &Client,
    args: &ProfileArgs,
    script: &str,
    duration: Duration,
    what: &str,
) -> Result<String> {
    let (namespace_id, actor_id) = match &args.durable_object {
        Some(dobj) => {
            let (ns, id) = dobj
                .split_once(':')
                .ok_or_else(|| anyhow!("--durable-object must be NAMESPACE:ID (got `{dobj}`)"))?;
            (Some(ns.to_owned()), Some(id.to_owned()))
        }
        None => (None, None),
    };
    let body = rest::CaptureRequest {
        script: Some(script.to_owned()),
        version: Some(args.version.clone()),
        duration_ms: Some(duration.as_millis() as u64),
        profile_type: Some(args.kind.into()),
        namespace_id,
        actor_id,
        data_center: args.data_center.clone(),
    };
    let sent = client
        .request(ureq::Agent::post, &["profiles"], &())?
        .send_json(&body);
    let started: rest::SessionStarted = read_json(client.check(sent, what)?, what)?;
    Ok(started.id)
}

/// Polls session `id` until it ends, with a progress bar while it runs.
fn wait_for_session(client: &Client, id: &str, what: &str) -> Result<rest::Session> {
    let t0 = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    loop {
        let s: rest::Session = client.get(&["profiles", id], &(), what)?;
        let duration = Duration::from_millis(s.duration_ms);
        if s.status.is_finished() {
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            return Ok(s);
        }
        let bar = bar.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::new(s.duration_ms);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {msg} [{bar:30}] {elapsed}/{prefix}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(format!("{duration:?}"));
            bar
        });
        bar.set_message(format!(
            "{} {} {} — {}/{} machines answered ({id})",
            s.status,
            s.script,
            s.profile_type,
            s.progress.machines_answered,
            s.progress.machines_total
        ));
        bar.set_position((t0.elapsed().as_millis() as u64).min(s.duration_ms));
        // The server bounds a capture by duration + slack; this bounds the
        // wait for a server that stops answering.
        let give_up = duration + Duration::from_secs(60);
        if t0.elapsed() > give_up {
            bar.finish_and_clear();
            bail!(
                "{what}: session {id} still `{}` after {give_up:?}; giving up",
                s.status
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn profile(conn: &Connection, args: &ProfileArgs, out: &mut impl Write) -> Result<ExitCode> {
    let duration = match &args.session {
        None => Some(parse_duration(&args.duration)?),
        Some(_) => None,
    };
    check_output(args)?;
    let client = Client::new(conn)?;
    let (id, what) = match (&args.session, &args.script, duration) {
        (Some(id), _, _) => (id.clone(), format!("session {id}")),
        (None, Some(script), Some(duration)) => {
            let what = format!("profile {script}");
            (start_capture(&client, args, script, duration, &what)?, what)
        }
        _ => bail!("profile: name a script, or pass --session ID"),
    };
    let session = wait_for_session(&client, &id, &what)?;
    if session.status == SessionStatus::Failed {
        let reason = session.error.as_deref().unwrap_or("no reason given");
        bail!("{what}: capture {id} failed: {reason}");
    }
    let bytes = client.get_bytes(&["profiles", &id, "pprof"], &what)?;
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
        "edgeprof: wrote {written_to} ({} bytes, session {id}, {}); {}",
        bytes.len(),
        session.status,
        requests_summary(session.requests, Duration::from_millis(session.duration_ms))
    );
    if let Some(note) = empty_profile_note(&bytes, session.profile_type) {
        eprintln!("edgeprof: note: {note}");
    }
    if args.json {
        serde_json::to_writer(&mut *out, &session)?;
        writeln!(out)?;
    }
    if session.status == SessionStatus::Partial {
        eprintln!(
            "edgeprof: partial capture: no profile from {}",
            session.missing_machines.join(", ")
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// Why a capture that succeeded holds no sample, so an empty flamegraph
/// is not mistaken for a broken one; `None` when it has samples.
fn empty_profile_note(pprof: &[u8], kind: ProfileKind) -> Option<String> {
    let profile = edgeprof_pprof::decode(pprof).ok()?;
    if !profile.sample.is_empty() {
        return None;
    }
    Some(match kind {
        ProfileKind::Cpu => {
            "the profile holds no samples: the profiled isolates used less CPU than one \
                     sampling interval during the capture; capture for longer or under more traffic"
                .to_owned()
        }
        ProfileKind::Heap => {
            "the profile holds no samples: the profiled isolates allocated less than the \
                       heap sampling interval (512 KiB on average) during the capture and hold no \
                       sampled object; capture for longer or under more traffic"
                .to_owned()
        }
    })
}

/// What the summary says of the requests served during the capture: the
/// denominator of "CPU (or bytes) per request".
fn requests_summary(requests: Option<u64>, duration: Duration) -> String {
    match requests {
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

/// `targets --json`: the targets document with the memory view of the same
/// versions under `memory`.
#[derive(Debug, Serialize)]
struct TargetsOutput {
    #[serde(flatten)]
    targets: rest::TargetList,
    memory: rest::MemoryReport,
}

pub fn targets(conn: &Connection, args: &TargetsArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let script = args.script.as_str();
    let targets: rest::TargetList = client.get(
        &["scripts", script, "targets"],
        &rest::TargetsQuery {
            version: args.version.clone(),
            data_center: None,
        },
        &format!("targets {script}"),
    )?;
    let memory: rest::MemoryReport = client.get(
        &["scripts", script, "memory"],
        &rest::MemoryQuery {
            version: args.version.clone(),
            window_s: None,
        },
        &format!("memory {script}"),
    )?;
    if args.json {
        serde_json::to_writer(&mut *out, &TargetsOutput { targets, memory })?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<6} {:<14} {:<38} {:<12} {:>8} {:>10}  durable objects",
        "dc", "machine", "isolate", "version", "req/min", "memory"
    )?;
    for t in &targets.targets {
        writeln!(
            out,
            "{:<6} {:<14} {:<38} {:<12} {:>8} {:>10}  {}",
            t.data_center,
            t.machine,
            t.isolate,
            short_id(&t.version_id),
            t.requests_per_minute,
            mib(t.memory_bytes),
            t.durable_objects.join(",")
        )?;
    }
    for line in memory_summary(&memory) {
        writeln!(out, "{line}")?;
    }
    if targets.targets.is_empty() {
        eprintln!("edgeprof: no isolates of {script} served traffic in the last 60 s");
    }
    Ok(ExitCode::SUCCESS)
}

/// The first 12 characters of a version id, as tables show it.
fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

/// Memory in MiB with one decimal, e.g. `12.5 MiB`.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// One line per version of a `…/memory` document: nearest-rank memory
/// percentiles over the window and "Exceeded Memory" evictions.
fn memory_summary(memory: &rest::MemoryReport) -> Vec<String> {
    memory
        .versions
        .iter()
        .map(|v| {
            let p = |b: Option<u64>| b.map(mib).unwrap_or_else(|| "-".into());
            let m = &v.memory_bytes;
            format!(
                "version {}: memory p50 {} p99 {} p99.9 {} max {} ({} readings, last {} s); Exceeded Memory evictions {} (of {})",
                short_id(&v.version_id),
                p(m.p50),
                p(m.p99),
                p(m.p999),
                p(m.max),
                m.samples,
                v.window_s,
                v.evictions.exceeded_memory,
                v.evictions.total,
            )
        })
        .collect()
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
    let bytes = if bytes.starts_with(b"\0asm") {
        bytes
    } else if args.wasm.extension().is_some_and(|e| e == "wat") {
        // The text format, compiled here: the control plane takes binary
        // modules only.
        wat::parse_bytes(&bytes)
            .map(std::borrow::Cow::into_owned)
            .map_err(|e| anyhow::anyhow!("{}: not valid WAT: {e}", args.wasm.display()))?
    } else {
        bail!(
            "{}: not a WebAssembly module (no \\0asm header; a text-format module needs a .wat name)",
            args.wasm.display()
        );
    };
    let what = format!("deploy {}", args.script);
    let query = rest::UploadQuery {
        weight: args.weight,
    };
    let sent = client
        .request(
            ureq::Agent::post,
            &["scripts", &args.script, "versions"],
            &query,
        )?
        .content_type("application/wasm")
        .send(&bytes[..]);
    let version: rest::UploadedVersion = read_json(client.check(sent, &what)?, &what)?;
    if args.json {
        serde_json::to_writer(&mut *out, &version)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", version.id)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `edgeprof sessions`.
#[derive(Debug, clap::Args)]
pub struct SessionsArgs {
    /// Only sessions of this script.
    #[arg(long)]
    pub script: Option<String>,
    /// At most this many, newest first (1–1000; default 100).
    #[arg(long, short = 'n')]
    pub limit: Option<u32>,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn sessions(conn: &Connection, args: &SessionsArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let list: rest::SessionList = client.get(
        &["profiles"],
        &rest::SessionsQuery {
            script: args.script.clone(),
            limit: args.limit,
        },
        "sessions",
    )?;
    if args.json {
        serde_json::to_writer(&mut *out, &list)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<38} {:<20} {:<5} {:<9} {:>7}  created",
        "id", "script", "type", "status", "ms"
    )?;
    for s in &list.profiles {
        writeln!(
            out,
            "{:<38} {:<20} {:<5} {:<9} {:>7}  {}",
            s.id,
            s.script,
            s.profile_type.as_str(),
            s.status.as_str(),
            s.duration_ms,
            utc_time(s.created_at_ms)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Unix milliseconds as UTC to the second, `2026-12-03T12:53:22Z`.
fn utc_time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => {
            humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
                .to_string()
        }
        Err(_) => "-".to_owned(),
    }
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
    let body = rest::DeploymentRequest {
        versions: args
            .split
            .iter()
            .map(|(version_id, weight)| rest::DeploymentRequestEntry {
                version_id: version_id.clone(),
                weight: *weight,
            })
            .collect(),
    };
    let what = format!("rollout {}", args.script);
    let sent = client
        .request(
            ureq::Agent::put,
            &["scripts", &args.script, "deployment"],
            &(),
        )?
        .send_json(&body);
    let _: rest::Deployment = read_json(client.check(sent, &what)?, &what)?;
    print_versions(&client, &args.script, args.json, out)
}

/// A script's versions as JSON or as a table with each version's share.
fn print_versions(
    client: &Client,
    script: &str,
    as_json: bool,
    out: &mut impl Write,
) -> Result<ExitCode> {
    let list: rest::VersionList = client.get(
        &["scripts", script, "versions"],
        &(),
        &format!("versions of {script}"),
    )?;
    if as_json {
        serde_json::to_writer(&mut *out, &list)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let total: u64 = list.versions.iter().map(|v| u64::from(v.weight)).sum();
    writeln!(
        out,
        "{:<38} {:>6} {:>6}  {:>10}",
        "version", "weight", "share", "bytes"
    )?;
    for v in &list.versions {
        let share = if total == 0 {
            0.0
        } else {
            100.0 * f64::from(v.weight) / total as f64
        };
        writeln!(
            out,
            "{:<38} {:>6} {:>5.1}%  {:>10}",
            v.id, v.weight, share, v.wasm_bytes
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    fn doc() -> rest::MemoryReport {
        serde_json::from_value(serde_json::json!({"script": "api", "versions": [
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
        ]}))
        .unwrap()
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
        assert_eq!(mib(1536 * 1024), "1.5 MiB");
    }

    #[test]
    fn times_are_utc_seconds() {
        assert_eq!(utc_time(1_796_302_217_422), "2026-12-03T12:50:17Z");
        assert_eq!(utc_time(-1), "-");
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn an_empty_profile_is_explained() {
        let types = [("samples", "count"), ("cpu", "nanoseconds")];
        let empty = edgeprof_pprof::encode(&edgeprof_pprof::ProfileBuilder::new(&types).build());
        let note = empty_profile_note(&empty, ProfileKind::Cpu).unwrap();
        assert!(
            note.starts_with("the profile holds no samples: the profiled isolates used less CPU than one sampling interval"),
            "{note}"
        );
        assert!(
            empty_profile_note(&empty, ProfileKind::Heap)
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
            empty_profile_note(&edgeprof_pprof::encode(&b.build()), ProfileKind::Cpu),
            None
        );
    }

    #[test]
    fn requests_in_the_summary() {
        let d = Duration::from_secs(4);
        assert_eq!(
            requests_summary(Some(118), d),
            "118 requests began on the profiled isolates during the 4s capture"
        );
        assert_eq!(
            requests_summary(Some(1), d),
            "1 request began on the profiled isolates during the 4s capture"
        );
        assert_eq!(
            requests_summary(None, d),
            "requests during the capture: unknown (an agent did not count them)"
        );
    }
}

#[cfg(test)]
mod url_tests {
    use super::*;

    fn client(url: &str) -> Client {
        Client::new(&Connection {
            url: url.into(),
            token: Some("t".into()),
            account: Some("acme".into()),
            ca_cert: None,
        })
        .unwrap()
    }

    #[test]
    fn segments_and_queries_are_encoded() {
        let c = client("https://cp.example/base/");
        let query = rest::SessionsQuery {
            script: Some("a&limit=1 #x".into()),
            limit: None,
        };
        assert_eq!(
            c.url(&["profiles"], &query).unwrap(),
            "https://cp.example/base/v1/accounts/acme/profiles?script=a%26limit%3D1+%23x"
        );
        assert_eq!(
            c.url(&["profiles", "../x?y#z", "pprof"], &()).unwrap(),
            "https://cp.example/base/v1/accounts/acme/profiles/..%2Fx%3Fy%23z/pprof"
        );
        for bad in ["..", ".", ""] {
            let e = c.url(&["profiles", bad, "pprof"], &()).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("`{bad}` is not a valid name (account, script, version or session id)")
            );
        }
        assert_eq!(
            c.url(
                &["scripts", "api", "versions"],
                &rest::UploadQuery { weight: None }
            )
            .unwrap(),
            "https://cp.example/base/v1/accounts/acme/scripts/api/versions"
        );
    }
}
