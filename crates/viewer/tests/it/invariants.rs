//! The crate's architecture invariant, checked with cargo itself: the model
//! (default features) builds for `wasm32-unknown-unknown` and links no
//! tokio, sqlx, tonic or terminal crates. Slow (a wasm build), so it runs
//! when `EDGEPROF_SLOW_TESTS=1`, as `cargo xtask ci` sets.

use std::path::PathBuf;
use std::process::Command;

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    c.current_dir(&root)
        // Its own target dir: the outer `cargo test` may hold the usual one.
        .env("CARGO_TARGET_DIR", root.join("target/viewer-wasm-check"));
    c
}

#[test]
fn the_model_builds_for_wasm_and_links_no_io_stack() {
    if std::env::var_os("EDGEPROF_SLOW_TESTS").is_none() {
        return;
    }
    let tree = cargo()
        .args([
            "tree",
            "-p",
            "edgeprof-viewer",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--target", "wasm32-unknown-unknown"])
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&tree.stdout);
    assert!(
        tree.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let forbidden = [
        "tokio",
        "sqlx",
        "tonic",
        "ratatui",
        "crossterm",
        "mio",
        "hyper",
        "axum",
    ];
    let linked: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| forbidden.iter().any(|f| name.starts_with(f)))
        .collect();
    assert!(
        linked.is_empty(),
        "the viewer model links {linked:?}:\n{stdout}"
    );

    let build = cargo()
        .args([
            "build",
            "-p",
            "edgeprof-viewer",
            "--target",
            "wasm32-unknown-unknown",
        ])
        .output()
        .expect("run cargo build");
    assert!(
        build.status.success(),
        "the viewer model does not build for wasm32-unknown-unknown:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
}
