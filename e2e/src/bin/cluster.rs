//! `edgeprof-cluster` (run by `cargo xtask cluster`): a local edge under
//! traffic until Ctrl-C or SIGTERM, which stop every child process.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use edgeprof_e2e::traffic::Target;
use edgeprof_e2e::{Cluster, ClusterOptions, Traffic, TrafficMix};
use serde_json::json;

/// A local edge: control plane + node agents + example workers + traffic.
#[derive(Debug, Parser)]
struct Args {
    /// Number of data centers.
    #[arg(long, default_value_t = 3)]
    data_centers: usize,
    /// Machines per data center.
    #[arg(long, default_value_t = 2)]
    machines_per_dc: usize,
    /// Requests per second of synthetic traffic (0 = none).
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// The traffic mix: `SCRIPT=WEIGHT,…`; `counter-object` requests go to
    /// its Durable Objects.
    #[arg(
        long,
        default_value = "json-gateway=40,metrics-twice=20,leftover-instrumentation=10,counter-object=20",
        value_parser = parse_mix
    )]
    mix: Mix,
    /// Where state, logs and cluster.json go.
    #[arg(long, default_value = "target/edgeprof-cluster")]
    state_dir: PathBuf,
    /// Where the example workers' .wasm files are.
    #[arg(long, default_value = "target/workers")]
    workers: PathBuf,
    /// Keep the database of a previous run (scripts, sessions, profiles).
    #[arg(long)]
    keep_state: bool,
    /// Stop by itself after this many seconds (0 = run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    exit_after: u64,
    /// Continuous profiling: CPU samples per second on every isolate of
    /// every agent (0 turns it off; the history commands then find nothing).
    #[arg(long, default_value_t = 19)]
    continuous_hz: u32,
    /// Length of a continuous-profiling window, in whole seconds (1–300).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    continuous_window_secs: u64,
}

/// (script, wasm file, weight): the deployment the cluster starts with. A
/// gradual rollout of json-gateway's fix; the other fixes are uploaded as
/// versions of their own with weight 0 (not serving), ready for
/// `edgeprof rollout`.
const DEPLOYMENT: &[(&str, &str, u32)] = &[
    ("json-gateway", "json-gateway.wasm", 90),
    ("json-gateway", "json-gateway-fixed.wasm", 10),
    ("metrics-twice", "metrics-twice.wasm", 100),
    ("metrics-twice", "metrics-twice-fixed.wasm", 0),
    (
        "leftover-instrumentation",
        "leftover-instrumentation.wasm",
        100,
    ),
    (
        "leftover-instrumentation",
        "leftover-instrumentation-fixed.wasm",
        0,
    ),
    ("counter-object", "counter-object.wasm", 100),
];

/// `--mix`: scripts with weights.
#[derive(Debug, Clone)]
struct Mix(Vec<(String, u32)>);

fn parse_mix(s: &str) -> Result<Mix, String> {
    let known: Vec<&str> = DEPLOYMENT.iter().map(|(script, _, _)| *script).collect();
    let mut mix = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (script, weight) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected SCRIPT=WEIGHT"))?;
        let script = script.trim();
        if !known.contains(&script) {
            return Err(format!("`{script}`: not an example script (one of {})", {
                let mut k = known.clone();
                k.dedup();
                k.join(", ")
            }));
        }
        let weight: u32 = weight
            .trim()
            .parse()
            .map_err(|_| format!("`{part}`: weight must be a whole number"))?;
        mix.push((script.to_owned(), weight));
    }
    if mix.iter().all(|(_, w)| *w == 0) {
        return Err("the mix needs a script with a weight above 0".into());
    }
    Ok(Mix(mix))
}

impl Mix {
    /// Requests the generator sends: a script's weight is spread over its
    /// Durable Objects for `counter-object`.
    fn targets(&self) -> Vec<(u32, Target)> {
        let mut targets = Vec::new();
        for (script, weight) in &self.0 {
            if script == "counter-object" {
                // One hot object (half of the requests, the one the printed
                // command profiles) and a few quieter ones.
                let ids = counter_ids();
                let quiet = ids.len() as u32 - 1;
                for (i, id) in ids.into_iter().enumerate() {
                    let share = if i == 0 {
                        weight.div_ceil(2)
                    } else {
                        (weight / 2).div_ceil(quiet)
                    };
                    targets.push((
                        share,
                        Target::DurableObject {
                            namespace: script.clone(),
                            id,
                            path: "/increment".into(),
                        },
                    ));
                }
            } else {
                targets.push((
                    *weight,
                    Target::Script {
                        script: script.clone(),
                        path: "/".into(),
                    },
                ));
            }
        }
        targets
    }

    fn scripts(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(_, w)| *w > 0)
            .map(|(s, _)| s.as_str())
            .collect()
    }
}

/// The Durable Objects the traffic increments.
fn counter_ids() -> Vec<String> {
    (1..=4u64).map(|i| format!("{i:064x}")).collect()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (stop_tx, stop_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .context("cannot install the Ctrl-C/SIGTERM handler")?;

    let mut options = ClusterOptions::new(&args.state_dir);
    options.data_centers = args.data_centers;
    options.machines_per_dc = args.machines_per_dc;
    options.fresh = !args.keep_state;
    options.continuous_hz = args.continuous_hz;
    options.continuous_window = Duration::from_secs(args.continuous_window_secs);
    let kept = args.keep_state && args.state_dir.join("edgeprof.sqlite").is_file();
    eprintln!(
        "edgeprof-cluster: starting a control plane and {}×{} node agents{}…",
        args.data_centers,
        args.machines_per_dc,
        if kept { " on the kept state" } else { "" }
    );
    let cluster = Cluster::start(options)?;

    let mut scripts = Vec::new();
    for (script, file, weight) in DEPLOYMENT {
        let path = args.workers.join(file);
        if !path.is_file() {
            eprintln!(
                "edgeprof-cluster: {} missing; run `cargo xtask build-workers`",
                path.display()
            );
            continue;
        }
        // With --keep-state a module uploaded before stays the version it
        // was (same bytes, same id), and the deployment stays as it was left.
        let id = match cluster.version_with_wasm(script, &path)? {
            Some(id) => {
                eprintln!("edgeprof-cluster: kept {script} {id} from {file}");
                id
            }
            None => {
                let id = cluster.deploy(script, &path, *weight)?;
                eprintln!("edgeprof-cluster: deployed {script} {id} (weight {weight}) from {file}");
                id
            }
        };
        scripts.push(
            json!({"script": script, "account": cluster.account, "version": id, "wasm": file}),
        );
    }
    for s in scripts.iter_mut() {
        let script = s["script"].as_str().unwrap_or_default().to_owned();
        let weights = cluster.weights(&script)?;
        let id = s["version"].as_str().unwrap_or_default();
        s["weight"] = json!(weights.get(id).copied().unwrap_or(0));
    }

    let targets = args.mix.targets();
    let traffic = (args.rate > 0.0).then(|| {
        Traffic::start(
            &cluster,
            TrafficMix {
                targets,
                rate: args.rate,
                max_duration: Duration::from_secs(if args.exit_after > 0 {
                    args.exit_after
                } else {
                    24 * 3600
                }),
                max_requests: u64::MAX,
                concurrency: 16,
            },
        )
    });

    if traffic.is_some() {
        eprintln!("edgeprof-cluster: waiting until every script serves traffic…");
        // A script on every machine (the printed `edgeprof targets` lists
        // them all); a Durable Object's script where its objects live.
        let (objects, scripts): (Vec<&str>, Vec<&str>) = args
            .mix
            .scripts()
            .into_iter()
            .partition(|s| *s == "counter-object");
        let waited = cluster
            .wait_serving_everywhere(&scripts, Duration::from_secs(90))
            .and_then(|()| cluster.wait_serving(&objects, Duration::from_secs(90)));
        if let Err(e) = waited {
            eprintln!(
                "edgeprof-cluster: warning: {e:#}; captures may answer \"no recent executions\" for a while"
            );
        }
    }

    let commands = example_commands(&cluster, &scripts);
    let mut doc = cluster.describe(&scripts);
    doc["commands"] = json!(commands);
    let json_path = args.state_dir.join("cluster.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    println!(
        "edgeprof local edge is up ({} data centers × {} machines)",
        args.data_centers, args.machines_per_dc
    );
    println!();
    println!("  dashboard:  {}/", cluster.url);
    println!("  token:      {}", cluster.token);
    println!("  account:    {}", cluster.account);
    println!("  state:      {}", json_path.display());
    println!();
    println!("try (each line after `$` can be pasted into a shell):");
    for c in &commands {
        println!("  # {}", c["what"].as_str().unwrap_or_default());
        println!("  $ {}", c["command"].as_str().unwrap_or_default());
    }
    println!();
    println!("Ctrl-C stops every process.");

    if args.exit_after > 0 {
        let _ = stop_rx.recv_timeout(Duration::from_secs(args.exit_after));
    } else {
        let _ = stop_rx.recv();
    }
    eprintln!("edgeprof-cluster: stopping…");
    drop(traffic);
    drop(cluster);
    eprintln!("edgeprof-cluster: stopped");
    Ok(())
}

/// The commands printed at start (and written to `cluster.json`), each
/// `{"what", "command"}`; the first sets up the shell.
fn example_commands(cluster: &Cluster, scripts: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let bin = cluster.options.bin_dir.display();
    let version_of = |wasm: &str| {
        scripts
            .iter()
            .find(|s| s["wasm"] == wasm)
            .and_then(|s| s["version"].as_str())
            .map(str::to_owned)
    };
    let counter = &counter_ids()[0];
    let first_machine = &cluster.data_centers[0].machines[0];
    let mut c = vec![
        (
            "point the CLI at this edge",
            format!(
                "export PATH=\"{bin}:$PATH\" EDGEPROF_URL={} EDGEPROF_TOKEN={} EDGEPROF_ACCOUNT={}",
                cluster.url, cluster.token, cluster.account
            ),
        ),
        (
            "one request to json-gateway, by its host {script}.{account}.localhost on the first machine",
            format!("curl -fsS {}/", first_machine.worker_url("json-gateway", &cluster.account)),
        ),
        (
            "where json-gateway runs, per machine and version, with memory",
            "edgeprof targets json-gateway".to_owned(),
        ),
        (
            "a 5 s CPU profile of json-gateway's v1 (90 % of its traffic; `latest` would be the fix)",
            format!(
                "edgeprof profile json-gateway --version {} --duration 5s -o json-gateway.pprof",
                version_of("json-gateway.wasm").unwrap_or_else(|| "latest".into())
            ),
        ),
        (
            "the hottest functions, as go tool pprof -top ranks them",
            "edgeprof top json-gateway.pprof".to_owned(),
        ),
        (
            "the flamegraph in the terminal (q quits)",
            "edgeprof view json-gateway.pprof".to_owned(),
        ),
        // 10 s: at the default mix its busy isolates serve about one
        // request a second each, ~0.7 heap samples a request; 5 s of that
        // would hold no instrumentation sample about once in 200 runs
        // (estimated from those rates).
        (
            "what allocates in leftover-instrumentation",
            "edgeprof profile leftover-instrumentation --type heap --duration 10s -o heap.pprof && edgeprof top heap.pprof --sample-index alloc_space".to_owned(),
        ),
        (
            "one Durable Object's isolate only",
            format!("edgeprof profile counter-object --durable-object counter-object:{counter} --duration 5s -o counter.pprof"),
        ),
    ];
    if cluster.options.continuous_hz > 0 {
        let window = cluster.options.continuous_window.as_secs().max(1);
        c.push((
            "json-gateway's history (continuous profiling, in windows of this length; the first arrives after one)",
            format!("edgeprof history json-gateway --from -5m -o json-gateway-5m.pprof  # windows of {window} s"),
        ));
        c.push((
            "CPU and requests per minute of json-gateway, one sparkline per version",
            "edgeprof timeline json-gateway --from -30m --step 1m --group-by version".to_owned(),
        ));
    }
    if let Some(fixed) = version_of("metrics-twice-fixed.wasm") {
        c.push((
            "deploy metrics-twice's fix to half of its traffic",
            format!("edgeprof rollout metrics-twice latest=50 {fixed}=50"),
        ));
    }
    c.into_iter()
        .map(|(what, command)| json!({"what": what, "command": command}))
        .collect()
}
