//! `cargo xtask dist`: builds the browser dashboard into `target/dist/` of
//! the repository (whatever `CARGO_TARGET_DIR` says), where the control
//! plane looks by default (`--dashboard-dir` overrides it).
//!
//! Steps: ensure the `wasm32-unknown-unknown` target; ensure the
//! `wasm-bindgen` CLI of exactly the `wasm-bindgen` version in `Cargo.lock`
//! (installed with `cargo install`); build `edgeprof-viewer-web` for wasm in
//! release; run `wasm-bindgen --target web`; copy the page's sources from
//! `crates/control-plane/web/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{cargo, root, run as sh};

const WEB_SOURCES: &str = "crates/control-plane/web";

/// Runs the task.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`dist` takes no arguments (got `{a}`)"));
    }
    let root = root();
    sh(Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]))?;
    let version = locked_version(&root, "wasm-bindgen")?;
    ensure_wasm_bindgen(&version)?;

    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    sh(cargo().args([
        "build",
        "-p",
        "edgeprof-viewer-web",
        "--release",
        "--target",
        "wasm32-unknown-unknown",
    ]))?;
    let wasm = target_dir.join("wasm32-unknown-unknown/release/edgeprof_viewer_web.wasm");
    let out = root.join("target/dist");
    let assets = out.join("assets");
    std::fs::create_dir_all(&assets)
        .map_err(|e| format!("cannot create {}: {e}", assets.display()))?;
    sh(Command::new("wasm-bindgen")
        .arg("--target")
        .arg("web")
        .arg("--no-typescript")
        .arg("--out-dir")
        .arg(&assets)
        .arg("--out-name")
        .arg("viewer")
        .arg(&wasm))?;
    let sources = root.join(WEB_SOURCES);
    let entries = std::fs::read_dir(&sources)
        .map_err(|e| format!("cannot read {}: {e}", sources.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading {}: {e}", sources.display()))?;
        let name = entry.file_name();
        let dest = if name == "index.html" {
            out.join(&name)
        } else {
            assets.join(&name)
        };
        std::fs::copy(entry.path(), &dest).map_err(|e| {
            format!(
                "cannot copy {} to {}: {e}",
                entry.path().display(),
                dest.display()
            )
        })?;
    }
    eprintln!("xtask dist: dashboard written to {}", out.display());
    Ok(())
}

/// The version of `package` in `Cargo.lock`.
fn locked_version(root: &Path, package: &str) -> Result<String, String> {
    let path = root.join("Cargo.lock");
    let lock = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let wanted = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted
            && let Some(v) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = "))
        {
            return Ok(v.trim_matches('"').to_owned());
        }
    }
    Err(format!("{}: no package `{package}`", path.display()))
}

/// Installs the `wasm-bindgen` CLI at `version` unless it is already there.
fn ensure_wasm_bindgen(version: &str) -> Result<(), String> {
    let installed = Command::new("wasm-bindgen")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if let Some(v) = &installed
        && v.split_whitespace().nth(1) == Some(version)
    {
        return Ok(());
    }
    eprintln!(
        "xtask dist: wasm-bindgen {version} needed (found {}); installing",
        installed.as_deref().map(str::trim).unwrap_or("none")
    );
    let locked = sh(cargo().args([
        "install",
        "--locked",
        "wasm-bindgen-cli",
        "--version",
        version,
    ]));
    if let Err(e) = locked {
        // The registry mirror may lack a crate version the CLI's own lock
        // file names; resolve afresh rather than give up.
        eprintln!("xtask dist: {e}; retrying without --locked");
        sh(cargo().args(["install", "wasm-bindgen-cli", "--version", version]))?;
    }
    Ok(())
}
