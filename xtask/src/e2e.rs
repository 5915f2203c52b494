//! `cargo xtask e2e`: the end-to-end suite (`e2e/tests/it`) against real
//! processes. Builds what the suite starts (the example workers, every
//! binary of the workspace in the dev profile, the dashboard in
//! `target/dist`), then runs `cargo test -p edgeprof-e2e` with the slow
//! tests on and `CI` semantics for prerequisites (a missing one fails).
//! Extra arguments go to the test binary (`cargo xtask e2e fleet` runs the
//! tests whose names contain `fleet`).

use crate::util::{cargo, run as sh};

/// Runs the task.
pub fn run(args: &[String]) -> Result<(), String> {
    crate::ci::setup()?;
    build_prerequisites()?;
    run_suite(args)
}

/// The suite alone, once [`build_prerequisites`] ran.
pub fn run_suite(args: &[String]) -> Result<(), String> {
    let started = std::time::Instant::now();
    sh(cargo()
        .args(["test", "-p", "edgeprof-e2e", "--all-targets", "--"])
        .args(args)
        .env("EDGEPROF_SLOW_TESTS", "1")
        .env("CI", std::env::var("CI").unwrap_or_else(|_| "true".into())))?;
    eprintln!("xtask e2e: passed in {:.0?}", started.elapsed());
    Ok(())
}

/// What the end-to-end and browser tests start: workers, binaries, dashboard.
pub fn build_prerequisites() -> Result<(), String> {
    crate::workers::run_task(&[])?;
    sh(cargo().args(["build", "--workspace", "--bins"]))?;
    crate::dist::run(&[])
}
