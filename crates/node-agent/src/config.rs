//! Flags and environment → one validated [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};

/// Highest `--max-isolates` on any kernel; below it, the kernel's map
/// count bounds it ([`max_isolates_for`]).
pub const MAX_ISOLATES_LIMIT: usize = 16_384;

/// Most control-plane URLs `--control-plane` takes.
pub const MAX_CONTROL_PLANES: usize = 16;

/// Memory maps one isolate takes, with a margin: measured 10.7 with 5,000
/// Durable Objects of the counter worker (thread stack, signal stack and
/// their guard pages, the linear memory's reservation and image, tables).
pub const MAPS_PER_ISOLATE: u64 = 12;

/// Memory maps left for the rest of the agent (code, heap, runtime
/// threads, captures).
pub const MAPS_RESERVED: u64 = 2000;

/// The kernel's limit on one process's memory maps (`vm.max_map_count`;
/// Linux's default where it cannot be read).
pub fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530)
}

/// Most isolates a process limited to `max_maps` memory maps can hold
/// (5,294 at Linux's default 65,530): past it, starting an isolate fails
/// to map memory or to spawn its thread.
pub fn max_isolates_for(max_maps: u64) -> usize {
    let n = max_maps.saturating_sub(MAPS_RESERVED) / MAPS_PER_ISOLATE;
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .min(MAX_ISOLATES_LIMIT)
}

/// Command-line flags (each also readable from an `EDGEPROF_*` variable).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "edgeprof-node-agent",
    version,
    about = "edgeprof node agent: hosts isolates and captures their profiles"
)]
pub struct Args {
    /// Data center code of this machine (e.g. `lhr`).
    #[arg(long, env = "EDGEPROF_DATA_CENTER")]
    pub data_center: String,
    /// Machine id, unique in the fleet.
    #[arg(long, env = "EDGEPROF_MACHINE_ID")]
    pub machine_id: String,
    /// Control plane gRPC URL, or several replicas' URLs separated by
    /// commas: calls go to one and fail over to the next when it cannot be
    /// reached.
    #[arg(
        long,
        env = "EDGEPROF_CONTROL_PLANE",
        default_value = "http://127.0.0.1:9090"
    )]
    pub control_plane: String,
    /// HTTP ingress listen address (port 0 = any free port).
    #[arg(long, env = "EDGEPROF_HTTP_LISTEN", default_value = "127.0.0.1:8081")]
    pub http_listen: SocketAddr,
    /// Operator listener (`/metrics`, `/debug/pprof/profile`, `/healthz`);
    /// keep it off the public network (port 0 = any free port).
    #[arg(
        long,
        env = "EDGEPROF_OPERATOR_LISTEN",
        default_value = "127.0.0.1:8082"
    )]
    pub operator_listen: SocketAddr,
    /// gRPC (NodeAgent) listen address (port 0 = any free port).
    #[arg(long, env = "EDGEPROF_GRPC_LISTEN", default_value = "127.0.0.1:9091")]
    pub grpc_listen: SocketAddr,
    /// DNS zone worker hosts are under: `{script}.{account}.{zone}`
    /// reaches a script (`*.localhost` resolves to loopback, so
    /// `curl http://api.dev.localhost:8081/` works locally).
    #[arg(long, env = "EDGEPROF_ZONE", default_value = "localhost")]
    pub zone: String,
    /// Host name other machines and the control plane reach this one by.
    #[arg(long, env = "EDGEPROF_ADVERTISE_HOST", default_value = "127.0.0.1")]
    pub advertise_host: String,
    /// Shared secret presented to the control plane and required from it.
    #[arg(long, env = "EDGEPROF_AGENT_SECRET", hide_env_values = true)]
    pub agent_secret: String,
    /// Linear-memory limit of one isolate, in MiB.
    #[arg(long, env = "EDGEPROF_ISOLATE_MEMORY_MIB", default_value_t = 128)]
    pub isolate_memory_mib: u64,
    /// CPU time one request may use before it is stopped, in milliseconds.
    #[arg(long, env = "EDGEPROF_REQUEST_CPU_LIMIT_MS", default_value_t = 30_000)]
    pub request_cpu_limit_ms: u64,
    /// Default CPU sampling interval, in milliseconds (1–100).
    #[arg(long, env = "EDGEPROF_SAMPLING_INTERVAL_MS", default_value_t = 1)]
    pub sampling_interval_ms: u64,
    /// How often to heartbeat, in milliseconds.
    #[arg(long, env = "EDGEPROF_HEARTBEAT_MS", default_value_t = 2000)]
    pub heartbeat_ms: u64,
    /// Most isolates per busy script version.
    #[arg(long, env = "EDGEPROF_MAX_ISOLATES_PER_VERSION", default_value_t = 4)]
    pub max_isolates_per_version: usize,
    /// Most live isolates on this machine, Durable Objects included (each
    /// is one thread); over it a request that needs a new isolate gets 503.
    #[arg(long, env = "EDGEPROF_MAX_ISOLATES", default_value_t = 512)]
    pub max_isolates: usize,
    /// Most live isolates of one account on this machine.
    #[arg(long, env = "EDGEPROF_MAX_ISOLATES_PER_ACCOUNT", default_value_t = 128)]
    pub max_isolates_per_account: usize,
    /// Isolates idle this long (seconds) are reclaimed, Durable Objects included.
    #[arg(long, env = "EDGEPROF_IDLE_ISOLATE_SECS", default_value_t = 120)]
    pub idle_isolate_secs: u64,
    /// Continuous profiling: CPU samples per second taken in the background
    /// on every isolate (19 by default, Parca's rate; 0 turns continuous
    /// profiling off; at most 100), rounded to whole sampling ticks.
    #[arg(long, env = "EDGEPROF_CONTINUOUS_HZ", default_value_t = 19)]
    pub continuous_hz: u32,
    /// Length of a continuous-profiling window (whole seconds, 1s–5min, e.g.
    /// `10s`, `1min`); windows start at wall-clock multiples of it.
    #[arg(long, env = "EDGEPROF_CONTINUOUS_WINDOW", default_value = "10s")]
    pub continuous_window: String,
    /// How long unsent windows are kept while the control plane is away
    /// (1s–24h, e.g. `10min`); older ones are dropped and counted.
    #[arg(long, env = "EDGEPROF_CONTINUOUS_BUFFER", default_value = "10min")]
    pub continuous_buffer: String,
    /// Most bytes of unsent windows kept (1 MiB–64 GiB); past it the oldest
    /// window is dropped and counted.
    #[arg(
        long,
        env = "EDGEPROF_CONTINUOUS_QUEUE_BYTES",
        default_value_t = 64 << 20
    )]
    pub continuous_queue_bytes: u64,
    /// Write `{"http": ..., "grpc": ...}` with the bound addresses here once listening.
    #[arg(long, env = "EDGEPROF_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Validate the configuration, print it, and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Simulate this many machines in this one process (0, the default: be
    /// one real machine). Each gets its own id (`{machine-id}-NNNN`),
    /// listeners on ephemeral ports, registration and heartbeats; all share
    /// one Wasmtime engine. For tests and benchmarks (`simulate`).
    #[arg(long, env = "EDGEPROF_SIMULATE_MACHINES", default_value_t = 0)]
    pub simulate_machines: usize,
    /// Data centers the simulated machines are spread over, round robin
    /// (comma-separated codes; `--data-center` alone when not given).
    #[arg(long, env = "EDGEPROF_SIMULATE_DATA_CENTERS")]
    pub simulate_data_centers: Option<String>,
    /// Worker hosts (`{script}.{account}.{zone}`, comma-separated) the
    /// simulation's traffic requests `/` of, on every simulated machine.
    #[arg(long, env = "EDGEPROF_SIMULATE_TRAFFIC")]
    pub simulate_traffic: Option<String>,
    /// Requests per second the simulation sends to each simulated machine
    /// and host (0.01–100).
    #[arg(long, env = "EDGEPROF_SIMULATE_RATE", default_value_t = 1.0)]
    pub simulate_rate: f64,
}

/// The agent's validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Data center code.
    pub data_center: String,
    /// Machine id.
    pub machine_id: String,
    /// Control plane replicas' gRPC URLs (at least one).
    pub control_planes: Vec<String>,
    /// HTTP ingress listen address.
    pub http_listen: SocketAddr,
    /// gRPC listen address.
    pub grpc_listen: SocketAddr,
    /// Operator listen address.
    pub operator_listen: SocketAddr,
    /// Host others reach this machine by.
    pub advertise_host: String,
    /// Zone of worker hosts, lowercase, no leading or trailing dot.
    pub zone: String,
    /// Shared agent secret.
    pub agent_secret: String,
    /// Isolate linear-memory limit in bytes.
    pub isolate_memory_bytes: u64,
    /// Per-request CPU limit.
    pub request_cpu_limit: Duration,
    /// Default sampling interval.
    pub sampling_interval: Duration,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// Most isolates per script version.
    pub max_isolates_per_version: usize,
    /// Most live isolates on this machine.
    pub max_isolates: usize,
    /// Most live isolates of one account on this machine.
    pub max_isolates_per_account: usize,
    /// Idle isolates are reclaimed after this.
    pub idle_isolate: Duration,
    /// Continuous profiling, unless `--continuous-hz 0`.
    pub continuous: Option<Continuous>,
    /// Where to write bound addresses.
    pub ready_file: Option<PathBuf>,
    /// Only check the configuration.
    pub check_only: bool,
    /// Many simulated machines in this process, when asked for.
    pub simulate: Option<Simulation>,
}

/// `--simulate-machines` and its settings, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// How many machines.
    pub machines: usize,
    /// Their data centers, assigned round robin.
    pub data_centers: Vec<String>,
    /// Worker hosts the traffic requests, on every machine.
    pub traffic: Vec<String>,
    /// Requests per second per machine and host.
    pub rate: f64,
}

/// File descriptors one simulated machine may hold: its three listeners,
/// its channel to the control plane, the control plane's capture
/// connection, the traffic's connection at both ends, and a spare.
pub const FDS_PER_SIMULATED_MACHINE: u64 = 8;

/// The soft limit on this process's open files (`RLIMIT_NOFILE`, read from
/// `/proc/self/limits`; 1024 where it cannot be read).
pub fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(1024)
}

fn simulation(a: &Args, code_ok: impl Fn(&str) -> bool) -> Result<Option<Simulation>> {
    if a.simulate_machines == 0 {
        return Ok(None);
    }
    let data_centers: Vec<String> = match &a.simulate_data_centers {
        Some(list) => list.split(',').map(|c| c.trim().to_owned()).collect(),
        None => vec![a.data_center.clone()],
    };
    if let Some(bad) = data_centers.iter().find(|c| !code_ok(c)) {
        bail!("--simulate-data-centers `{bad}`: use 1–32 letters, digits, `-` or `_`");
    }
    if a.machine_id.len() > 27 {
        bail!(
            "--machine-id `{}`: at most 27 characters with --simulate-machines (`-NNNN` is appended)",
            a.machine_id
        );
    }
    let traffic: Vec<String> = a
        .simulate_traffic
        .iter()
        .flat_map(|t| t.split(','))
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect();
    if traffic.len() > 16 {
        bail!(
            "--simulate-traffic: at most 16 hosts (got {})",
            traffic.len()
        );
    }
    if !(0.01..=100.0).contains(&a.simulate_rate) {
        bail!("--simulate-rate {}: must be 0.01–100", a.simulate_rate);
    }
    // Each machine holds at most `--max-isolates-per-version` isolates of
    // each host's script; all of them must fit the process's map count.
    let isolates = a.simulate_machines * a.max_isolates_per_version * traffic.len().max(1);
    let maps = max_map_count();
    let most = max_isolates_for(maps);
    if a.simulate_machines > 10_000 || isolates > most {
        bail!(
            "--simulate-machines {}: {isolates} isolates (machines × --max-isolates-per-version × hosts) must fit this process's {most} (vm.max_map_count {maps}, about {MAPS_PER_ISOLATE} maps an isolate), and at most 10000 machines",
            a.simulate_machines
        );
    }
    let fds = open_files_limit();
    let need = a.simulate_machines as u64 * FDS_PER_SIMULATED_MACHINE + 256;
    if need > fds {
        bail!(
            "--simulate-machines {}: needs about {need} open files and this process may open {fds} (raise it with `ulimit -n {need}`)",
            a.simulate_machines
        );
    }
    Ok(Some(Simulation {
        machines: a.simulate_machines,
        data_centers,
        traffic,
        rate: a.simulate_rate,
    }))
}

/// Continuous profiling settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Continuous {
    /// CPU samples per second (1–100), before rounding to whole ticks.
    pub hz: u32,
    /// Window length (whole seconds).
    pub window: Duration,
    /// Unsent windows older than this are dropped.
    pub buffer: Duration,
    /// Most bytes of unsent windows kept.
    pub queue_bytes: u64,
}

/// Highest `--continuous-hz`.
pub const MAX_CONTINUOUS_HZ: u32 = 100;

fn continuous(a: &Args) -> Result<Option<Continuous>> {
    if a.continuous_hz > MAX_CONTINUOUS_HZ {
        bail!(
            "--continuous-hz {}: must be 0 (off) to {MAX_CONTINUOUS_HZ}",
            a.continuous_hz
        );
    }
    let window = humantime::parse_duration(a.continuous_window.trim())
        .ok()
        .filter(|w| w.subsec_nanos() == 0 && (1..=300).contains(&w.as_secs()))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--continuous-window `{}`: must be whole seconds from 1s to 5min (e.g. `10s`)",
                a.continuous_window
            )
        })?;
    let buffer = humantime::parse_duration(a.continuous_buffer.trim())
        .ok()
        .filter(|b| (Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(b))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--continuous-buffer `{}`: must be 1s–24h (e.g. `10min`)",
                a.continuous_buffer
            )
        })?;
    if !((1 << 20)..=(64 << 30)).contains(&a.continuous_queue_bytes) {
        bail!(
            "--continuous-queue-bytes {}: must be 1 MiB–64 GiB ({}–{})",
            a.continuous_queue_bytes,
            1u64 << 20,
            64u64 << 30
        );
    }
    Ok((a.continuous_hz > 0).then_some(Continuous {
        hz: a.continuous_hz,
        window,
        buffer,
        queue_bytes: a.continuous_queue_bytes,
    }))
}

impl TryFrom<Args> for Config {
    type Error = anyhow::Error;

    fn try_from(a: Args) -> Result<Self> {
        let code_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 32
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !code_ok(&a.data_center) {
            bail!(
                "--data-center `{}`: use 1–32 letters, digits, `-` or `_`",
                a.data_center
            );
        }
        if !code_ok(&a.machine_id) {
            bail!(
                "--machine-id `{}`: use 1–32 letters, digits, `-` or `_`",
                a.machine_id
            );
        }
        let control_planes: Vec<String> = a
            .control_plane
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .collect();
        for url in &control_planes {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("--control-plane `{url}`: must be an http:// or https:// URL");
            }
        }
        if control_planes.len() > MAX_CONTROL_PLANES {
            bail!(
                "--control-plane: at most {MAX_CONTROL_PLANES} URLs (got {})",
                control_planes.len()
            );
        }
        let zone = a.zone.trim_matches('.').to_ascii_lowercase();
        let zone_ok = !zone.is_empty()
            && zone.len() <= 253
            && zone.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !zone_ok {
            bail!(
                "--zone `{}`: must be a DNS name (labels of letters, digits and `-`, e.g. `localhost` or `edge.example.com`)",
                a.zone
            );
        }
        if a.agent_secret.len() < 8 {
            bail!("--agent-secret: must be at least 8 characters");
        }
        if !(1..=4096).contains(&a.isolate_memory_mib) {
            bail!(
                "--isolate-memory-mib {}: must be 1–4096",
                a.isolate_memory_mib
            );
        }
        if !(1..=100).contains(&a.sampling_interval_ms) {
            bail!(
                "--sampling-interval-ms {}: must be 1–100",
                a.sampling_interval_ms
            );
        }
        if !(100..=60_000).contains(&a.heartbeat_ms) {
            bail!("--heartbeat-ms {}: must be 100–60000", a.heartbeat_ms);
        }
        if a.request_cpu_limit_ms == 0 {
            bail!("--request-cpu-limit-ms: must be positive");
        }
        if a.max_isolates_per_version == 0 {
            bail!("--max-isolates-per-version: must be at least 1");
        }
        let maps = max_map_count();
        let most = max_isolates_for(maps);
        if !(1..=most).contains(&a.max_isolates) {
            bail!(
                "--max-isolates {}: must be 1–{most} (each isolate takes about {MAPS_PER_ISOLATE} memory maps, and this kernel's vm.max_map_count is {maps}; raise it with `sysctl -w vm.max_map_count=N` for more, up to {MAX_ISOLATES_LIMIT})",
                a.max_isolates
            );
        }
        if !(1..=a.max_isolates).contains(&a.max_isolates_per_account) {
            bail!(
                "--max-isolates-per-account {}: must be 1–{} (--max-isolates)",
                a.max_isolates_per_account,
                a.max_isolates
            );
        }
        if a.idle_isolate_secs == 0 {
            bail!("--idle-isolate-secs: must be positive");
        }
        let continuous = continuous(&a)?;
        let simulate = simulation(&a, code_ok)?;
        Ok(Config {
            data_center: a.data_center,
            machine_id: a.machine_id,
            control_planes,
            http_listen: a.http_listen,
            grpc_listen: a.grpc_listen,
            operator_listen: a.operator_listen,
            advertise_host: a.advertise_host,
            zone,
            agent_secret: a.agent_secret,
            isolate_memory_bytes: a.isolate_memory_mib << 20,
            request_cpu_limit: Duration::from_millis(a.request_cpu_limit_ms),
            sampling_interval: Duration::from_millis(a.sampling_interval_ms),
            heartbeat: Duration::from_millis(a.heartbeat_ms),
            max_isolates_per_version: a.max_isolates_per_version,
            max_isolates: a.max_isolates,
            max_isolates_per_account: a.max_isolates_per_account,
            idle_isolate: Duration::from_secs(a.idle_isolate_secs),
            continuous,
            ready_file: a.ready_file,
            check_only: a.check_config,
            simulate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_count_bounds_the_isolates() {
        assert_eq!(max_isolates_for(65_530), 5294, "Linux's default");
        assert_eq!(max_isolates_for(262_144), MAX_ISOLATES_LIMIT);
        assert_eq!(max_isolates_for(1000), 0);
    }
}
