//! Integration tests of the `edgeprof` binary: the offline commands on real
//! files, against the reference tool (`go tool pprof`) where it matters.

mod errors;
mod interop;
mod output;
mod support;
mod targets;
