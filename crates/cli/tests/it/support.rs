//! Running the `edgeprof` binary, the Go oracle program and `go tool pprof`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Output of one `edgeprof` run.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the `edgeprof` binary built for these tests.
pub fn edgeprof(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_edgeprof"))
        .args(args)
        .output()
        .expect("cannot start edgeprof");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `edgeprof ARGS` keeping stdout as bytes (a profile written to `-o -`).
pub fn edgeprof_raw(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeprof"))
        .args(args)
        .output()
        .expect("cannot start edgeprof")
}

/// `edgeprof ARGS` that must succeed; returns stdout.
pub fn edgeprof_ok(args: &[&str]) -> String {
    let run = edgeprof(args);
    assert_eq!(
        run.code,
        Some(0),
        "edgeprof {args:?} failed:\n{}",
        run.stderr
    );
    run.stdout
}

/// The Go toolchain with the Go oracle program built, or `None` (after
/// printing why) when `go` is absent outside CI. In CI (`CI` set) a missing
/// `go` is a failure: `cargo xtask ci` installs it.
pub struct Go {
    /// Where the oracle binary, Go's caches and recorded profiles live.
    dir: PathBuf,
    oracle: PathBuf,
}

pub fn go() -> Option<&'static Go> {
    static GO: OnceLock<Option<Go>> = OnceLock::new();
    GO.get_or_init(|| {
        if Command::new("go").arg("version").output().is_err() {
            if std::env::var_os("CI").is_some() {
                panic!("`go` is not on PATH, and CI is set: `cargo xtask ci` installs golang-go");
            }
            eprintln!("skipping go-pprof interop: `go` is not on PATH (install golang-go)");
            return None;
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-oracle");
        std::fs::create_dir_all(&dir).expect("cannot create the go-oracle dir");
        let go = Go {
            oracle: dir.join("go-oracle"),
            dir,
        };
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/go-oracle");
        let out = go
            .command("go")
            .args(["build", "-o"])
            .arg(&go.oracle)
            .arg(".")
            .current_dir(&src)
            .output()
            .expect("cannot start go build");
        check(&out, "go build e2e/go-oracle");
        Some(go)
    })
    .as_ref()
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed with {}:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Go {
    /// A command with Go's environment set up for an offline machine.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .env("GOPROXY", "off")
            .env("GOCACHE", self.dir.join("cache"))
            .env("GOPATH", self.dir.join("gopath"))
            // `go tool pprof` would otherwise write copies of every file it reads.
            .env("PPROF_TMPDIR", self.dir.join("pprof-tmp"));
        c
    }

    /// Records a profile with the oracle: `mode` is `cpu` or `heap`.
    pub fn record(&self, mode: &str, out: &Path, extra: &[&str]) {
        let run = self
            .command(&self.oracle)
            .arg(mode)
            .arg(out)
            .args(extra)
            .output()
            .expect("cannot start go-oracle");
        check(&run, &format!("go-oracle {mode}"));
    }

    /// `go tool pprof ARGS`, which must succeed; returns stdout as bytes.
    pub fn pprof(&self, args: &[&str]) -> Vec<u8> {
        let out = self
            .command("go")
            .args(["tool", "pprof"])
            .args(args)
            .output()
            .expect("cannot start go tool pprof");
        check(&out, &format!("go tool pprof {args:?}"));
        out.stdout
    }

    /// `go tool pprof -top` as numbers: the total and (function, flat, cum)
    /// rows in pprof's order. `unit` is passed as `-unit` so values print as
    /// exact integers.
    pub fn top(&self, file: &Path, sample_index: Option<&str>, cum: bool, unit: &str) -> Top {
        self.top_with(file, sample_index, cum, unit, &[])
    }

    /// [`Go::top`] with more flags (`-diff_base=F`, `-tagfocus=K=V`).
    pub fn top_with(
        &self,
        file: &Path,
        sample_index: Option<&str>,
        cum: bool,
        unit: &str,
        extra: &[&str],
    ) -> Top {
        let mut args = vec!["-top".to_owned(), "-nodefraction=0.005".to_owned()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        if let Some(i) = sample_index {
            args.push(format!("-sample_index={i}"));
        }
        if cum {
            args.push("-cum".into());
        }
        match unit {
            "nanoseconds" => args.push("-unit=ns".into()),
            "bytes" => args.push("-unit=B".into()),
            _ => {}
        }
        args.push(file.to_str().expect("utf-8 path").to_owned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = String::from_utf8(self.pprof(&args)).expect("pprof prints utf-8");
        parse_top(&text)
    }
}

/// One `top` table as numbers.
#[derive(Debug, PartialEq, Eq)]
pub struct Top {
    pub sample_type: String,
    pub total: i64,
    pub rows: Vec<(String, i64, i64)>,
}

/// A value as pprof prints it with an exact `-unit`: `1490000000ns`, `640B`, `0`.
fn parse_value(s: &str, line: &str) -> i64 {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    digits
        .parse()
        .unwrap_or_else(|_| panic!("cannot read value {s:?} in pprof line {line:?}"))
}

fn parse_top(text: &str) -> Top {
    let mut sample_type = String::new();
    let mut total = None;
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("Type: ") {
            sample_type = t.trim().to_owned();
        } else if let Some(rest) = line.strip_prefix("Showing nodes accounting for ") {
            // "Showing nodes accounting for X, P% of T total"
            let t = rest
                .split(" of ")
                .nth(1)
                .and_then(|s| s.strip_suffix(" total"))
                .unwrap_or_else(|| panic!("unexpected pprof line {line:?}"));
            total = Some(parse_value(t, line));
        } else if line.trim_start().starts_with("flat  flat%") {
            in_table = true;
        } else if in_table {
            let mut rest = line.trim_start();
            let mut fields = Vec::new();
            for _ in 0..5 {
                let end = rest.find(' ').unwrap_or(rest.len());
                fields.push(&rest[..end]);
                rest = rest[end..].trim_start();
            }
            let function = rest
                .strip_suffix(" (inline)")
                .or_else(|| rest.strip_suffix(" (partial-inline)"))
                .unwrap_or(rest);
            rows.push((
                function.to_owned(),
                parse_value(fields[0], line),
                parse_value(fields[3], line),
            ));
        }
    }
    Top {
        sample_type,
        total: total.unwrap_or_else(|| panic!("no total in pprof output:\n{text}")),
        rows,
    }
}

/// `edgeprof top --json` as numbers, with the sample type's unit.
pub fn edgeprof_top(file: &Path, sample_index: Option<&str>, cum: bool) -> (Top, String) {
    edgeprof_top_with(file, sample_index, cum, &[])
}

/// [`edgeprof_top`] with more flags (`--diff-base F`, `--tag K=V`).
pub fn edgeprof_top_with(
    file: &Path,
    sample_index: Option<&str>,
    cum: bool,
    extra: &[&str],
) -> (Top, String) {
    let file = file.to_str().expect("utf-8 path");
    let mut args = vec!["top", "--json", "--node-fraction", "0.005", file];
    args.extend(extra);
    if let Some(i) = sample_index {
        args.extend(["--sample-index", i]);
    }
    if cum {
        args.push("--cum");
    }
    let out = edgeprof_ok(&args);
    let doc: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("edgeprof top --json printed invalid JSON ({e}):\n{out}"));
    let int = |v: &serde_json::Value| {
        v.as_i64()
            .unwrap_or_else(|| panic!("expected an integer, got {v} in {out}"))
    };
    let rows = doc["rows"]
        .as_array()
        .expect("rows is an array")
        .iter()
        .map(|r| {
            (
                r["function"]
                    .as_str()
                    .expect("function is a string")
                    .to_owned(),
                int(&r["flat"]),
                int(&r["cum"]),
            )
        })
        .collect();
    let top = Top {
        sample_type: doc["sample_type"]["type"]
            .as_str()
            .expect("sample_type.type")
            .to_owned(),
        total: int(&doc["total"]),
        rows,
    };
    let unit = doc["sample_type"]["unit"]
        .as_str()
        .expect("sample_type.unit")
        .to_owned();
    (top, unit)
}
