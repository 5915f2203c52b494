//! Integration tests of the control plane: real sockets, real SQLite and
//! PostgreSQL, real tonic servers standing in for agents (see `support`).

mod abuse;
mod admission;
mod api;
mod architecture;
mod capture;
mod history_compact;
mod history_ingest;
mod history_query;
mod lifecycle;
mod memory;
mod placement;
mod process;
mod progress;
mod pyroscope;
mod replicas;
mod storage;
mod support;
mod tls;
mod windows_store;
