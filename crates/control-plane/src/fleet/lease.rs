//! The Durable Object lease rule, pure: whether a machine's lease on its
//! objects has ended, given when it was last heard and the database's
//! record of its last heartbeat.

use std::time::{Duration, Instant};

/// Default Durable Object lease, in heartbeat intervals.
pub const DEFAULT_LEASE_INTERVALS: u32 = 4;
/// Shortest lease accepted, in heartbeat intervals: it must outlast the
/// liveness window (2.5 intervals) so a machine that is still live never
/// loses its objects.
pub const MIN_LEASE_INTERVALS: u32 = 3;

/// Whether a machine's lease on its Durable Objects has ended at `now`: it
/// has been silent for at least `lease`, counted from its last call this
/// process saw, or from this process's start (`started`) if later, so a
/// restarted control plane waits out a full lease before moving anything;
/// and the database's record of its last heartbeat (`db_heartbeat_ms`,
/// written by whichever control plane heard it) is at least `lease` older
/// than `now_ms` too.
pub fn lease_ended(
    heard: Option<Instant>,
    started: Instant,
    now: Instant,
    db_heartbeat_ms: Option<i64>,
    now_ms: i64,
    lease: Duration,
) -> bool {
    let since = heard.map_or(started, |h| h.max(started));
    let silent = now.saturating_duration_since(since) >= lease;
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let silent_in_db = db_heartbeat_ms.is_none_or(|ms| now_ms.saturating_sub(ms) >= lease_ms);
    silent && silent_in_db
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_rules() {
        let lease = Duration::from_secs(10);
        let started = Instant::now();
        let s = Duration::from_secs(1);
        let now_ms = 1_000_000;
        let ended = |heard: Option<Instant>, now: Instant, db: Option<i64>| {
            lease_ended(heard, started, now, db, now_ms, lease)
        };
        // Heard 9.999 s ago: held; 10 s ago: ended.
        let heard = Some(started + s);
        assert!(!ended(
            heard,
            started + 11 * s - Duration::from_millis(1),
            None
        ));
        assert!(ended(heard, started + 11 * s, None));
        // Never heard by this process: counted from its start, so a
        // restarted control plane waits out a full lease.
        assert!(!ended(None, started + 9 * s, None));
        assert!(ended(None, started + 10 * s, None));
        // A heartbeat another control plane recorded in the database
        // within the lease keeps it, whatever this process heard.
        assert!(!ended(None, started + 60 * s, Some(now_ms - 9_999)));
        assert!(ended(None, started + 60 * s, Some(now_ms - 10_000)));
        // A database clock ahead of ours never ends a lease early.
        assert!(!ended(None, started + 60 * s, Some(now_ms + 5_000)));
    }
}
