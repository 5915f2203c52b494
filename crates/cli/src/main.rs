//! `edgeprof`: the command-line front of edgeprof.
//!
//! Offline commands work on `.pprof` files (`top`, `tags`, `merge`, `collapse`);
//! online ones talk to a control plane over its REST API. This binary is thin
//! glue: parsing flags (clap), converting them once into the libraries'
//! options, printing. Data goes to stdout, messages to stderr; bad input exits
//! 1 with a one-line cause naming the file; a closed stdout pipe is not an
//! error.
//!
//! It never talks to a database or to agents directly, and defines no wire
//! types of its own.

mod history;
mod offline;
mod online;
mod view;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// edgeprof: profile live serverless isolates, and read pprof files.
#[derive(Debug, Parser)]
#[command(name = "edgeprof", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    connection: online::Connection,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Capture a CPU or heap profile of a script's live isolates.
    Profile(online::ProfileArgs),
    /// Where a script runs: data center, machine, isolate, version, traffic.
    Targets(online::TargetsArgs),
    /// Upload a new version of a script.
    Deploy(online::DeployArgs),
    /// A script's versions and their share of traffic.
    Versions(online::VersionsArgs),
    /// Set which versions of a script serve traffic, with weights.
    Rollout(online::RolloutArgs),
    /// Past and running capture sessions.
    Sessions(online::SessionsArgs),
    /// Merge a script's continuous-profiling history over a range into one pprof.
    History(history::HistoryArgs),
    /// A script's CPU or heap over a range, per version, data center or machine.
    Timeline(history::TimelineArgs),
    /// Functions ranked by flat or cumulative value, like `go tool pprof -top`.
    Top(offline::TopArgs),
    /// Interactive flamegraph and table of a profile, in the terminal (of a
    /// diff, coloured by change, with --diff-base).
    View(view::ViewArgs),
    /// Merge profiles of one kind into one gzip'd pprof file.
    Merge {
        /// Profiles to merge (`.pprof`, gzip'd or raw).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where to write the merged profile.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Collapsed ("folded") stacks for flamegraph tools: `a;b;c VALUE` per line
    /// (`a;b;c BASE NEW` with --diff-base).
    Collapse(offline::CollapseArgs),
    /// Label keys and values with their share, like `go tool pprof -tags`.
    Tags(offline::TagsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = io::BufWriter::new(io::stdout().lock());
    let result = match cli.command {
        Command::Profile(args) => online::profile(&cli.connection, &args, &mut out),
        Command::Targets(args) => online::targets(&cli.connection, &args, &mut out),
        Command::Deploy(args) => online::deploy(&cli.connection, &args, &mut out),
        Command::Versions(args) => online::versions(&cli.connection, &args, &mut out),
        Command::Rollout(args) => online::rollout(&cli.connection, &args, &mut out),
        Command::Sessions(args) => online::sessions(&cli.connection, &args, &mut out),
        Command::History(args) => history::history(&cli.connection, &args, &mut out),
        Command::Timeline(args) => history::timeline(&cli.connection, &args, &mut out),
        Command::Top(args) => offline::top(&args, &mut out),
        Command::View(args) => view::view(&args),
        Command::Merge { files, output } => offline::merge(&files, &output),
        Command::Collapse(args) => offline::collapse(&args, &mut out),
        Command::Tags(args) => offline::tags(&args, &mut out),
    }
    .and_then(|code| {
        out.flush()?;
        Ok(code)
    });
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgeprof: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}
