//! Commands that work on local `.pprof` files only.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use edgeprof_pprof::{Merger, Profile, SampleIndex, TopOptions, TopSort, format_value};

/// Flags of `edgeprof top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Profile to read (`-` for stdin).
    pub file: PathBuf,
    /// Sample type by name (`cpu`, `alloc_space`) or 0-based number; default:
    /// the profile's default (the last type, as pprof).
    #[arg(long, short = 'i')]
    pub sample_index: Option<String>,
    /// Sort by cumulative value instead of flat.
    #[arg(long)]
    pub cum: bool,
    /// Show at most N rows.
    #[arg(short = 'n', long = "nodecount", value_name = "N")]
    pub limit: Option<usize>,
    /// Leave out functions whose cum is below this fraction of the total
    /// (pprof's -nodefraction).
    #[arg(long, default_value_t = 0.005, value_name = "F")]
    pub node_fraction: f64,
    /// Print one JSON object: {"sample_type", "total", "rows": [{"function", "flat", "cum"}]}.
    #[arg(long)]
    pub json: bool,
}

/// Reads and decodes one profile; errors name the file.
pub fn read_profile(path: &Path) -> Result<Profile> {
    let name = path.display();
    let bytes = if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read stdin")?;
        buf
    } else {
        std::fs::read(path).with_context(|| format!("{name}: cannot read"))?
    };
    edgeprof_pprof::decode(&bytes).map_err(|e| anyhow!("{name}: {e}"))
}

fn sample_index(arg: Option<&str>) -> Option<SampleIndex> {
    arg.map(|s| s.parse().expect("parsing a SampleIndex is infallible"))
}

pub fn top(args: &TopArgs, out: &mut impl Write) -> Result<ExitCode> {
    if !(0.0..=1.0).contains(&args.node_fraction) {
        return Err(anyhow!(
            "--node-fraction must be between 0 and 1 (got {})",
            args.node_fraction
        ));
    }
    let profile = read_profile(&args.file)?;
    let options = TopOptions {
        sample_index: sample_index(args.sample_index.as_deref()),
        sort: if args.cum {
            TopSort::Cum
        } else {
            TopSort::Flat
        },
        node_fraction: args.node_fraction,
        limit: args.limit,
    };
    let report = edgeprof_pprof::top(&profile, &options)
        .map_err(|e| anyhow!("{}: {e}", args.file.display()))?;

    if args.json {
        let rows: Vec<_> = report
            .rows
            .iter()
            .map(|r| serde_json::json!({"function": r.function, "flat": r.flat, "cum": r.cum}))
            .collect();
        let doc = serde_json::json!({
            "sample_type": {"type": report.sample_type, "unit": report.unit},
            "total": report.total,
            "rows": rows,
        });
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }

    let unit = report.unit.as_str();
    let pct = |v: i64| {
        if report.total == 0 {
            0.0
        } else {
            v as f64 * 100.0 / report.total as f64
        }
    };
    let shown: i64 = report.rows.iter().map(|r| r.flat).sum();
    writeln!(
        out,
        "Showing nodes accounting for {}, {:.2}% of {} total ({})",
        format_value(shown, unit),
        pct(shown),
        format_value(report.total, unit),
        report.sample_type
    )?;
    if report.dropped_nodes > 0 {
        writeln!(
            out,
            "Dropped {} nodes (cum <= {})",
            report.dropped_nodes,
            format_value(report.node_cutoff, unit)
        )?;
    }
    if report.truncated_nodes > 0 {
        writeln!(
            out,
            "Showing top {} nodes out of {}",
            report.rows.len(),
            report.rows.len() + report.truncated_nodes
        )?;
    }
    writeln!(
        out,
        "{:>10} {:>6} {:>6} {:>10} {:>6}",
        "flat", "flat%", "sum%", "cum", "cum%"
    )?;
    let mut sum = 0i64;
    for r in &report.rows {
        sum = sum.saturating_add(r.flat);
        writeln!(
            out,
            "{:>10} {:>5.2}% {:>5.2}% {:>10} {:>5.2}%  {}",
            format_value(r.flat, unit),
            pct(r.flat),
            pct(sum),
            format_value(r.cum, unit),
            pct(r.cum),
            r.function
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn merge(files: &[PathBuf], output: &Path) -> Result<ExitCode> {
    let mut merger = Merger::new();
    for file in files {
        let profile = read_profile(file)?;
        merger
            .add(&profile)
            .map_err(|e| anyhow!("{}: cannot merge: {e}", file.display()))?;
    }
    let merged = merger.finish()?;
    let bytes = edgeprof_pprof::encode(&merged);
    write_output(output, &bytes)?;
    eprintln!(
        "edgeprof: wrote {} ({} samples from {} profiles)",
        output.display(),
        merged.sample.len(),
        files.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to `path` (`-o`). Only a regular file or a new path is
/// written atomically: through a temporary file in the same directory,
/// renamed over it, so a failure never leaves it half-written. Anything
/// else (a character device such as `/dev/null`, a FIFO, a symlink such as
/// `/dev/stdout`) is opened and written in place, never created or replaced:
/// renaming over a device node would turn it into a regular file.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    let cannot = || format!("{}: cannot write", path.display());
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => write_atomically(path, bytes),
        Ok(meta) if meta.is_dir() => Err(anyhow!("{}: is a directory", path.display())),
        Ok(_) => {
            // What the path names, through any symlink: truncate only a
            // regular file (O_TRUNC means nothing to a device or a pipe).
            let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .truncate(regular)
                .open(path)
                .with_context(cannot)?;
            file.write_all(bytes)
                .and_then(|()| file.flush())
                .with_context(cannot)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_atomically(path, bytes),
        Err(e) => Err(anyhow!("{}: cannot write: {e}", path.display())),
    }
}

/// Writes through a temporary file in the same directory, renamed over
/// `path`; only for regular files and new paths.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file path", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).with_context(|| format!("{}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: cannot write", path.display())
    })
}

pub fn collapse(file: &Path, index: Option<&str>, out: &mut impl Write) -> Result<ExitCode> {
    let profile = read_profile(file)?;
    let stacks = edgeprof_pprof::collapse(&profile, sample_index(index).as_ref())
        .map_err(|e| anyhow!("{}: {e}", file.display()))?;
    for (stack, value) in stacks {
        writeln!(out, "{stack} {value}")?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn view(file: &Path, index: Option<&str>, by_line: bool) -> Result<ExitCode> {
    use std::io::IsTerminal;
    let profile = read_profile(file)?;
    if !std::io::stdout().is_terminal() {
        return Err(anyhow!(
            "{}: `edgeprof view` needs a terminal; use `edgeprof top` or `collapse` for text",
            file.display()
        ));
    }
    let sample_index = sample_index(index);
    // Fail before taking over the screen when the sample index is wrong.
    edgeprof_pprof::resolve_sample_index(&profile, sample_index.as_ref())
        .map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let options = edgeprof_viewer::terminal::TerminalOptions {
        sample_index,
        granularity: if by_line {
            edgeprof_viewer::Granularity::FileLine
        } else {
            edgeprof_viewer::Granularity::Function
        },
    };
    edgeprof_viewer::terminal::run_terminal(profile, options)
        .with_context(|| format!("{}: terminal viewer", file.display()))?;
    Ok(ExitCode::SUCCESS)
}
