//! Small process helpers shared by the tasks.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the repository root")
        .to_path_buf()
}

/// `cargo` as invoked by the user (respects `$CARGO`).
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs `cmd`, echoing it first; an error names the command and its exit status.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("$ {}", show(cmd));
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start `{}`: {e}", show(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed with {status}", show(cmd)))
    }
}

/// The edge's binaries every local run needs (control plane, node agent,
/// CLI), and `extra` packages, built in release.
pub fn build_release(extra: &[&str]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["build", "--release"]);
    for package in [
        "edgeprof-control-plane",
        "edgeprof-node-agent",
        "edgeprof-cli",
    ]
    .iter()
    .chain(extra)
    {
        cmd.args(["-p", package]);
    }
    run(&mut cmd)
}

/// The standard output of `edgeprof ARGS FILE`; an error carries its
/// standard error.
pub fn edgeprof_output(edgeprof: &Path, args: &[&str], file: &Path) -> Result<String, String> {
    let out = Command::new(edgeprof)
        .args(args)
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run edgeprof {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "edgeprof {} {}: {}",
            args.join(" "),
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `program` can be found on `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Installs Debian packages with apt-get when `program` is missing.
pub fn ensure_apt(program: &str, packages: &[&str]) -> Result<(), String> {
    if on_path(program) {
        return Ok(());
    }
    eprintln!("xtask: `{program}` not found; installing {packages:?} with apt-get");
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
