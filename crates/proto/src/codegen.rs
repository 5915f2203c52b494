//! Checks that the committed generated code matches `proto/`.
//!
//! `EDGEPROF_CODEGEN=write cargo test -p edgeprof-proto codegen` (which is what
//! `cargo xtask codegen` runs) rewrites `src/gen/` instead of failing.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn generate(out: &Path) {
    let root = repo_root().join("proto");
    let files = [
        "pprof/profile.proto",
        "edgeprof/v1/agent.proto",
        "pyroscope/push/v1/push.proto",
    ];
    let fds = protox::compile(files, [&root]).expect("proto/ parses");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(out)
        .compile_fds(fds)
        .expect("code generation succeeds");
}

#[test]
fn codegen_is_fresh() {
    let tmp = tempfile::tempdir().unwrap();
    generate(tmp.path());
    let committed_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    let write = std::env::var("EDGEPROF_CODEGEN").as_deref() == Ok("write");
    let mut stale = Vec::new();
    for name in [
        "perftools.profiles.rs",
        "edgeprof.v1.rs",
        "push.v1.rs",
        "types.v1.rs",
    ] {
        let fresh = std::fs::read_to_string(tmp.path().join(name)).unwrap();
        let path = committed_dir.join(name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if fresh != committed {
            if write {
                std::fs::write(&path, fresh).unwrap();
            } else {
                stale.push(name);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "generated code in crates/proto/src/gen is stale ({stale:?}); run `cargo xtask codegen`"
    );
}
