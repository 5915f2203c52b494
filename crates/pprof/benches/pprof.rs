//! Benchmarks of the pprof crate.

fn main() {}
