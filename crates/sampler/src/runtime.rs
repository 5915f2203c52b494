//! The engine: one Wasmtime [`wasmtime::Engine`] with its epoch ticker
//! thread, the module cache, and eviction counters.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustc_hash::FxHashMap;
use sha2::Digest;

use crate::symbols::ModuleSymbols;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Epoch tick: the finest sampling interval (1–100 ms, default 1 ms).
    pub tick: Duration,
    /// Frames kept per captured stack; deeper stacks are cut and marked
    /// `[truncated]` (Wasmtime's default of 20 is far too low).
    pub max_frames: usize,
    /// Epoch interruption. Off only to measure its cost: without it there is
    /// no sampling and no CPU limit.
    pub epoch_interruption: bool,
    /// How many ticks an unprofiled request runs between checks of its CPU
    /// limit and of whether a capture has started.
    pub poll_ticks: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            tick: Duration::from_millis(1),
            max_frames: 4096,
            epoch_interruption: true,
            poll_ticks: 10,
        }
    }
}

/// Errors creating a runtime or loading a module.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A config field is out of range.
    #[error("runtime config: {field} = {value} is outside {range}")]
    Config {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// The allowed range.
        range: &'static str,
    },
    /// Wasmtime refused the configuration.
    #[error("wasmtime engine: {0}")]
    Engine(String),
    /// The bytes are neither wasm nor valid WAT.
    #[error("module `{name}` is not valid WAT: {message}")]
    Wat {
        /// Module name.
        name: String,
        /// Parser message.
        message: String,
    },
    /// Wasmtime could not compile the module.
    #[error("module `{name}` does not compile: {message}")]
    Compile {
        /// Module name.
        name: String,
        /// Compiler message.
        message: String,
    },
}

/// What the profiler needs to know about a module.
#[derive(Debug)]
pub(crate) struct ModuleInfo {
    pub name: String,
    pub build_id: String,
    pub bytes_len: usize,
    pub symbols: ModuleSymbols,
}

/// A compiled script version, shared by all isolates running it. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Module {
    pub(crate) module: wasmtime::Module,
    pub(crate) info: Arc<ModuleInfo>,
}

impl Module {
    /// The hash of the wasm bytes (hex SHA-256), the pprof mapping's build id.
    pub fn build_id(&self) -> &str {
        &self.info.build_id
    }
    /// The name it was loaded under (the pprof mapping's file name).
    pub fn name(&self) -> &str {
        &self.info.name
    }
    /// Whether the module carries DWARF (file:line in profiles).
    pub fn has_dwarf(&self) -> bool {
        self.info.symbols.has_dwarf
    }
}

/// Why isolates were evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EvictionReason {
    /// Linear memory would have grown past the isolate's limit.
    ExceededMemory,
    /// A request ran past its CPU-time limit.
    ExceededCpu,
    /// The guest trapped (its state can no longer be trusted).
    Trap,
}

/// Eviction counts since the runtime started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionCounts {
    /// [`EvictionReason::ExceededMemory`].
    pub exceeded_memory: u64,
    /// [`EvictionReason::ExceededCpu`].
    pub exceeded_cpu: u64,
    /// [`EvictionReason::Trap`].
    pub trap: u64,
}

#[derive(Debug, Default)]
pub(crate) struct EvictionCounters {
    exceeded_memory: AtomicU64,
    exceeded_cpu: AtomicU64,
    trap: AtomicU64,
}

impl EvictionCounters {
    pub(crate) fn count(&self, reason: EvictionReason) {
        let c = match reason {
            EvictionReason::ExceededMemory => &self.exceeded_memory,
            EvictionReason::ExceededCpu => &self.exceeded_cpu,
            EvictionReason::Trap => &self.trap,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub(crate) struct RuntimeInner {
    pub engine: wasmtime::Engine,
    pub config: RuntimeConfig,
    pub evictions: EvictionCounters,
    /// Ticks the ticker has made, mirroring the engine's epoch (which
    /// Wasmtime does not expose): a host call compares it with the tick its
    /// isolate's next sample is due at, an atomic load instead of a clock
    /// read.
    pub ticks: Arc<AtomicU64>,
    modules: Mutex<FxHashMap<String, Module>>,
    stop: Arc<AtomicBool>,
    ticker: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.lock().ok().and_then(|mut t| t.take()) {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// One engine with its epoch ticker thread. Cheap to clone; the ticker stops
/// when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

impl Runtime {
    /// Builds the engine and starts its ticker.
    pub fn new(config: RuntimeConfig) -> Result<Runtime, LoadError> {
        if config.tick < Duration::from_millis(1) || config.tick > Duration::from_millis(100) {
            return Err(LoadError::Config {
                field: "tick",
                value: format!("{:?}", config.tick),
                range: "1ms..=100ms",
            });
        }
        let Some(max_frames) = NonZeroUsize::new(config.max_frames) else {
            return Err(LoadError::Config {
                field: "max_frames",
                value: "0".into(),
                range: "1..",
            });
        };
        if config.poll_ticks == 0 {
            return Err(LoadError::Config {
                field: "poll_ticks",
                value: "0".into(),
                range: "1..",
            });
        }
        let mut c = wasmtime::Config::new();
        c.epoch_interruption(config.epoch_interruption);
        // Symbolization happens at stop; per-sample DWARF lookups cost
        // milliseconds.
        c.wasm_backtrace_details(wasmtime::WasmBacktraceDetails::Disable);
        c.wasm_backtrace_max_frames(Some(max_frames));
        let engine = wasmtime::Engine::new(&c).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = if config.epoch_interruption {
            let engine = engine.clone();
            let (stop, ticks) = (stop.clone(), ticks.clone());
            let tick = config.tick;
            Some(
                std::thread::Builder::new()
                    .name("edgeprof-epoch".into())
                    .spawn(move || run_ticker(&engine, tick, &stop, &ticks))
                    .map_err(|e| LoadError::Engine(format!("spawning the epoch ticker: {e}")))?,
            )
        } else {
            None
        };
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                config,
                evictions: EvictionCounters::default(),
                ticks,
                modules: Mutex::new(FxHashMap::default()),
                stop,
                ticker: Mutex::new(ticker),
            }),
        })
    }

    /// Compiles a module (wasm binary, or WAT text) or returns the cached
    /// one with the same bytes. `name` becomes the pprof mapping's file name.
    pub fn load_module(&self, name: &str, bytes: &[u8]) -> Result<Module, LoadError> {
        let wasm = if bytes.starts_with(b"\0asm") {
            std::borrow::Cow::Borrowed(bytes)
        } else {
            wat::parse_bytes(bytes).map_err(|e| LoadError::Wat {
                name: name.into(),
                message: e.to_string(),
            })?
        };
        let build_id = hex(&sha2::Sha256::digest(&wasm));
        if let Some(m) = self.lock_modules().get(&build_id) {
            return Ok(m.clone());
        }
        let module =
            wasmtime::Module::new(&self.inner.engine, &wasm).map_err(|e| LoadError::Compile {
                name: name.into(),
                message: format!("{e:#}"),
            })?;
        let m = Module {
            module,
            info: Arc::new(ModuleInfo {
                name: name.into(),
                build_id: build_id.clone(),
                bytes_len: wasm.len(),
                symbols: ModuleSymbols::read(&wasm),
            }),
        };
        self.lock_modules().insert(build_id, m.clone());
        Ok(m)
    }

    fn lock_modules(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, Module>> {
        self.inner.modules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Evictions so far, by cause.
    pub fn evictions(&self) -> EvictionCounts {
        let e = &self.inner.evictions;
        EvictionCounts {
            exceeded_memory: e.exceeded_memory.load(Ordering::Relaxed),
            exceeded_cpu: e.exceeded_cpu.load(Ordering::Relaxed),
            trap: e.trap.load(Ordering::Relaxed),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }
}

/// Ticks on an absolute schedule (`start + n * tick`): sleeping `tick`
/// after each increment ran ~6 % slow (timer slack and wake-up latency add
/// up), and the profile's sample count is measured against the interval.
/// After a stall longer than a tick it resumes from now rather than
/// catching up in a burst.
fn run_ticker(engine: &wasmtime::Engine, tick: Duration, stop: &AtomicBool, ticks: &AtomicU64) {
    let mut next = std::time::Instant::now() + tick;
    while !stop.load(Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now < next {
            std::thread::park_timeout(next - now);
            continue;
        }
        engine.increment_epoch();
        ticks.fetch_add(1, Ordering::Release);
        next += tick;
        if next <= now {
            next = now + tick;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
