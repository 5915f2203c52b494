//! `edgeprof-node-agent`: parses flags and environment into a validated
//! [`edgeprof_node_agent::Config`], then runs the agent until Ctrl-C/SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use edgeprof_node_agent::{Args, Config};

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match Config::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("edgeprof-node-agent: invalid configuration: {e:#}");
            return ExitCode::from(2);
        }
    };
    if config.check_only {
        println!(
            "configuration ok: machine {} in {}",
            config.machine_id, config.data_center
        );
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "edgeprof_node_agent=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("edgeprof-node-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(edgeprof_node_agent::run_until_shutdown(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgeprof-node-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
