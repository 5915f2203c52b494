//! `cargo xtask cluster [ARGS]`: builds what a local edge needs (release
//! binaries, example workers) with visible progress, then runs
//! `edgeprof-cluster` in the foreground; Ctrl-C stops it and every process it
//! started. Arguments are passed through (`--data-centers N`,
//! `--machines-per-dc M`, `--rate R`, `--mix SCRIPT=W,…`, `--keep-state`,
//! `--exit-after S`, `--continuous-hz H`, `--continuous-window-secs S`).

use std::process::Command;

use crate::util::{build_release, root, run};

pub fn run_cluster(args: &[String]) -> Result<(), String> {
    eprintln!("xtask cluster: building the example workers…");
    crate::workers::run_task(&[])?;
    eprintln!("xtask cluster: building the dashboard (wasm + assets into target/dist)…");
    crate::dist::run(&[])?;
    eprintln!(
        "xtask cluster: building the control plane, node agent, CLI and cluster runner (release)…"
    );
    build_release(&["edgeprof-e2e"])?;
    let bin = root().join("target/release/edgeprof-cluster");
    run(Command::new(bin)
        .current_dir(root())
        .env("EDGEPROF_BIN_DIR", root().join("target/release"))
        .args(args))
}
