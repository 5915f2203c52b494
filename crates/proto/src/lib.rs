//! Wire types of edgeprof: the only crate that defines them.
//!
//! Everything here is generated from the `.proto` files under `proto/` at the
//! repository root and committed under `src/gen/`. A test regenerates the code
//! into a temporary directory and fails if it differs; run
//! `cargo xtask codegen` after editing a `.proto` file.
//!
//! - [`pprof`]: the pprof profile format (`perftools.profiles`), always built.
//! - [`v1`]: the agent ⇄ control-plane gRPC contract, behind the default
//!   `grpc` feature so that no-IO crates (such as `edgeprof-pprof`) can use the
//!   profile types without linking tonic.
//! - [`pyroscope`]: the messages of Grafana Pyroscope's push API
//!   (`push.v1`, `types.v1`), which the control plane forwards windows with.
//! - [`rest`]: the control plane's REST contract (request and response
//!   bodies, query strings, the error body, session status and profile
//!   kind), hand-written serde types behind the `rest` feature (pulls in
//!   serde), shared by the control plane, the CLI and the tests.
//!
//! This crate must never depend on another edgeprof crate, nor contain logic
//! beyond the wire types themselves (the generated code, and in [`rest`]
//! plain structs and enums with their wire names): domain types, validation
//! and conversions live at the edges.

#![allow(missing_docs)]

/// The pprof profile format, field for field as google/pprof publishes it.
pub mod pprof {
    include!("gen/perftools.profiles.rs");
}

/// The agent ⇄ control-plane gRPC contract (`proto/edgeprof/v1/agent.proto`).
#[cfg(feature = "grpc")]
pub mod v1 {
    include!("gen/edgeprof.v1.rs");
}

/// Grafana Pyroscope's push API (`push.v1`, and the `types.v1` messages it
/// uses), messages only: the control plane forwards windows with it.
pub mod pyroscope {
    /// `push.v1`: `PushRequest` and what it carries.
    pub mod push {
        pub mod v1 {
            include!("gen/push.v1.rs");
        }
    }
    /// `types.v1`: `LabelPair`.
    pub mod types {
        pub mod v1 {
            include!("gen/types.v1.rs");
        }
    }
}

/// The control plane's REST contract (see `docs/api.md`).
#[cfg(feature = "rest")]
#[warn(missing_docs)]
pub mod rest;

#[cfg(test)]
mod codegen;
