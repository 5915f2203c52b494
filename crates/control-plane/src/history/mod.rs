//! Continuous profiling's history: windows agents push (`ingest`), checked
//! and stored through `store::windows`, and optionally forwarded to Grafana
//! Pyroscope (`pyroscope`).
//!
//! Rank 3 of the module order (beside `capture`): it uses `store` and
//! `fleet`; `registry` and `api` call it.

pub mod ingest;
pub mod pyroscope;
