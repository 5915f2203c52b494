//! Profiling state shared between an isolate (which records samples on its
//! own thread) and any number of [`ProfilerHandle`]s (which start and stop
//! captures from other threads).
//!
//! Captures of two owners run side by side ([`CaptureOwner`]): one
//! on-demand capture at a time, and the continuous profiler's CPU and heap
//! captures, which [`ProfilerHandle::rotate`] cuts into windows without a
//! gap. While several CPU captures run, the isolate samples at the finest of
//! their intervals and records every sample into each: each capture's CPU
//! total is the CPU of its time, and a capture running beside a finer one
//! holds more samples than its own interval asks for (weighing the same).
//! Starting a CPU capture restarts the isolate's count: the CPU since the
//! previous sample (less than one interval of the finest capture running)
//! is attributed to none.
//!
//! Start and stop only flip an atomic state and swap a buffer under a mutex
//! the sample path holds for a hash-map insert; symbolization happens in
//! `stop`, after the buffer has been taken, so a running request never waits
//! on it.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgeprof_pprof::{LineSpec, MappingSpec, Profile, ProfileBuilder};
use rustc_hash::FxHashMap;

use crate::runtime::ModuleInfo;

/// What a capture samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    /// Wasm stacks on epoch ticks, weighted by thread CPU time.
    Cpu,
    /// Stacks of sampled allocations reported by the guest allocator.
    Heap,
}

impl ProfileKind {
    fn code(self) -> u8 {
        match self {
            ProfileKind::Cpu => STATE_CPU,
            ProfileKind::Heap => STATE_HEAP,
        }
    }
}

/// Who a capture is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureOwner {
    /// An on-demand capture: at most one at a time on an isolate, of
    /// either kind.
    OnDemand,
    /// The continuous profiler: at most one capture of each kind, cut into
    /// windows by [`ProfilerHandle::rotate`].
    Continuous,
}

/// No capture runs.
pub(crate) const STATE_OFF: u8 = 0;
/// Bit set while a CPU capture runs.
pub(crate) const STATE_CPU: u8 = 1;
/// Bit set while a heap capture runs.
pub(crate) const STATE_HEAP: u8 = 2;

/// One recorded frame, symbolized only at stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RawFrame {
    /// A wasm function and the module offset of its program counter.
    Wasm { func: u32, offset: u32 },
    /// Time inside a host import, named `[host] <module>.<name>`.
    Host(&'static str),
    /// The stack was longer than the configured frame limit.
    Truncated,
}

/// Leaf first.
pub(crate) type Stack = Box<[RawFrame]>;

/// Bounds of the sampler's memory.
#[derive(Debug, Clone, Copy)]
pub struct SamplerLimits {
    /// Distinct stacks kept per capture; further new stacks are dropped.
    pub max_stacks: usize,
    /// Samples kept per capture; further samples are dropped.
    pub max_samples: u64,
    /// Live sampled heap objects tracked per isolate.
    pub max_live_objects: usize,
    /// Frames kept in all the distinct stacks of one capture, and of the
    /// heap tracker: what bounds the buffers in bytes (issue 10: 20 000
    /// stacks of 4 096 frames were allowed, hundreds of MiB; a frame costs
    /// 24 bytes, twice in the heap tracker, so the default bounds a capture
    /// to 6 MiB and the heap tracker to 12 MiB). A new stack that would
    /// pass it is dropped and counted.
    pub max_frames_kept: usize,
}

impl Default for SamplerLimits {
    fn default() -> Self {
        SamplerLimits {
            max_stacks: 20_000,
            max_samples: 1_000_000,
            max_live_objects: 100_000,
            max_frames_kept: 1 << 18,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct CpuValue {
    count: i64,
    nanos: i64,
}

#[derive(Debug, Default, Clone, Copy)]
struct HeapValue {
    alloc_objects: f64,
    alloc_space: f64,
}

#[derive(Debug, Clone, Copy)]
struct LiveObject {
    stack: u32,
    size: u64,
}

#[derive(Debug)]
struct Capture {
    kind: ProfileKind,
    owner: CaptureOwner,
    /// The generation at its start: CPU samples of earlier generations
    /// were weighed before it began.
    generation: u64,
    /// Its own sampling interval, in ticks.
    interval_ticks: u64,
    started: (Instant, SystemTime),
    cpu: FxHashMap<Stack, CpuValue>,
    heap: FxHashMap<u32, HeapValue>,
    samples: u64,
    dropped: u64,
    truncated: u64,
    requests: u64,
    /// Frames in the keys of `cpu`.
    frames: usize,
    /// Time the CPU sample path took, stack capture to insert.
    sample_nanos: u64,
}

impl Capture {
    fn new(kind: ProfileKind, owner: CaptureOwner, generation: u64, interval_ticks: u64) -> Self {
        Capture {
            kind,
            owner,
            generation,
            interval_ticks,
            started: (Instant::now(), SystemTime::now()),
            cpu: FxHashMap::default(),
            heap: FxHashMap::default(),
            samples: 0,
            dropped: 0,
            truncated: 0,
            requests: 0,
            frames: 0,
            sample_nanos: 0,
        }
    }

    /// A capture like this one, starting now, empty.
    fn successor(&self) -> Self {
        Capture::new(self.kind, self.owner, self.generation, self.interval_ticks)
    }
}

/// Most captures that run at once on an isolate: one on-demand, and a
/// continuous CPU and heap capture.
const MAX_CAPTURES: usize = 3;

#[derive(Debug, Default)]
struct HeapTracker {
    stacks: Vec<Stack>,
    stack_ids: FxHashMap<Stack, u32>,
    live: FxHashMap<u32, LiveObject>,
    dropped: u64,
    /// Frames in `stacks`.
    frames: usize,
}

#[derive(Debug, Default)]
struct Buffers {
    /// At most [`MAX_CAPTURES`].
    captures: Vec<Capture>,
    heap: HeapTracker,
}

impl Buffers {
    /// What the buffers hold, in bytes, from their counts (an estimate of
    /// the allocations: entries and frames, not the maps' spare capacity).
    fn bytes(&self) -> u64 {
        use std::mem::size_of;
        let frame = size_of::<RawFrame>();
        let stack = size_of::<Stack>();
        let capture: usize = self
            .captures
            .iter()
            .map(|c| {
                c.frames * frame
                    + c.cpu.len() * (stack + size_of::<CpuValue>())
                    + c.heap.len() * (size_of::<u32>() + size_of::<HeapValue>())
            })
            .sum();
        let h = &self.heap;
        // Each stack is kept twice: in the list and as the map's key.
        let heap = 2 * h.frames * frame
            + h.stacks.len() * (2 * stack + size_of::<u32>())
            + h.live.len() * (size_of::<u32>() + size_of::<LiveObject>());
        (capture + heap) as u64
    }

    fn find(&self, owner: CaptureOwner, kind: Option<ProfileKind>) -> Option<usize> {
        self.captures
            .iter()
            .position(|c| c.owner == owner && kind.is_none_or(|k| c.kind == k))
    }
}

/// The state one isolate shares with its handles.
#[derive(Debug)]
pub(crate) struct ProfilerShared {
    state: AtomicU8,
    generation: AtomicU64,
    interval_ticks: AtomicU64,
    max_lock_wait_nanos: AtomicU64,
    /// [`Buffers::bytes`] as of the last change, read without the lock
    /// (the memory view counts it).
    held_bytes: AtomicU64,
    buffers: Mutex<Buffers>,
    limits: SamplerLimits,
}

impl ProfilerShared {
    pub(crate) fn new(limits: SamplerLimits) -> Self {
        ProfilerShared {
            state: AtomicU8::new(STATE_OFF),
            generation: AtomicU64::new(0),
            interval_ticks: AtomicU64::new(1),
            max_lock_wait_nanos: AtomicU64::new(0),
            held_bytes: AtomicU64::new(0),
            buffers: Mutex::new(Buffers::default()),
            limits,
        }
    }

    /// `(state, generation, ticks between samples)`.
    #[inline]
    pub(crate) fn snapshot(&self) -> (u8, u64, u64) {
        (
            self.state.load(Ordering::Acquire),
            self.generation.load(Ordering::Acquire),
            self.interval_ticks.load(Ordering::Relaxed),
        )
    }

    /// The sample path's lock: the time it waited is recorded so tests (and
    /// operators) can see the bound hold.
    fn lock_for_sample(&self) -> MutexGuard<'_, Buffers> {
        // Uncontended (all but a start or stop): no clock read.
        if let Ok(guard) = self.buffers.try_lock() {
            return guard;
        }
        let t = Instant::now();
        let guard = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let waited = t.elapsed().as_nanos() as u64;
        self.max_lock_wait_nanos
            .fetch_max(waited, Ordering::Relaxed);
        guard
    }

    fn lock(&self) -> MutexGuard<'_, Buffers> {
        self.buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_held(&self, b: &Buffers) {
        self.held_bytes.store(b.bytes(), Ordering::Relaxed);
    }

    /// After captures started or stopped: the state bits, the finest CPU
    /// interval and the bytes held, for the lock-free readers.
    fn publish(&self, b: &Buffers) {
        let mut state = STATE_OFF;
        let mut ticks = u64::MAX;
        for c in &b.captures {
            state |= c.kind.code();
            if c.kind == ProfileKind::Cpu {
                ticks = ticks.min(c.interval_ticks);
            }
        }
        if ticks != u64::MAX {
            self.interval_ticks.store(ticks, Ordering::Relaxed);
        }
        self.update_held(b);
        self.state.store(state, Ordering::Release);
    }

    /// What the profiler's buffers hold for this isolate, in bytes.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Records a CPU sample of `nanos`, weighed in `generation`, for
    /// `stack` into every CPU capture that ran all that time; the sample
    /// path began at `started`.
    pub(crate) fn record_cpu(
        &self,
        generation: u64,
        stack: Stack,
        nanos: u64,
        truncated: bool,
        started: Instant,
    ) {
        let mut b = self.lock_for_sample();
        let mut grew = false;
        let mut stack = Some(stack);
        let n = b.captures.len();
        for i in 0..n {
            let c = &mut b.captures[i];
            if c.kind != ProfileKind::Cpu || c.generation > generation {
                continue;
            }
            let stacks = c.cpu.len();
            // The last capture to record takes the stack, the others a copy.
            let more = b.captures[i + 1..]
                .iter()
                .any(|c| c.kind == ProfileKind::Cpu && c.generation <= generation);
            let s = if more {
                stack.clone().unwrap_or_default()
            } else {
                stack.take().unwrap_or_default()
            };
            let c = &mut b.captures[i];
            self.insert_cpu(c, s, nanos, truncated);
            c.sample_nanos += started.elapsed().as_nanos() as u64;
            grew |= c.cpu.len() != stacks;
        }
        if grew {
            self.update_held(&b);
        }
    }

    fn insert_cpu(&self, c: &mut Capture, stack: Stack, nanos: u64, truncated: bool) {
        if c.samples >= self.limits.max_samples {
            c.dropped += 1;
            return;
        }
        let len = c.cpu.len();
        match c.cpu.get_mut(&stack) {
            Some(v) => {
                v.count += 1;
                v.nanos = v.nanos.saturating_add(nanos as i64);
            }
            None if len >= self.limits.max_stacks
                || c.frames + stack.len() > self.limits.max_frames_kept =>
            {
                c.dropped += 1;
                return;
            }
            None => {
                c.frames += stack.len();
                c.cpu.insert(
                    stack,
                    CpuValue {
                        count: 1,
                        nanos: nanos as i64,
                    },
                );
            }
        }
        c.samples += 1;
        if truncated {
            c.truncated += 1;
        }
    }

    /// A request begins on the isolate: counted by every running capture
    /// (CPU or heap), so its profile can be read per request. Only takes
    /// the lock while a capture runs.
    pub(crate) fn record_request(&self) {
        if self.state.load(Ordering::Acquire) == STATE_OFF {
            return;
        }
        let mut b = self.lock_for_sample();
        for c in &mut b.captures {
            c.requests += 1;
        }
    }

    /// A sampled allocation reported by the guest allocator.
    pub(crate) fn record_alloc(&self, ptr: u32, size: u64, stack: Stack, truncated: bool) {
        let mut guard = self.lock_for_sample();
        let b = &mut *guard;
        let heap = &mut b.heap;
        let id = match heap.stack_ids.get(&stack) {
            Some(&id) => id,
            None if heap.stacks.len() >= self.limits.max_stacks
                || heap.frames + stack.len() > self.limits.max_frames_kept =>
            {
                heap.dropped += 1;
                for c in &mut b.captures {
                    if c.kind == ProfileKind::Heap {
                        c.dropped += 1;
                    }
                }
                return;
            }
            None => {
                let id = heap.stacks.len() as u32;
                heap.frames += stack.len();
                heap.stacks.push(stack.clone());
                heap.stack_ids.insert(stack, id);
                id
            }
        };
        if heap.live.len() < self.limits.max_live_objects || heap.live.contains_key(&ptr) {
            heap.live.insert(ptr, LiveObject { stack: id, size });
        } else {
            heap.dropped += 1;
        }
        for c in &mut b.captures {
            if c.kind != ProfileKind::Heap {
                continue;
            }
            let scale = unbias(size);
            let v = c.heap.entry(id).or_default();
            v.alloc_objects += scale;
            v.alloc_space += scale * size as f64;
            c.samples += 1;
            if truncated {
                c.truncated += 1;
            }
        }
        self.update_held(b);
    }

    /// The free of a sampled pointer.
    pub(crate) fn record_free(&self, ptr: u32) {
        let mut b = self.lock_for_sample();
        if b.heap.live.remove(&ptr).is_some() {
            self.update_held(&b);
        }
    }
}

/// Go's `scaleHeapSample`: an object of `size` bytes is sampled with
/// probability `1 - exp(-size / mean)`, so each sample stands for
/// `1 / that` objects.
fn unbias(size: u64) -> f64 {
    let mean = edgeprof_guest_sdk::HEAP_SAMPLE_MEAN_BYTES as f64;
    if size == 0 {
        return 1.0;
    }
    1.0 / (1.0 - (-(size as f64) / mean).exp())
}

/// Why a start or stop was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfilerError {
    /// A capture is already running on this isolate (for on-demand
    /// captures, of any kind; for the continuous profiler, of this kind).
    #[error("a {0:?} capture is already running on this isolate")]
    AlreadyActive(ProfileKind),
    /// `stop` or `rotate` without a running capture.
    #[error("no capture is running on this isolate")]
    NotActive,
    /// The sampling interval is outside what the engine's ticker can do.
    #[error("sampling interval {interval:?} is outside {min:?}..={max:?}")]
    IntervalOutOfRange {
        /// Requested.
        interval: Duration,
        /// The engine's tick.
        min: Duration,
        /// Upper bound.
        max: Duration,
    },
}

/// The result of a capture.
#[derive(Debug, Clone)]
pub struct CaptureResult {
    /// The symbolized profile.
    pub profile: Profile,
    /// Samples recorded.
    pub samples: u64,
    /// Samples lost to the sampler's bounds ([`SamplerLimits`]).
    pub dropped: u64,
    /// Samples whose stack was cut at the frame limit (their root is a
    /// `[truncated]` frame).
    pub truncated: u64,
    /// Requests that began on the isolate while the capture ran (failed
    /// ones included): the denominator of "CPU (or bytes) per request".
    pub requests: u64,
    /// Time the isolate spent taking CPU samples (capturing the stack and
    /// recording it), over `samples` this is the cost of one.
    pub sample_time: Duration,
}

/// Starts and stops captures on one isolate from any thread. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct ProfilerHandle {
    pub(crate) shared: Arc<ProfilerShared>,
    pub(crate) module: Arc<ModuleInfo>,
    pub(crate) tick: Duration,
}

/// Live sampled objects per stack id `(objects, bytes)`, and the stacks.
type LiveSnapshot = (FxHashMap<u32, (f64, f64)>, FxHashMap<u32, Stack>);

/// Longest sampling interval accepted.
pub const MAX_INTERVAL: Duration = Duration::from_millis(1000);

impl ProfilerHandle {
    /// Starts an on-demand capture. CPU: a sample every `interval` (a
    /// whole number of the engine's ticks) while a request runs. Heap: the
    /// guest decides when to sample (every 512 KiB on average); `interval`
    /// is only validated.
    pub fn start(&self, kind: ProfileKind, interval: Duration) -> Result<(), ProfilerError> {
        self.start_for(CaptureOwner::OnDemand, kind, interval)
    }

    /// Starts a capture for `owner` (see [`Self::start`]).
    pub fn start_for(
        &self,
        owner: CaptureOwner,
        kind: ProfileKind,
        interval: Duration,
    ) -> Result<(), ProfilerError> {
        if interval < self.tick || interval > MAX_INTERVAL {
            return Err(ProfilerError::IntervalOutOfRange {
                interval,
                min: self.tick,
                max: MAX_INTERVAL,
            });
        }
        let ticks = (interval.as_nanos() / self.tick.as_nanos()).max(1) as u64;
        let mut b = self.shared.lock();
        let running = match owner {
            CaptureOwner::OnDemand => b.find(owner, None),
            CaptureOwner::Continuous => b.find(owner, Some(kind)),
        };
        if let Some(i) = running {
            return Err(ProfilerError::AlreadyActive(b.captures[i].kind));
        }
        debug_assert!(b.captures.len() < MAX_CAPTURES);
        // A new CPU capture restarts the isolate's count, so its first
        // sample weighs no CPU from before it; a heap capture needs none.
        let mut generation = self.shared.generation.load(Ordering::Relaxed);
        if kind == ProfileKind::Cpu {
            generation += 1;
            self.shared.generation.store(generation, Ordering::Release);
        }
        b.captures
            .push(Capture::new(kind, owner, generation, ticks));
        self.shared.publish(&b);
        Ok(())
    }

    /// The kind of the running on-demand capture, if any.
    pub fn active(&self) -> Option<ProfileKind> {
        let b = self.shared.lock();
        b.find(CaptureOwner::OnDemand, None)
            .map(|i| b.captures[i].kind)
    }

    /// Whether `owner` runs a capture of `kind`.
    pub fn running(&self, owner: CaptureOwner, kind: ProfileKind) -> bool {
        self.shared.lock().find(owner, Some(kind)).is_some()
    }

    /// Stops the on-demand capture and returns its symbolized profile.
    pub fn stop(&self) -> Result<CaptureResult, ProfilerError> {
        self.take(CaptureOwner::OnDemand, None, false)
    }

    /// Stops `owner`'s capture of `kind` and returns its profile.
    pub fn stop_for(
        &self,
        owner: CaptureOwner,
        kind: ProfileKind,
    ) -> Result<CaptureResult, ProfilerError> {
        self.take(owner, Some(kind), false)
    }

    /// Ends the continuous profiler's window of `kind` and starts the next
    /// one in the same step: returns the window's profile, and no sample
    /// falls between two windows.
    pub fn rotate(&self, kind: ProfileKind) -> Result<CaptureResult, ProfilerError> {
        self.take(CaptureOwner::Continuous, Some(kind), true)
    }

    /// Takes `owner`'s capture (of `kind`, if given) out of the buffers,
    /// leaving an empty successor when `keep` is set, and symbolizes it
    /// after the lock is released.
    fn take(
        &self,
        owner: CaptureOwner,
        kind: Option<ProfileKind>,
        keep: bool,
    ) -> Result<CaptureResult, ProfilerError> {
        let (capture, live) = {
            let mut b = self.shared.lock();
            let i = b.find(owner, kind).ok_or(ProfilerError::NotActive)?;
            let capture = if keep {
                let next = b.captures[i].successor();
                std::mem::replace(&mut b.captures[i], next)
            } else {
                b.captures.swap_remove(i)
            };
            // Heap captures also report what is still live: copy the (small,
            // bounded) live set and the stacks it needs.
            let live = if capture.kind == ProfileKind::Heap {
                let mut per_stack: FxHashMap<u32, (f64, f64)> = FxHashMap::default();
                for obj in b.heap.live.values() {
                    let scale = unbias(obj.size);
                    let e = per_stack.entry(obj.stack).or_default();
                    e.0 += scale;
                    e.1 += scale * obj.size as f64;
                }
                let stacks: FxHashMap<u32, Stack> = per_stack
                    .keys()
                    .chain(capture.heap.keys())
                    .map(|&id| (id, b.heap.stacks[id as usize].clone()))
                    .collect();
                Some((per_stack, stacks))
            } else {
                None
            };
            self.shared.publish(&b);
            (capture, live)
        };
        Ok(self.symbolize(capture, live))
    }

    /// The longest time the sample path has waited for the profiler's lock
    /// on this isolate (it only contends with `start`/`stop`).
    pub fn max_lock_wait(&self) -> Duration {
        Duration::from_nanos(self.shared.max_lock_wait_nanos.load(Ordering::Relaxed))
    }

    fn symbolize(&self, capture: Capture, live: Option<LiveSnapshot>) -> CaptureResult {
        let kind = capture.kind;
        let mut b = match kind {
            ProfileKind::Cpu => {
                let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
                b.period(
                    "cpu",
                    "nanoseconds",
                    (self.tick.as_nanos() as u64 * capture.interval_ticks) as i64,
                );
                b.default_sample_type("cpu");
                b
            }
            ProfileKind::Heap => {
                let mut b = ProfileBuilder::new(&[
                    ("alloc_objects", "count"),
                    ("alloc_space", "bytes"),
                    ("inuse_objects", "count"),
                    ("inuse_space", "bytes"),
                ]);
                b.period(
                    "space",
                    "bytes",
                    edgeprof_guest_sdk::HEAP_SAMPLE_MEAN_BYTES as i64,
                );
                b.default_sample_type("inuse_space");
                b
            }
        };
        let (started, started_at) = capture.started;
        let t = started_at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        b.time_nanos(t);
        b.duration_nanos(started.elapsed().as_nanos() as i64);
        let m = &self.module;
        let has_dwarf = m.symbols.has_dwarf;
        let mapping = b.mapping(&MappingSpec {
            memory_start: 0,
            memory_limit: m.bytes_len as u64,
            file_offset: 0,
            filename: &m.name,
            build_id: &m.build_id,
            has_functions: true,
            has_filenames: has_dwarf,
            has_line_numbers: has_dwarf,
            has_inline_frames: has_dwarf,
        });
        let mut sym = Symbolizer {
            module: m,
            mapping,
            locations: FxHashMap::default(),
        };
        let mut ids = Vec::new();
        match kind {
            ProfileKind::Cpu => {
                for (stack, v) in &capture.cpu {
                    sym.stack(&mut b, stack, &mut ids);
                    b.add_sample(&ids, &[v.count, v.nanos], &[]);
                }
            }
            ProfileKind::Heap => {
                let (live, stacks) = live.unwrap_or_default();
                for (id, v) in &capture.heap {
                    sym.heap_stack(&mut b, &stacks[id], &mut ids);
                    let (io, is) = live.get(id).copied().unwrap_or_default();
                    b.add_sample(
                        &ids,
                        &[
                            v.alloc_objects.round() as i64,
                            v.alloc_space.round() as i64,
                            io.round() as i64,
                            is.round() as i64,
                        ],
                        &[],
                    );
                }
                for (id, (io, is)) in &live {
                    if capture.heap.contains_key(id) {
                        continue;
                    }
                    sym.heap_stack(&mut b, &stacks[id], &mut ids);
                    b.add_sample(&ids, &[0, 0, io.round() as i64, is.round() as i64], &[]);
                }
            }
        }
        CaptureResult {
            profile: b.build(),
            samples: capture.samples,
            dropped: capture.dropped,
            truncated: capture.truncated,
            requests: capture.requests,
            sample_time: Duration::from_nanos(capture.sample_nanos),
        }
    }
}

struct Symbolizer<'a> {
    module: &'a ModuleInfo,
    mapping: u64,
    locations: FxHashMap<RawFrame, u64>,
}

impl Symbolizer<'_> {
    fn stack(&mut self, b: &mut ProfileBuilder, stack: &[RawFrame], ids: &mut Vec<u64>) {
        ids.clear();
        for f in stack {
            ids.push(self.location(b, *f));
        }
    }

    /// A heap sample's stack without the sampling allocator's own frames
    /// on top (all of them if nothing else is left).
    fn heap_stack(&mut self, b: &mut ProfileBuilder, stack: &[RawFrame], ids: &mut Vec<u64>) {
        let symbols = &self.module.symbols;
        let skip = stack
            .iter()
            .take_while(|f| matches!(f, RawFrame::Wasm { func, .. } if symbols.is_allocator(*func)))
            .count();
        let trimmed = if skip < stack.len() {
            &stack[skip..]
        } else {
            stack
        };
        self.stack(b, trimmed, ids);
    }

    fn location(&mut self, b: &mut ProfileBuilder, frame: RawFrame) -> u64 {
        if let Some(&id) = self.locations.get(&frame) {
            return id;
        }
        let id = match frame {
            RawFrame::Host(name) => {
                let f = b.function(&format!("[host] {name}"), name, "", 0);
                b.location(
                    0,
                    0,
                    &[LineSpec {
                        function_id: f,
                        line: 0,
                        column: 0,
                    }],
                )
            }
            RawFrame::Truncated => {
                let f = b.function("[truncated]", "", "", 0);
                b.location(
                    0,
                    0,
                    &[LineSpec {
                        function_id: f,
                        line: 0,
                        column: 0,
                    }],
                )
            }
            RawFrame::Wasm { func, offset } => {
                let symbols = &self.module.symbols;
                let name = symbols.function_name(func);
                let source = symbols.source_frames(u64::from(offset));
                let mut lines = Vec::with_capacity(source.len().max(1));
                let n = source.len();
                for (i, s) in source.iter().enumerate() {
                    // The outermost DWARF frame is the wasm function itself:
                    // prefer the name section's name when DWARF has none.
                    let fname = if s.function.is_empty() && i + 1 == n {
                        name.clone()
                    } else if s.function.is_empty() {
                        "[inlined]".to_string()
                    } else {
                        s.function.clone()
                    };
                    let f = b.function(&fname, &fname, &s.file, 0);
                    lines.push(LineSpec {
                        function_id: f,
                        line: s.line,
                        column: 0,
                    });
                }
                if lines.is_empty() {
                    let f = b.function(&name, &name, "", 0);
                    lines.push(LineSpec {
                        function_id: f,
                        line: 0,
                        column: 0,
                    });
                }
                b.location(self.mapping, u64::from(offset), &lines)
            }
        };
        self.locations.insert(frame, id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(func: u32, depth: usize) -> Stack {
        (0..depth)
            .map(|i| RawFrame::Wasm {
                func,
                offset: i as u32,
            })
            .collect()
    }

    /// Regression test for issue 10: the buffers were bounded in stacks
    /// only (20 000 stacks of up to 4 096 frames each).
    #[test]
    fn new_stacks_past_the_frame_bound_are_dropped_and_counted() {
        let shared = ProfilerShared::new(SamplerLimits {
            max_frames_kept: 10,
            ..SamplerLimits::default()
        });
        shared
            .lock()
            .captures
            .push(Capture::new(ProfileKind::Cpu, CaptureOwner::OnDemand, 1, 1));
        shared.record_cpu(1, stack(1, 6), 1, false, Instant::now());
        shared.record_cpu(1, stack(2, 6), 1, false, Instant::now());
        shared.record_cpu(1, stack(1, 6), 1, false, Instant::now());
        shared.record_alloc(8, 16, stack(3, 6), false);
        shared.record_alloc(16, 16, stack(4, 6), false);
        let b = shared.lock();
        let c = &b.captures[0];
        assert_eq!((c.cpu.len(), c.frames), (1, 6));
        assert_eq!((c.samples, c.dropped), (2, 1));
        assert_eq!(
            (b.heap.stacks.len(), b.heap.frames, b.heap.dropped),
            (1, 6, 1)
        );
    }
}
