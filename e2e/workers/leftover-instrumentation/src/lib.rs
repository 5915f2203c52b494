//! A worker with leftover debug instrumentation: for every request it
//! formats a verbose trace of the request (about 60 % of all bytes the
//! worker allocates) and keeps a slice of it in a global that is never
//! drained, so under load memory grows past 128 MiB. With
//! `--features fixed` the instrumentation is gone.

use edgeprof_guest_sdk::{Request, Response, handler};

#[cfg(not(feature = "fixed"))]
static mut RETAINED: Vec<Vec<u8>> = Vec::new();

/// Leftover instrumentation: 128 KiB of formatted trace per request, 64 KiB
/// of it kept forever.
#[cfg(not(feature = "fixed"))]
#[inline(never)]
fn record_instrumentation(req: &Request) {
    let mut trace = Vec::with_capacity(64 * 1024);
    while trace.len() + 64 <= 64 * 1024 {
        trace.extend_from_slice(format!("{:>56}|{:>6}\n", req.path, trace.len()).as_bytes());
    }
    let mut scratch = vec![0u8; 64 * 1024];
    scratch[..trace.len()].copy_from_slice(&trace);
    #[allow(static_mut_refs)]
    // SAFETY: wasm32 guests are single-threaded.
    unsafe {
        RETAINED.push(trace);
    }
    std::hint::black_box(&scratch);
}

/// The real work: 64 KiB of response.
#[inline(never)]
fn render(req: &Request) -> Vec<u8> {
    let mut body = vec![b'.'; 64 * 1024];
    let n = req.path.len().min(body.len());
    body[..n].copy_from_slice(&req.path.as_bytes()[..n]);
    body
}

fn handle(req: Request) -> Response {
    #[cfg(not(feature = "fixed"))]
    record_instrumentation(&req);
    Response::new(200, render(&req))
}

handler!(handle);
