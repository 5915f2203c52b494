//! Capture sessions, their state changes and profiles, and retention.

use sqlx::Row;

use edgeprof_proto::rest::SessionStatus;

use super::rows::*;
use super::{Result, Store, now_ms, sha256_hex, sql};

/// Most sessions one retention batch deletes.
pub const RETENTION_BATCH: usize = 500;

impl Store {
    /// Stores a new session and its first event.
    pub async fn create_session(&self, s: &SessionRow) -> Result<()> {
        self.create_session_on(s, None).await
    }

    /// Stores a new session run by control-plane replica `replica_id`, and
    /// its first event.
    pub async fn create_session_on(&self, s: &SessionRow, replica_id: Option<&str>) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(sql("begin a session"))?;
        sqlx::query(
            "INSERT INTO capture_sessions (id, account_id, script, version_id, version_selector, kind,
                duration_ms, data_center, durable_object, status, error, targets_json, failures_json,
                machines_total, machines_answered, created_at_ms, updated_at_ms, requests, replica_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        )
        .bind(&s.id)
        .bind(&s.account)
        .bind(&s.script)
        .bind(&s.version_id)
        .bind(&s.version_selector)
        .bind(s.kind.as_str())
        .bind(s.duration_ms)
        .bind(s.data_center.clone())
        .bind(s.durable_object.clone())
        .bind(s.status.as_str())
        .bind(s.error.clone())
        .bind(&s.targets_json)
        .bind(&s.failures_json)
        .bind(s.machines_total)
        .bind(s.machines_answered)
        .bind(s.created_at_ms)
        .bind(s.updated_at_ms)
        .bind(s.requests)
        .bind(replica_id.map(str::to_owned))
        .execute(&mut *tx)
        .await
        .map_err(sql(format!("create session {}", s.id)))?;
        Self::add_event(&mut tx, &s.id, s.status, s.created_at_ms, None).await?;
        tx.commit()
            .await
            .map_err(sql(format!("commit session {}", s.id)))
    }

    async fn add_event(
        conn: &mut sqlx::AnyConnection,
        id: &str,
        status: SessionStatus,
        at: i64,
        detail: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO capture_session_events (session_id, seq, status, at_ms, detail)
             VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM capture_session_events WHERE session_id = $1), $2, $3, $4)",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(at)
        .bind(detail.map(str::to_owned))
        .execute(conn)
        .await
        .map_err(sql(format!("record a state change of session {id}")))?;
        Ok(())
    }

    /// Moves a session to `status`, recording the change; a session that
    /// has ended (`done`, `partial`, `failed`) keeps its state, so a replica
    /// declared stopped that comes back cannot overwrite the `failed` the
    /// others recorded. Whether the session changed.
    pub async fn set_session_status(
        &self,
        id: &str,
        status: SessionStatus,
        error: Option<&str>,
        detail: Option<&str>,
    ) -> Result<bool> {
        let now = now_ms();
        // The state and its event are written together, so a crash never
        // leaves one without the other.
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(sql("begin a state change"))?;
        let changed = sqlx::query(
            "UPDATE capture_sessions SET status = $2, error = COALESCE($3, error), updated_at_ms = $4
             WHERE id = $1 AND status IN ('pending', 'capturing', 'merging')",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(error.map(str::to_owned))
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(sql(format!("update session {id}")))?
        .rows_affected()
            > 0;
        if !changed {
            tx.rollback()
                .await
                .map_err(sql(format!("end a state change of session {id}")))?;
            return Ok(false);
        }
        Self::add_event(&mut tx, id, status, now, detail.or(error)).await?;
        tx.commit()
            .await
            .map_err(sql(format!("commit a state change of session {id}")))?;
        Ok(true)
    }

    /// Records how many machines answered and what failed so far.
    pub async fn set_session_progress(
        &self,
        id: &str,
        answered: i64,
        failures_json: &str,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE capture_sessions SET machines_answered = $2, failures_json = $3, updated_at_ms = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(answered)
        .bind(failures_json)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(sql(format!("update progress of session {id}")))?;
        Ok(())
    }

    /// Records the requests served during a session's capture.
    pub async fn set_session_requests(&self, id: &str, requests: i64) -> Result<()> {
        sqlx::query("UPDATE capture_sessions SET requests = $2 WHERE id = $1")
            .bind(id)
            .bind(requests)
            .execute(&self.pool)
            .await
            .map_err(sql(format!("record the requests of session {id}")))?;
        Ok(())
    }

    /// A session of an account.
    pub async fn session(&self, account: &str, id: &str) -> Result<Option<SessionRow>> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM capture_sessions WHERE account_id = $1 AND id = $2"
        )))
        .bind(account)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("read session {id}")))
    }

    /// Sessions of an account, newest first.
    pub async fn sessions(
        &self,
        account: &str,
        script: Option<&str>,
        limit: i64,
    ) -> Result<Vec<SessionRow>> {
        // Only constants are spliced in.
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM capture_sessions
             WHERE account_id = $1 AND ($2 = '' OR script = $2)
             ORDER BY created_at_ms DESC, id DESC LIMIT $3"
        )))
        .bind(account)
        .bind(script.unwrap_or("").to_owned())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list sessions"))
    }

    /// State changes of a session, oldest first.
    pub async fn session_events(&self, id: &str) -> Result<Vec<SessionEvent>> {
        sqlx::query_as(
            "SELECT status, at_ms, detail FROM capture_session_events WHERE session_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("read events of session {id}")))
    }

    /// Marks sessions left unfinished by a previous process as failed;
    /// returns their ids. With `only_unowned`, only those no replica owns
    /// (started by a build before replicas): on a database several
    /// replicas share, the others' sessions are theirs until they stop.
    pub async fn fail_interrupted_sessions(&self, only_unowned: bool) -> Result<Vec<String>> {
        #[derive(sqlx::FromRow)]
        struct Unfinished {
            id: String,
            #[sqlx(try_from = "String")]
            status: SessionStatus,
        }
        let rows: Vec<Unfinished> = sqlx::query_as(
            if only_unowned {
                "SELECT id, status FROM capture_sessions
                 WHERE status IN ('pending', 'capturing', 'merging') AND replica_id IS NULL"
            } else {
                "SELECT id, status FROM capture_sessions WHERE status IN ('pending', 'capturing', 'merging')"
            },
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql("find interrupted sessions"))?;
        let mut ids = Vec::new();
        for r in rows {
            let reason = format!(
                "interrupted: the control plane restarted while the session was {}",
                r.status
            );
            if self
                .set_session_status(&r.id, SessionStatus::Failed, Some(&reason), None)
                .await?
            {
                ids.push(r.id);
            }
        }
        Ok(ids)
    }

    /// Stores the merged profile of a session.
    pub async fn store_profile(&self, session_id: &str, pprof: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO profiles (session_id, pprof, sha256, created_at_ms) VALUES ($1, $2, $3, $4)",
        )
        .bind(session_id)
        .bind(pprof.to_vec())
        .bind(sha256_hex(pprof))
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(sql(format!("store the profile of session {session_id}")))?;
        Ok(())
    }

    /// The merged profile of a session, if it has one.
    pub async fn profile(&self, session_id: &str) -> Result<Option<Vec<u8>>> {
        let row = sqlx::query("SELECT pprof FROM profiles WHERE session_id = $1")
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(sql(format!("read the profile of session {session_id}")))?;
        row.map(|r| r.try_get(0).map_err(sql("read a profile")))
            .transpose()
    }

    /// Deletes up to `batch` finished sessions created before `cutoff_ms`
    /// (Unix ms), with their events and profiles, oldest first; call again
    /// until it deletes fewer than `batch`.
    pub async fn delete_sessions_before(&self, cutoff_ms: i64, batch: usize) -> Result<Deleted> {
        let ids: Vec<(String,)> = sqlx::query_as(
            "SELECT id FROM capture_sessions
             WHERE created_at_ms < $1 AND status IN ('done', 'partial', 'failed')
             ORDER BY created_at_ms LIMIT $2",
        )
        .bind(cutoff_ms)
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(sql("find expired sessions"))?;
        if ids.is_empty() {
            return Ok(Deleted::default());
        }
        let placeholders: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
        let list = placeholders.join(", ");
        let mut tx = self.pool.begin().await.map_err(sql("begin retention"))?;
        let mut deleted = Deleted::default();
        for (table, column) in [
            ("profiles", "session_id"),
            ("capture_session_events", "session_id"),
            ("capture_sessions", "id"),
        ] {
            // Only constants and placeholders are spliced in.
            let text = format!("DELETE FROM {table} WHERE {column} IN ({list})");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
            for (id,) in &ids {
                q = q.bind(id);
            }
            let n = q
                .execute(&mut *tx)
                .await
                .map_err(sql(format!("delete expired rows of {table}")))?
                .rows_affected();
            match table {
                "profiles" => deleted.profiles = n,
                "capture_sessions" => deleted.sessions = n,
                _ => {}
            }
        }
        tx.commit().await.map_err(sql("commit retention"))?;
        Ok(deleted)
    }
}
