//! Compaction: old windows merged into coarser blocks per series (account,
//! script, version, data center, machine, kind) so a long query reads a
//! bounded number of blobs. Level 0 (windows as agents send them) becomes
//! level 1 (blocks of [`LEVEL1_BLOCK_MS`], aligned to the minute) once a
//! block ended [`LEVEL0_AGE_MS`] plus [`REPLICA_CLOCK_SKEW_MS`] ago; level 1
//! becomes level 2 (blocks of [`LEVEL2_BLOCK_MS`]) after [`LEVEL1_AGE_MS`].
//!
//! A block's samples, requests and value are its sources' sums, its blob
//! their merge (labels kept, one summed `requests: N` comment), its bounds
//! the aligned block's. Each block replaces exactly the sources it was
//! made from in one transaction ([`Store::replace_with_block`]): with
//! several replicas compacting at once, the one that stores a block first
//! wins and the others roll back, so no window is lost or counted twice.
//!
//! Ingest refuses level-0 windows that start more than [`LEVEL0_AGE_MS`]
//! ago ([`crate::history::ingest`]), so no window can arrive for a block
//! compaction may already have made (replicas' clocks may differ by up to
//! [`REPLICA_CLOCK_SKEW_MS`]).
//!
//! A source whose blob no longer decodes is left out of its block and left
//! where it is (logged, not deleted): queries skip and name it as before,
//! and retention deletes it by age. A block made once is not made again,
//! so such a source is not read on every pass; while it stays, the 10 min
//! block over it is not made (it would have to leave it out of its range
//! too), so that range stays at 1 min blocks until retention.
//!
//! A pass makes at most [`MAX_BLOCKS_PER_PASS`] blocks of each level, one
//! at a time, each from at most [`MAX_SOURCES_PER_BLOCK`] sources (a block
//! with more is skipped and logged), so it holds bounded memory.

use edgeprof_proto::rest::ProfileKind;

use crate::store::{BlockKey, NewWindow, Replaced, SourceWindow, Store, StoreError};

/// Age at which level-0 windows are compacted, and beyond which ingest
/// refuses a window (by its start).
pub const LEVEL0_AGE_MS: i64 = 3_600_000;
/// Length of a level-1 block.
pub const LEVEL1_BLOCK_MS: i64 = 60_000;
/// Age at which level-1 blocks are compacted.
pub const LEVEL1_AGE_MS: i64 = 24 * 3_600_000;
/// Length of a level-2 block.
pub const LEVEL2_BLOCK_MS: i64 = 10 * 60_000;
/// How far the clocks of replicas (and so of ingest and compaction) may
/// differ: compaction waits this much longer than ingest accepts.
pub const REPLICA_CLOCK_SKEW_MS: i64 = 5 * 60_000;
/// Most blocks of each level one pass makes.
pub const MAX_BLOCKS_PER_PASS: usize = 2_000;
/// Most sources one block is made of (a 1 min block of 10 s windows has
/// 6; a 10 min block of 1 min blocks 10).
pub const MAX_SOURCES_PER_BLOCK: usize = 64;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Blocks stored.
    pub blocks: u64,
    /// Source windows they replaced.
    pub sources: u64,
    /// Blocks another replica made first (or whose sources changed).
    pub raced: u64,
    /// Sources left out because their blob no longer decodes.
    pub unreadable: u64,
}

/// One compaction pass at `now_ms`: level 0 → 1, then level 1 → 2.
pub async fn compact(store: &Store, now_ms: i64) -> Result<Compacted, StoreError> {
    let mut total = Compacted::default();
    for (level, size, age) in [
        (0, LEVEL1_BLOCK_MS, LEVEL0_AGE_MS + REPLICA_CLOCK_SKEW_MS),
        (1, LEVEL2_BLOCK_MS, LEVEL1_AGE_MS),
    ] {
        let blocks = store
            .compaction_candidates(level, size, now_ms - age, MAX_BLOCKS_PER_PASS)
            .await?;
        for key in blocks {
            compact_block(store, &key, &mut total).await?;
            tokio::task::yield_now().await;
        }
    }
    Ok(total)
}

async fn compact_block(
    store: &Store,
    key: &BlockKey,
    total: &mut Compacted,
) -> Result<(), StoreError> {
    let sources = store.block_sources(key, MAX_SOURCES_PER_BLOCK + 1).await?;
    if sources.is_empty() {
        // Another replica compacted it since it was listed.
        return Ok(());
    }
    if sources.len() > MAX_SOURCES_PER_BLOCK {
        tracing::warn!(
            "compaction: block of {}/{} version {} on {} at {} ms has more than \
             {MAX_SOURCES_PER_BLOCK} level-{} windows; left as they are",
            key.account_id,
            key.script,
            key.version_id,
            key.machine_id,
            key.start_ms,
            key.level
        );
        return Ok(());
    }
    let kind: ProfileKind = key
        .kind
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("profile window kind `{}`: {e}", key.kind)))?;
    let describe = format!(
        "{}/{} version {} on {}",
        key.account_id, key.script, key.version_id, key.machine_id
    );
    let merged = tokio::task::spawn_blocking(move || merge(sources, &describe))
        .await
        .map_err(|e| StoreError::Corrupt(format!("compaction merge: {e}")))?;
    total.unreadable += merged.unreadable;
    let Some(block) = merged.block else {
        return Ok(());
    };
    let sources = merged.merged;
    let new = NewWindow {
        account: key.account_id.clone(),
        script: key.script.clone(),
        version_id: key.version_id.clone(),
        data_center: key.data_center.clone(),
        machine_id: key.machine_id.clone(),
        kind,
        level: key.level + 1,
        start_ms: key.start_ms,
        end_ms: key.start_ms + key.size_ms,
        samples: block.samples,
        requests: block.requests,
        value: block.value,
        bytes: block.pprof.len() as i64,
        pprof: block.pprof,
    };
    match store.replace_with_block(key, new, &sources).await? {
        Replaced::Done => {
            total.blocks += 1;
            total.sources += sources.len() as u64;
        }
        Replaced::Raced => total.raced += 1,
    }
    Ok(())
}

struct Sums {
    samples: i64,
    requests: i64,
    value: i64,
    pprof: Vec<u8>,
}

struct Merge {
    /// `None` when no source could be merged.
    block: Option<Sums>,
    /// Starts of the sources merged (the ones to delete).
    merged: Vec<i64>,
    unreadable: u64,
}

/// Merges the sources that decode (labels kept as they are: queries add
/// data center and machine) into one gzip'd pprof with one summed
/// `requests: N`.
fn merge(sources: Vec<SourceWindow>, describe: &str) -> Merge {
    let mut merger = edgeprof_pprof::Merger::new();
    let mut sums = Sums {
        samples: 0,
        requests: 0,
        value: 0,
        pprof: Vec::new(),
    };
    let mut merged = Vec::new();
    let mut unreadable = 0;
    for s in sources {
        let added = super::decode_window(&s.pprof)
            .map_err(|e| e.to_string())
            .and_then(|p| merger.add(&p).map_err(|e| e.to_string()));
        match added {
            Ok(()) => {
                merged.push(s.start_ms);
                sums.samples = sums.samples.saturating_add(s.samples);
                sums.requests = sums.requests.saturating_add(s.requests);
                sums.value = sums.value.saturating_add(s.value);
            }
            Err(e) => {
                unreadable += 1;
                tracing::warn!(
                    "compaction: window of {describe} at {} ms left uncompacted: {e}",
                    s.start_ms
                );
            }
        }
    }
    if merged.is_empty() {
        return Merge {
            block: None,
            merged,
            unreadable,
        };
    }
    let mut profile = match merger.finish() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("compaction: block of {describe} not made: {e}");
            return Merge {
                block: None,
                merged: Vec::new(),
                unreadable,
            };
        }
    };
    super::set_requests_comment(&mut profile, u64::try_from(sums.requests).unwrap_or(0));
    sums.pprof = edgeprof_pprof::encode(&profile);
    Merge {
        block: Some(sums),
        merged,
        unreadable,
    }
}
