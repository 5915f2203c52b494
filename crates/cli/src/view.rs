//! `edgeprof view FILE [--diff-base BASE]`: the terminal viewer.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use edgeprof_viewer::Granularity;
use edgeprof_viewer::terminal::{App, DiffBase, TerminalOptions};

use crate::offline::{CompareArgs, diff_error, read_profile, sample_index};

/// Flags of `edgeprof view`.
#[derive(Debug, clap::Args)]
pub struct ViewArgs {
    /// Profile to open (`-` for stdin).
    pub file: PathBuf,
    /// Sample type shown first, by name or 0-based number.
    #[arg(long, short = 'i')]
    pub sample_index: Option<String>,
    /// Merge frames by file:line instead of by function.
    #[arg(long)]
    pub by_line: bool,
    #[command(flatten)]
    pub compare: CompareArgs,
}

pub fn view(args: &ViewArgs) -> Result<ExitCode> {
    let file = &args.file;
    let profile = read_profile(file)?;
    let options = TerminalOptions {
        sample_index: sample_index(args.sample_index.as_deref()),
        granularity: if args.by_line {
            Granularity::FileLine
        } else {
            Granularity::Function
        },
    };
    // Built before taking over the screen, so a wrong sample index or a
    // base of another kind is a one-line error naming the file.
    let app = match &args.compare.diff_base {
        Some(base_path) => {
            let base = DiffBase {
                profile: read_profile(base_path)?,
                name: base_path.display().to_string(),
                normalize: args.compare.normalize(),
            };
            App::diff(profile, base, options).map_err(|e| diff_error(e, base_path, file))?
        }
        None => App::new(profile, options).map_err(|e| anyhow!("{}: {e}", file.display()))?,
    };
    if !std::io::stdout().is_terminal() {
        return Err(anyhow!(
            "{}: `edgeprof view` needs a terminal; use `edgeprof top` or `collapse` for text",
            file.display()
        ));
    }
    edgeprof_viewer::terminal::run_app(app)
        .with_context(|| format!("{}: terminal viewer", file.display()))?;
    Ok(ExitCode::SUCCESS)
}
