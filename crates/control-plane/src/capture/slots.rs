//! The per-script concurrency limit, and one capture per isolate at a time:
//! the rule ([`admit`], pure) and its slots, kept in the database so every
//! control-plane replica on it admits against the same captures.

use crate::store::SlotRow;

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

/// Whether a capture of `isolates` may start at `now_ms` beside the
/// script's `running` captures (none expired): not when `max` are running,
/// nor when one of them profiles one of its isolates.
pub fn admit(
    running: &[SlotRow],
    isolates: &[String],
    now_ms: i64,
    max: usize,
) -> Result<(), Busy> {
    let wait = |r: &SlotRow| r.end_ms.saturating_sub(now_ms).max(0);
    let busy = |reason, soonest_ms: i64| Busy {
        running: running.len(),
        reason,
        retry_after_secs: ((soonest_ms as f64) / 1000.0).ceil().max(1.0) as u64,
    };
    if running.len() >= max {
        let soonest = running.iter().map(wait).min().unwrap_or_default();
        return Err(busy(BusyReason::Limit, soonest));
    }
    let in_the_way: Vec<&SlotRow> = running
        .iter()
        .filter(|r| r.isolates.iter().any(|i| isolates.contains(i)))
        .collect();
    if in_the_way.is_empty() {
        return Ok(());
    }
    let mut shared: Vec<String> = isolates
        .iter()
        .filter(|i| in_the_way.iter().any(|r| r.isolates.contains(i)))
        .cloned()
        .collect();
    shared.sort();
    // All of them must end before every shared isolate is free.
    let latest = in_the_way.iter().map(|r| wait(r)).max().unwrap_or_default();
    Err(busy(BusyReason::Overlap(shared), latest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: &str, end_ms: i64, isolates: &[&str]) -> SlotRow {
        SlotRow {
            session_id: id.into(),
            end_ms,
            isolates: isolates.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn the_limit_and_the_overlap_refuse_with_the_wait() {
        let mine = vec!["m1/a".to_owned(), "m2/b".to_owned()];
        assert_eq!(admit(&[], &mine, 0, 1), Ok(()));
        let one = [slot("s1", 2_500, &["m3/c"])];
        assert_eq!(admit(&one, &mine, 0, 2), Ok(()));
        let full = admit(&one, &mine, 0, 1).unwrap_err();
        assert_eq!(
            (full.reason, full.retry_after_secs, full.running),
            (BusyReason::Limit, 3, 1)
        );
        let two = [
            slot("s1", 1_000, &["m2/b"]),
            slot("s2", 9_000, &["m1/a", "m9/z"]),
        ];
        let overlap = admit(&two, &mine, 0, 5).unwrap_err();
        assert_eq!(
            overlap.reason,
            BusyReason::Overlap(vec!["m1/a".into(), "m2/b".into()])
        );
        // Both must end: the later one's wait.
        assert_eq!(overlap.retry_after_secs, 9);
        // A slot about to end still asks for a second.
        let ending = [slot("s1", 10, &["m1/a"])];
        assert_eq!(admit(&ending, &mine, 0, 5).unwrap_err().retry_after_secs, 1);
    }
}
