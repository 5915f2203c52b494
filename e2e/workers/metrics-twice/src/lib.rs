//! A metrics endpoint that builds its (expensive) metrics list twice per
//! request: once to check that it is not empty, once to respond.
//! With `--features fixed` it builds the list once.

use edgeprof_guest_sdk::{Request, Response, handler};

#[inline(never)]
fn build_metrics() -> Vec<String> {
    (0..4000u64)
        .map(|i| {
            let v = (0..50u64).fold(i, |a, b| a.wrapping_mul(31).wrapping_add(b));
            format!("edge_requests_total{{shard=\"{i}\"}} {}", v % 100_000)
        })
        .collect()
}

fn handle(_req: Request) -> Response {
    #[cfg(not(feature = "fixed"))]
    let metrics = if build_metrics().is_empty() {
        Vec::new()
    } else {
        build_metrics()
    };
    #[cfg(feature = "fixed")]
    let metrics = build_metrics();
    Response::new(200, metrics.join("\n"))
}

handler!(handle);
