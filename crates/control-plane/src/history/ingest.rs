//! `Registry.PushWindows`: every window of a batch is checked on its own
//! (a refused one is named with its reason, the others stored), then the
//! accepted ones are stored in one transaction, idempotently, then handed to
//! the Pyroscope forwarder if there is one (those new to the store only).
//! A window that starts more than [`LEVEL0_AGE_MS`] before now is refused:
//! its minute may be compacted (`super::compact`).

use std::collections::HashMap;

use edgeprof_proto::rest::ProfileKind;
use edgeprof_proto::v1;

use super::compact::LEVEL0_AGE_MS;
use super::pyroscope::Forwarder;
use crate::fleet::Machine;
use crate::store::{NewWindow, Store, StoreError};
use crate::text::truncate;

/// Most windows one push carries; the rest of a larger batch is refused.
pub const MAX_WINDOWS_PER_PUSH: usize = 256;
/// Largest gzip'd pprof of one window.
pub const MAX_WINDOW_PPROF_BYTES: usize = 4 << 20;
/// Largest inflated pprof of one window.
pub const MAX_WINDOW_INFLATED_BYTES: u64 = 32 << 20;
/// Longest window (agents cut at most 5 min; compacted blocks are made here).
pub const MAX_WINDOW_MS: i64 = 10 * 60_000;
/// How far in the future a window may end (clock skew between machines).
pub const MAX_CLOCK_SKEW_MS: i64 = 5 * 60_000;
/// Longest name (account, script, version id) a window may carry.
const MAX_NAME_BYTES: usize = 128;

/// What a push stored and refused.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// Windows of the push now stored (stored before included).
    pub accepted: u32,
    /// `window N: reason` per refused window.
    pub rejected: Vec<String>,
}

/// The name of the sample type whose sum is a window's `value`: CPU
/// nanoseconds, or sampled bytes allocated (which add up over time, unlike
/// in-use bytes).
pub fn value_type(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Cpu => "cpu",
        ProfileKind::Heap => "alloc_space",
    }
}

/// Checks and stores `windows` from `machine`; `now_ms` bounds their ends.
/// The stored ones are handed to `forward` (which never waits).
pub async fn push(
    store: &Store,
    machine: &Machine,
    windows: Vec<v1::ProfileWindow>,
    now_ms: i64,
    forward: Option<&Forwarder>,
) -> Result<Pushed, StoreError> {
    let mut out = Pushed::default();
    let mut checked = Vec::new();
    // A push carries each version's CPU and heap windows, often of many
    // windows: each (account, script, version) is looked up once.
    let mut known = HashMap::new();
    for (i, w) in windows.into_iter().enumerate() {
        if i >= MAX_WINDOWS_PER_PUSH {
            out.rejected.push(format!(
                "window {i}: a push carries at most {MAX_WINDOWS_PER_PUSH} windows"
            ));
            continue;
        }
        match check(store, machine, w, now_ms, &mut known).await? {
            Ok(n) => checked.push(n),
            Err(reason) => out
                .rejected
                .push(format!("window {i}: {}", truncate(&reason, 512))),
        }
    }
    out.accepted = checked.len() as u32;
    // Copied before the store takes the blobs; only those new to the store
    // are handed off, so a push retried by an agent is not forwarded twice.
    let forwarded = forward.map(|f| (f, checked.clone()));
    let new = store.insert_windows_marked(checked).await?;
    if let Some((f, windows)) = forwarded {
        f.hand_off(
            windows
                .into_iter()
                .zip(new)
                .filter_map(|(w, new)| new.then_some(w))
                .collect(),
        );
    }
    Ok(out)
}

/// One window as a row to store, or why not.
async fn check(
    store: &Store,
    machine: &Machine,
    w: v1::ProfileWindow,
    now_ms: i64,
    known: &mut HashMap<(String, String, String), bool>,
) -> Result<Result<NewWindow, String>, StoreError> {
    let kind = match v1::ProfileKind::try_from(w.kind) {
        Ok(v1::ProfileKind::Cpu) => ProfileKind::Cpu,
        Ok(v1::ProfileKind::Heap) => ProfileKind::Heap,
        _ => return Ok(Err(format!("kind {}: must be cpu or heap", w.kind))),
    };
    for (field, v) in [
        ("account", &w.account),
        ("script", &w.script),
        ("version_id", &w.version_id),
    ] {
        if v.is_empty() || v.len() > MAX_NAME_BYTES {
            return Ok(Err(format!(
                "{field}: must be 1–{MAX_NAME_BYTES} bytes (got {})",
                v.len()
            )));
        }
    }
    let (start, end) = (w.start_unix_ms, w.end_unix_ms);
    if start <= 0 || end <= start || end - start > MAX_WINDOW_MS {
        return Ok(Err(format!(
            "start_unix_ms {start}, end_unix_ms {end}: the end must follow the start by at most {MAX_WINDOW_MS} ms"
        )));
    }
    if end > now_ms + MAX_CLOCK_SKEW_MS {
        return Ok(Err(format!(
            "end_unix_ms {end}: more than {MAX_CLOCK_SKEW_MS} ms after the control plane's clock ({now_ms})"
        )));
    }
    // Compaction makes a minute's block only after every window of it is
    // refused here, so a late window is never merged twice nor lost.
    if start < now_ms - LEVEL0_AGE_MS {
        return Ok(Err(format!(
            "start_unix_ms {start}: more than {} min before the control plane's clock ({now_ms}); \
             its minute may be compacted already, so windows older than that are refused",
            LEVEL0_AGE_MS / 60_000
        )));
    }
    if w.pprof.len() > MAX_WINDOW_PPROF_BYTES {
        return Ok(Err(format!(
            "pprof: {} bytes, at most {MAX_WINDOW_PPROF_BYTES} gzip'd",
            w.pprof.len()
        )));
    }
    let key = (w.account.clone(), w.script.clone(), w.version_id.clone());
    let exists = match known.get(&key) {
        Some(&b) => b,
        None => {
            let b = store
                .version_of_script(&w.account, &w.script, &w.version_id)
                .await?;
            known.insert(key, b);
            b
        }
    };
    if !exists {
        return Ok(Err(format!(
            "{}/{}: no version {} of this script in this account",
            w.account, w.script, w.version_id
        )));
    }
    let pprof = w.pprof;
    let decoded = tokio::task::spawn_blocking(move || {
        let value = summed_value(&pprof, kind);
        (pprof, value)
    })
    .await;
    let (pprof, value) = match decoded {
        Ok((pprof, Ok(value))) => (pprof, value),
        Ok((_, Err(reason))) => return Ok(Err(reason)),
        Err(e) => return Ok(Err(format!("pprof: cannot be read ({e})"))),
    };
    Ok(Ok(NewWindow {
        account: w.account,
        script: w.script,
        version_id: w.version_id,
        data_center: machine.data_center.clone(),
        machine_id: machine.id.clone(),
        kind,
        level: 0,
        start_ms: start,
        end_ms: end,
        samples: i64::try_from(w.samples).unwrap_or(i64::MAX),
        requests: i64::try_from(w.requests).unwrap_or(i64::MAX),
        value,
        bytes: pprof.len() as i64,
        pprof,
    }))
}

/// The sum of the kind's value type over the profile's samples, after a
/// bounded decode and validation.
fn summed_value(pprof: &[u8], kind: ProfileKind) -> Result<i64, String> {
    let p = super::decode_window(pprof).map_err(|e| format!("pprof: {e}"))?;
    edgeprof_pprof::validate(&p).map_err(|e| format!("pprof: {e}"))?;
    let name = value_type(kind);
    let index = p
        .sample_type
        .iter()
        .position(|t| edgeprof_pprof::string(&p, t.r#type) == name)
        .ok_or_else(|| format!("pprof: no `{name}` sample type, as a {kind} window needs"))?;
    Ok(p.sample
        .iter()
        .filter_map(|s| s.value.get(index))
        .fold(0i64, |a, v| a.saturating_add(*v)))
}
