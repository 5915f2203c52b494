//! The wasm side of the guest ABI: request/response buffers behind the
//! exported functions, host imports, and the sampling global allocator.
//!
//! wasm32-unknown-unknown without threads is single-threaded, which is what
//! makes the `Sync` impl of [`Single`] sound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell, UnsafeCell};

use crate::{HEAP_SAMPLE_MEAN_BYTES, Request, Response};

#[link(wasm_import_module = "edgeprof")]
unsafe extern "C" {
    #[link_name = "heap_alloc"]
    fn host_heap_alloc(ptr: i32, size: i32);
    #[link_name = "heap_free"]
    fn host_heap_free(ptr: i32);
    #[link_name = "log"]
    fn host_log(ptr: i32, len: i32);
}

/// Writes a line to the host's log for this isolate.
pub fn log(line: &str) {
    // SAFETY: the host only reads `len` bytes at `ptr`, which `line` owns.
    unsafe { host_log(line.as_ptr() as i32, line.len() as i32) }
}

thread_local! {
    static REQUEST: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static RESPONSE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `edgeprof_alloc`: a buffer of `len` bytes for the host to write the
/// request into.
pub fn alloc_request(len: i32) -> i32 {
    REQUEST.with(|r| {
        let mut r = r.borrow_mut();
        r.clear();
        r.resize(len.max(0) as usize, 0);
        r.as_mut_ptr() as i32
    })
}

/// `edgeprof_handle`: decodes the request the host wrote, runs `f`, and
/// returns `(ptr << 32) | len` of the encoded response (valid until the next
/// call).
pub fn handle(_ptr: i32, len: i32, f: fn(Request) -> Response) -> i64 {
    let request = REQUEST.with(|r| {
        let r = r.borrow();
        let len = (len.max(0) as usize).min(r.len());
        Request::decode(&r[..len])
    });
    let response = match request {
        Ok(req) => f(req),
        Err(e) => Response::new(400, format!("edgeprof guest: bad request encoding: {e}")),
    };
    RESPONSE.with(|out| {
        let mut out = out.borrow_mut();
        *out = response.encode();
        ((out.as_ptr() as u32 as i64) << 32) | out.len() as i64
    })
}

/// `edgeprof_allocated_bytes`: every byte the allocator handed out so far.
pub fn allocated_bytes() -> i64 {
    STATE.get().allocated.get() as i64
}

/// `edgeprof_heap_seed`: seeds the sampling thresholds. The host calls it
/// once per isolate with a random value, so that isolates of one version do
/// not all sample the same allocations (with one fixed seed every isolate
/// drew the same intervals, and all went without a sample over the same
/// stretch of their requests).
pub fn seed_heap_sampling(seed: i64) {
    let s = STATE.get();
    // xorshift's state must not be zero.
    s.rng
        .set(if seed == 0 { DEFAULT_SEED } else { seed as u64 });
    s.until_sample.set(s.next_interval());
}

struct Single<T>(UnsafeCell<T>);
// SAFETY: wasm32-unknown-unknown (no atomics feature) has one thread.
unsafe impl<T> Sync for Single<T> {}
impl<T> Single<T> {
    fn get(&self) -> &T {
        // SAFETY: single-threaded; only shared references are handed out and
        // all mutation goes through `Cell`s.
        unsafe { &*self.0.get() }
    }
}

/// Open-addressed set of sampled pointers, so a free is reported only for
/// sampled objects. Full → the new sample is still reported but its free is
/// not (the host then sees it as live).
const TABLE: usize = 4096;
const PROBE: usize = 64;
const EMPTY: u32 = 0;
const TOMBSTONE: u32 = u32::MAX;
/// The thresholds' seed until the host calls `edgeprof_heap_seed`.
const DEFAULT_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

struct State {
    allocated: Cell<u64>,
    until_sample: Cell<i64>,
    rng: Cell<u64>,
    live: Cell<u32>,
    sampled: [Cell<u32>; TABLE],
}

static STATE: Single<State> = Single(UnsafeCell::new(State {
    allocated: Cell::new(0),
    until_sample: Cell::new(0),
    rng: Cell::new(DEFAULT_SEED),
    live: Cell::new(0),
    sampled: [const { Cell::new(0) }; TABLE],
}));

impl State {
    fn next_interval(&self) -> i64 {
        // xorshift64*, then an exponential draw with the configured mean.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        let bits = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        let u = (bits as f64 + 1.0) / ((1u64 << 53) as f64 + 1.0);
        (-u.ln() * HEAP_SAMPLE_MEAN_BYTES as f64) as i64 + 1
    }

    fn slot(ptr: u32) -> usize {
        (ptr.wrapping_mul(0x9E37_79B1) >> 20) as usize % TABLE
    }

    fn on_alloc(&self, ptr: *mut u8, size: usize) {
        self.allocated.set(self.allocated.get() + size as u64);
        if self.until_sample.get() == 0 {
            self.until_sample.set(self.next_interval());
        }
        let left = self.until_sample.get() - size as i64;
        if left > 0 {
            self.until_sample.set(left);
            return;
        }
        self.until_sample.set(self.next_interval());
        let p = ptr as u32;
        let start = Self::slot(p);
        for i in 0..PROBE {
            let c = &self.sampled[(start + i) % TABLE];
            if c.get() == EMPTY || c.get() == TOMBSTONE {
                c.set(p);
                self.live.set(self.live.get() + 1);
                break;
            }
        }
        // SAFETY: a plain host import taking two integers.
        unsafe { host_heap_alloc(p as i32, size as i32) }
    }

    fn on_free(&self, ptr: *mut u8) {
        if self.live.get() == 0 {
            return;
        }
        let p = ptr as u32;
        let start = Self::slot(p);
        for i in 0..PROBE {
            let at = (start + i) % TABLE;
            let c = &self.sampled[at];
            match c.get() {
                EMPTY => return,
                v if v == p => {
                    self.live.set(self.live.get() - 1);
                    // Linear probing: a slot followed by an empty one can be
                    // emptied, and so can the tombstones before it.
                    if self.sampled[(at + 1) % TABLE].get() == EMPTY {
                        c.set(EMPTY);
                        let mut back = (at + TABLE - 1) % TABLE;
                        while self.sampled[back].get() == TOMBSTONE {
                            self.sampled[back].set(EMPTY);
                            back = (back + TABLE - 1) % TABLE;
                        }
                    } else {
                        c.set(TOMBSTONE);
                    }
                    // SAFETY: a plain host import taking one integer.
                    unsafe { host_heap_free(p as i32) }
                    return;
                }
                _ => {}
            }
        }
    }
}

/// The global allocator of every worker built with this SDK: the system
/// allocator, plus heap sampling.
pub struct SamplingAllocator;

// SAFETY: every method forwards to `System` with the caller's arguments and
// only adds bookkeeping that does not allocate.
unsafe impl GlobalAlloc for SamplingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            STATE.get().on_alloc(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            STATE.get().on_alloc(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        STATE.get().on_free(ptr);
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let q = unsafe { System.realloc(ptr, layout, new_size) };
        if !q.is_null() {
            // A reallocation is a free of the old block and a new
            // allocation of `new_size` bytes, as Go and tcmalloc count it.
            let s = STATE.get();
            s.on_free(ptr);
            s.on_alloc(q, new_size);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: SamplingAllocator = SamplingAllocator;
