//! `--simulate-machines N`: many machines of the edge in one process, for
//! tests and benchmarks (`cargo xtask bench capture`, `e2e/tests/it/
//! simulate.rs`).
//!
//! Each simulated machine is a whole agent started by the same
//! [`crate::start_on`] as a real one: its own id (`{machine-id}-NNNN`) and
//! data center (round robin over `--simulate-data-centers`), HTTP, gRPC and
//! operator listeners on ephemeral ports, its own registration, heartbeats,
//! deployment and isolates. So the control plane sees N machines, and a
//! capture reaches each over real gRPC and is sampled by the real sampler
//! from the isolates serving the traffic. What they share is one Wasmtime
//! engine (one epoch ticker; a module is compiled once, not N times).
//!
//! One traffic task keeps their isolates live: `--simulate-rate` requests a
//! second of `/` on each `--simulate-traffic` host through each machine's
//! HTTP ingress, at most [`MAX_IN_FLIGHT`] at once (a request that would
//! go past it is skipped and counted, never queued).
//!
//! Bounds: every isolate is a thread with about 12 memory maps, so one
//! process holds about 5,300 isolates at Linux's default
//! `vm.max_map_count`; the config refuses machines × isolates per version
//! × hosts past it, and machines × [`crate::config::FDS_PER_SIMULATED_MACHINE`]
//! past the open-file limit. Keep `--max-isolates-per-version` at 1–2.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;

use crate::config::{Config, Simulation};
use crate::{RunningAgent, start_on, wasm_runtime};

/// Most traffic requests in flight over the whole simulation.
pub const MAX_IN_FLIGHT: usize = 256;

/// How often the traffic task sends what the rate asks for since its last
/// round.
const ROUND: Duration = Duration::from_millis(10);

/// The simulated machines and their traffic.
#[derive(Debug)]
pub struct SimulatedEdge {
    machines: Vec<RunningAgent>,
    traffic: Option<JoinHandle<()>>,
}

impl SimulatedEdge {
    /// Stops the traffic and every machine.
    pub fn shutdown(self) {
        if let Some(t) = self.traffic {
            t.abort();
        }
        for m in self.machines {
            m.shutdown();
        }
    }
}

/// The config of simulated machine `i` (from 0): `base` with its id, data
/// center and ephemeral ports on the same addresses.
fn machine_config(base: &Config, sim: &Simulation, i: usize) -> Config {
    let any_port = |a: SocketAddr| SocketAddr::new(a.ip(), 0);
    Config {
        machine_id: format!("{}-{:04}", base.machine_id, i + 1),
        data_center: sim.data_centers[i % sim.data_centers.len()].clone(),
        http_listen: any_port(base.http_listen),
        grpc_listen: any_port(base.grpc_listen),
        operator_listen: any_port(base.operator_listen),
        ready_file: None,
        simulate: None,
        ..base.clone()
    }
}

/// Starts `sim.machines` machines on one engine, then the traffic; writes
/// `base.ready_file` as `{"pid", "machines": [{"id", "data_center",
/// "http", "grpc", "operator"}]}` once every machine listens.
pub async fn start(base: Config, sim: Simulation) -> Result<SimulatedEdge> {
    let runtime = wasm_runtime(base.sampling_interval)?;
    let mut edge = SimulatedEdge {
        machines: Vec::with_capacity(sim.machines),
        traffic: None,
    };
    let mut listed = Vec::with_capacity(sim.machines);
    for i in 0..sim.machines {
        let config = machine_config(&base, &sim, i);
        let (id, dc) = (config.machine_id.clone(), config.data_center.clone());
        let agent = match start_on(config, runtime.clone()).await {
            Ok(a) => a,
            Err(e) => {
                edge.shutdown();
                return Err(e).with_context(|| format!("simulated machine {id}"));
            }
        };
        listed.push(serde_json::json!({
            "id": id,
            "data_center": dc,
            "http": format!("http://{}", agent.http),
            "grpc": format!("http://{}", agent.grpc),
            "operator": format!("http://{}", agent.operator),
        }));
        edge.machines.push(agent);
    }
    if !sim.traffic.is_empty() {
        let ingresses = edge.machines.iter().map(|m| m.http).collect();
        edge.traffic = Some(tokio::spawn(traffic(
            ingresses,
            sim.traffic.clone(),
            sim.rate,
        )));
    }
    tracing::info!(
        machines = sim.machines,
        data_centers = ?sim.data_centers,
        hosts = ?sim.traffic,
        rate = sim.rate,
        "simulated edge listening"
    );
    if let Some(path) = &base.ready_file {
        let doc = serde_json::json!({"pid": std::process::id(), "machines": listed});
        if let Err(e) = std::fs::write(path, doc.to_string()) {
            edge.shutdown();
            return Err(e)
                .with_context(|| format!("{}: cannot write the ready file", path.display()));
        }
    }
    Ok(edge)
}

/// Sends `rate` requests a second of `/` on each host to each ingress,
/// spread over rounds of [`ROUND`], at most [`MAX_IN_FLIGHT`] at once.
async fn traffic(ingresses: Vec<SocketAddr>, hosts: Vec<String>, rate: f64) {
    let client = match reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(1)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("simulated traffic: cannot build the HTTP client: {e}");
            return;
        }
    };
    let targets: Vec<(String, String)> = ingresses
        .iter()
        .flat_map(|a| {
            hosts
                .iter()
                .map(move |h| (format!("http://{a}/"), h.clone()))
        })
        .collect();
    let per_round = rate * targets.len() as f64 * ROUND.as_secs_f64();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let skipped = Arc::new(AtomicU64::new(0));
    let mut round = tokio::time::interval(ROUND);
    round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut budget, mut next) = (0.0f64, 0usize);
    loop {
        round.tick().await;
        budget += per_round;
        while budget >= 1.0 {
            budget -= 1.0;
            let (url, host) = &targets[next];
            next = (next + 1) % targets.len();
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                let n = skipped.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        "simulated traffic: {n} requests skipped ({MAX_IN_FLIGHT} in flight)"
                    );
                }
                continue;
            };
            let request = client.get(url).header("host", host).send();
            tokio::spawn(async move {
                if let Ok(r) = request.await {
                    let _ = r.bytes().await;
                }
                drop(permit);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn machines_get_ids_data_centers_and_ephemeral_ports() {
        let args = crate::Args::parse_from([
            "edgeprof-node-agent",
            "--data-center=lhr",
            "--machine-id=sim",
            "--agent-secret=secret-secret",
            "--simulate-machines=4",
            "--simulate-data-centers=lhr,sjc,nrt",
        ]);
        let base = Config::try_from(args).unwrap();
        let sim = base.simulate.clone().unwrap();
        let shape: Vec<(String, String, u16)> = (0..4)
            .map(|i| machine_config(&base, &sim, i))
            .map(|c| (c.machine_id, c.data_center, c.grpc_listen.port()))
            .collect();
        let want = [
            ("sim-0001", "lhr"),
            ("sim-0002", "sjc"),
            ("sim-0003", "nrt"),
            ("sim-0004", "lhr"),
        ];
        assert_eq!(
            shape,
            want.map(|(m, d)| (m.to_owned(), d.to_owned(), 0)).to_vec()
        );
    }
}
