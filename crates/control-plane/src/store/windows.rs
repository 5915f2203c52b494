//! Continuous-profiling windows: stored once per (machine, account, script,
//! version, kind, level, start) — a retried batch is a no-op — read by
//! range through the index columns (timelines, query bounds) or with their
//! blobs (merged profiles, `crate::api::history`), and deleted by age in
//! batches. Compaction (`crate::history::compact`) lists the blocks to
//! make from the index columns, reads one block's sources, and replaces
//! them with the block in one transaction that stores the block only if
//! none has its key and deletes exactly the sources it read, or changes
//! nothing — so replicas compacting at once never lose or double-count a
//! window, on SQLite and PostgreSQL alike. `level` is 0 for a window as an
//! agent sent it, 1 and 2 for 1 min and 10 min blocks.

use futures_util::StreamExt;
use sqlx::Row;

use edgeprof_proto::rest::ProfileKind;

use super::{Result, Store, sql};

/// A window to store (as an agent sent it, or a compacted block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWindow {
    /// Owning account.
    pub account: String,
    /// Script.
    pub script: String,
    /// Version id.
    pub version_id: String,
    /// Data center of the machine.
    pub data_center: String,
    /// Machine that profiled it.
    pub machine_id: String,
    /// CPU or heap.
    pub kind: ProfileKind,
    /// 0 as sent; 1, 2 compacted.
    pub level: i64,
    /// Unix ms, inclusive.
    pub start_ms: i64,
    /// Unix ms, exclusive.
    pub end_ms: i64,
    /// Samples taken.
    pub samples: i64,
    /// Requests begun in it.
    pub requests: i64,
    /// Sum of the primary sample value.
    pub value: i64,
    /// Stored (gzip'd) size of the profile.
    pub bytes: i64,
    /// The gzip'd pprof.
    pub pprof: Vec<u8>,
}

/// A stored window with its blob, as queries and compaction read it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct WindowBlob {
    /// Version id.
    pub version_id: String,
    /// Data center.
    pub data_center: String,
    /// Machine.
    pub machine_id: String,
    /// Compaction level.
    pub level: i64,
    /// Unix ms.
    pub start_ms: i64,
    /// Unix ms.
    pub end_ms: i64,
    /// Samples.
    pub samples: i64,
    /// Requests.
    pub requests: i64,
    /// Primary value.
    pub value: i64,
    /// Stored (gzip'd) size.
    pub bytes: i64,
    /// The gzip'd pprof.
    pub pprof: Vec<u8>,
}

/// Which windows a query covers: those of one script and kind whose start
/// is in `[from_ms, to_ms)`, optionally of one version, data center or
/// machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowFilter<'a> {
    /// Account.
    pub account: &'a str,
    /// Script.
    pub script: &'a str,
    /// Kind.
    pub kind: ProfileKind,
    /// Unix ms, inclusive.
    pub from_ms: i64,
    /// Unix ms, exclusive.
    pub to_ms: i64,
    /// Only this version id.
    pub version_id: Option<&'a str>,
    /// Only this data center.
    pub data_center: Option<&'a str>,
    /// Only this machine.
    pub machine_id: Option<&'a str>,
}

impl WindowFilter<'_> {
    /// `WHERE …` with placeholders from `$1`, and the values to bind.
    fn clause(&self) -> (String, Vec<String>) {
        let mut text = String::from(
            "account_id = $1 AND script = $2 AND kind = $3 AND start_ms >= $4 AND start_ms < $5",
        );
        let mut strings = Vec::new();
        for (column, v) in [
            ("version_id", self.version_id),
            ("data_center", self.data_center),
            ("machine_id", self.machine_id),
        ] {
            if let Some(v) = v {
                strings.push(v.to_owned());
                text.push_str(&format!(" AND {column} = ${}", 5 + strings.len()));
            }
        }
        (text, strings)
    }
}

/// What a timeline step sums.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TimelineRow {
    /// The group's value (or `all`).
    pub key: String,
    /// Steps since the range's start.
    pub step: i64,
    /// Summed values.
    pub value: i64,
    /// Summed requests.
    pub requests: i64,
}

/// Column a timeline groups by (constants only: they are spliced into SQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineColumn {
    /// One series.
    All,
    /// Per version id.
    Version,
    /// Per data center.
    DataCenter,
    /// Per machine.
    Machine,
}

impl TimelineColumn {
    fn sql(self) -> &'static str {
        match self {
            TimelineColumn::All => "CAST('all' AS TEXT)",
            TimelineColumn::Version => "version_id",
            TimelineColumn::DataCenter => "data_center",
            TimelineColumn::Machine => "machine_id",
        }
    }
}

const BLOB_COLUMNS: &str = "version_id, data_center, machine_id, level, start_ms, end_ms, samples, requests, value, bytes, pprof";

fn bind_filter<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    f: &WindowFilter<'_>,
    strings: Vec<String>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    q = q
        .bind(f.account.to_owned())
        .bind(f.script.to_owned())
        .bind(f.kind.as_str())
        .bind(f.from_ms)
        .bind(f.to_ms);
    for s in strings {
        q = q.bind(s);
    }
    q
}

/// Stores a window unless one with its key is stored already.
const INSERT: &str = "INSERT INTO profile_windows
    (account_id, script, version_id, data_center, machine_id, kind, level, start_ms, end_ms,
     samples, requests, value, bytes, pprof)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
    ON CONFLICT DO NOTHING";

/// The insert of `w`, which it consumes (the blob is moved, not copied).
fn insert_query(w: NewWindow) -> sqlx::query::Query<'static, sqlx::Any, sqlx::any::AnyArguments> {
    sqlx::query(INSERT)
        .bind(w.account)
        .bind(w.script)
        .bind(w.version_id)
        .bind(w.data_center)
        .bind(w.machine_id)
        .bind(w.kind.as_str())
        .bind(w.level)
        .bind(w.start_ms)
        .bind(w.end_ms)
        .bind(w.samples)
        .bind(w.requests)
        .bind(w.value)
        .bind(w.bytes)
        .bind(w.pprof)
}

impl Store {
    /// Whether `version_id` is a version of `account`'s `script`.
    pub async fn version_of_script(
        &self,
        account: &str,
        script: &str,
        version_id: &str,
    ) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 FROM script_versions WHERE account_id = $1 AND script = $2 AND id = $3",
        )
        .bind(account)
        .bind(script)
        .bind(version_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("look up version {version_id}")))?;
        Ok(row.is_some())
    }

    /// Stores windows, skipping any already stored (same machine, account,
    /// script, version, kind, level and start); how many were new.
    pub async fn insert_windows(&self, windows: Vec<NewWindow>) -> Result<u64> {
        let new = self.insert_windows_marked(windows).await?;
        Ok(new.iter().filter(|n| **n).count() as u64)
    }

    /// As [`Store::insert_windows`]; per window, whether it was new.
    pub async fn insert_windows_marked(&self, windows: Vec<NewWindow>) -> Result<Vec<bool>> {
        if windows.is_empty() {
            return Ok(Vec::new());
        }
        let _w = self.write.lock().await;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(sql("begin storing windows"))?;
        let mut stored = Vec::with_capacity(windows.len());
        for w in windows {
            let rows = insert_query(w)
                .execute(&mut *tx)
                .await
                .map_err(sql("store a profile window"))?
                .rows_affected();
            stored.push(rows > 0);
        }
        tx.commit().await.map_err(sql("commit profile windows"))?;
        Ok(stored)
    }

    /// How many windows `filter` covers and their stored (gzip'd) bytes,
    /// from the index columns only.
    pub async fn window_totals(&self, filter: &WindowFilter<'_>) -> Result<(i64, i64)> {
        let (clause, strings) = filter.clause();
        let text = format!(
            "SELECT CAST(COUNT(*) AS BIGINT), CAST(COALESCE(SUM(bytes), 0) AS BIGINT)
             FROM profile_windows WHERE {clause}"
        );
        let row = bind_filter(sqlx::query(sqlx::AssertSqlSafe(text)), filter, strings)
            .fetch_one(&self.pool)
            .await
            .map_err(sql("count profile windows"))?;
        let get = |i| {
            row.try_get::<i64, _>(i)
                .map_err(sql("count profile windows"))
        };
        Ok((get(0)?, get(1)?))
    }

    /// Calls `each` with every window `filter` covers, blob included, one
    /// at a time as the database sends them (oldest first), awaiting each
    /// call before reading the next row (so a slow consumer holds at most
    /// one blob here); stops at the first error `each` returns.
    pub async fn for_each_window<E, F>(
        &self,
        filter: &WindowFilter<'_>,
        mut each: impl FnMut(WindowBlob) -> F,
    ) -> Result<std::result::Result<(), E>>
    where
        F: std::future::Future<Output = std::result::Result<(), E>>,
    {
        let (clause, strings) = filter.clause();
        let text = format!(
            "SELECT {BLOB_COLUMNS} FROM profile_windows WHERE {clause}
             ORDER BY start_ms, machine_id, version_id, level"
        );
        let q = bind_filter(sqlx::query(sqlx::AssertSqlSafe(text)), filter, strings);
        let mut rows = q.fetch(&self.pool);
        while let Some(row) = rows.next().await {
            let row = row.map_err(sql("read profile windows"))?;
            let w: WindowBlob =
                sqlx::FromRow::from_row(&row).map_err(sql("read a profile window"))?;
            if let Err(e) = each(w).await {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Values and requests of the windows `filter` covers, summed per
    /// `step_ms` from its start and per `group`, from the index columns;
    /// at most `limit` rows (ordered by key, then step).
    pub async fn window_timeline(
        &self,
        filter: &WindowFilter<'_>,
        group: TimelineColumn,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<TimelineRow>> {
        let (clause, strings) = filter.clause();
        let text = format!(
            "SELECT {key} AS key, CAST((start_ms - {from}) / {step_ms} AS BIGINT) AS step,
                    CAST(SUM(value) AS BIGINT) AS value, CAST(SUM(requests) AS BIGINT) AS requests
             FROM profile_windows WHERE {clause} GROUP BY 1, 2 ORDER BY 1, 2 LIMIT {limit}",
            key = group.sql(),
            from = filter.from_ms,
            limit = i64::try_from(limit).unwrap_or(i64::MAX),
        );
        let q = bind_filter(sqlx::query(sqlx::AssertSqlSafe(text)), filter, strings);
        let rows = q
            .fetch_all(&self.pool)
            .await
            .map_err(sql("sum profile windows"))?;
        rows.iter()
            .map(|r| sqlx::FromRow::from_row(r).map_err(sql("read a timeline row")))
            .collect()
    }

    /// Deletes up to `batch` windows that ended before `cutoff_ms`, oldest
    /// first; call again until it deletes fewer than `batch`.
    pub async fn delete_windows_before(&self, cutoff_ms: i64, batch: usize) -> Result<u64> {
        let _w = self.write.lock().await;
        let n = sqlx::query(
            "DELETE FROM profile_windows
             WHERE (machine_id, account_id, script, version_id, kind, level, start_ms) IN (
                SELECT machine_id, account_id, script, version_id, kind, level, start_ms
                FROM profile_windows WHERE end_ms < $1 ORDER BY end_ms LIMIT $2)",
        )
        .bind(cutoff_ms)
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await
        .map_err(sql("delete expired profile windows"))?
        .rows_affected();
        Ok(n)
    }
}

/// A block compaction may make: the windows of one series (account,
/// script, version, data center, machine, kind) at `level` whose start is
/// in `[start_ms, start_ms + size_ms)`, merged into one at `level + 1`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BlockKey {
    /// Account.
    pub account_id: String,
    /// Script.
    pub script: String,
    /// Version id.
    pub version_id: String,
    /// Data center.
    pub data_center: String,
    /// Machine.
    pub machine_id: String,
    /// `cpu` or `heap`, as stored.
    pub kind: String,
    /// Level of the sources.
    pub level: i64,
    /// The block's start: a multiple of `size_ms`.
    pub start_ms: i64,
    /// The block's length.
    pub size_ms: i64,
}

/// A source of a block as compaction reads it: its key's start and its
/// counts and blob.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SourceWindow {
    /// Unix ms (with the block's series and level, the window's key).
    pub start_ms: i64,
    /// Samples.
    pub samples: i64,
    /// Requests.
    pub requests: i64,
    /// Primary value.
    pub value: i64,
    /// The gzip'd pprof.
    pub pprof: Vec<u8>,
}

/// What [`Store::replace_with_block`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    /// The block is stored and its sources deleted.
    Done,
    /// Nothing changed: another compaction made this block first, or a
    /// source was deleted meanwhile (by another compaction or retention).
    Raced,
}

impl Store {
    /// Up to `limit` blocks of `size_ms` whose level-`level` windows all
    /// started before `before_ms` (a multiple of `size_ms` is not needed:
    /// only blocks ending by it are listed) and that are not made yet,
    /// oldest first, from the index columns.
    pub async fn compaction_candidates(
        &self,
        level: i64,
        size_ms: i64,
        before_ms: i64,
        limit: usize,
    ) -> Result<Vec<BlockKey>> {
        // A block is listed once its end is at or before `before_ms`; one
        // already made (a source left behind, e.g. unreadable) is not, nor
        // one with windows of a lower level left in its range (being
        // compacted now, or unreadable): it would miss them.
        let last_start = before_ms.div_euclid(size_ms) * size_ms;
        let text = format!(
            "SELECT w.account_id, w.script, w.version_id, w.data_center, w.machine_id, w.kind,
                    w.level, (w.start_ms / {size_ms}) * {size_ms} AS start_ms,
                    CAST({size_ms} AS BIGINT) AS size_ms
             FROM profile_windows w
             WHERE w.level = $1 AND w.start_ms < $2
               AND NOT EXISTS (SELECT 1 FROM profile_windows b
                   WHERE b.machine_id = w.machine_id AND b.account_id = w.account_id
                     AND b.script = w.script AND b.version_id = w.version_id
                     AND b.kind = w.kind AND b.level = $1 + 1
                     AND b.start_ms = (w.start_ms / {size_ms}) * {size_ms})
               AND NOT EXISTS (SELECT 1 FROM profile_windows s
                   WHERE s.machine_id = w.machine_id AND s.account_id = w.account_id
                     AND s.script = w.script AND s.version_id = w.version_id
                     AND s.kind = w.kind AND s.level < $1
                     AND s.start_ms >= (w.start_ms / {size_ms}) * {size_ms}
                     AND s.start_ms < (w.start_ms / {size_ms}) * {size_ms} + {size_ms})
             GROUP BY 1, 2, 3, 4, 5, 6, 7, 8
             ORDER BY 8, 5, 1, 2, 3, 6
             LIMIT {limit}",
            limit = i64::try_from(limit).unwrap_or(i64::MAX),
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(text))
            .bind(level)
            .bind(last_start)
            .fetch_all(&self.pool)
            .await
            .map_err(sql("list blocks to compact"))?;
        rows.iter()
            .map(|r| sqlx::FromRow::from_row(r).map_err(sql("read a block to compact")))
            .collect()
    }

    /// The sources of `block`, oldest first, at most `limit` (read one
    /// more to know whether there are more).
    pub async fn block_sources(&self, block: &BlockKey, limit: usize) -> Result<Vec<SourceWindow>> {
        let rows = sqlx::query(
            "SELECT start_ms, samples, requests, value, pprof FROM profile_windows
             WHERE machine_id = $1 AND account_id = $2 AND script = $3 AND version_id = $4
               AND kind = $5 AND level = $6 AND data_center = $7
               AND start_ms >= $8 AND start_ms < $9
             ORDER BY start_ms LIMIT $10",
        )
        .bind(block.machine_id.as_str())
        .bind(block.account_id.as_str())
        .bind(block.script.as_str())
        .bind(block.version_id.as_str())
        .bind(block.kind.as_str())
        .bind(block.level)
        .bind(block.data_center.as_str())
        .bind(block.start_ms)
        .bind(block.start_ms + block.size_ms)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(sql("read the windows of a block"))?;
        rows.iter()
            .map(|r| sqlx::FromRow::from_row(r).map_err(sql("read a window of a block")))
            .collect()
    }

    /// In one transaction: stores `block` (unless one with its key is
    /// stored) and deletes the sources of `key` starting at `sources`, all
    /// or nothing. If the block was stored already, or a source is gone,
    /// it rolls back: then another compaction made this block from the
    /// same sources, or retention took one, and nothing is counted twice.
    pub async fn replace_with_block(
        &self,
        key: &BlockKey,
        block: NewWindow,
        sources: &[i64],
    ) -> Result<Replaced> {
        let _w = self.write.lock().await;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(sql("begin storing a compacted block"))?;
        let made = insert_query(block)
            .execute(&mut *tx)
            .await
            .map_err(sql("store a compacted block"))?
            .rows_affected();
        if made == 0 {
            tx.rollback()
                .await
                .map_err(sql("roll back a compacted block"))?;
            return Ok(Replaced::Raced);
        }
        for &start in sources {
            let n = sqlx::query(
                "DELETE FROM profile_windows
                 WHERE machine_id = $1 AND account_id = $2 AND script = $3 AND version_id = $4
                   AND kind = $5 AND level = $6 AND start_ms = $7",
            )
            .bind(key.machine_id.as_str())
            .bind(key.account_id.as_str())
            .bind(key.script.as_str())
            .bind(key.version_id.as_str())
            .bind(key.kind.as_str())
            .bind(key.level)
            .bind(start)
            .execute(&mut *tx)
            .await
            .map_err(sql("delete a compacted window"))?
            .rows_affected();
            if n != 1 {
                tx.rollback()
                    .await
                    .map_err(sql("roll back a compacted block"))?;
                return Ok(Replaced::Raced);
            }
        }
        tx.commit().await.map_err(sql("commit a compacted block"))?;
        Ok(Replaced::Done)
    }

    /// How many windows are stored at each level (level, count), for
    /// tests and operators.
    pub async fn windows_per_level(&self) -> Result<Vec<(i64, i64)>> {
        let rows = sqlx::query(
            "SELECT level, CAST(COUNT(*) AS BIGINT) FROM profile_windows GROUP BY level ORDER BY level",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql("count windows per level"))?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get(0).map_err(sql("count windows per level"))?,
                    r.try_get(1).map_err(sql("count windows per level"))?,
                ))
            })
            .collect()
    }
}
