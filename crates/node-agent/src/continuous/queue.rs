//! The windows waiting to be sent: bounded by bytes (the oldest goes first)
//! and by age (`--continuous-buffer`). Time is an argument, so the rules are
//! tested without a clock.
//!
//! The shipper takes a batch out ([`WindowQueue::take_batch`]) and puts it
//! back in front if the call fails ([`WindowQueue::restore`]), where the
//! bounds apply to it again: a window is counted exactly once, shipped or
//! dropped. While a batch is in flight the queue may hold up to its byte
//! bound besides that batch.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use edgeprof_proto::v1;

/// Most windows in one `PushWindows` call.
pub const MAX_BATCH_WINDOWS: usize = 64;
/// Most pprof bytes in one `PushWindows` call (a batch always holds at
/// least one window).
pub const MAX_BATCH_BYTES: u64 = 8 << 20;

/// A window and when it was queued.
#[derive(Debug, Clone)]
pub struct Queued {
    /// The window as it is sent.
    pub window: v1::ProfileWindow,
    /// When the collector queued it.
    pub queued_at: Instant,
}

impl Queued {
    /// What the window holds, in bytes (its pprof and names).
    pub fn bytes(&self) -> u64 {
        let w = &self.window;
        (w.pprof.len() + w.account.len() + w.script.len() + w.version_id.len() + 64) as u64
    }
}

/// Windows dropped by one call, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// The queue was over its byte bound.
    pub full: u64,
    /// Older than the age bound.
    pub expired: u64,
}

/// Unsent windows, oldest first.
#[derive(Debug)]
pub struct WindowQueue {
    windows: VecDeque<Queued>,
    bytes: u64,
    max_bytes: u64,
    max_age: Duration,
}

impl WindowQueue {
    /// An empty queue keeping at most `max_bytes`, for at most `max_age`.
    pub fn new(max_bytes: u64, max_age: Duration) -> Self {
        WindowQueue {
            windows: VecDeque::new(),
            bytes: 0,
            max_bytes,
            max_age,
        }
    }

    /// Windows queued.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Bytes queued.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Queues `window` at `now` (the newest), then applies the bounds.
    pub fn push(&mut self, window: v1::ProfileWindow, now: Instant) -> Dropped {
        let q = Queued {
            window,
            queued_at: now,
        };
        self.bytes += q.bytes();
        self.windows.push_back(q);
        self.bound(now)
    }

    /// Takes the oldest windows out, at most [`MAX_BATCH_WINDOWS`] and
    /// [`MAX_BATCH_BYTES`] (at least one if any is queued), after dropping
    /// those too old at `now`.
    pub fn take_batch(&mut self, now: Instant) -> (Vec<Queued>, Dropped) {
        let dropped = self.bound(now);
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(front) = self.windows.front() {
            let b = front.bytes();
            if batch.len() >= MAX_BATCH_WINDOWS
                || (!batch.is_empty() && bytes + b > MAX_BATCH_BYTES)
            {
                break;
            }
            bytes += b;
            self.bytes -= b;
            batch.extend(self.windows.pop_front());
        }
        (batch, dropped)
    }

    /// Puts back a batch a failed call could not deliver, ahead of the
    /// windows queued since, then applies the bounds at `now`.
    pub fn restore(&mut self, batch: Vec<Queued>, now: Instant) -> Dropped {
        for q in batch.into_iter().rev() {
            self.bytes += q.bytes();
            self.windows.push_front(q);
        }
        self.bound(now)
    }

    fn bound(&mut self, now: Instant) -> Dropped {
        let mut dropped = Dropped::default();
        while let Some(front) = self.windows.front() {
            let expired = now.saturating_duration_since(front.queued_at) > self.max_age;
            if !expired && self.bytes <= self.max_bytes {
                break;
            }
            if expired {
                dropped.expired += 1;
            } else {
                dropped.full += 1;
            }
            self.bytes -= front.bytes();
            self.windows.pop_front();
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: i64, pprof_bytes: usize) -> v1::ProfileWindow {
        v1::ProfileWindow {
            account: "a".into(),
            start_unix_ms: start,
            pprof: vec![0; pprof_bytes],
            ..Default::default()
        }
    }

    fn starts(q: &[Queued]) -> Vec<i64> {
        q.iter().map(|q| q.window.start_unix_ms).collect()
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn over_its_bytes_the_oldest_window_goes() {
        let t = Instant::now();
        let one = Queued {
            window: window(0, 1000),
            queued_at: t,
        }
        .bytes();
        let mut q = WindowQueue::new(3 * one, 60 * S);
        for i in 0..3 {
            assert_eq!(q.push(window(i, 1000), t), Dropped::default());
        }
        assert_eq!(
            q.push(window(3, 1000), t),
            Dropped {
                full: 1,
                expired: 0
            }
        );
        assert_eq!((q.len(), q.bytes()), (3, 3 * one));
        let (batch, _) = q.take_batch(t);
        assert_eq!(starts(&batch), [1, 2, 3]);
        assert_eq!((q.len(), q.bytes()), (0, 0));
    }

    #[test]
    fn windows_older_than_the_buffer_are_dropped() {
        let t = Instant::now();
        let mut q = WindowQueue::new(1 << 30, 10 * S);
        q.push(window(0, 10), t);
        q.push(window(1, 10), t + 5 * S);
        assert_eq!(q.push(window(2, 10), t + 10 * S).expired, 0);
        let (batch, dropped) = q.take_batch(t + 11 * S);
        assert_eq!(dropped.expired, 1);
        assert_eq!(starts(&batch), [1, 2]);
    }

    #[test]
    fn a_failed_batch_goes_back_in_front_and_the_bounds_apply_to_it() {
        let t = Instant::now();
        let mut q = WindowQueue::new(1 << 30, 10 * S);
        for i in 0..3 {
            q.push(window(i, 10), t);
        }
        let (batch, _) = q.take_batch(t);
        q.push(window(3, 10), t + 8 * S);
        assert_eq!(q.restore(batch, t + 9 * S), Dropped::default());
        let (batch, _) = q.take_batch(t + 9 * S);
        assert_eq!(starts(&batch), [0, 1, 2, 3]);
        assert_eq!(q.restore(batch, t + 11 * S).expired, 3);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn batches_are_bounded_in_windows_and_bytes_but_hold_at_least_one() {
        let t = Instant::now();
        let mut q = WindowQueue::new(1 << 30, 10 * S);
        for i in 0..100 {
            q.push(window(i, 10), t);
        }
        assert_eq!(q.take_batch(t).0.len(), MAX_BATCH_WINDOWS);
        let mut q = WindowQueue::new(1 << 30, 10 * S);
        let big = (MAX_BATCH_BYTES / 2) as usize;
        for i in 0..3 {
            q.push(window(i, big), t);
        }
        assert_eq!(starts(&q.take_batch(t).0), [0]);
        let mut q = WindowQueue::new(1 << 30, 10 * S);
        q.push(window(0, 2 * MAX_BATCH_BYTES as usize), t);
        assert_eq!(q.take_batch(t).0.len(), 1);
    }
}
