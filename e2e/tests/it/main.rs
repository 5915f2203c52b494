//! End-to-end tests: a real control plane and real node-agent processes on
//! loopback, real workers, real traffic, driven through the `edgeprof` CLI
//! and the REST API the way a user would.
//!
//! They need the binaries (`cargo build --bins`) and the example workers
//! (`cargo xtask build-workers`); `cargo xtask ci` builds both first. Without
//! them, the tests fail under `CI` and skip with a printed reason elsewhere.

mod browser;
mod capture;
mod cases;
mod cluster;
mod dashboard;
mod deploy;
mod history;
mod hostile;
mod memory;
mod placement;
mod simulate;

use std::path::PathBuf;

use edgeprof_e2e::cluster::default_bin_dir;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A built example worker (`NAME.wasm`, or a WAT one named `NAME.wat`), or
/// `None` (after printing why) when the prerequisites are missing outside CI.
pub fn worker(name: &str) -> Option<PathBuf> {
    let file = if name.ends_with(".wat") {
        name.to_owned()
    } else {
        format!("{name}.wasm")
    };
    let path = root().join("target/workers").join(file);
    let bins = ["edgeprof-control-plane", "edgeprof-node-agent", "edgeprof"]
        .iter()
        .all(|b| default_bin_dir().join(b).is_file());
    if path.is_file() && bins {
        return Some(path);
    }
    let why = format!(
        "needs {} and the binaries in {} (run `cargo build --bins && cargo xtask build-workers`, or `cargo xtask ci`)",
        path.display(),
        default_bin_dir().display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{why}");
    }
    eprintln!("skipping: {why}");
    None
}

/// A fresh state directory under `target/`.
pub fn state_dir(test: &str) -> PathBuf {
    root().join("target/e2e-state").join(test)
}

/// `go tool pprof -top FILE` succeeds (the reference reader opens our file).
/// Without `go` the check is skipped with a printed reason, except under CI.
pub fn assert_go_pprof_opens(file: &std::path::Path) {
    let out = match std::process::Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(file)
        .output()
    {
        Ok(out) => out,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping the go tool pprof check: cannot run go: {e}");
            return;
        }
        Err(e) => panic!("cannot run go tool pprof: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("flat%"),
        "go tool pprof -top {}: {}{}",
        file.display(),
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
}
