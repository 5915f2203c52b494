//! Writes the benchmark's synthetic profiles to a directory:
//! `gen_profiles DIR [COUNT]` → `DIR/isolate-000.pprof` … (gzip'd pprof).
//! Used by `cargo xtask bench pprof`.

#[path = "../benches/support/synth.rs"]
mod synth;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: gen_profiles DIR [COUNT]");
        std::process::exit(2);
    };
    let count: u64 = match args.next().map(|c| c.parse()) {
        None => 100,
        Some(Ok(c)) => c,
        Some(Err(e)) => {
            eprintln!("gen_profiles: COUNT: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("gen_profiles: {dir}: {e}");
        std::process::exit(1);
    }
    for seed in 0..count {
        let path = std::path::Path::new(&dir).join(format!("isolate-{seed:03}.pprof"));
        let bytes = edgeprof_pprof::encode(&synth::cpu_profile(&synth::ISOLATE, seed));
        if let Err(e) = std::fs::write(&path, bytes) {
            eprintln!("gen_profiles: {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
