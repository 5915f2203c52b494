//! One window boundary: every isolate's continuous captures are cut
//! (`rotate`; `stop` for an isolate whose thread ended), merged per
//! (account, script, version) and kind, each sample labelled with its
//! `isolate` (and `durable_object`), and encoded. Runs on a blocking thread:
//! the sampler symbolizes inside `rotate`, and merging and gzip are CPU work.

use std::collections::BTreeMap;
use std::sync::Arc;

use edgeprof_proto::v1;
use edgeprof_sampler::{CaptureOwner, CaptureResult, ProfileKind};

use crate::hosting::Slot;

/// Largest gzip'd pprof of one window; a larger one is dropped and counted.
pub const MAX_WINDOW_PPROF_BYTES: usize = 4 << 20;

/// What one boundary produced.
#[derive(Debug, Default)]
pub struct Collected {
    /// Windows with samples or requests.
    pub windows: Vec<v1::ProfileWindow>,
    /// Windows over [`MAX_WINDOW_PPROF_BYTES`], dropped.
    pub oversized: u64,
}

/// (account, script, version, kind).
type GroupKey = (String, String, String, i32);

/// Cuts the window `[start_ms, end_ms)` from `live` isolates (their
/// captures keep running) and from `departed` ones (their captures end).
pub fn collect(
    live: &[Arc<Slot>],
    departed: &[Arc<Slot>],
    start_ms: i64,
    end_ms: i64,
) -> Collected {
    let mut groups: BTreeMap<GroupKey, Vec<(&Slot, CaptureResult)>> = BTreeMap::new();
    let cut = live
        .iter()
        .map(|s| (s, true))
        .chain(departed.iter().map(|s| (s, false)));
    for (slot, keep) in cut {
        let Some(profiler) = slot.profiler() else {
            continue;
        };
        for (kind, wire) in [
            (ProfileKind::Cpu, v1::ProfileKind::Cpu),
            (ProfileKind::Heap, v1::ProfileKind::Heap),
        ] {
            let result = if keep {
                profiler.rotate(kind)
            } else {
                profiler.stop_for(CaptureOwner::Continuous, kind)
            };
            // Not running (it failed to start, or was taken already).
            let Ok(r) = result else { continue };
            if r.samples == 0 && r.requests == 0 {
                continue;
            }
            let key = (
                slot.key.account.clone(),
                slot.key.script.clone(),
                slot.version_id.clone(),
                wire as i32,
            );
            groups.entry(key).or_default().push((slot, r));
        }
    }
    let mut out = Collected::default();
    for ((account, script, version_id, kind), captures) in groups {
        let mut merger = edgeprof_pprof::Merger::new();
        let (mut samples, mut requests) = (0u64, 0u64);
        for (slot, r) in &captures {
            let object = slot.durable_object.as_ref().map(|o| o.wire());
            let mut labels = vec![("isolate", slot.id.as_str())];
            if let Some(o) = &object {
                labels.push(("durable_object", o.as_str()));
            }
            if let Err(e) = merger.add_labeled(&r.profile, &labels) {
                tracing::warn!(isolate = %slot.id, "continuous window of {script} (account {account}) cannot merge: {e}");
                continue;
            }
            samples += r.samples;
            requests += r.requests;
        }
        let Ok(mut profile) = merger.finish() else {
            continue;
        };
        edgeprof_pprof::add_comment(&mut profile, &format!("requests: {requests}"));
        let pprof = edgeprof_pprof::encode(&profile);
        if pprof.len() > MAX_WINDOW_PPROF_BYTES {
            tracing::warn!(
                "continuous window of {script} version {version_id} (account {account}) dropped: its pprof is {} bytes, over the bound of {MAX_WINDOW_PPROF_BYTES}",
                pprof.len()
            );
            out.oversized += 1;
            continue;
        }
        out.windows.push(v1::ProfileWindow {
            account,
            script,
            version_id,
            kind,
            start_unix_ms: start_ms,
            end_unix_ms: end_ms,
            pprof,
            samples,
            requests,
        });
    }
    out
}
