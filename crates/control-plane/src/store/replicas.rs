//! What control-plane replicas on one database share: their liveness, the
//! capture slots (admission), and the fleet log (every registration and
//! heartbeat any replica received, in commit order).

use sqlx::Row;

use edgeprof_proto::rest::SessionStatus;

use super::rows::{OrphanRow, SlotDbRow};
use super::{Result, Store, StoreError, sql};

/// A capture holding a slot: its session, when it ends at the latest, and
/// the isolates it profiles (`machine/isolate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    /// Session id.
    pub session_id: String,
    /// Unix ms by which the capture ends at the latest.
    pub end_ms: i64,
    /// Isolates it profiles, `machine/isolate`.
    pub isolates: Vec<String>,
}

/// One entry of the fleet log.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LogEntry {
    /// Position in the log (commit order).
    pub seq: i64,
    /// The replica that received the call.
    pub replica_id: String,
    /// Unix ms when it received it.
    pub received_ms: i64,
    /// `register` or `heartbeat`.
    pub kind: String,
    /// The call's wire message.
    pub payload: Vec<u8>,
}

/// A session whose replica stopped while running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Session id.
    pub id: String,
    /// Its state when found.
    pub status: SessionStatus,
    /// The replica that ran it.
    pub replica_id: Option<String>,
    /// Unix ms of that replica's last sign of life, if it has a row.
    pub last_heartbeat_ms: Option<i64>,
}

const UNFINISHED: &str = "('pending', 'capturing', 'merging')";

impl Store {
    /// Records that replica `id` (started at `started_ms`) is alive at
    /// `now_ms`.
    pub async fn replica_alive(&self, id: &str, started_ms: i64, now_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO replicas (id, started_at_ms, heartbeat_ms) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET heartbeat_ms = $3",
        )
        .bind(id)
        .bind(started_ms)
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(sql(format!("record replica {id} alive")))?;
        Ok(())
    }

    /// Deletes the rows of replicas silent since before `cutoff_ms`.
    pub async fn forget_replicas_before(&self, cutoff_ms: i64) -> Result<u64> {
        let r = sqlx::query("DELETE FROM replicas WHERE heartbeat_ms < $1")
            .bind(cutoff_ms)
            .execute(&self.pool)
            .await
            .map_err(sql("forget stopped replicas"))?;
        Ok(r.rows_affected())
    }

    /// Unfinished sessions of replicas other than `me` that have been
    /// silent since before `cutoff_ms` (or have no row any more).
    pub async fn orphaned_sessions(&self, me: &str, cutoff_ms: i64) -> Result<Vec<Orphan>> {
        let rows: Vec<OrphanRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT s.id, s.status, s.replica_id, r.heartbeat_ms AS last_heartbeat_ms
             FROM capture_sessions s LEFT JOIN replicas r ON r.id = s.replica_id
             WHERE s.status IN {UNFINISHED}
               AND s.replica_id IS NOT NULL AND s.replica_id <> $1
               AND (r.heartbeat_ms IS NULL OR r.heartbeat_ms < $2)"
        )))
        .bind(me)
        .bind(cutoff_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(sql("find sessions of stopped replicas"))?;
        rows.into_iter()
            .map(|r| {
                Ok(Orphan {
                    status: r.status.parse().map_err(|_| {
                        StoreError::Corrupt(format!("session {} status `{}`", r.id, r.status))
                    })?,
                    id: r.id,
                    replica_id: r.replica_id,
                    last_heartbeat_ms: r.last_heartbeat_ms,
                })
            })
            .collect()
    }

    /// Takes a capture slot of `(account, script)` for `slot`, if `admit`
    /// (shown the slots running then, expired ones removed) says yes; the
    /// check and the insert are one transaction that no other replica's
    /// admission of the same script interleaves with.
    pub async fn take_capture_slot<E>(
        &self,
        (account, script): (&str, &str),
        replica_id: &str,
        slot: &SlotRow,
        now_ms: i64,
        admit: impl FnOnce(&[SlotRow]) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<(), E>> {
        let _w = self.write.lock().await;
        let context = format!("admit a capture of {account}/{script}");
        let mut tx = self.pool.begin().await.map_err(sql(context.clone()))?;
        // The script's counter row is the lock: its update waits for any
        // other admission of the script to commit.
        let lock = format!("capture_slots:{account}/{script}");
        sqlx::query(
            "INSERT INTO counters (name, value) VALUES ($1, 1)
             ON CONFLICT (name) DO UPDATE SET value = counters.value + 1",
        )
        .bind(&lock)
        .execute(&mut *tx)
        .await
        .map_err(sql(context.clone()))?;
        sqlx::query(
            "DELETE FROM capture_slots WHERE account_id = $1 AND script = $2 AND end_ms <= $3",
        )
        .bind(account)
        .bind(script)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(sql(context.clone()))?;
        let rows: Vec<SlotDbRow> = sqlx::query_as(
            "SELECT session_id, end_ms, isolates FROM capture_slots
             WHERE account_id = $1 AND script = $2 ORDER BY end_ms",
        )
        .bind(account)
        .bind(script)
        .fetch_all(&mut *tx)
        .await
        .map_err(sql(context.clone()))?;
        let running = rows
            .into_iter()
            .map(|r| {
                Ok(SlotRow {
                    isolates: serde_json::from_str(&r.isolates).map_err(|e| {
                        StoreError::Corrupt(format!(
                            "capture slot isolates of session {}: {e}",
                            r.session_id
                        ))
                    })?,
                    session_id: r.session_id,
                    end_ms: r.end_ms,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Err(refused) = admit(&running) {
            // Nothing written but the lock counter: let it go.
            tx.rollback().await.map_err(sql(context))?;
            return Ok(Err(refused));
        }
        sqlx::query(
            "INSERT INTO capture_slots (session_id, account_id, script, replica_id, end_ms, isolates)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&slot.session_id)
        .bind(account)
        .bind(script)
        .bind(replica_id)
        .bind(slot.end_ms)
        .bind(serde_json::to_string(&slot.isolates).unwrap_or_else(|_| "[]".into()))
        .execute(&mut *tx)
        .await
        .map_err(sql(context.clone()))?;
        tx.commit().await.map_err(sql(context))?;
        Ok(Ok(()))
    }

    /// Frees the capture slot of `session_id` (if it still holds one).
    pub async fn free_capture_slot(&self, session_id: &str) -> Result<()> {
        sqlx::query("DELETE FROM capture_slots WHERE session_id = $1")
            .bind(session_id)
            .execute(&self.pool)
            .await
            .map_err(sql(format!("free the capture slot of {session_id}")))?;
        Ok(())
    }

    /// Frees every slot of replica `replica_id` (it stopped).
    pub async fn free_capture_slots_of(&self, replica_id: &str) -> Result<u64> {
        let r = sqlx::query("DELETE FROM capture_slots WHERE replica_id = $1")
            .bind(replica_id)
            .execute(&self.pool)
            .await
            .map_err(sql(format!(
                "free the capture slots of replica {replica_id}"
            )))?;
        Ok(r.rows_affected())
    }

    /// Frees every capture slot (a single process starting: none of them
    /// can still be running).
    pub async fn free_all_capture_slots(&self) -> Result<u64> {
        let r = sqlx::query("DELETE FROM capture_slots")
            .execute(&self.pool)
            .await
            .map_err(sql("free the capture slots"))?;
        Ok(r.rows_affected())
    }

    /// Appends a call to the fleet log; its position. Appends commit in
    /// position order (the counter row is held until commit), so a reader
    /// that has seen position `n` never later finds one below it.
    pub async fn append_fleet_log(
        &self,
        replica_id: &str,
        received_ms: i64,
        kind: &str,
        payload: &[u8],
    ) -> Result<i64> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(sql("append to the fleet log"))?;
        let seq: i64 = sqlx::query(
            "INSERT INTO counters (name, value) VALUES ('fleet_log', 1)
             ON CONFLICT (name) DO UPDATE SET value = counters.value + 1
             RETURNING value",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(sql("number a fleet log entry"))?
        .try_get(0)
        .map_err(sql("number a fleet log entry"))?;
        sqlx::query(
            "INSERT INTO fleet_log (seq, replica_id, received_ms, kind, payload)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(seq)
        .bind(replica_id)
        .bind(received_ms)
        .bind(kind)
        .bind(payload.to_vec())
        .execute(&mut *tx)
        .await
        .map_err(sql("append to the fleet log"))?;
        tx.commit().await.map_err(sql("append to the fleet log"))?;
        Ok(seq)
    }

    /// At most `limit` fleet log entries after position `after`, in order.
    pub async fn fleet_log_after(&self, after: i64, limit: usize) -> Result<Vec<LogEntry>> {
        sqlx::query_as(
            "SELECT seq, replica_id, received_ms, kind, payload FROM fleet_log
             WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(sql("read the fleet log"))
    }

    /// Deletes at most `batch` fleet log entries received before
    /// `cutoff_ms`; how many.
    pub async fn trim_fleet_log(&self, cutoff_ms: i64, batch: usize) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM fleet_log WHERE seq IN
               (SELECT seq FROM fleet_log WHERE received_ms < $1 ORDER BY seq LIMIT $2)",
        )
        .bind(cutoff_ms)
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await
        .map_err(sql("trim the fleet log"))?;
        Ok(r.rows_affected())
    }
}
