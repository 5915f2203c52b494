//! The Rust SDK for edgeprof workers: the request/response encoding of the
//! guest ABI (`docs/guest-abi.md`), the [`handler!`] macro that exports a
//! `fn(Request) -> Response` as the ABI's entry points, and (on `wasm32`) the
//! sampling global allocator that reports heap samples to the host.
//!
//! The encoding ([`Request`], [`Response`]) is plain Rust and compiles
//! everywhere; the host side (`edgeprof-sampler`) uses the same code, so there
//! is one definition of the wire format. Everything that only makes sense
//! inside a wasm guest (the allocator, the exported functions) is behind
//! `cfg(target_arch = "wasm32")`.
//!
//! This crate must never depend on the host runtime (Wasmtime) or on anything
//! that does IO: it is linked into every worker.
//!
//! `unsafe` is allowed in the wasm-only `rt` module alone: implementing
//! `GlobalAlloc` and declaring host imports cannot be done without it.

mod codec;

pub use codec::{DecodeError, Request, Response};

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
#[doc(hidden)]
pub mod rt;

/// Mean number of bytes between two heap samples (exponentially
/// distributed intervals, as tcmalloc and Go do). The host unbiases with the
/// same figure.
pub const HEAP_SAMPLE_MEAN_BYTES: u64 = 512 * 1024;

/// Exports `$f: fn(Request) -> Response` as the worker's handler
/// (`edgeprof_alloc`, `edgeprof_handle`, `edgeprof_allocated_bytes`,
/// `edgeprof_heap_seed`).
#[macro_export]
macro_rules! handler {
    ($f:path) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn edgeprof_alloc(len: i32) -> i32 {
            $crate::rt::alloc_request(len)
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn edgeprof_handle(ptr: i32, len: i32) -> i64 {
            $crate::rt::handle(ptr, len, $f)
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn edgeprof_allocated_bytes() -> i64 {
            $crate::rt::allocated_bytes()
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn edgeprof_heap_seed(seed: i64) {
            $crate::rt::seed_heap_sampling(seed)
        }
    };
}
