//! Starting, inspecting and stopping a local edge.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

/// Data-center codes handed out in order.
pub const DATA_CENTER_CODES: [&str; 8] = ["lhr", "sjc", "nrt", "fra", "iad", "sin", "gru", "syd"];

/// The shape and location of a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of data centers (1–8).
    pub data_centers: usize,
    /// Machines (agents) per data center.
    pub machines_per_dc: usize,
    /// Where the database, logs and `cluster.json` go.
    pub state_dir: PathBuf,
    /// Directory holding `edgeprof-control-plane`, `edgeprof-node-agent`, `edgeprof`.
    pub bin_dir: PathBuf,
    /// Agent heartbeat period.
    pub heartbeat: Duration,
    /// The control plane's Durable Object lease (its default when `None`).
    pub durable_object_lease: Option<Duration>,
    /// Remove the state directory first.
    pub fresh: bool,
    /// Further flags for every node agent (e.g. tighter limits).
    pub agent_args: Vec<String>,
    /// Continuous profiling on every agent: CPU samples per second per
    /// isolate (the agent's default, 19; 0 turns it off).
    pub continuous_hz: u32,
    /// Length of a continuous-profiling window (the agent's default, 10 s;
    /// whole seconds).
    pub continuous_window: Duration,
    /// Run every machine inside one agent process
    /// (`--simulate-machines`), with this traffic, instead of one process
    /// a machine.
    pub simulated: Option<SimulatedTraffic>,
}

/// The traffic of a simulated edge (`edgeprof-node-agent --simulate-*`):
/// requests of `/` on each script, through every machine.
#[derive(Debug, Clone)]
pub struct SimulatedTraffic {
    /// Scripts of the cluster's account to request.
    pub scripts: Vec<String>,
    /// Requests per second per machine and script.
    pub rate: f64,
}

impl ClusterOptions {
    /// Defaults for a cluster under `state_dir`, with binaries next to the
    /// running executable (`target/<profile>/`).
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        ClusterOptions {
            data_centers: 3,
            machines_per_dc: 2,
            state_dir: state_dir.into(),
            bin_dir: default_bin_dir(),
            heartbeat: Duration::from_millis(1000),
            durable_object_lease: None,
            fresh: true,
            agent_args: Vec::new(),
            continuous_hz: 19,
            continuous_window: Duration::from_secs(10),
            simulated: None,
        }
    }
}

/// `target/<profile>/`, found from the running executable (which is either
/// there or in its `deps/`), or `$EDGEPROF_BIN_DIR`.
pub fn default_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("EDGEPROF_BIN_DIR") {
        return d.into();
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The host name of `script` of `account` on the local edge (agents run
/// with the default `--zone localhost`).
pub fn worker_host(script: &str, account: &str) -> String {
    format!("{script}.{account}.localhost")
}

/// One agent as the cluster knows it.
#[derive(Debug, Clone)]
pub struct MachineInfo {
    /// Machine id.
    pub id: String,
    /// HTTP ingress base URL.
    pub http: String,
    /// gRPC URL.
    pub grpc: String,
    /// Operator endpoints' base URL (`/metrics`, `/debug/pprof/profile`).
    pub operator: String,
}

impl MachineInfo {
    /// `http://{script}.{account}.localhost:PORT`: what a user types
    /// (`curl` resolves `*.localhost` to loopback by itself).
    pub fn worker_url(&self, script: &str, account: &str) -> String {
        let port = self.http.rsplit_once(':').map_or("", |(_, p)| p);
        format!("http://{}:{port}", worker_host(script, account))
    }

    /// A request for `path` of `script` of `account` through this machine,
    /// sent to its address with the script's host (no DNS needed).
    pub fn worker_request(
        &self,
        client: &reqwest::blocking::Client,
        method: reqwest::Method,
        script: &str,
        account: &str,
        path: &str,
    ) -> reqwest::blocking::RequestBuilder {
        client
            .request(method, format!("{}{path}", self.http))
            .header("host", worker_host(script, account))
    }
}

/// One data center.
#[derive(Debug, Clone)]
pub struct DataCenter {
    /// Short code, e.g. `lhr`.
    pub code: String,
    /// Its machines.
    pub machines: Vec<MachineInfo>,
}

struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

/// A running local edge.
pub struct Cluster {
    /// Control plane REST base URL (also serves the dashboard).
    pub url: String,
    /// Control plane gRPC URL (for agents).
    pub grpc: String,
    /// Dev API token.
    pub token: String,
    /// Dev account.
    pub account: String,
    /// Agent secret.
    pub agent_secret: String,
    /// The simulated edge.
    pub data_centers: Vec<DataCenter>,
    /// Options it was started with.
    pub options: ClusterOptions,
    procs: Vec<Proc>,
    http: reqwest::blocking::Client,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("url", &self.url)
            .field("data_centers", &self.data_centers)
            .finish_non_exhaustive()
    }
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A port nobody listens on right now (the OS picks it).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Polls `ready` until it yields a value; fails with the log's tail when
/// the process exits first or `timeout` passes.
fn wait_until<T>(
    proc: &mut Proc,
    timeout: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = ready() {
            return Ok(v);
        }
        if let Some(status) = proc.child.try_wait()? {
            bail!(
                "{} exited with {status} before it was ready; last log lines:\n{}",
                proc.name,
                tail(&proc.log, 20)
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "{} not ready after {timeout:?}; last log lines:\n{}",
                proc.name,
                tail(&proc.log, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for a process's ready file (JSON) to appear.
fn wait_for_file(path: &Path, proc: &mut Proc, timeout: Duration) -> Result<Value> {
    wait_until(proc, timeout, || {
        serde_json::from_str(&fs::read_to_string(path).ok()?).ok()
    })
}

/// A machine's addresses from an agent's ready file.
fn machine_info(id: &str, ready: &Value) -> MachineInfo {
    let field = |k: &str| ready[k].as_str().unwrap_or_default().to_owned();
    MachineInfo {
        id: id.to_owned(),
        http: field("http"),
        grpc: field("grpc"),
        operator: field("operator"),
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let Ok(f) = fs::File::open(path) else {
        return String::new();
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Cluster {
    /// Starts the control plane and every agent, and waits until all agents
    /// have registered.
    pub fn start(options: ClusterOptions) -> Result<Cluster> {
        if !(1..=DATA_CENTER_CODES.len()).contains(&options.data_centers) {
            bail!(
                "--data-centers {}: must be 1–{}",
                options.data_centers,
                DATA_CENTER_CODES.len()
            );
        }
        if !(1..=16).contains(&options.machines_per_dc) {
            bail!(
                "--machines-per-dc {}: must be 1–16",
                options.machines_per_dc
            );
        }
        for bin in ["edgeprof-control-plane", "edgeprof-node-agent", "edgeprof"] {
            let p = options.bin_dir.join(bin);
            if !p.is_file() {
                bail!(
                    "{}: not built; run `cargo build --bins` (cargo xtask ci and cargo xtask cluster do)",
                    p.display()
                );
            }
        }
        if options.fresh && options.state_dir.exists() {
            fs::remove_dir_all(&options.state_dir)
                .with_context(|| format!("cannot clear {}", options.state_dir.display()))?;
        }
        let logs = options.state_dir.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
        let agent_secret = "edgeprof-local-agent-secret".to_owned();
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?;

        let mut cluster = Cluster {
            url: String::new(),
            grpc: String::new(),
            token: String::new(),
            account: String::new(),
            agent_secret: agent_secret.clone(),
            data_centers: Vec::new(),
            options: options.clone(),
            procs: Vec::new(),
            http,
        };

        // Control plane. Ports are picked here (bind to :0, release, pass on);
        // a clash with another process in between fails loudly at bind.
        let http_port = free_port()?;
        let grpc_port = free_port()?;
        let token = format!("edgeprof-dev-{:016x}", random_u64());
        let mut cmd = Command::new(options.bin_dir.join("edgeprof-control-plane"));
        cmd.arg("--http-listen")
            .arg(format!("127.0.0.1:{http_port}"))
            .arg("--grpc-listen")
            .arg(format!("127.0.0.1:{grpc_port}"))
            .arg("--database")
            .arg(options.state_dir.join("edgeprof.sqlite"))
            .arg("--agent-secret")
            .arg(&agent_secret)
            .arg("--heartbeat-interval-ms")
            .arg(options.heartbeat.as_millis().to_string())
            .arg("--dev")
            .arg("--dev-token")
            .arg(&token);
        // The dashboard `cargo xtask dist` built beside these binaries
        // (`target/dist` next to `target/<profile>/`), not whatever path the
        // control plane's default was compiled with.
        if let Some(dist) = options.bin_dir.parent().map(|t| t.join("dist"))
            && dist.join("index.html").is_file()
        {
            cmd.arg("--dashboard-dir").arg(dist);
        }
        if let Some(lease) = options.durable_object_lease {
            cmd.arg("--durable-object-lease-ms")
                .arg(lease.as_millis().to_string());
        }
        let mut proc = cluster.spawn("control-plane", cmd)?;
        cluster.url = format!("http://127.0.0.1:{http_port}");
        cluster.grpc = format!("http://127.0.0.1:{grpc_port}");
        cluster.token = token;
        cluster.account = "dev".into();
        cluster.wait_healthy(&mut proc, Duration::from_secs(60))?;
        cluster.procs.push(proc);

        // Agents.
        if let Some(traffic) = &options.simulated {
            cluster.data_centers = cluster.start_simulated(traffic)?;
            cluster.wait_registered(Duration::from_secs(60))?;
            return Ok(cluster);
        }
        for code in DATA_CENTER_CODES.iter().take(options.data_centers) {
            let code = (*code).to_owned();
            let mut machines = Vec::new();
            for m in 0..options.machines_per_dc {
                let id = format!("{code}-m{:02}", m + 1);
                machines.push(cluster.start_agent(&code, &id)?);
            }
            cluster.data_centers.push(DataCenter { code, machines });
        }
        cluster.wait_registered(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn spawn(&self, name: &str, mut cmd: Command) -> Result<Proc> {
        let log = self
            .options
            .state_dir
            .join("logs")
            .join(format!("{name}.log"));
        let out =
            fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            log,
        })
    }

    fn start_agent(&mut self, dc: &str, id: &str) -> Result<MachineInfo> {
        let ready = self.options.state_dir.join(format!("{id}.ready.json"));
        let cmd = self.agent_command(dc, id, &ready);
        let mut proc = self.spawn(id, cmd)?;
        let info = wait_for_file(&ready, &mut proc, Duration::from_secs(60))?;
        self.procs.push(proc);
        Ok(machine_info(id, &info))
    }

    /// Every machine in one `--simulate-machines` agent process: ids
    /// `sim-0001`…, data centers round robin.
    fn start_simulated(&mut self, traffic: &SimulatedTraffic) -> Result<Vec<DataCenter>> {
        let codes: Vec<&str> = DATA_CENTER_CODES
            .iter()
            .take(self.options.data_centers)
            .copied()
            .collect();
        let n = codes.len() * self.options.machines_per_dc;
        let hosts: Vec<String> = traffic
            .scripts
            .iter()
            .map(|s| worker_host(s, &self.account))
            .collect();
        let ready = self.options.state_dir.join("simulated.ready.json");
        let mut cmd = self.agent_command(codes[0], "sim", &ready);
        cmd.args(["--simulate-machines", &n.to_string()])
            .args(["--simulate-data-centers", &codes.join(",")])
            .args(["--simulate-traffic", &hosts.join(",")])
            .args(["--simulate-rate", &traffic.rate.to_string()]);
        let mut proc = self.spawn("simulated-edge", cmd)?;
        let info = wait_for_file(&ready, &mut proc, Duration::from_secs(60))?;
        self.procs.push(proc);
        let mut dcs: Vec<DataCenter> = codes
            .iter()
            .map(|c| DataCenter {
                code: (*c).to_owned(),
                machines: Vec::new(),
            })
            .collect();
        for m in info["machines"].as_array().into_iter().flatten() {
            let dc = m["data_center"].as_str().unwrap_or_default();
            let id = m["id"].as_str().unwrap_or_default();
            let slot = dcs
                .iter_mut()
                .find(|d| d.code == dc)
                .ok_or_else(|| anyhow!("simulated machine {id} in unknown data center `{dc}`"))?;
            slot.machines.push(machine_info(id, m));
        }
        Ok(dcs)
    }

    /// `edgeprof-node-agent` for machine `id` in `dc` with this cluster's
    /// control plane, secret, heartbeat, ephemeral ports and ready file.
    fn agent_command(&self, dc: &str, id: &str, ready: &Path) -> Command {
        let _ = fs::remove_file(ready);
        let mut cmd = Command::new(self.options.bin_dir.join("edgeprof-node-agent"));
        cmd.args(["--data-center", dc, "--machine-id", id])
            .args(["--control-plane", &self.grpc])
            .args([
                "--http-listen",
                "127.0.0.1:0",
                "--grpc-listen",
                "127.0.0.1:0",
                "--operator-listen",
                "127.0.0.1:0",
            ])
            .args(["--agent-secret", &self.agent_secret])
            .args([
                "--heartbeat-ms",
                &self.options.heartbeat.as_millis().to_string(),
            ])
            .args([
                "--continuous-hz",
                &self.options.continuous_hz.to_string(),
                "--continuous-window",
                &format!("{}s", self.options.continuous_window.as_secs().max(1)),
            ])
            .arg("--ready-file")
            .arg(ready)
            .args(&self.options.agent_args);
        cmd
    }

    fn wait_healthy(&self, proc: &mut Proc, timeout: Duration) -> Result<()> {
        let url = format!("{}/healthz", self.url);
        wait_until(proc, timeout, || {
            self.http
                .get(&url)
                .send()
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
    }

    fn wait_registered(&self, timeout: Duration) -> Result<()> {
        let want = self
            .data_centers
            .iter()
            .map(|d| d.machines.len())
            .sum::<usize>();
        let start = Instant::now();
        loop {
            let live = self.live_machines().unwrap_or(0);
            if live >= want {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!("only {live} of {want} agents registered after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Machines whose heartbeat the control plane considers current.
    pub fn live_machines(&self) -> Result<usize> {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()?
            .text()?;
        text.lines()
            .find_map(|l| l.strip_prefix("edgeprof_live_machines "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("control plane /metrics has no edgeprof_live_machines"))
    }

    /// Every machine, with its data center code.
    pub fn machines(&self) -> impl Iterator<Item = (&str, &MachineInfo)> {
        self.data_centers
            .iter()
            .flat_map(|d| d.machines.iter().map(move |m| (d.code.as_str(), m)))
    }

    /// Creates account `account` with a token of its own (through the
    /// control plane's `token create`, on the same database); returns the token.
    pub fn add_account(&self, account: &str) -> Result<String> {
        let out = Command::new(self.options.bin_dir.join("edgeprof-control-plane"))
            .args(["token", "create", "--account", account, "--database"])
            .arg(self.options.state_dir.join("edgeprof.sqlite"))
            .output()
            .context("cannot run edgeprof-control-plane token create")?;
        if !out.status.success() {
            bail!(
                "token create --account {account}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The process id of agent `machine_id`.
    pub fn agent_pid(&self, machine_id: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.name == machine_id)
            .map(|p| p.child.id())
    }

    /// The `edgeprof` CLI, pointed at this cluster.
    pub fn cli(&self) -> Command {
        let mut c = Command::new(self.options.bin_dir.join("edgeprof"));
        c.env("EDGEPROF_URL", &self.url)
            .env("EDGEPROF_TOKEN", &self.token)
            .env("EDGEPROF_ACCOUNT", &self.account);
        c
    }

    /// Uploads a version of `script` with `weight`; returns its id.
    pub fn deploy(&self, script: &str, wasm: &Path, weight: u32) -> Result<String> {
        let out = self
            .cli()
            .args(["deploy", script])
            .arg(wasm)
            .args(["--weight", &weight.to_string()])
            .output()
            .context("cannot run edgeprof deploy")?;
        if !out.status.success() {
            bail!(
                "edgeprof deploy {script} {}: {}",
                wasm.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `GET /v1/accounts/{account}{path}` as JSON.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        let url = format!("{}/v1/accounts/{}{path}", self.url, self.account);
        let resp = self.http.get(&url).bearer_auth(&self.token).send()?;
        let status = resp.status();
        let body: Value = resp
            .json()
            .with_context(|| format!("GET {url}: not JSON"))?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {body}");
        }
        Ok(body)
    }

    /// The version of `script` whose module has the same bytes as `wasm`,
    /// if one was uploaded before (a kept state).
    pub fn version_with_wasm(&self, script: &str, wasm: &Path) -> Result<Option<String>> {
        use sha2::Digest;
        let bytes = fs::read(wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
        let sha = hex::encode(sha2::Sha256::digest(&bytes));
        let scripts = self.get_json("/scripts")?;
        let known = scripts["scripts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == script);
        if !known {
            return Ok(None);
        }
        let doc = self.get_json(&format!("/scripts/{script}/versions"))?;
        Ok(doc["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["wasm_sha256"] == sha.as_str())
            .and_then(|v| v["id"].as_str())
            .map(str::to_owned))
    }

    /// Each version of `script` with its deployment weight (0: not serving).
    pub fn weights(&self, script: &str) -> Result<std::collections::HashMap<String, u64>> {
        let doc = self.get_json(&format!("/scripts/{script}/versions"))?;
        Ok(doc["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["id"].as_str()?.to_owned(), v["weight"].as_u64()?)))
            .collect())
    }

    /// Waits until each script has an isolate with recent requests, i.e.
    /// until a capture of it can find targets.
    pub fn wait_serving(&self, scripts: &[&str], timeout: Duration) -> Result<()> {
        self.wait_targets(scripts, timeout, false)
    }

    /// Waits until each script has an isolate with recent requests on
    /// every machine (what `edgeprof targets` then lists for it).
    pub fn wait_serving_everywhere(&self, scripts: &[&str], timeout: Duration) -> Result<()> {
        self.wait_targets(scripts, timeout, true)
    }

    fn wait_targets(&self, scripts: &[&str], timeout: Duration, everywhere: bool) -> Result<()> {
        let all: std::collections::BTreeSet<&str> =
            self.machines().map(|(_, m)| m.id.as_str()).collect();
        let start = Instant::now();
        let mut waiting: Vec<&str> = scripts.to_vec();
        while !waiting.is_empty() {
            waiting.retain(|script| {
                let Ok(doc) = self.get_json(&format!("/scripts/{script}/targets")) else {
                    return true;
                };
                let serving: std::collections::BTreeSet<&str> = doc["targets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["machine"].as_str())
                    .collect();
                if everywhere {
                    !all.iter().all(|m| serving.contains(m))
                } else {
                    serving.is_empty()
                }
            });
            if waiting.is_empty() {
                break;
            }
            if start.elapsed() > timeout {
                bail!(
                    "no traffic reached {} after {timeout:?}",
                    waiting.join(", ")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(())
    }

    /// Stops one agent abruptly (SIGKILL), as a machine failure would.
    pub fn kill_agent(&mut self, machine_id: &str) -> Result<()> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.name == machine_id)
            .ok_or_else(|| anyhow!("no agent {machine_id}"))?;
        p.child.kill()?;
        p.child.wait()?;
        Ok(())
    }

    /// Freezes one agent (SIGSTOP): alive, holding its sockets, answering
    /// nothing, as a machine stalled by a long pause would.
    pub fn pause_agent(&mut self, machine_id: &str) -> Result<()> {
        self.signal_agent(machine_id, "-STOP")
    }

    /// Lets a paused agent run again (SIGCONT).
    pub fn resume_agent(&mut self, machine_id: &str) -> Result<()> {
        self.signal_agent(machine_id, "-CONT")
    }

    fn signal_agent(&mut self, machine_id: &str, signal: &str) -> Result<()> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.name == machine_id)
            .ok_or_else(|| anyhow!("no agent {machine_id}"))?;
        let status = Command::new("kill")
            .arg(signal)
            .arg(p.child.id().to_string())
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill {signal} {machine_id}: {status}");
        }
        Ok(())
    }

    /// Process ids of every child still running.
    pub fn pids(&mut self) -> Vec<u32> {
        self.procs
            .iter_mut()
            .filter_map(|p| matches!(p.child.try_wait(), Ok(None)).then(|| p.child.id()))
            .collect()
    }

    /// What `cluster.json` holds (shape in the design, §5).
    pub fn describe(&self, scripts: &[Value]) -> Value {
        json!({
            "url": self.url,
            "token": self.token,
            "account": self.account,
            "data_centers": self.data_centers.iter().map(|d| json!({
                "code": d.code,
                "machines": d.machines.iter().map(|m| json!({
                    "id": m.id,
                    "http": m.http,
                    "grpc": m.grpc,
                    "url": m.worker_url("json-gateway", &self.account),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "scripts": scripts,
            "continuous_profiling": {
                "enabled": self.options.continuous_hz > 0,
                "cpu_hz": self.options.continuous_hz,
                "window_s": self.options.continuous_window.as_secs().max(1),
                "heap": self.options.continuous_hz > 0,
            },
        })
    }

    /// Stops every child: SIGTERM-like kill for agents first, then the control plane.
    pub fn stop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            let _ = terminate(&mut p.child);
        }
        self.procs.clear();
    }
}

/// Asks a child to stop (SIGTERM through `kill`), then kills it after 5 s.
fn terminate(child: &mut Child) -> std::io::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    // A paused child handles the TERM once it runs again.
    let _ = Command::new("kill")
        .arg("-CONT")
        .arg(child.id().to_string())
        .status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?;
    child.wait().map(|_| ())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
