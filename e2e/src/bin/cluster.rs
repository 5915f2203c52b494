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
}

/// (script, wasm file, weight): the deployment the cluster starts with.
const DEPLOYMENT: &[(&str, &str, u32)] = &[
    ("json-gateway", "json-gateway.wasm", 90),
    ("json-gateway", "json-gateway-fixed.wasm", 10),
    ("metrics-twice", "metrics-twice.wasm", 100),
    (
        "leftover-instrumentation",
        "leftover-instrumentation.wasm",
        100,
    ),
    ("counter-object", "counter-object.wasm", 100),
];

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
    eprintln!(
        "edgeprof-cluster: starting a control plane and {}×{} node agents…",
        args.data_centers, args.machines_per_dc
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
        let id = cluster.deploy(script, &path, *weight)?;
        eprintln!("edgeprof-cluster: deployed {script} {id} (weight {weight}) from {file}");
        scripts.push(json!({"script": script, "version": id, "weight": weight, "wasm": file}));
    }

    let mut targets: Vec<(u32, Target)> = vec![
        (
            40,
            Target::Script {
                script: "json-gateway".into(),
                path: "/".into(),
            },
        ),
        (
            20,
            Target::Script {
                script: "metrics-twice".into(),
                path: "/".into(),
            },
        ),
        (
            10,
            Target::Script {
                script: "leftover-instrumentation".into(),
                path: "/".into(),
            },
        ),
    ];
    for i in 0..4u8 {
        let id = format!("{:064x}", u64::from(i) + 1);
        targets.push((
            5,
            Target::DurableObject {
                namespace: "counter-object".into(),
                id,
                path: "/increment".into(),
            },
        ));
    }
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

    let doc = cluster.describe(&scripts);
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
    println!("try:");
    println!(
        "  export EDGEPROF_URL={} EDGEPROF_TOKEN={} EDGEPROF_ACCOUNT={}",
        cluster.url, cluster.token, cluster.account
    );
    println!("  cargo run -q -p edgeprof-cli -- targets json-gateway");
    println!(
        "  cargo run -q -p edgeprof-cli -- profile json-gateway --duration 5s -o json-gateway.pprof"
    );
    println!("  cargo run -q -p edgeprof-cli -- top json-gateway.pprof");
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
