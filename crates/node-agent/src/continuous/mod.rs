//! Continuous profiling: every isolate is profiled in the background at a
//! low rate (CPU at `--continuous-hz`, heap always), the samples are cut
//! into windows at wall-clock multiples of `--continuous-window` (so the
//! windows of all machines line up), merged per (account, script, version)
//! and kind, and shipped to the control plane's `Registry.PushWindows`.
//!
//! - `hosting` starts each isolate's continuous captures on its thread
//!   before anyone can reach it, and keeps an ended isolate (evicted,
//!   reclaimed, replaced) for the next boundary, whose window takes its last
//!   samples ([`crate::hosting::Hosting::take_departed`]).
//! - [`collect`]: at a boundary, rotates every isolate's captures, then
//!   symbolizes, merges and encodes on a blocking thread, never on an
//!   isolate thread or an async worker.
//! - [`queue`]: unsent windows, bounded by bytes and by age.
//! - [`ship`]: batches to the control plane, retried with backoff.
//!
//! Every window is shipped or counted as dropped
//! (`edgeprof_agent_continuous_windows_dropped_total{reason}`); the count
//! also travels in each push as `dropped_total`.
//!
//! Imports: `collect` and `queue` know nothing of each other or of the
//! network; `ship` uses `queue` and `registry`; this module wires them.

pub mod collect;
pub mod queue;
pub mod ship;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;

use crate::config::Continuous;
use crate::hosting::Hosting;
use crate::metrics::{Metrics, WindowDrop};
use crate::registry::Registry;

/// The continuous CPU sampling interval for `hz` on a runtime ticking every
/// `tick`: whole ticks (the sampler's unit), rounded down so the rate is at
/// least `hz`, and at least one tick.
pub fn cpu_interval(hz: u32, tick: Duration) -> Duration {
    let period = Duration::from_secs(1) / hz.max(1);
    let ticks = (period.as_nanos() / tick.as_nanos().max(1)).max(1);
    tick * u32::try_from(ticks).unwrap_or(u32::MAX)
}

/// The latest window boundary at or before `now_ms`: a multiple of
/// `window_ms` since the Unix epoch.
pub fn boundary_at(now_ms: i64, window_ms: i64) -> i64 {
    now_ms.div_euclid(window_ms) * window_ms
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Starts the collector and the shipper.
pub fn start(
    config: Continuous,
    hosting: Arc<Hosting>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
) -> Vec<JoinHandle<()>> {
    let outbox = Arc::new(ship::Outbox::new(
        queue::WindowQueue::new(config.queue_bytes, config.buffer),
        metrics.clone(),
    ));
    let shipper = tokio::spawn(ship::run(outbox.clone(), registry, metrics.clone()));
    let collector = tokio::spawn(collect_at_boundaries(
        hosting,
        outbox,
        metrics,
        config.window,
    ));
    vec![collector, shipper]
}

/// At each boundary, cuts the window that ends there and queues it.
async fn collect_at_boundaries(
    hosting: Arc<Hosting>,
    outbox: Arc<ship::Outbox>,
    metrics: Arc<Metrics>,
    window: Duration,
) {
    let w = window.as_millis() as i64;
    let mut next = boundary_at(unix_ms(), w) + w;
    loop {
        // The wall clock decides: a sleep that ends early (the clocks
        // disagree) sleeps again, so no window is cut twice.
        loop {
            let now = unix_ms();
            if now >= next {
                break;
            }
            tokio::time::sleep(Duration::from_millis((next - now) as u64)).await;
        }
        let end = boundary_at(unix_ms(), w);
        if end > next {
            tracing::warn!(
                "continuous collection {} ms late: the window ending at {end} also holds the samples since {}",
                end - next,
                next - w
            );
        }
        next = end + w;
        let departed = hosting.take_departed();
        let live = hosting.slots();
        let cut =
            tokio::task::spawn_blocking(move || collect::collect(&live, &departed, end - w, end))
                .await;
        match cut {
            Ok(c) => {
                metrics.windows_dropped(WindowDrop::Oversized, c.oversized);
                outbox.push(c.windows);
            }
            Err(e) => tracing::error!("continuous window ending at {end} lost: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_interval_is_whole_ticks_at_or_under_the_period() {
        let ms = Duration::from_millis;
        assert_eq!(cpu_interval(19, ms(1)), ms(52));
        assert_eq!(cpu_interval(100, ms(1)), ms(10));
        assert_eq!(cpu_interval(19, ms(5)), ms(50));
        assert_eq!(cpu_interval(19, ms(100)), ms(100), "at least one tick");
        assert_eq!(cpu_interval(1, ms(3)), ms(999));
    }

    #[test]
    fn boundaries_are_wall_clock_multiples_of_the_window() {
        assert_eq!(boundary_at(1_700_000_012_345, 10_000), 1_700_000_010_000);
        assert_eq!(boundary_at(1_700_000_010_000, 10_000), 1_700_000_010_000);
        assert_eq!(boundary_at(59_999, 60_000), 0);
    }
}
