//! The per-script concurrency limit, and one capture per isolate at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A capture refused because others of the same script are running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// How many captures of the script are running.
    pub running: usize,
    /// Why this one cannot start now.
    pub reason: BusyReason,
    /// Seconds until the earliest capture in the way should end.
    pub retry_after_secs: u64,
}

/// Why a capture must wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusyReason {
    /// The per-script limit is reached.
    Limit,
    /// A running capture already profiles some of the same isolates (an
    /// isolate's profiler serves one capture at a time); these, as
    /// `machine/isolate`.
    Overlap(Vec<String>),
}

/// A capture in progress: its session, when it should end at the latest,
/// and the isolates (`machine/isolate`) it profiles.
#[derive(Debug)]
struct Running {
    id: String,
    end: Instant,
    isolates: Vec<String>,
}

type ByScript = HashMap<(String, String), Vec<Running>>;

/// `(account, script)` → captures running.
#[derive(Debug, Clone, Default)]
pub struct Slots(Arc<Mutex<ByScript>>);

/// Frees its slot when dropped.
#[derive(Debug)]
pub struct SlotGuard {
    slots: Slots,
    key: (String, String),
    id: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut map = self.slots.lock();
        if let Some(v) = map.get_mut(&self.key) {
            v.retain(|r| r.id != self.id);
            if v.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByScript> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Captures running.
    pub fn running(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// Takes a slot for session `id` of `key` profiling `isolates` until
    /// `end` at the latest, unless `max` are running or one of them
    /// profiles an isolate of this one.
    pub fn acquire(
        &self,
        key: (String, String),
        id: &str,
        isolates: Vec<String>,
        now: Instant,
        until: Duration,
        max: usize,
    ) -> Result<SlotGuard, Busy> {
        let mut map = self.lock();
        let running = map.entry(key.clone()).or_default();
        let wait = |r: &Running| r.end.saturating_duration_since(now);
        let busy = |reason, soonest: Duration| Busy {
            running: running.len(),
            reason,
            retry_after_secs: soonest.as_secs_f64().ceil().max(1.0) as u64,
        };
        if running.len() >= max {
            let soonest = running.iter().map(wait).min().unwrap_or_default();
            return Err(busy(BusyReason::Limit, soonest));
        }
        let in_the_way: Vec<&Running> = running
            .iter()
            .filter(|r| r.isolates.iter().any(|i| isolates.contains(i)))
            .collect();
        if !in_the_way.is_empty() {
            let mut shared: Vec<String> = isolates
                .iter()
                .filter(|i| in_the_way.iter().any(|r| r.isolates.contains(i)))
                .cloned()
                .collect();
            shared.sort();
            // All of them must end before every shared isolate is free.
            let latest = in_the_way.iter().map(|r| wait(r)).max().unwrap_or_default();
            return Err(busy(BusyReason::Overlap(shared), latest));
        }
        running.push(Running {
            id: id.to_owned(),
            end: now + until,
            isolates,
        });
        drop(map);
        Ok(SlotGuard {
            slots: self.clone(),
            key,
            id: id.to_owned(),
        })
    }
}
