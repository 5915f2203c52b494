//! A Durable-Object-style counter: its state lives in the isolate, so every
//! request for one object must reach this one isolate. The bug: it keeps
//! every increment and sums the history on each request (cost grows with
//! the object's age). With `--features fixed` it keeps a running total.

use std::cell::RefCell;

use edgeprof_guest_sdk::{Request, Response, handler};

thread_local! {
    static HISTORY: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static TOTAL: RefCell<u64> = const { RefCell::new(0) };
}

#[inline(never)]
fn increment(by: u64) -> u64 {
    #[cfg(not(feature = "fixed"))]
    {
        HISTORY.with(|h| {
            let mut h = h.borrow_mut();
            h.push(by);
            h.iter().sum()
        })
    }
    #[cfg(feature = "fixed")]
    {
        let _ = &HISTORY;
        TOTAL.with(|t| {
            *t.borrow_mut() += by;
            *t.borrow()
        })
    }
}

fn handle(req: Request) -> Response {
    #[cfg(not(feature = "fixed"))]
    let _ = &TOTAL;
    let value = if req.method == "POST" {
        increment(1)
    } else {
        increment(0)
    };
    Response::new(200, value.to_string())
}

handler!(handle);
