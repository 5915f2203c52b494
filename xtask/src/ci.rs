//! `cargo xtask ci`: the whole test suite, runnable on a fresh machine.
//!
//! Installs what the tests need (rustfmt/clippy components, the
//! `wasm32-unknown-unknown` target, Debian's `golang-go` for the `go tool pprof`
//! oracle), then checks formatting, runs clippy with `-D warnings` and runs
//! every test of the workspace with the slow suites enabled, after building
//! the example workers, the binaries and the dashboard the tests start;
//! then the end-to-end suite (`cargo xtask e2e`).

use std::process::Command;

use crate::util::{cargo, ensure_apt, run as sh};

pub fn setup() -> Result<(), String> {
    sh(Command::new("rustup").args(["component", "add", "rustfmt", "clippy"]))?;
    sh(Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]))?;
    ensure_apt("go", &["golang-go"])?;
    ensure_apt("chromium", &["chromium"])?;
    Ok(())
}

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`ci` takes no arguments (got `{a}`)"));
    }
    let started = std::time::Instant::now();
    setup()?;
    sh(cargo().args(["fmt", "--all", "--check"]))?;
    sh(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let phase = std::time::Instant::now();
    // Tests outside e2e also start binaries (the control plane's browser and
    // process tests) and load the workers and the dashboard.
    crate::e2e::build_prerequisites()?;
    sh(cargo()
        .args([
            "test",
            "--workspace",
            "--all-targets",
            "--exclude",
            "edgeprof-e2e",
        ])
        .env("EDGEPROF_SLOW_TESTS", "1"))?;
    sh(cargo().args(["test", "--workspace", "--doc"]))?;
    let unit = phase.elapsed();
    crate::e2e::run_suite(&[])?;
    eprintln!(
        "xtask ci: crate tests took {unit:.0?}, the end-to-end suite {:.0?}",
        phase.elapsed() - unit
    );
    eprintln!("xtask ci: all checks passed in {:.0?}", started.elapsed());
    Ok(())
}

pub fn codegen() -> Result<(), String> {
    sh(cargo()
        .args(["test", "-p", "edgeprof-proto", "codegen"])
        .env("EDGEPROF_CODEGEN", "write"))
}
