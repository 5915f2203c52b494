//! Memory as the platform sees it, per script version: every heartbeat's
//! per-isolate readings for the last [`MEMORY_WINDOW`] (at most
//! [`MAX_MEMORY_READINGS`] per version), the eviction counters each machine
//! last reported, and nearest-rank percentiles over a window.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use edgeprof_proto::rest::{EvictionCounts, IsolateMemory, MemoryStats, VersionMemory};

use super::{Fleet, Isolate};

/// Longest window of memory readings kept (and the most `window_s` may ask).
pub const MEMORY_WINDOW: Duration = Duration::from_secs(300);
/// Most memory readings kept per script version; beyond it the oldest go.
pub const MAX_MEMORY_READINGS: usize = 20_000;

/// `(account, script, version_id)`.
pub(super) type VersionKey = (String, String, String);

#[derive(Debug)]
pub(super) struct Readings {
    /// `(when, memory_bytes)`, oldest first.
    readings: VecDeque<(Instant, u64)>,
    /// Per machine: `(evictions, memory_evictions)` as last reported.
    evictions: HashMap<String, (u64, u64)>,
    last_update: Instant,
}

/// The nearest-rank `per_mille`/1000 quantile of `sorted` (ascending): the
/// smallest reading with at least that share of readings at or below it,
/// i.e. `sorted[ceil(per_mille * n / 1000) - 1]` (rank at least 1). `None`
/// for no readings. Integer arithmetic, so p99 of 100 readings is exactly
/// the 99th.
pub fn nearest_rank(sorted: &[u64], per_mille: u32) -> Option<u64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let pm = per_mille.min(1000) as usize;
    let rank = (pm * n).div_ceil(1000).max(1);
    Some(sorted[rank - 1])
}

/// Whether anything at all is known about a version.
pub fn has_data(m: &VersionMemory) -> bool {
    !m.isolates.is_empty() || m.memory_bytes.samples > 0 || m.evictions.total > 0
}

/// [`MemoryStats`] of `readings` (any order).
pub fn memory_stats(readings: &mut [u64]) -> MemoryStats {
    readings.sort_unstable();
    MemoryStats {
        p50: nearest_rank(readings, 500),
        p99: nearest_rank(readings, 990),
        p999: nearest_rank(readings, 999),
        max: readings.last().copied(),
        samples: readings.len() as u64,
    }
}

impl Fleet {
    /// Adds one heartbeat's memory readings and eviction counters at `now`,
    /// then drops readings older than [`MEMORY_WINDOW`] or beyond
    /// [`MAX_MEMORY_READINGS`], and versions nothing reported for a window.
    #[cfg(test)]
    fn record_memory(&self, machine_id: &str, isolates: &[Isolate], now: Instant) {
        self.record_readings(machine_id, isolates.iter(), now);
    }

    /// [`Fleet::record_memory`] over live and evicted isolates alike.
    pub(super) fn record_readings<'a>(
        &self,
        machine_id: &str,
        isolates: impl Iterator<Item = &'a Isolate> + Clone,
        now: Instant,
    ) {
        // The agent counts evictions per version and machine and repeats
        // the count on each of the version's isolates: this heartbeat's
        // largest value per version stands for the machine.
        let mut counts: HashMap<(&str, &str, &str), (u64, u64)> = HashMap::new();
        for i in isolates.clone() {
            let c = counts
                .entry((&i.account, &i.script, &i.version_id))
                .or_insert((0, 0));
            *c = (c.0.max(i.evictions), c.1.max(i.memory_evictions));
        }
        let mut mem = self.lock_memory();
        for i in isolates {
            let key = (i.account.clone(), i.script.clone(), i.version_id.clone());
            let v = mem.entry(key).or_insert_with(|| Readings {
                readings: VecDeque::new(),
                evictions: HashMap::new(),
                last_update: now,
            });
            v.readings.push_back((now, i.memory_bytes));
            v.last_update = now;
            if let Some(c) =
                counts.get(&(i.account.as_str(), i.script.as_str(), i.version_id.as_str()))
            {
                v.evictions.insert(machine_id.to_owned(), *c);
            }
        }
        let cutoff = now.checked_sub(MEMORY_WINDOW);
        mem.retain(|_, v| {
            while v.readings.len() > MAX_MEMORY_READINGS {
                v.readings.pop_front();
            }
            if let Some(cutoff) = cutoff {
                while v.readings.front().is_some_and(|(t, _)| *t < cutoff) {
                    v.readings.pop_front();
                }
                v.last_update >= cutoff
            } else {
                true
            }
        });
    }

    /// The memory view of `version_id` of `account/script` over the last
    /// `window` (at most [`MEMORY_WINDOW`]).
    pub fn memory(
        &self,
        account: &str,
        script: &str,
        version_id: &str,
        window: Duration,
    ) -> VersionMemory {
        self.memory_at(account, script, version_id, window, self.clock.now())
    }

    fn memory_at(
        &self,
        account: &str,
        script: &str,
        version_id: &str,
        window: Duration,
        now: Instant,
    ) -> VersionMemory {
        let window = window.min(MEMORY_WINDOW);
        let since = now.checked_sub(window);
        let key = (account.to_owned(), script.to_owned(), version_id.to_owned());
        let (mut readings, evictions) = {
            let mem = self.lock_memory();
            match mem.get(&key) {
                None => (Vec::new(), EvictionCounts::default()),
                Some(v) => {
                    let readings: Vec<u64> = v
                        .readings
                        .iter()
                        .filter(|(t, _)| since.is_none_or(|s| *t >= s))
                        .map(|(_, b)| *b)
                        .collect();
                    let evictions = v.evictions.values().fold(
                        EvictionCounts::default(),
                        |acc, (total, memory)| EvictionCounts {
                            exceeded_memory: acc.exceeded_memory + memory,
                            total: acc.total + total,
                        },
                    );
                    (readings, evictions)
                }
            }
        };
        let expiry = self.expiry();
        let mut isolates: Vec<IsolateMemory> = {
            let map = self.lock();
            map.values()
                .filter(|m| now.saturating_duration_since(m.last_heartbeat) < expiry)
                .flat_map(|m| {
                    m.isolates
                        .iter()
                        .filter(|i| {
                            i.account == account && i.script == script && i.version_id == version_id
                        })
                        .map(|i| IsolateMemory {
                            machine: m.machine.id.clone(),
                            data_center: m.machine.data_center.clone(),
                            isolate: i.id.clone(),
                            memory_bytes: i.memory_bytes,
                        })
                })
                .collect()
        };
        isolates.sort_by(|a, b| {
            (&a.data_center, &a.machine, &a.isolate).cmp(&(&b.data_center, &b.machine, &b.isolate))
        });
        VersionMemory {
            version_id: version_id.to_owned(),
            isolates,
            memory_bytes: memory_stats(&mut readings),
            evictions,
            window_s: window.as_secs(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Fleet;
    use crate::fleet::tests::{iso, machine};

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(nearest_rank(&[], 500), None);
        assert_eq!(nearest_rank(&[7], 500), Some(7));
        assert_eq!(nearest_rank(&[7], 999), Some(7));
        assert_eq!(nearest_rank(&[7], 0), Some(7));
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&hundred, 500), Some(50));
        assert_eq!(nearest_rank(&hundred, 990), Some(99));
        // ceil(99.9) = 100: with 100 readings p99.9 is the largest.
        assert_eq!(nearest_rank(&hundred, 999), Some(100));
        let thousand: Vec<u64> = (1..=1000).collect();
        assert_eq!(nearest_rank(&thousand, 999), Some(999));
        assert_eq!(nearest_rank(&thousand, 990), Some(990));
        // Two readings: the median is the lower one (rank ceil(1.0) = 1).
        assert_eq!(nearest_rank(&[10, 20], 500), Some(10));
        assert_eq!(nearest_rank(&[10, 20], 501), Some(20));
        // Three: the middle one.
        assert_eq!(nearest_rank(&[1, 2, 3], 500), Some(2));
    }

    #[test]
    fn memory_stats_sorts_and_counts() {
        let mut r = vec![5, 1, 4, 2, 3];
        let s = memory_stats(&mut r);
        assert_eq!(
            s,
            MemoryStats {
                p50: Some(3),
                p99: Some(5),
                p999: Some(5),
                max: Some(5),
                samples: 5
            }
        );
        assert_eq!(memory_stats(&mut []), MemoryStats::default());
    }

    #[test]
    fn window_selects_recent_readings_and_drops_old_ones() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        // One reading a second for 400 s: 100 MiB before t0+200 s, 1 MiB after.
        for s in 0..400u64 {
            let bytes = if s < 200 { 100 << 20 } else { 1 << 20 };
            fleet.record_memory(
                "m1",
                &[iso("i1", "v1", bytes, (0, 0))],
                t0 + Duration::from_secs(s),
            );
        }
        let now = t0 + Duration::from_secs(399);
        // The last 60 s: all small.
        let m = fleet.memory_at("acme", "api", "v1", Duration::from_secs(60), now);
        assert_eq!(m.memory_bytes.samples, 61);
        assert_eq!(m.memory_bytes.max, Some(1 << 20));
        assert_eq!(m.window_s, 60);
        // The full window keeps readings from t0+99 s on (older ones were
        // dropped): 101 large and 200 small, so p50 small, p99 large.
        let m = fleet.memory_at("acme", "api", "v1", MEMORY_WINDOW, now);
        assert_eq!(m.memory_bytes.samples, 301);
        assert_eq!(m.memory_bytes.p50, Some(1 << 20));
        assert_eq!(m.memory_bytes.p99, Some(100 << 20));
        // Asking for more than the window gives the window.
        let m = fleet.memory_at("acme", "api", "v1", Duration::from_secs(10_000), now);
        assert_eq!(m.window_s, MEMORY_WINDOW.as_secs());
        assert_eq!(m.memory_bytes.samples, 301);
        // Other versions and scripts know nothing.
        let m = fleet.memory_at("acme", "api", "v2", MEMORY_WINDOW, now);
        assert_eq!(m.memory_bytes, MemoryStats::default());
        assert!(!has_data(&m));
    }

    #[test]
    fn readings_per_version_are_bounded() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        let many: Vec<Isolate> = (0..1000)
            .map(|n| iso(&format!("i{n}"), "v1", n, (0, 0)))
            .collect();
        for k in 0..25u64 {
            fleet.record_memory("m1", &many, t0 + Duration::from_millis(k));
        }
        let m = fleet.memory_at(
            "acme",
            "api",
            "v1",
            MEMORY_WINDOW,
            t0 + Duration::from_secs(1),
        );
        assert_eq!(m.memory_bytes.samples, MAX_MEMORY_READINGS as u64);
    }

    #[test]
    fn versions_silent_for_a_window_are_forgotten() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        fleet.record_memory("m1", &[iso("i1", "old", 5, (3, 2))], t0);
        fleet.record_memory(
            "m1",
            &[iso("i2", "new", 6, (0, 0))],
            t0 + MEMORY_WINDOW + Duration::from_secs(1),
        );
        assert_eq!(fleet.lock_memory().len(), 1);
        let m = fleet.memory_at("acme", "api", "old", MEMORY_WINDOW, t0);
        assert_eq!(m.evictions, EvictionCounts::default());
    }

    #[test]
    fn evictions_sum_machines_latest_reports() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        // m1 reports the version's counters on both isolates: counted once.
        fleet.record_memory(
            "m1",
            &[iso("a", "v1", 1, (4, 3)), iso("b", "v1", 1, (4, 3))],
            t0,
        );
        fleet.record_memory("m2", &[iso("c", "v1", 1, (1, 0))], t0);
        let m = fleet.memory_at("acme", "api", "v1", MEMORY_WINDOW, t0);
        assert_eq!(
            m.evictions,
            EvictionCounts {
                exceeded_memory: 3,
                total: 5
            }
        );
        // A newer report from m1 replaces its old one.
        fleet.record_memory(
            "m1",
            &[iso("a", "v1", 1, (6, 5))],
            t0 + Duration::from_secs(1),
        );
        let m = fleet.memory_at(
            "acme",
            "api",
            "v1",
            MEMORY_WINDOW,
            t0 + Duration::from_secs(1),
        );
        assert_eq!(
            m.evictions,
            EvictionCounts {
                exceeded_memory: 5,
                total: 7
            }
        );
    }

    #[test]
    fn isolates_listed_from_live_machines() {
        let fleet = Fleet::new(Duration::from_secs(3600));
        fleet.heartbeat(
            machine("m2", "sjc"),
            Some(vec![iso("z", "v1", 300, (0, 0)), iso("o", "v2", 9, (0, 0))]),
            &[],
        );
        fleet.heartbeat(
            machine("m1", "lhr"),
            Some(vec![iso("y", "v1", 200, (0, 0))]),
            &[],
        );
        let m = fleet.memory("acme", "api", "v1", Duration::from_secs(60));
        assert_eq!(
            m.isolates,
            vec![
                IsolateMemory {
                    machine: "m1".into(),
                    data_center: "lhr".into(),
                    isolate: "y".into(),
                    memory_bytes: 200
                },
                IsolateMemory {
                    machine: "m2".into(),
                    data_center: "sjc".into(),
                    isolate: "z".into(),
                    memory_bytes: 300
                },
            ]
        );
        assert_eq!(m.memory_bytes.samples, 2);
        assert_eq!(m.memory_bytes.p50, Some(200));
        assert_eq!(m.memory_bytes.max, Some(300));
    }
}
