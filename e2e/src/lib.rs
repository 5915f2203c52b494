//! A simulated edge made of real processes, for `cargo xtask cluster` and the
//! end-to-end tests: one control plane (embedded SQLite) and node agents in
//! several data centers, each a child process on loopback, plus a bounded
//! open-loop traffic generator.
//!
//! [`Cluster`] owns its children: dropping it (or Ctrl-C/SIGTERM in the
//! `edgeprof-cluster` binary) stops every one of them, so no process is left
//! behind.
//!
//! This crate only drives the public surfaces (binaries, REST, CLI): it must
//! never link the control plane, agent or sampler libraries, so what it tests
//! is what users run.

pub mod cluster;
pub mod traffic;

pub use cluster::{Cluster, ClusterOptions, DataCenter, MachineInfo, SimulatedTraffic};
pub use traffic::{Traffic, TrafficMix};
