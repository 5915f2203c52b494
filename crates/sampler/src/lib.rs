//! edgeprof's isolate runtime and sampler: real Wasmtime isolates serving
//! requests through the guest ABI (`docs/guest-abi.md`), profiled while they
//! run, CPU and heap, into symbolized pprof.
//!
//! ```no_run
//! use std::time::Duration;
//! use edgeprof_sampler::{Isolate, Limits, ProfileKind, Request, Runtime, RuntimeConfig};
//!
//! let runtime = Runtime::new(RuntimeConfig::default())?; // engine + epoch ticker
//! let module = runtime.load_module("worker.wasm", &std::fs::read("worker.wasm")?)?; // cached by build id
//! let mut isolate = Isolate::new(&runtime, &module, Limits::default())?;
//! let profiler = isolate.profiler(); // Clone + Send: start/stop from any thread
//! profiler.start(ProfileKind::Cpu, Duration::from_millis(1))?;
//! let response = isolate.handle(&Request::get("/"))?;
//! let capture = profiler.stop()?; // capture.profile is an edgeprof_pprof::Profile
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Runtime`]: one engine (epoch interruption on, `wasm_backtrace_details`
//!   off, a high `wasm_backtrace_max_frames`) and one ticker thread calling
//!   `increment_epoch` every [`RuntimeConfig::tick`] (default 1 ms).
//! - [`Isolate`]: one store + instance; [`Limits`] caps linear memory
//!   (default 128 MiB → [`IsolateError::ExceededMemory`], the isolate is
//!   marked evicted and [`Runtime::evictions`] counts it) and CPU per request
//!   (default 30 s, enforced from the epoch callback with thread CPU time).
//!   The caller replaces an evicted isolate with a fresh `Isolate::new`.
//! - [`ProfilerHandle`]: `start(kind, interval)` / `stop()`; start and stop
//!   only flip an atomic state and swap a buffer under a mutex the sample
//!   path holds for one hash-map insert, so a request in flight keeps
//!   running. Unprofiled isolates take no samples: their epoch callback runs
//!   every [`RuntimeConfig::poll_ticks`] ticks only to check the CPU limit and
//!   whether a capture started (so a capture starts within that many ticks).
//! - CPU samples weigh the stack by thread CPU time since the previous
//!   sample. Time inside a host import is recorded as a `[host] <import>` leaf
//!   under the calling wasm stack with the thread CPU time the call used, via
//!   `Store::call_hook`; the wasm CPU before the call stays with the next
//!   tick's sample (no call-site bias). `cpu/nanoseconds` is one clock, CPU
//!   time: a host call that blocks or is preempted adds its wall time
//!   nowhere.
//! - Every capture counts the requests that began on the isolate while it
//!   ran ([`CaptureResult::requests`]), so a profile reads per request.
//! - Heap: the guest SDK's allocator reports sampled allocations (mean
//!   interval 512 KiB) and their frees; live sampled objects are tracked
//!   always (bounded), so a heap capture reports allocations made during the
//!   capture plus what is still live, unbiased as Go does.
//! - Frames are recorded as (function index, module offset) and symbolized at
//!   stop: name section names (Rust demangled), else `wasm-function[N]`;
//!   DWARF file:line and inlined frames through one cached `addr2line`
//!   context per module; mapping = the module, build id = SHA-256 of its
//!   bytes.
//!
//! This crate knows nothing of HTTP servers, gRPC, or the control plane; it
//! never does network IO. `unsafe` is used in one place only, the
//! `cputime` module (reading `CLOCK_THREAD_CPUTIME_ID` through libc).

mod cputime;
mod isolate;
mod profiler;
mod runtime;
mod sampling;
mod symbols;

pub use edgeprof_guest_sdk::{Request, Response};
pub use isolate::{
    Isolate, IsolateError, Limits, MAX_LOG_BYTES, MAX_LOG_LINES, MAX_TABLE_ELEMENTS, MAX_TABLES,
    TABLE_ELEMENT_BYTES,
};
pub use profiler::{
    CaptureOwner, CaptureResult, MAX_INTERVAL, ProfileKind, ProfilerError, ProfilerHandle,
    SamplerLimits,
};
pub use runtime::{EvictionCounts, EvictionReason, LoadError, Module, Runtime, RuntimeConfig};
