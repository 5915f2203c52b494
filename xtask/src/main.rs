//! `cargo xtask`: the one entry point for edgeprof's automation.
//!
//! Kept light on purpose (std only) so it compiles in seconds on a fresh machine.
fn main() {}
