//! `cargo xtask bench pprof`: decode + merge of 100 profiles by the release
//! `edgeprof merge` and by `go tool pprof -proto`, on the same files, side by
//! side in one run (alternating repetitions, medians), with the ratio.
//! `cargo xtask bench capture`: fan-out of one capture to a simulated edge
//! of N machines (`capture`).
//!
//! The per-function benchmarks (decode, merge, top) are criterion's:
//! `cargo bench -p edgeprof-pprof`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{cargo, edgeprof_output, ensure_apt, root, run as sh};

mod capture;

const USAGE: &str = "usage: cargo xtask bench pprof [--profiles N] [--reps N]
       cargo xtask bench capture [--machines 100,500,1000] [--duration 2s] [--rate R]";

pub fn run(args: &[String]) -> Result<(), String> {
    let (what, rest) = args.split_first().ok_or(USAGE)?;
    if what == "capture" {
        return capture::run(rest, USAGE);
    }
    if what != "pprof" {
        return Err(format!("unknown benchmark `{what}`\n{USAGE}"));
    }
    let mut profiles = 100u32;
    let mut reps = 5u32;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let n: u32 = value
            .parse()
            .map_err(|e| format!("{flag} {value}: {e}\n{USAGE}"))?;
        match flag.as_str() {
            "--profiles" if n > 0 => profiles = n,
            "--reps" if n > 0 => reps = n,
            _ => return Err(format!("bad flag `{flag} {value}`\n{USAGE}")),
        }
    }
    pprof(profiles, reps)
}

/// `target/release` of the repository (or of `CARGO_TARGET_DIR`).
fn release_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("release")
}

fn pprof(profiles: u32, reps: u32) -> Result<(), String> {
    ensure_apt("go", &["golang-go"])?;
    sh(cargo().args([
        "build",
        "--release",
        "-p",
        "edgeprof-cli",
        "-p",
        "edgeprof-pprof",
        "--example",
        "gen_profiles",
    ]))?;
    let release = release_dir();
    let edgeprof = release.join("edgeprof");

    let dir = std::env::temp_dir().join(format!("edgeprof-bench-{}", std::process::id()));
    let result = compare(&release, &edgeprof, &dir, profiles, reps);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn compare(
    release: &Path,
    edgeprof: &Path,
    dir: &Path,
    profiles: u32,
    reps: u32,
) -> Result<(), String> {
    let inputs = dir.join("in");
    sh(Command::new(release.join("examples/gen_profiles"))
        .arg(&inputs)
        .arg(profiles.to_string()))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&inputs)
        .map_err(|e| format!("{}: {e}", inputs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let bytes: u64 = files
        .iter()
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum();

    let ours_out = dir.join("edgeprof.pprof");
    let go_out = dir.join("go.pprof");
    let mut ours = Command::new(edgeprof);
    ours.arg("merge")
        .args(&files)
        .arg("-o")
        .arg(&ours_out)
        .stderr(Stdio::null());
    let go_env = dir.join("go");
    let mut go = Command::new("go");
    go.args(["tool", "pprof", "-proto"])
        .args(&files)
        .env("GOCACHE", go_env.join("cache"))
        .env("GOPATH", go_env.join("gopath"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("PPROF_TMPDIR", go_env.join("pprof-tmp"))
        .stderr(Stdio::null());

    eprintln!("xtask bench: warming up (one untimed run each)");
    time(&mut ours, None)?;
    time(&mut go, Some(&go_out))?;
    let (a, b) = (total(edgeprof, &ours_out)?, total(edgeprof, &go_out)?);
    if a != b {
        return Err(format!(
            "the merged profiles disagree: edgeprof's total cpu is {a}, go tool pprof's {b}"
        ));
    }

    let mut ours_times = Vec::new();
    let mut go_times = Vec::new();
    for rep in 0..reps {
        eprintln!("xtask bench: repetition {}/{reps}", rep + 1);
        // Alternate which goes first, so neither always runs on a warmer cache.
        if rep % 2 == 0 {
            ours_times.push(time(&mut ours, None)?);
            go_times.push(time(&mut go, Some(&go_out))?);
        } else {
            go_times.push(time(&mut go, Some(&go_out))?);
            ours_times.push(time(&mut ours, None)?);
        }
    }
    let (ours_med, go_med) = (median(&mut ours_times), median(&mut go_times));
    println!(
        "decode + merge of {profiles} profiles ({:.1} MB gzip'd), {reps} alternating repetitions, median [min, max]:",
        bytes as f64 / 1e6
    );
    println!(
        "  edgeprof merge        {:>8.3} s  [{:.3}, {:.3}]",
        ours_med.as_secs_f64(),
        ours_times[0].as_secs_f64(),
        ours_times[ours_times.len() - 1].as_secs_f64()
    );
    println!(
        "  go tool pprof -proto  {:>8.3} s  [{:.3}, {:.3}]",
        go_med.as_secs_f64(),
        go_times[0].as_secs_f64(),
        go_times[go_times.len() - 1].as_secs_f64()
    );
    println!(
        "  ratio (go tool pprof / edgeprof): {:.2}x  (both outputs total {a} cpu ns)",
        go_med.as_secs_f64() / ours_med.as_secs_f64()
    );
    Ok(())
}

/// Wall time of one run of `cmd`, which must succeed; stdout goes to `out`.
fn time(cmd: &mut Command, out: Option<&Path>) -> Result<Duration, String> {
    match out {
        Some(path) => {
            let file =
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            cmd.stdout(file);
        }
        None => {
            cmd.stdout(Stdio::null());
        }
    }
    let start = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let elapsed = start.elapsed();
    if !status.success() {
        return Err(format!("{:?} failed with {status}", cmd.get_program()));
    }
    Ok(elapsed)
}

/// Sorts `times` and returns the median.
fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    let n = times.len();
    if n % 2 == 1 {
        times[n / 2]
    } else {
        (times[n / 2 - 1] + times[n / 2]) / 2
    }
}

/// The `total` of `edgeprof top --json` on `file`.
fn total(edgeprof: &Path, file: &Path) -> Result<i64, String> {
    let text = edgeprof_output(edgeprof, &["top", "--json", "-n", "1"], file)?;
    text.split("\"total\":")
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            digits.parse().ok()
        })
        .ok_or_else(|| format!("no total in edgeprof top --json output: {text}"))
}
