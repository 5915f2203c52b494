//! [`Isolate`]: one instance of one module with its own store, serving
//! requests one at a time through the guest ABI, with its memory and CPU
//! limits and its sampling hooks.

use std::sync::Arc;
use std::time::Duration;

use edgeprof_guest_sdk::{Request, Response};
use wasmtime::{
    AsContext, CallHook, Caller, Linker, Memory, ResourceLimiter, Store, TypedFunc, UpdateDeadline,
    WasmBacktrace,
};

use crate::cputime::thread_cpu_nanos;
use crate::profiler::{ProfilerHandle, ProfilerShared, RawFrame, SamplerLimits};
use crate::runtime::{EvictionReason, Module, Runtime};
use crate::sampling::{CpuSampler, Tick};

/// Per-isolate limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Linear memory cap (default 128 MiB).
    pub memory_bytes: usize,
    /// CPU time one request may use (default 30 s).
    pub cpu_per_request: Duration,
    /// Bounds of the profiler's buffers.
    pub sampler: SamplerLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 128 << 20,
            cpu_per_request: Duration::from_secs(30),
            sampler: SamplerLimits::default(),
        }
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum IsolateError {
    /// The module could not be instantiated (imports, start function, …).
    #[error("instantiating `{module}`: {message}")]
    Instantiate {
        /// Module name.
        module: String,
        /// Wasmtime's message.
        message: String,
    },
    /// The module does not implement the guest ABI.
    #[error("module `{module}` does not implement the guest ABI: {message}")]
    Abi {
        /// Module name.
        module: String,
        /// What is missing or mistyped.
        message: String,
    },
    /// Linear memory would have grown past the limit; the isolate is evicted.
    #[error(
        "Exceeded Memory: linear memory would grow to {requested} bytes, the limit is {limit} bytes"
    )]
    ExceededMemory {
        /// The limit.
        limit: usize,
        /// The size the guest asked for.
        requested: usize,
    },
    /// The request used more CPU time than allowed; the isolate is evicted.
    #[error("Exceeded CPU: the request ran past its CPU-time limit of {limit:?}")]
    ExceededCpu {
        /// The limit.
        limit: Duration,
    },
    /// The guest trapped; the isolate is evicted.
    #[error("worker trapped: {0}")]
    Trap(String),
    /// The isolate was evicted by an earlier request.
    #[error("isolate was evicted ({0:?}); create a new one")]
    Evicted(EvictionReason),
    /// The guest returned something that is not an encoded response.
    #[error("worker returned an invalid response: {0}")]
    BadResponse(String),
}

pub(crate) struct HostState {
    memory_limit: usize,
    exceeded_memory: Option<usize>,
    cpu_limit_ns: u64,
    request_cpu_start: u64,
    cpu_exceeded: bool,
    prof: Arc<ProfilerShared>,
    sampler: CpuSampler,
    max_frames: usize,
    logs: Vec<String>,
    /// Bytes in `logs`.
    log_bytes: usize,
    /// Lines dropped over [`MAX_LOG_LINES`] or [`MAX_LOG_BYTES`].
    logs_dropped: usize,
    /// Elements in all the isolate's tables (creation counts as growth).
    table_elements: usize,
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.exceeded_memory = Some(desired);
            return Err(wasmtime::Error::msg("Exceeded Memory"));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements += desired.saturating_sub(current);
        Ok(true)
    }

    // One instance with one memory: the memory limit is then the limit of
    // all the linear memory the isolate holds (issue 10: four memories of
    // 120 MiB each got 514 MB of host RSS past a 128 MiB limit).
    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

/// Most tables in one isolate, and elements in one table.
pub const MAX_TABLES: usize = 4;
/// See [`MAX_TABLES`].
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// Host bytes per table element (a function or extern reference).
pub const TABLE_ELEMENT_BYTES: usize = 8;

/// Frames of the wasm stack, leaf first, cut at `max_frames`, under
/// `leaf` if given.
fn capture_stack(
    ctx: impl AsContext,
    max_frames: usize,
    leaf: Option<RawFrame>,
) -> (Vec<RawFrame>, bool) {
    let bt = WasmBacktrace::capture(ctx);
    let frames = bt.frames();
    let truncated = frames.len() >= max_frames;
    let mut stack: Vec<RawFrame> = Vec::with_capacity(frames.len() + 2);
    stack.extend(leaf);
    stack.extend(frames.iter().map(|f| RawFrame::Wasm {
        func: f.func_index(),
        offset: f.module_offset().unwrap_or(0) as u32,
    }));
    if truncated {
        stack.push(RawFrame::Truncated);
    }
    (stack, truncated)
}

/// Most log lines kept per request.
pub const MAX_LOG_LINES: usize = 1000;
/// Most log bytes kept per request (further lines are counted, not kept).
pub const MAX_LOG_BYTES: usize = 64 << 10;

/// A seed for one isolate's heap sampling thresholds, different for every
/// isolate. std's `RandomState` takes its keys from the OS once per thread
/// and steps them on every call, which is all this needs.
fn heap_seed() -> i64 {
    use std::hash::{BuildHasher, Hasher, RandomState};
    RandomState::new().build_hasher().finish() as i64
}

/// One instance of one module. `Send`: move it to the thread that serves it.
pub struct Isolate {
    store: Store<HostState>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    handler: TypedFunc<(i32, i32), i64>,
    allocated_bytes: Option<TypedFunc<(), i64>>,
    profiler: ProfilerHandle,
    runtime: Runtime,
    limits: Limits,
    eviction: Option<EvictionReason>,
    requests: u64,
}

impl std::fmt::Debug for Isolate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Isolate")
            .field("module", &self.profiler.module.name)
            .field("requests", &self.requests)
            .field("eviction", &self.eviction)
            .finish()
    }
}

/// The `[host]` frame of a sample taken outside any wasm call of a request:
/// the host encoding the request or decoding the response.
pub(crate) const REQUEST_FRAME: &str = "request and response";

/// Called first by every import: names the host call, in case a sample
/// falls in it (see `on_call_hook`). One store, no clock.
pub(crate) fn enter_import(caller: &mut Caller<'_, HostState>, name: &'static str) {
    caller.data_mut().sampler.import = Some(name);
}

fn linker(runtime: &Runtime) -> wasmtime::Result<Linker<HostState>> {
    let mut l = Linker::new(&runtime.inner.engine);
    l.func_wrap(
        "edgeprof",
        "log",
        |mut caller: Caller<'_, HostState>, ptr: i32, len: i32| {
            enter_import(&mut caller, "edgeprof.log");
            let Some(mem) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
                return;
            };
            let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
            let st = caller.data();
            let room = MAX_LOG_BYTES.saturating_sub(st.log_bytes);
            if st.logs.len() >= MAX_LOG_LINES || room == 0 {
                caller.data_mut().logs_dropped += 1;
                return;
            }
            // Only what fits is copied out of guest memory.
            let keep = len.min(room);
            let line = mem
                .data(&caller)
                .get(ptr..ptr.saturating_add(len))
                .map(|b| String::from_utf8_lossy(&b[..keep]).into_owned());
            let st = caller.data_mut();
            if let Some(line) = line {
                st.log_bytes += line.len();
                if keep < len {
                    st.logs_dropped += 1;
                }
                st.logs.push(line);
            }
        },
    )?;
    l.func_wrap(
        "edgeprof",
        "heap_alloc",
        |mut caller: Caller<'_, HostState>, ptr: i32, size: i32| {
            enter_import(&mut caller, "edgeprof.heap_alloc");
            let max = caller.data().max_frames;
            let (stack, truncated) = capture_stack(&caller, max, None);
            caller.data().prof.record_alloc(
                ptr as u32,
                u64::from(size as u32),
                stack.into_boxed_slice(),
                truncated,
            );
        },
    )?;
    l.func_wrap(
        "edgeprof",
        "heap_free",
        |mut caller: Caller<'_, HostState>, ptr: i32| {
            enter_import(&mut caller, "edgeprof.heap_free");
            caller.data().prof.record_free(ptr as u32);
        },
    )?;
    Ok(l)
}

impl Isolate {
    /// Instantiates `module` in a fresh store.
    pub fn new(
        runtime: &Runtime,
        module: &Module,
        limits: Limits,
    ) -> Result<Isolate, IsolateError> {
        Self::with_imports(runtime, module, limits, |_| Ok(()))
    }

    /// [`Isolate::new`] with further host imports defined by `extra` (the
    /// unit tests' blocking import).
    pub(crate) fn with_imports(
        runtime: &Runtime,
        module: &Module,
        limits: Limits,
        extra: impl FnOnce(&mut Linker<HostState>) -> wasmtime::Result<()>,
    ) -> Result<Isolate, IsolateError> {
        let cfg = &runtime.inner.config;
        let prof = Arc::new(ProfilerShared::new(limits.sampler));
        let state = HostState {
            memory_limit: limits.memory_bytes,
            exceeded_memory: None,
            cpu_limit_ns: limits.cpu_per_request.as_nanos().min(u64::MAX as u128) as u64,
            request_cpu_start: 0,
            cpu_exceeded: false,
            prof: prof.clone(),
            sampler: CpuSampler::new(
                runtime.inner.ticks.clone(),
                cfg.tick.as_nanos() as u64,
                cfg.poll_ticks,
            ),
            max_frames: cfg.max_frames,
            logs: Vec::new(),
            log_bytes: 0,
            table_elements: 0,
            logs_dropped: 0,
        };
        let mut store = Store::new(&runtime.inner.engine, state);
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        if cfg.epoch_interruption {
            // Start-up (the start function, `edgeprof_heap_seed`) is
            // guest code like a request: it runs under the request CPU
            // limit, so a module that loops while starting fails to start
            // instead of holding its thread for ever.
            store.data_mut().request_cpu_start = thread_cpu_nanos();
            store.set_epoch_deadline(cfg.poll_ticks);
            store.epoch_deadline_callback(on_epoch_deadline);
        }
        store.call_hook(on_call_hook);
        let name = &module.info.name;
        let instantiate_err = |e: wasmtime::Error| IsolateError::Instantiate {
            module: name.clone(),
            message: format!("{e:#}"),
        };
        let mut linker = linker(runtime).map_err(instantiate_err)?;
        extra(&mut linker).map_err(instantiate_err)?;
        // What a failed start-up call of guest code was: a limit, or `other`.
        let start_err = |store: &Store<HostState>, other: IsolateError| {
            if let Some(requested) = store.data().exceeded_memory {
                IsolateError::ExceededMemory {
                    limit: limits.memory_bytes,
                    requested,
                }
            } else if store.data().cpu_exceeded {
                IsolateError::ExceededCpu {
                    limit: limits.cpu_per_request,
                }
            } else {
                other
            }
        };
        let instance = linker
            .instantiate(&mut store, &module.module)
            .map_err(|e| start_err(&store, instantiate_err(e)))?;
        let abi_err = |what: &str, e: wasmtime::Error| IsolateError::Abi {
            module: name.clone(),
            message: format!("{what}: {e:#}"),
        };
        let memory =
            instance
                .get_memory(&mut store, "memory")
                .ok_or_else(|| IsolateError::Abi {
                    module: name.clone(),
                    message: "no exported memory named `memory`".into(),
                })?;
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "edgeprof_alloc")
            .map_err(|e| abi_err("export `edgeprof_alloc: (i32) -> i32`", e))?;
        let handler = instance
            .get_typed_func::<(i32, i32), i64>(&mut store, "edgeprof_handle")
            .map_err(|e| abi_err("export `edgeprof_handle: (i32, i32) -> i64`", e))?;
        let allocated_bytes = instance
            .get_typed_func::<(), i64>(&mut store, "edgeprof_allocated_bytes")
            .ok();
        if let Some(seed) = instance.get_func(&mut store, "edgeprof_heap_seed") {
            const SEED: &str = "export `edgeprof_heap_seed: (i64) -> ()`";
            seed.typed::<i64, ()>(&store)
                .map_err(|e| abi_err(SEED, e))?
                .call(&mut store, heap_seed())
                .map_err(|e| start_err(&store, abi_err(SEED, e)))?;
        }
        if cfg.epoch_interruption {
            // Far away until the first request sets it.
            store.set_epoch_deadline(u64::MAX / 2);
        }
        Ok(Isolate {
            store,
            memory,
            alloc,
            handler,
            allocated_bytes,
            profiler: ProfilerHandle {
                shared: prof,
                module: module.info.clone(),
                tick: cfg.tick,
            },
            runtime: runtime.clone(),
            limits,
            eviction: None,
            requests: 0,
        })
    }

    /// Serves one request.
    pub fn handle(&mut self, request: &Request) -> Result<Response, IsolateError> {
        if let Some(reason) = self.eviction {
            return Err(IsolateError::Evicted(reason));
        }
        // The request's whole cost (its encoding, the response's decoding)
        // counts as the isolate's CPU.
        self.begin_request();
        self.requests += 1;
        self.profiler.shared.record_request();
        // Logs are per request: whatever the embedder did not take is gone.
        self.clear_logs();
        let response = self.serve(request);
        self.end_request();
        response
    }

    fn serve(&mut self, request: &Request) -> Result<Response, IsolateError> {
        let bytes = request.encode();
        let (rptr, rlen) = self.call_guest(&bytes)?;
        let data = self.memory.data(&self.store);
        let body = data.get(rptr..rptr.saturating_add(rlen)).ok_or_else(|| {
            IsolateError::BadResponse(format!(
                "response at {rptr:#x}+{rlen} is outside linear memory ({} bytes)",
                data.len()
            ))
        })?;
        Response::decode(body).map_err(|e| IsolateError::BadResponse(e.to_string()))
    }

    /// Places the request and runs the handler: the response's location.
    fn call_guest(&mut self, bytes: &[u8]) -> Result<(usize, usize), IsolateError> {
        let len = i32::try_from(bytes.len()).map_err(|_| {
            IsolateError::BadResponse(format!("request of {} bytes exceeds 2 GiB", bytes.len()))
        })?;
        let ptr = self.alloc.call(&mut self.store, len);
        let ptr = match ptr {
            Ok(p) => p,
            Err(e) => return Err(self.fail(e)),
        };
        self.memory
            .write(&mut self.store, ptr as u32 as usize, bytes)
            .map_err(|_| {
                IsolateError::BadResponse(format!(
                    "edgeprof_alloc({len}) returned {ptr:#x}, outside linear memory"
                ))
            })?;
        let packed = match self.handler.call(&mut self.store, (ptr, len)) {
            Ok(p) => p as u64,
            Err(e) => return Err(self.fail(e)),
        };
        Ok(((packed >> 32) as usize, (packed & 0xffff_ffff) as usize))
    }

    /// Before the request's first call into wasm: the CPU limit's base and
    /// the sampler's deadline (see `sampling`), from one clock read.
    fn begin_request(&mut self) {
        let st = self.store.data_mut();
        let start_tick = st.sampler.tick_now();
        let now = thread_cpu_nanos();
        st.request_cpu_start = now;
        let poll = st.sampler.begin_request(&st.prof, now, start_tick);
        if st.sampler.due() {
            // The tick landed while the clock was read.
            sample_outside_wasm(st, now);
        }
        let deadline = st.sampler.ticks_to_due(poll);
        if self.runtime.inner.config.epoch_interruption {
            self.store.set_epoch_deadline(deadline);
        }
    }

    /// The request is answered: while a CPU capture runs, a tick that
    /// landed where no epoch check noticed it (the host placing the request
    /// or reading the response, the tail of the guest's call) is sampled
    /// here, and the CPU not yet sampled is kept for the next request.
    fn end_request(&mut self) {
        let st = self.store.data_mut();
        if !st.sampler.counting(&st.prof) {
            return;
        }
        if st.sampler.due() {
            sample_outside_wasm(st, thread_cpu_nanos());
        }
        st.sampler.end_request();
    }

    fn fail(&mut self, e: wasmtime::Error) -> IsolateError {
        let st = self.store.data();
        let (reason, err) = if let Some(requested) = st.exceeded_memory {
            (
                EvictionReason::ExceededMemory,
                IsolateError::ExceededMemory {
                    limit: self.limits.memory_bytes,
                    requested,
                },
            )
        } else if st.cpu_exceeded {
            (
                EvictionReason::ExceededCpu,
                IsolateError::ExceededCpu {
                    limit: self.limits.cpu_per_request,
                },
            )
        } else {
            (EvictionReason::Trap, IsolateError::Trap(format!("{e:#}")))
        };
        self.eviction = Some(reason);
        self.runtime.inner.evictions.count(reason);
        err
    }

    /// A handle to start and stop captures from any thread.
    pub fn profiler(&self) -> ProfilerHandle {
        self.profiler.clone()
    }

    /// Current linear memory size in bytes (what the memory limit applies
    /// to).
    pub fn memory_bytes(&self) -> usize {
        self.memory.data_size(&self.store)
    }

    /// What the host holds for this isolate, in bytes: its linear memory,
    /// its tables' elements ([`TABLE_ELEMENT_BYTES`] each), the log bytes
    /// kept of the current request and the profiler's buffers. Not the
    /// compiled code, which the isolates of one version share.
    pub fn host_bytes(&self) -> u64 {
        let st = self.store.data();
        self.memory_bytes() as u64
            + (st.table_elements * TABLE_ELEMENT_BYTES) as u64
            + st.log_bytes as u64
            + self.profiler.shared.held_bytes()
    }

    /// Why this isolate was evicted, if it was.
    pub fn eviction(&self) -> Option<EvictionReason> {
        self.eviction
    }

    /// Requests served (or attempted).
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Total bytes the guest allocator handed out, if the worker exports
    /// `edgeprof_allocated_bytes` (the SDK does): the truth heap profiles are
    /// checked against.
    pub fn guest_allocated_bytes(&mut self) -> Option<u64> {
        let f = self.allocated_bytes.clone()?;
        f.call(&mut self.store, ()).ok().map(|v| v as u64)
    }

    /// Lines the worker logged through `edgeprof.log` during the last
    /// request, oldest first: at most [`MAX_LOG_LINES`] lines and
    /// [`MAX_LOG_BYTES`] bytes are kept (a longer line is cut), and the
    /// number of lines dropped or cut.
    pub fn take_logs(&mut self) -> (Vec<String>, usize) {
        let st = self.store.data_mut();
        let dropped = std::mem::take(&mut st.logs_dropped);
        st.log_bytes = 0;
        (std::mem::take(&mut st.logs), dropped)
    }

    fn clear_logs(&mut self) {
        let _ = self.take_logs();
    }
}

fn on_epoch_deadline(
    mut ctx: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<UpdateDeadline> {
    let now = thread_cpu_nanos();
    let st = ctx.data_mut();
    if now.saturating_sub(st.request_cpu_start) > st.cpu_limit_ns {
        st.cpu_exceeded = true;
        return Ok(UpdateDeadline::Interrupt);
    }
    let next = sample(&mut ctx, now, None);
    Ok(UpdateDeadline::Continue(next))
}

/// A tick that landed in the host's part of a request (placing it,
/// reading the response, the clock read itself), at thread CPU `now`: a
/// [`REQUEST_FRAME`] sample. Without these a request of a few microseconds,
/// most of it host work, lost most of its ticks (a sample count far under
/// CPU / interval).
fn sample_outside_wasm(st: &mut HostState, now: u64) {
    let started = std::time::Instant::now();
    if let Tick::Sample {
        generation, weight, ..
    } = st.sampler.tick(&st.prof, now)
    {
        let stack = vec![RawFrame::Host(REQUEST_FRAME)].into_boxed_slice();
        st.prof
            .record_cpu(generation, stack, weight, false, started);
    }
}

/// A tick was noticed at thread CPU `now`, in wasm or (`import`) on the
/// return of a host import: records a sample if one is due. Returns the
/// ticks until the next check.
fn sample(
    ctx: &mut wasmtime::StoreContextMut<'_, HostState>,
    now: u64,
    import: Option<&'static str>,
) -> u64 {
    let st = ctx.data_mut();
    match st.sampler.tick(&st.prof, now) {
        Tick::Wait(next) => next,
        Tick::Sample {
            generation,
            weight,
            next,
        } => {
            let started = std::time::Instant::now();
            let max = st.max_frames;
            let (stack, truncated) = capture_stack(&*ctx, max, import.map(RawFrame::Host));
            ctx.data().prof.record_cpu(
                generation,
                stack.into_boxed_slice(),
                weight,
                truncated,
                started,
            );
            next
        }
    }
}

fn on_call_hook(
    mut ctx: wasmtime::StoreContextMut<'_, HostState>,
    hook: CallHook,
) -> wasmtime::Result<()> {
    // Only the return of one of our imports matters (Wasmtime's libcalls,
    // the epoch callback among them, set no import name): wasm's own epoch
    // checks notice the ticks that land anywhere else.
    if !matches!(hook, CallHook::ReturningFromHost) {
        return Ok(());
    }
    let st = ctx.data_mut();
    let Some(import) = st.sampler.import.take() else {
        return Ok(());
    };
    if !st.sampler.due() {
        return Ok(());
    }
    let next = sample(&mut ctx, thread_cpu_nanos(), Some(import));
    ctx.set_epoch_deadline(next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use super::*;
    use crate::{ProfileKind, RuntimeConfig};

    /// Regression test for issue 6: `[host]` leaves carried the import's
    /// *wall* time while wasm frames carry thread CPU time, so a host call
    /// that blocks showed up as CPU. A blocked import must add ~no CPU.
    #[test]
    fn a_blocking_host_import_gets_its_cpu_time_not_its_wall_time() {
        const SLEEP_MS: u64 = 20;
        const CALLS: u64 = 5;
        let rt = Runtime::new(RuntimeConfig::default()).unwrap();
        let wat = format!(
            r#"(module
  (import "test" "sleep" (func $sleep (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param i32) (result i32) (i32.const 1024))
  (func $spin (local $i i32) (local $x i32)
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (i32.const 30000000)))
      (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (global.set $sink (local.get $x)))
  (func $blocked (local $n i32)
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $n) (i32.const {CALLS})))
      (call $sleep (i32.const {SLEEP_MS}))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $l))))
  (func (export "edgeprof_handle") (param i32 i32) (result i64)
    (call $spin) (call $blocked) (call $spin) (i64.const 12)))"#
        );
        let m = rt.load_module("blocking.wat", wat.as_bytes()).unwrap();
        let mut iso = Isolate::with_imports(&rt, &m, Limits::default(), |l| {
            l.func_wrap(
                "test",
                "sleep",
                |mut caller: Caller<'_, HostState>, ms: i32| {
                    enter_import(&mut caller, "test.sleep");
                    std::thread::sleep(Duration::from_millis(ms as u64));
                },
            )?;
            Ok(())
        })
        .unwrap();
        let prof = iso.profiler();
        prof.start(ProfileKind::Cpu, Duration::from_millis(1))
            .unwrap();
        let ticks = &rt.inner.ticks;
        let (tick0, wall0) = (ticks.load(Ordering::Acquire), Instant::now());
        let cpu_before = thread_cpu_nanos();
        assert_eq!(iso.handle(&Request::get("/")).unwrap().status, 200);
        let thread_cpu = thread_cpu_nanos() - cpu_before;
        let cap = prof.stop().unwrap();
        // The share of the ticks due that the ticker made: CPU is
        // estimated from them, and on a loaded machine the ticker waits
        // for a core too (see `sampling`'s module doc).
        let (made_ticks, wall) = (ticks.load(Ordering::Acquire) - tick0, wall0.elapsed());
        let made = (made_ticks as f64 * 1e6 / wall.as_nanos() as f64).min(1.0);
        let missed_ns = (wall.as_nanos() as i64).saturating_sub(made_ticks as i64 * 1_000_000);
        let top = crate::sampling::tests::cpu_top(&cap.profile);
        let row = |f: &str| top.rows.iter().find(|r| r.function == f);
        // Host time is sampled: a tick that lands in a sleep finds (almost)
        // no CPU since the previous sample and waits for more, so the sleeps
        // get at most one sample, weighing the little CPU before it. On a
        // loaded machine a starved ticker's late tick, made once the sleep
        // frees the core, may also give the sleep the CPU of the ticks it
        // missed (seen: 9.8 ms; see `sampling`'s module doc).
        let host = row("[host] test.sleep").map_or(0, |r| r.flat);
        let blocked_wall = (SLEEP_MS * CALLS * 1_000_000) as i64;
        assert!(
            host * 20 < blocked_wall + 20 * missed_ns.max(0),
            "[host] test.sleep has {host} ns of cpu for {blocked_wall} ns blocked, \
             {missed_ns} ns of ticks missed"
        );
        // The profile's CPU is the thread's CPU: nothing added for the sleep.
        assert!(
            top.total <= thread_cpu as i64 && top.total as f64 >= 0.8 * made * thread_cpu as f64,
            "profile total {} ns, thread CPU {thread_cpu} ns, {:.0} % of the ticks made",
            top.total,
            made * 100.0
        );
        assert!(row("spin").is_some_and(|r| r.flat > 0), "{:?}", top.rows);
        assert_eq!(cap.requests, 1);
    }
}
