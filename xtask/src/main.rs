//! `cargo xtask`: the one entry point for edgeprof's automation.
//!
//! Kept light on purpose (std only, no dependencies) so it compiles in seconds
//! on a fresh machine. Each task lives in its own module; `main` only
//! dispatches.
//!
//! - `ci`: the whole test suite (what `.ci/run` runs): installs what it needs,
//!   then fmt, clippy, tests.
//! - `e2e`: the end-to-end suite against real processes (part of `ci`).
//! - `codegen`: regenerates `crates/proto/src/gen` from `proto/`.
//! - `bench pprof`: decode+merge of 100 profiles, edgeprof beside `go tool pprof`.
//! - `bench capture`: capture fan-out to 100, 500 and 1,000 simulated machines.

mod bench;
mod ci;
mod cluster;
mod dist;
mod e2e;
mod util;
mod workers;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((t, r)) => (t.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match task {
        "bench" => bench::run(rest),
        "build-workers" => workers::run_task(rest),
        "ci" => ci::run(rest),
        "cluster" => cluster::run_cluster(rest),
        "codegen" => ci::codegen(),
        "dist" => dist::run(rest),
        "e2e" => e2e::run(rest),
        "help" | "--help" | "-h" => {
            println!("{}", HELP);
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

const HELP: &str = "usage: cargo xtask <task>

tasks:
  bench pprof  decode+merge of 100 profiles: edgeprof vs go tool pprof, side by side
  bench capture  capture fan-out to N simulated machines [--machines 100,500,1000] [--duration 2s]
  build-workers  build e2e/workers for wasm32 into target/workers/
  cluster    a local edge (control plane + agents + workers + traffic) with the dashboard
  ci         run the whole test suite (installs what it needs)
  codegen    regenerate crates/proto/src/gen from proto/
  dist       build the browser dashboard (wasm + assets) into target/dist/
  e2e [FILTER]  the end-to-end suite: a real control plane, agents, workers, traffic";
