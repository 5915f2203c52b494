//! Time as the control plane reads it: the system clock in production, a
//! manual one in tests, so liveness windows, leases, memory windows and
//! retention are tested by advancing the clock, never by sleeping.
//!
//! Imports nothing of this crate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of `Instant`s and Unix milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Mutex<Manual>>>,
}

#[derive(Debug)]
struct Manual {
    start: Instant,
    start_ms: i64,
    offset: Duration,
}

fn system_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock { manual: None }
    }

    /// A clock that starts at the system's now and moves only by
    /// [`Clock::advance`].
    pub fn manual() -> Self {
        Clock {
            manual: Some(Arc::new(Mutex::new(Manual {
                start: Instant::now(),
                start_ms: system_ms(),
                offset: Duration::ZERO,
            }))),
        }
    }

    fn with_manual<T>(&self, f: impl FnOnce(&mut Manual) -> T) -> Option<T> {
        self.manual
            .as_ref()
            .map(|m| f(&mut m.lock().unwrap_or_else(|e| e.into_inner())))
    }

    /// Now, as a monotonic instant.
    pub fn now(&self) -> Instant {
        self.with_manual(|m| m.start + m.offset)
            .unwrap_or_else(Instant::now)
    }

    /// Now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.with_manual(|m| {
            m.start_ms
                .saturating_add(i64::try_from(m.offset.as_millis()).unwrap_or(i64::MAX))
        })
        .unwrap_or_else(system_ms)
    }

    /// Moves a manual clock forward by `by`; panics on the system clock,
    /// which only tests would try to move.
    pub fn advance(&self, by: Duration) {
        self.with_manual(|m| m.offset += by)
            .expect("only a manual clock can be advanced");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let c = Clock::manual();
        let (t, ms) = (c.now(), c.now_ms());
        assert_eq!((c.now(), c.now_ms()), (t, ms));
        c.advance(Duration::from_secs(3));
        assert_eq!(c.now() - t, Duration::from_secs(3));
        assert_eq!(c.now_ms() - ms, 3_000);
    }
}
