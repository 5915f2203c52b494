//! A bounded, open-loop traffic generator: synthetic clients in every
//! region send a weighted mix of worker and Durable Object requests to a
//! machine of their nearest data center, at a fixed rate, until stopped or
//! until its time or request budget runs out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Cluster;

/// What one request goes to.
#[derive(Debug, Clone)]
pub enum Target {
    /// `http://{script}.{account}.localhost{path}` on a machine of the
    /// client's data center.
    Script {
        /// Script name.
        script: String,
        /// The path the worker sees, e.g. `/render?depth=6`.
        path: String,
    },
    /// `/do/{namespace}/{id}{path}` under the host of the script of the
    /// same name.
    DurableObject {
        /// Namespace (= the script implementing it).
        namespace: String,
        /// 64-hex object id.
        id: String,
        /// Path after the id.
        path: String,
    },
}

impl Target {
    fn url_path(&self) -> String {
        match self {
            Target::Script { path, .. } if path.is_empty() => "/".to_owned(),
            Target::Script { path, .. } => path.clone(),
            Target::DurableObject {
                namespace,
                id,
                path,
            } => format!("/do/{namespace}/{id}{path}"),
        }
    }
    /// The script the request goes to, and the name requests are counted under.
    pub fn name(&self) -> &str {
        match self {
            Target::Script { script, .. } => script,
            Target::DurableObject { namespace, .. } => namespace,
        }
    }
}

/// The weighted mix and the bounds.
#[derive(Debug, Clone)]
pub struct TrafficMix {
    /// Targets with weights.
    pub targets: Vec<(u32, Target)>,
    /// Requests per second across all clients.
    pub rate: f64,
    /// Stop after this long.
    pub max_duration: Duration,
    /// Stop after this many requests.
    pub max_requests: u64,
    /// Concurrent connections.
    pub concurrency: usize,
}

/// Per-target outcome counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// 2xx answers.
    pub ok: u64,
    /// Other answers and transport errors.
    pub failed: u64,
}

/// A running generator; stops on drop.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    shed: Arc<AtomicU64>,
    counts: Arc<Mutex<HashMap<String, Counts>>>,
    threads: Vec<JoinHandle<()>>,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

impl Traffic {
    /// Starts sending `mix` to `cluster`'s machines.
    pub fn start(cluster: &Cluster, mix: TrafficMix) -> Traffic {
        let regions: Vec<Vec<String>> = cluster
            .data_centers
            .iter()
            .map(|d| d.machines.iter().map(|m| m.http.clone()).collect())
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let shed = Arc::new(AtomicU64::new(0));
        let counts: Arc<Mutex<HashMap<String, Counts>>> = Arc::default();
        let account = cluster.account.clone();
        let (tx, rx) = sync_channel::<Job>(mix.concurrency.max(1) * 2);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for _ in 0..mix.concurrency.max(1) {
            let rx = rx.clone();
            let counts = counts.clone();
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()
                    .expect("an HTTP client builds");
                loop {
                    let job = rx
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .recv_timeout(Duration::from_millis(100));
                    match job {
                        Ok(Job { name, url, host }) => {
                            let ok = client
                                .get(&url)
                                .header("host", host)
                                .send()
                                .map(|r| r.status().is_success())
                                .unwrap_or(false);
                            let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
                            let e = c.entry(name).or_default();
                            if ok { e.ok += 1 } else { e.failed += 1 }
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        let (s_stop, s_sent, s_shed) = (stop.clone(), sent.clone(), shed.clone());
        threads.push(std::thread::spawn(move || {
            schedule(mix, regions, &account, tx, s_stop, s_sent, s_shed)
        }));
        Traffic {
            stop,
            sent,
            shed,
            counts,
            threads,
        }
    }

    /// Requests issued so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Requests not issued because every connection was busy (open loop).
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Outcomes per target name so far.
    pub fn counts(&self) -> HashMap<String, Counts> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops and waits for in-flight requests.
    pub fn stop(mut self) -> HashMap<String, Counts> {
        self.halt();
        self.counts()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One request to send: counted under `name`, sent to `url` (the machine's
/// address) with `host` naming the script, as
/// `http://{script}.{account}.localhost:PORT/…` would without DNS.
struct Job {
    name: String,
    url: String,
    host: String,
}

fn schedule(
    mix: TrafficMix,
    regions: Vec<Vec<String>>,
    account: &str,
    tx: SyncSender<Job>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    shed: Arc<AtomicU64>,
) {
    let total_weight: u64 = mix.targets.iter().map(|(w, _)| u64::from(*w)).sum();
    if total_weight == 0 || regions.is_empty() || mix.rate <= 0.0 {
        return;
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()));
    let gap = Duration::from_secs_f64(1.0 / mix.rate);
    let start = Instant::now();
    let mut next = start;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed)
        && n < mix.max_requests
        && start.elapsed() < mix.max_duration
    {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += gap;
        let mut pick = rng.below(total_weight);
        let target = mix
            .targets
            .iter()
            .find(|(w, _)| {
                if pick < u64::from(*w) {
                    true
                } else {
                    pick -= u64::from(*w);
                    false
                }
            })
            .map(|(_, t)| t)
            .expect("weights sum to total");
        let region = &regions[rng.below(regions.len() as u64) as usize];
        let machine = &region[rng.below(region.len() as u64) as usize];
        let job = Job {
            name: target.name().to_owned(),
            url: format!("{machine}{}", target.url_path()),
            host: crate::cluster::worker_host(target.name(), account),
        };
        match tx.try_send(job) {
            Ok(()) => {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => {
                shed.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
        n += 1;
    }
}
