//! `cargo xtask bench capture [--machines 100,500,1000] [--duration 2s]
//! [--rate R]`: the fan-out of one capture to an edge of N machines (issue
//! 15; DESIGN.md §6 asks duration + 1 s at 100 machines).
//!
//! For each N, on fresh processes: the release control plane on embedded
//! SQLite (`--dev`, a dev token), one `edgeprof-node-agent
//! --simulate-machines N` (machines over five data centers, one isolate
//! each of `e2e/workers/wat/tiny.wat`, `R` requests a second per machine
//! through their HTTP ingress, continuous profiling off), the worker
//! deployed with the CLI; once `/metrics` says `edgeprof_live_machines N`
//! and `…/targets` lists every machine, one synchronous capture `POST
//! …/versions/latest/profile` of the duration. Printed per N: wall time,
//! wall − duration, machines with samples in the merged profile (distinct
//! `machine` labels, `edgeprof tags`), the control plane's CPU during the
//! capture (utime + stime of `/proc/PID/stat`) and its peak RSS (`VmHWM`).
//!
//! Every wait is bounded and says what it waited for; the children are
//! killed on every exit (`Children`'s drop). Std only, like all of xtask:
//! HTTP is a minimal HTTP/1.1 client over `TcpStream`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{build_release, edgeprof_output, root, run as sh};

const SECRET: &str = "edgeprof-bench-agent-secret";
const TOKEN: &str = "edgeprof-dev-bench-capture";
const SCRIPT: &str = "tiny";
const DATA_CENTERS: &str = "lhr,sjc,nrt,fra,iad";

struct Options {
    machines: Vec<usize>,
    duration: Duration,
    rate: f64,
}

fn parse(args: &[String], usage: &str) -> Result<Options, String> {
    let mut o = Options {
        machines: vec![100, 500, 1000],
        duration: Duration::from_secs(2),
        rate: 1.0,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{usage}"))?;
        let bad = |why: String| format!("{flag} {value}: {why}\n{usage}");
        match flag.as_str() {
            "--machines" => {
                o.machines = value
                    .split(',')
                    .map(|n| match n.trim().parse::<usize>() {
                        Ok(n) if (1..=5000).contains(&n) => Ok(n),
                        _ => Err(bad(format!("`{n}` is not a count of 1–5000"))),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--duration" => {
                let ms = match value.strip_suffix("ms") {
                    Some(ms) => ms.parse::<u64>().ok(),
                    None => value
                        .strip_suffix('s')
                        .unwrap_or(value)
                        .parse::<u64>()
                        .ok()
                        .map(|s| s * 1000),
                };
                match ms {
                    Some(ms) if (1000..=50_000).contains(&ms) => {
                        o.duration = Duration::from_millis(ms)
                    }
                    _ => return Err(bad("must be 1s–50s (e.g. `2s`, `1500ms`)".into())),
                }
            }
            "--rate" => match value.parse::<f64>() {
                Ok(r) if (0.01..=100.0).contains(&r) => o.rate = r,
                _ => return Err(bad("must be 0.01–100 requests a second".into())),
            },
            _ => return Err(format!("unknown flag `{flag}`\n{usage}")),
        }
    }
    Ok(o)
}

pub fn run(args: &[String], usage: &str) -> Result<(), String> {
    let o = parse(args, usage)?;
    build_release(&[])?;
    let bin = super::release_dir();
    let state = root().join("target/bench-capture");
    let mut rows = Vec::new();
    for &n in &o.machines {
        eprintln!("xtask bench capture: {n} machines");
        let dir = state.join(n.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        rows.push(
            one(&bin, &dir, n, &o)
                .map_err(|e| format!("{n} machines: {e} (logs in {})", dir.display()))?,
        );
    }
    println!(
        "capture fan-out, {} s capture of `{SCRIPT}` (one isolate a machine, {} req/s a machine), control plane on SQLite:",
        o.duration.as_secs_f64(),
        o.rate
    );
    println!(
        "  {:>8}  {:>8}  {:>13}  {:>8}  {:>14}  {:>12}  {:>11}",
        "machines", "wall s", "wall - dur s", "covered", "cp cpu s", "cp peak MiB", "edge cpu s"
    );
    for r in &rows {
        println!(
            "  {:>8}  {:>8.3}  {:>13.3}  {:>8}  {:>14.2}  {:>12.1}  {:>11.2}",
            r.machines,
            r.wall.as_secs_f64(),
            r.wall.as_secs_f64() - o.duration.as_secs_f64(),
            r.covered,
            r.cpu_secs,
            r.peak_rss_kib as f64 / 1024.0,
            r.edge_cpu_secs
        );
    }
    Ok(())
}

struct Row {
    machines: usize,
    wall: Duration,
    covered: usize,
    cpu_secs: f64,
    peak_rss_kib: u64,
    /// CPU of the simulated edge's process over the capture (every
    /// machine's sampling, answers and heartbeats, and the traffic).
    edge_cpu_secs: f64,
}

/// Child processes, killed and reaped when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

fn logged(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))
}

/// Polls `ready` every 100 ms until it is `Some`, for at most `timeout`;
/// fails naming `what`, or a child that exited.
fn wait<T>(
    what: &str,
    timeout: Duration,
    children: &mut Children,
    mut ready: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let start = Instant::now();
    loop {
        if let Some(v) = ready() {
            return Ok(v);
        }
        for c in &mut children.0 {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(format!(
                    "a child exited with {status} while waiting for {what}"
                ));
            }
        }
        if start.elapsed() > timeout {
            return Err(format!("{what}: not after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn one(bin: &Path, dir: &Path, n: usize, o: &Options) -> Result<Row, String> {
    let (http_port, grpc_port) = (free_port()?, free_port()?);
    let http = format!("127.0.0.1:{http_port}");
    let mut children = Children(Vec::new());
    let heartbeat_ms = "2000";
    children.0.push(logged(
        Command::new(bin.join("edgeprof-control-plane"))
            .args(["--http-listen", &http])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc_port}")])
            .arg("--database")
            .arg(dir.join("edgeprof.sqlite"))
            .args(["--agent-secret", SECRET])
            .args(["--heartbeat-interval-ms", heartbeat_ms])
            .args(["--dev", "--dev-token", TOKEN]),
        &dir.join("control-plane.log"),
    )?);
    let cp_pid = children.0[0].id();
    wait(
        "the control plane's /healthz",
        Duration::from_secs(60),
        &mut children,
        || (request(&http, "GET", "/healthz", None).ok()?.0 == 200).then_some(()),
    )?;

    let ready = dir.join("edge.ready.json");
    children.0.push(logged(
        Command::new(bin.join("edgeprof-node-agent"))
            .args(["--data-center", "lhr", "--machine-id", "sim"])
            .args(["--control-plane", &format!("http://127.0.0.1:{grpc_port}")])
            .args(["--http-listen", "127.0.0.1:0"])
            .args(["--grpc-listen", "127.0.0.1:0"])
            .args(["--operator-listen", "127.0.0.1:0"])
            .args(["--agent-secret", SECRET])
            .args(["--heartbeat-ms", heartbeat_ms])
            .args(["--continuous-hz", "0"])
            .args(["--max-isolates-per-version", "1"])
            .args(["--simulate-machines", &n.to_string()])
            .args(["--simulate-data-centers", DATA_CENTERS])
            .args(["--simulate-traffic", &format!("{SCRIPT}.dev.localhost")])
            .args(["--simulate-rate", &o.rate.to_string()])
            .arg("--ready-file")
            .arg(&ready)
            .env("RUST_LOG", "edgeprof_node_agent=warn"),
        &dir.join("simulated-edge.log"),
    )?);
    // Starting and registering is about a millisecond a machine here; the
    // bound leaves a wide margin on a loaded machine.
    let bound = Duration::from_secs(60) + Duration::from_millis(100) * n as u32;
    let started = Instant::now();
    wait(
        "the simulated edge's ready file",
        bound,
        &mut children,
        || ready.is_file().then_some(()),
    )?;
    wait(
        &format!("edgeprof_live_machines {n} in the control plane's /metrics"),
        bound,
        &mut children,
        || (live_machines(&http)? >= n).then_some(()),
    )?;
    eprintln!(
        "xtask bench capture: {n} machines live after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let wat = root().join("e2e/workers/wat/tiny.wat");
    sh(Command::new(bin.join("edgeprof"))
        .args(["deploy", SCRIPT])
        .arg(&wat)
        .args(["--weight", "100"])
        .env("EDGEPROF_URL", format!("http://{http}"))
        .env("EDGEPROF_TOKEN", TOKEN)
        .env("EDGEPROF_ACCOUNT", "dev")
        .stdout(Stdio::null()))?;
    let targets = format!("/v1/accounts/dev/scripts/{SCRIPT}/targets");
    wait(
        &format!("every one of the {n} machines serving `{SCRIPT}` (GET {targets})"),
        bound,
        &mut children,
        || {
            let (status, body) = request(&http, "GET", &targets, None).ok()?;
            (status == 200 && distinct_machines(&String::from_utf8_lossy(&body)) >= n).then_some(())
        },
    )?;

    let edge_pid = children.0[1].id();
    let (before, edge_before) = (cpu_ticks(cp_pid)?, cpu_ticks(edge_pid)?);
    let body = format!("{{\"duration_ms\": {}}}", o.duration.as_millis());
    let t0 = Instant::now();
    let (status, pprof) = request(
        &http,
        "POST",
        &format!("/v1/accounts/dev/scripts/{SCRIPT}/versions/latest/profile"),
        Some(&body),
    )?;
    let wall = t0.elapsed();
    let (after, edge_after) = (cpu_ticks(cp_pid)?, cpu_ticks(edge_pid)?);
    if status != 200 {
        return Err(format!(
            "the capture answered {status}: {}",
            String::from_utf8_lossy(&pprof)
        ));
    }
    let file = dir.join("capture.pprof");
    std::fs::write(&file, &pprof).map_err(|e| format!("{}: {e}", file.display()))?;
    let covered = machine_labels(bin, &file)?;
    Ok(Row {
        machines: n,
        wall,
        covered,
        cpu_secs: (after - before) as f64 / clock_ticks_per_sec() as f64,
        edge_cpu_secs: (edge_after - edge_before) as f64 / clock_ticks_per_sec() as f64,
        peak_rss_kib: peak_rss_kib(cp_pid)?,
    })
}

fn live_machines(http: &str) -> Option<usize> {
    let (status, body) = request(http, "GET", "/metrics", None).ok()?;
    if status != 200 {
        return None;
    }
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("edgeprof_live_machines "))
        .and_then(|v| v.trim().parse().ok())
}

/// Distinct values of `"machine":"…"` in a targets answer.
fn distinct_machines(json: &str) -> usize {
    let mut seen: Vec<&str> = json
        .split("\"machine\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

/// How many values the `machine` label has in `file` (`edgeprof tags`).
fn machine_labels(bin: &Path, file: &Path) -> Result<usize, String> {
    let text = edgeprof_output(&bin.join("edgeprof"), &["tags"], file)?;
    Ok(text
        .lines()
        .skip_while(|l| !l.starts_with("machine:"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .count())
}

/// utime + stime of `pid`, in clock ticks (`/proc/PID/stat` fields 14, 15).
fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The command name (field 2) may hold spaces; fields after it do not.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    match (field(11), field(12)) {
        (Some(u), Some(s)) => Ok(u + s),
        _ => Err(format!("{path}: no utime/stime in `{stat}`")),
    }
}

/// `getconf CLK_TCK` (100 on Linux where it cannot be asked).
fn clock_ticks_per_sec() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// `VmHWM` of `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("{path}: no VmHWM"))
}

/// One HTTP/1.1 request to `addr` with the bench's token (`Connection:
/// close`, 120 s timeouts); the status and the body (de-chunked).
fn request(
    addr: &str,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> Result<(u16, Vec<u8>), String> {
    let io = |e: std::io::Error| format!("{method} http://{addr}{path}: {e}");
    let mut s = TcpStream::connect(addr).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(io)?;
    s.set_write_timeout(Some(Duration::from_secs(120)))
        .map_err(io)?;
    let body = json.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(io)?;
    s.write_all(body.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("{method} {path}: no HTTP header in the answer"))?;
    let header = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = header
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{method} {path}: bad status line"))?;
    let mut rest = raw[split + 4..].to_vec();
    if header.contains("transfer-encoding: chunked") {
        rest = dechunk(&rest).ok_or_else(|| format!("{method} {path}: bad chunked body"))?;
    }
    Ok((status, rest))
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..line]).ok()?.trim(), 16).ok()?;
        b = &b[line + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}
