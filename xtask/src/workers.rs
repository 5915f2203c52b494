//! `cargo xtask build-workers`: builds the example workers in `e2e/workers/`
//! for `wasm32-unknown-unknown` (release, full DWARF kept) and copies them to
//! `target/workers/`: `<name>.wasm` (the buggy v1), `<name>-fixed.wasm` (v2,
//! built with `--features fixed`) and the WAT workers as `<name>.wat`.

use std::process::Command;

use crate::util::{root, run};

const WORKERS: &[&str] = &[
    "json-gateway",
    "metrics-twice",
    "leftover-instrumentation",
    "counter-object",
];
const TARGET: &str = "wasm32-unknown-unknown";

pub fn run_task(_args: &[String]) -> Result<(), String> {
    ensure_target()?;
    let root = root();
    let build_dir = root.join("target/workers-build");
    let out_dir = root.join("target/workers");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let manifest = root.join("e2e/workers/Cargo.toml");
    for (features, suffix) in [(None, ""), (Some("fixed"), "-fixed")] {
        for w in WORKERS {
            // Not `crate::util::cargo()`: that would inherit CARGO_TARGET_DIR
            // and build settings meant for the host workspace.
            let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            c.env_remove("CARGO_TARGET_DIR")
                .env_remove("RUSTFLAGS")
                .args(["build", "--release", "--target", TARGET, "-p", w])
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&build_dir);
            if let Some(f) = features {
                c.args(["--features", f]);
            }
            run(&mut c)?;
            let built = build_dir
                .join(TARGET)
                .join("release")
                .join(format!("{}.wasm", w.replace('-', "_")));
            let dest = out_dir.join(format!("{w}{suffix}.wasm"));
            std::fs::copy(&built, &dest)
                .map_err(|e| format!("copying {} to {}: {e}", built.display(), dest.display()))?;
        }
    }
    let wat_dir = root.join("e2e/workers/wat");
    let entries =
        std::fs::read_dir(&wat_dir).map_err(|e| format!("reading {}: {e}", wat_dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "wat") {
            let dest = out_dir.join(entry.file_name());
            std::fs::copy(&path, &dest).map_err(|e| format!("copying {}: {e}", path.display()))?;
        }
    }
    eprintln!("xtask build-workers: workers are in {}", out_dir.display());
    Ok(())
}

fn ensure_target() -> Result<(), String> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("cannot run `rustup target list --installed`: {e}"))?;
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == TARGET)
    {
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", TARGET]))
}
