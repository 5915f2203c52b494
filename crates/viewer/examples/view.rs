//! `cargo run -p edgeprof-viewer --features terminal --example view -- FILE
//! [SAMPLE_INDEX]`: the terminal viewer on a pprof file, without the CLI.

use edgeprof_viewer::terminal::{TerminalOptions, run_terminal};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: view FILE [SAMPLE_INDEX]")?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let profile = edgeprof_pprof::decode(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let options = TerminalOptions {
        sample_index: args.next().map(|s| {
            s.parse()
                .unwrap_or_else(|e: std::convert::Infallible| match e {})
        }),
        ..TerminalOptions::default()
    };
    run_terminal(profile, options)?;
    Ok(())
}
