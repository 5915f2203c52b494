//! The shipper: sends queued windows to the control plane in batches,
//! retrying with jittered exponential backoff while it is away; the queue's
//! bounds decide what is lost meanwhile, and every loss is counted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;

use super::queue::{Dropped, WindowQueue};
use crate::metrics::{Metrics, WindowDrop};
use crate::registry::Registry;

/// First retry delay after a failed push.
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The queue, shared by the collector (which pushes) and the shipper.
#[derive(Debug)]
pub struct Outbox {
    queue: Mutex<WindowQueue>,
    ready: Notify,
    metrics: Arc<Metrics>,
}

impl Outbox {
    /// An empty outbox over `queue`.
    pub fn new(queue: WindowQueue, metrics: Arc<Metrics>) -> Self {
        Outbox {
            queue: Mutex::new(queue),
            ready: Notify::new(),
            metrics,
        }
    }

    fn with_queue<T>(&self, f: impl FnOnce(&mut WindowQueue) -> (T, Dropped)) -> T {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (out, dropped) = f(&mut q);
        self.metrics.window_queue(q.len(), q.bytes());
        drop(q);
        self.count(dropped);
        out
    }

    fn count(&self, d: Dropped) {
        if d.full > 0 {
            tracing::warn!(
                "{} continuous windows dropped: the unsent queue is over --continuous-queue-bytes",
                d.full
            );
            self.metrics.windows_dropped(WindowDrop::QueueFull, d.full);
        }
        if d.expired > 0 {
            tracing::warn!(
                "{} continuous windows dropped: unsent for longer than --continuous-buffer",
                d.expired
            );
            self.metrics.windows_dropped(WindowDrop::Expired, d.expired);
        }
    }

    /// Queues windows and wakes the shipper.
    pub fn push(&self, windows: Vec<edgeprof_proto::v1::ProfileWindow>) {
        if windows.is_empty() {
            return;
        }
        let now = Instant::now();
        self.with_queue(|q| {
            let mut d = Dropped::default();
            for w in windows {
                let more = q.push(w, now);
                d.full += more.full;
                d.expired += more.expired;
            }
            ((), d)
        });
        self.ready.notify_one();
    }
}

/// The delay after `failures` failed pushes in a row: doubling from
/// [`BACKOFF_MIN`] to [`BACKOFF_MAX`], then drawn from its upper half
/// (`jitter` in 0–1) so agents cut off together do not retry together.
pub fn backoff(failures: u32, jitter: f64) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// Sends what the outbox holds, for ever.
pub async fn run(outbox: Arc<Outbox>, registry: Arc<Registry>, metrics: Arc<Metrics>) {
    let mut failures = 0u32;
    loop {
        let batch = outbox.with_queue(|q| q.take_batch(Instant::now()));
        if batch.is_empty() {
            outbox.ready.notified().await;
            continue;
        }
        let windows: Vec<_> = batch.iter().map(|q| q.window.clone()).collect();
        let bytes: u64 = windows.iter().map(|w| w.pprof.len() as u64).sum();
        let sent = windows.len();
        match registry
            .push_windows(windows, metrics.windows_dropped_total())
            .await
        {
            Ok(resp) => {
                if failures > 0 {
                    tracing::info!("continuous windows reach the control plane again");
                }
                failures = 0;
                for why in &resp.rejected {
                    tracing::warn!("continuous window refused by the control plane: {why}");
                }
                metrics.windows_dropped(WindowDrop::Rejected, resp.rejected.len() as u64);
                if resp.accepted as usize + resp.rejected.len() != sent {
                    tracing::warn!(
                        "push of {sent} continuous windows answered {} accepted and {} rejected",
                        resp.accepted,
                        resp.rejected.len()
                    );
                }
                metrics.windows_shipped(u64::from(resp.accepted), bytes);
            }
            Err(status) => {
                failures = failures.saturating_add(1);
                let delay = backoff(failures, rand::rng().random());
                let message = format!(
                    "cannot push {sent} continuous windows ({:?}: {}); kept, retrying in {delay:?}",
                    status.code(),
                    status.message()
                );
                if failures == 1 {
                    tracing::warn!("{message}");
                } else {
                    tracing::debug!("{message}");
                }
                outbox.with_queue(|q| ((), q.restore(batch, Instant::now())));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_thirty_with_jitter_in_the_upper_half() {
        let ms = |f, j| backoff(f, j).as_millis();
        assert_eq!([ms(1, 1.0), ms(2, 1.0), ms(3, 1.0)], [500, 1000, 2000]);
        assert_eq!([ms(7, 1.0), ms(8, 1.0), ms(100, 1.0)], [30_000; 3]);
        assert_eq!([ms(1, 0.0), ms(100, 0.0)], [250, 15_000]);
    }
}
