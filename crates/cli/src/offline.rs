//! Commands that work on local `.pprof` files only.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use edgeprof_pprof::{Merger, Profile, SampleIndex, TopOptions, TopSort, format_value};
use edgeprof_viewer::{DiffError, DiffOptions, LabelFocus, Normalize, Side};

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
    /// Print one JSON object: {"sample_type", "total", "rows": [{"function", "flat", "cum"}]}
    /// (with --diff-base, each row also has "base": {"flat", "cum"} and "new": {"flat", "cum"}).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub compare: CompareArgs,
    #[command(flatten)]
    pub focus: FocusArgs,
}

/// The comparison flags of `top`, `collapse` and `view`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Compare with this profile (`go tool pprof -diff_base`): `top`'s flat
    /// and cum are FILE minus BASE, percentages of BASE's total; `collapse`
    /// prints `stack BASE_VALUE FILE_VALUE` per line (two-column folded
    /// stacks for difffolded-style tools), 0 where a side lacks the stack;
    /// `view` colours each frame by FILE minus BASE (red more, green less)
    /// and its table shows BASE, FILE and the change.
    #[arg(long, value_name = "BASE")]
    pub diff_base: Option<PathBuf>,
    /// With --diff-base: scale FILE to BASE's total (`total`, pprof's
    /// -normalize) or to BASE's requests (`requests`, from the `requests: N`
    /// comment of both files) before subtracting.
    #[arg(long, value_enum, requires = "diff_base")]
    pub normalize: Option<NormalizeArg>,
}

impl CompareArgs {
    pub fn normalize(&self) -> Normalize {
        self.normalize.map_or(Normalize::None, Normalize::from)
    }
}

/// The `--tag` flag of `top`, `tags` and `collapse`.
#[derive(Debug, clap::Args)]
pub struct FocusArgs {
    /// Only samples whose label KEY has one of the VALUEs (pprof's
    /// -tagfocus, exact values): KEY=VALUE[,VALUE…]; KEY!=VALUE[,VALUE…]
    /// drops them instead (-tagignore). Repeat for several keys, all of
    /// which must hold. Applies to both profiles of a --diff-base.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
}

/// `--normalize` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum NormalizeArg {
    /// Scale FILE to BASE's total.
    Total,
    /// Scale FILE to BASE's request count.
    Requests,
}

impl From<NormalizeArg> for Normalize {
    fn from(n: NormalizeArg) -> Self {
        match n {
            NormalizeArg::Total => Normalize::Total,
            NormalizeArg::Requests => Normalize::Requests,
        }
    }
}

/// Flags of `edgeprof collapse`.
#[derive(Debug, clap::Args)]
pub struct CollapseArgs {
    /// Profile to read (`-` for stdin).
    pub file: PathBuf,
    /// Sample type by name (`cpu`, `alloc_space`) or 0-based number.
    #[arg(long, short = 'i')]
    pub sample_index: Option<String>,
    #[command(flatten)]
    pub compare: CompareArgs,
    #[command(flatten)]
    pub focus: FocusArgs,
}

/// Flags of `edgeprof tags`.
#[derive(Debug, clap::Args)]
pub struct TagsArgs {
    /// Profile to read (`-` for stdin).
    pub file: PathBuf,
    /// Sample type by name (`cpu`, `alloc_space`) or 0-based number.
    #[arg(long, short = 'i')]
    pub sample_index: Option<String>,
    #[command(flatten)]
    pub focus: FocusArgs,
    /// Print one JSON object: {"sample_type", "keys": [{"key", "total", "values": [{"value", "total"}]}]}.
    #[arg(long)]
    pub json: bool,
}

/// `--tag` flags, parsed once.
fn label_focuses(tags: &[String]) -> Result<Vec<LabelFocus>> {
    tags.iter()
        .map(|t| t.parse().map_err(|e| anyhow!("--tag: {e}")))
        .collect()
}

/// The profile at `path` with the `--tag` focuses applied (percentages of
/// `tags` and `collapse` values are of what is left).
fn read_focused(path: &Path, focuses: &[LabelFocus]) -> Result<Profile> {
    let profile = read_profile(path)?;
    if focuses.is_empty() {
        return Ok(profile);
    }
    Ok(edgeprof_viewer::focus_all(&profile, focuses).into_owned())
}

/// A comparison error, naming the file it is about.
pub fn diff_error(e: DiffError, base: &Path, new: &Path) -> anyhow::Error {
    match e.side() {
        Some(Side::Base) => anyhow!("{}: {e}", base.display()),
        Some(Side::New) => anyhow!("{}: {e}", new.display()),
        None => anyhow!("{} against {}: {e}", new.display(), base.display()),
    }
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

pub fn sample_index(arg: Option<&str>) -> Option<SampleIndex> {
    arg.map(|s| s.parse().expect("parsing a SampleIndex is infallible"))
}

pub fn top(args: &TopArgs, out: &mut impl Write) -> Result<ExitCode> {
    if !(0.0..=1.0).contains(&args.node_fraction) {
        return Err(anyhow!(
            "--node-fraction must be between 0 and 1 (got {})",
            args.node_fraction
        ));
    }
    let focuses = label_focuses(&args.focus.tags)?;
    let unfocused = read_profile(&args.file)?;
    let profile = edgeprof_viewer::focus_all(&unfocused, &focuses);
    let index = sample_index(args.sample_index.as_deref());
    // pprof's percentages and cutoff are of the total before -tagfocus.
    let total_before_focus = |p: &Profile| -> Option<i64> {
        let vi = edgeprof_pprof::resolve_sample_index(p, index.as_ref()).ok()?;
        (!focuses.is_empty()).then(|| edgeprof_pprof::total(p, vi))
    };
    let sort = if args.cum {
        TopSort::Cum
    } else {
        TopSort::Flat
    };
    let compare = &args.compare;
    if let Some(base_path) = &compare.diff_base {
        let unfocused_base = read_profile(base_path)?;
        let base = edgeprof_viewer::focus_all(&unfocused_base, &focuses);
        let options = DiffOptions {
            sample_index: index.clone(),
            normalize: compare.normalize(),
            sort,
            node_fraction: args.node_fraction,
            limit: args.limit,
            total: total_before_focus(&unfocused_base),
        };
        let diff = edgeprof_viewer::diff(&base, &profile, &options)
            .map_err(|e| diff_error(e, base_path, &args.file))?;
        return print_diff(&diff, options.normalize, args.json, out);
    }
    let options = TopOptions {
        total: total_before_focus(&unfocused),
        sample_index: index,
        sort,
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
    write_summary(
        out,
        &Summary {
            unit,
            shown,
            shown_percent: pct(shown),
            total: report.total,
            total_of: &report.sample_type,
            dropped_nodes: report.dropped_nodes,
            node_cutoff: report.node_cutoff,
            rows: report.rows.len(),
            truncated_nodes: report.truncated_nodes,
        },
    )?;
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

/// What the lines above a `top` table say.
struct Summary<'a> {
    unit: &'a str,
    shown: i64,
    shown_percent: f64,
    total: i64,
    /// What the total is of, e.g. `cpu`.
    total_of: &'a str,
    dropped_nodes: usize,
    node_cutoff: i64,
    rows: usize,
    truncated_nodes: usize,
}

/// pprof's lines above its `-top` table.
fn write_summary(out: &mut impl Write, s: &Summary<'_>) -> Result<()> {
    writeln!(
        out,
        "Showing nodes accounting for {}, {:.2}% of {} total ({})",
        format_value(s.shown, s.unit),
        s.shown_percent,
        format_value(s.total, s.unit),
        s.total_of
    )?;
    if s.dropped_nodes > 0 {
        writeln!(
            out,
            "Dropped {} nodes (cum <= {})",
            s.dropped_nodes,
            format_value(s.node_cutoff, s.unit)
        )?;
    }
    if s.truncated_nodes > 0 {
        writeln!(
            out,
            "Showing top {} nodes out of {}",
            s.rows,
            s.rows + s.truncated_nodes
        )?;
    }
    Ok(())
}

/// `top --diff-base`: pprof's columns for the change, then each side's
/// flat and cum.
fn print_diff(
    diff: &edgeprof_viewer::Diff,
    normalize: Normalize,
    json: bool,
    out: &mut impl Write,
) -> Result<ExitCode> {
    let unit = diff.unit.as_str();
    if json {
        let side =
            |v: edgeprof_viewer::DiffValues| serde_json::json!({"flat": v.flat, "cum": v.cum});
        let rows: Vec<_> = diff
            .rows
            .iter()
            .map(|r| {
                let d = r.delta();
                serde_json::json!({
                    "function": r.function, "flat": d.flat, "cum": d.cum,
                    "base": side(r.base), "new": side(r.new),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "sample_type": {"type": diff.sample_type, "unit": diff.unit},
            "total": diff.total,
            "base_total": diff.base_total,
            "new_total": diff.new_total,
            "new_scale": diff.new_scale,
            "requests": diff.requests.map(|(b, n)| serde_json::json!({"base": b, "new": n})),
            "rows": rows,
        });
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    match (normalize, diff.requests) {
        (Normalize::Total, _) => writeln!(
            out,
            "New profile scaled by {:.4} to the base's total",
            diff.new_scale
        )?,
        (Normalize::Requests, Some((b, n))) => writeln!(
            out,
            "New profile scaled by {:.4} to the base's {b} requests (new: {n}); per request = value / {b}",
            diff.new_scale
        )?,
        _ => {}
    }
    let shown: i64 = diff.rows.iter().map(|r| r.delta().flat).sum();
    write_summary(
        out,
        &Summary {
            unit,
            shown,
            shown_percent: diff.percent(shown),
            total: diff.total,
            total_of: &format!("{}, base", diff.sample_type),
            dropped_nodes: diff.dropped_nodes,
            node_cutoff: diff.node_cutoff,
            rows: diff.rows.len(),
            truncated_nodes: diff.truncated_nodes,
        },
    )?;
    writeln!(
        out,
        "{:>10} {:>7} {:>7} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "flat", "flat%", "sum%", "cum", "cum%", "base flat", "new flat", "base cum", "new cum"
    )?;
    let mut sum = 0i64;
    for r in &diff.rows {
        let d = r.delta();
        sum = sum.saturating_add(d.flat);
        writeln!(
            out,
            "{:>10} {:>6.2}% {:>6.2}% {:>10} {:>6.2}% {:>10} {:>10} {:>10} {:>10}  {}",
            format_value(d.flat, unit),
            diff.percent(d.flat),
            diff.percent(sum),
            format_value(d.cum, unit),
            diff.percent(d.cum),
            format_value(r.base.flat, unit),
            format_value(r.new.flat, unit),
            format_value(r.base.cum, unit),
            format_value(r.new.cum, unit),
            r.function
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `edgeprof tags`: each label key's values with their share, as `go tool
/// pprof -tags`.
pub fn tags(args: &TagsArgs, out: &mut impl Write) -> Result<ExitCode> {
    let focuses = label_focuses(&args.focus.tags)?;
    let profile = read_focused(&args.file, &focuses)?;
    let index = sample_index(args.sample_index.as_deref());
    let vi = edgeprof_pprof::resolve_sample_index(&profile, index.as_ref())
        .map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let keys = edgeprof_viewer::label_shares(&profile, Some(&SampleIndex::Position(vi)))
        .map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let (ty, unit) = edgeprof_pprof::sample_types(&profile)[vi];
    if args.json {
        let keys: Vec<_> = keys
            .iter()
            .map(|k| {
                let values: Vec<_> = k
                    .values
                    .iter()
                    .map(|v| serde_json::json!({"value": v.value, "total": v.total}))
                    .collect();
                serde_json::json!({"key": k.key, "total": k.total, "values": values})
            })
            .collect();
        let doc = serde_json::json!({"sample_type": {"type": ty, "unit": unit}, "keys": keys});
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if keys.is_empty() {
        eprintln!("edgeprof: {}: no labels", args.file.display());
    }
    for k in &keys {
        writeln!(
            out,
            "{}: Total {} ({ty})",
            k.key,
            format_value(k.total, unit)
        )?;
        for v in &k.values {
            writeln!(
                out,
                "  {:>10} ({:>6.2}%): {}",
                format_value(v.total, unit),
                v.key_percent,
                v.value
            )?;
        }
        writeln!(out)?;
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

pub fn collapse(args: &CollapseArgs, out: &mut impl Write) -> Result<ExitCode> {
    let focuses = label_focuses(&args.focus.tags)?;
    let file = &args.file;
    let profile = read_focused(file, &focuses)?;
    let index = sample_index(args.sample_index.as_deref());
    if let Some(base_path) = &args.compare.diff_base {
        let base = read_focused(base_path, &focuses)?;
        let normalize = args.compare.normalize();
        let stacks = edgeprof_viewer::diff_collapse(&base, &profile, index.as_ref(), normalize)
            .map_err(|e| diff_error(e, base_path, file))?;
        for (stack, base, new) in stacks {
            writeln!(out, "{stack} {base} {new}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let stacks = edgeprof_pprof::collapse(&profile, index.as_ref())
        .map_err(|e| anyhow!("{}: {e}", file.display()))?;
    for (stack, value) in stacks {
        writeln!(out, "{stack} {value}")?;
    }
    Ok(ExitCode::SUCCESS)
}
