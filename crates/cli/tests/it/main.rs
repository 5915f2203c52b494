//! Integration tests of the `edgeprof` binary: the offline commands on real
//! files, against the reference tool (`go tool pprof`) where it matters.

mod compare;
mod cp;
mod errors;
mod history;
mod interop;
mod output;
mod sessions;
mod support;
mod targets;
mod tls;
