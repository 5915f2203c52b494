//! Continuous profiling's history: windows agents push (`ingest`), checked
//! and stored through `store::windows`, and merged into coarser blocks as
//! they age (`compact`: 10 s windows → 1 min blocks after an hour → 10 min
//! blocks after a day), and optionally forwarded to Grafana
//! Pyroscope (`pyroscope`). What the query merge and compaction share — how a
//! stored blob is decoded and how a merge says its requests — is here.
//!
//! Rank 3 of the module order (beside `capture`): it uses `store` and
//! `fleet`; `registry`, `api` and the housekeeping task call it.

pub mod compact;
pub mod ingest;
pub mod pyroscope;

use edgeprof_pprof::Profile;

/// Decodes a stored window's (or block's) gzip'd pprof within the limit
/// ingest checked it against.
pub fn decode_window(pprof: &[u8]) -> Result<Profile, edgeprof_pprof::DecodeError> {
    edgeprof_pprof::decode_with_limit(pprof, ingest::MAX_WINDOW_INFLATED_BYTES)
}

/// Replaces the `requests: N` comments a merge collected (one per source)
/// with one saying their sum.
pub fn set_requests_comment(merged: &mut Profile, requests: u64) {
    let comments = std::mem::take(&mut merged.comment);
    merged.comment = comments
        .into_iter()
        .filter(|&c| !edgeprof_pprof::string(merged, c).starts_with("requests: "))
        .collect();
    edgeprof_pprof::add_comment(merged, &format!("requests: {requests}"));
}
