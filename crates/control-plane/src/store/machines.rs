//! Machines as last registered, and Durable Object placements.

use sqlx::Row;

use super::rows::*;
use super::{Result, Store, StoreError, sql};

const MACHINE_COLUMNS: &str = "id, data_center, grpc_address, http_address, last_heartbeat_ms";

impl Store {
    /// Records a machine's registration or heartbeat.
    pub async fn upsert_machine(&self, m: &MachineRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO machines (id, data_center, grpc_address, http_address, registered_at_ms, last_heartbeat_ms)
             VALUES ($1, $2, $3, $4, $5, $5)
             ON CONFLICT (id) DO UPDATE SET data_center = excluded.data_center,
                grpc_address = excluded.grpc_address, http_address = excluded.http_address,
                last_heartbeat_ms = excluded.last_heartbeat_ms",
        )
        .bind(&m.id)
        .bind(&m.data_center)
        .bind(&m.grpc_address)
        .bind(&m.http_address)
        .bind(m.last_heartbeat_ms)
        .execute(&self.pool)
        .await
        .map_err(sql(format!("record machine {}", m.id)))?;
        Ok(())
    }

    /// Every machine ever registered.
    pub async fn machines(&self) -> Result<Vec<MachineRecord>> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MACHINE_COLUMNS} FROM machines ORDER BY id"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list machines"))
    }

    /// One machine as last recorded, if it ever registered.
    pub async fn machine(&self, id: &str) -> Result<Option<MachineRecord>> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MACHINE_COLUMNS} FROM machines WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("look up machine {id}")))
    }

    /// Where a Durable Object lives. Places it with `candidate` (machine,
    /// version) when it has no placement yet, or moves it there when
    /// `may_move(owner, owner's last recorded heartbeat in Unix ms)` says
    /// its owner lost it.
    ///
    /// Both writes are conditional (insert if absent; update only the
    /// placement that was read), so two control planes sharing a database
    /// agree on one winner: the loser reads the winner's placement.
    /// `now_ms` (Unix ms, the control plane's clock) stamps a new placement
    /// and marks the object seen.
    pub async fn place_durable_object(
        &self,
        key: &DurableObjectKey<'_>,
        candidate: (&str, &str),
        now_ms: i64,
        may_move: impl Fn(&str, Option<i64>) -> bool,
    ) -> Result<Placement> {
        let _w = self.write.lock().await;
        // Each round either returns or saw another writer win a race; a
        // third round would mean a writer racing us continuously.
        for _ in 0..3 {
            let current = self.placement(key).await?;
            let (now, updated) = match current {
                None => {
                    let now = now_ms;
                    let r = keyed(
                        "INSERT INTO durable_objects (account_id, script, namespace, object_id, machine_id, version_id, placed_at_ms, last_seen_ms)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
                         ON CONFLICT (account_id, script, namespace, object_id) DO NOTHING",
                        key,
                    )
                    .bind(candidate.0)
                    .bind(candidate.1)
                    .bind(now)
                    .execute(&self.pool)
                    .await
                    .map_err(sql("place a durable object"))?;
                    (now, r.rows_affected())
                }
                Some((p, owner_heartbeat_ms)) => {
                    if p.machine_id == candidate.0 {
                        // Its owner confirms it: seen now. Conditional on
                        // the placement read, so a placement reclaimed in
                        // between is placed again (next round).
                        if self.touch_placement(key, &p, now_ms).await? {
                            return Ok(p);
                        }
                        continue;
                    }
                    if !may_move(&p.machine_id, owner_heartbeat_ms) {
                        return Ok(p);
                    }
                    // Strictly later than the placement it replaces, so
                    // `placed_at_ms` identifies a placement.
                    let now = now_ms.max(p.placed_at_ms + 1);
                    let r = keyed(
                        "UPDATE durable_objects SET machine_id = $5, version_id = $6, placed_at_ms = $7, last_seen_ms = $7
                         WHERE account_id = $1 AND script = $2 AND namespace = $3 AND object_id = $4
                           AND machine_id = $8 AND placed_at_ms = $9",
                        key,
                    )
                    .bind(candidate.0)
                    .bind(candidate.1)
                    .bind(now)
                    .bind(&p.machine_id)
                    .bind(p.placed_at_ms)
                    .execute(&self.pool)
                    .await
                    .map_err(sql("move a durable object"))?;
                    (now, r.rows_affected())
                }
            };
            if updated == 1 {
                return Ok(Placement {
                    machine_id: candidate.0.to_owned(),
                    version_id: candidate.1.to_owned(),
                    placed_at_ms: now,
                    created: true,
                });
            }
        }
        Err(StoreError::Corrupt(format!(
            "durable object {}:{}: its placement kept changing under concurrent writers",
            key.namespace, key.object_id
        )))
    }

    /// Marks placement `p` of `key` as seen now; false if it is not there
    /// any more (reclaimed or moved since it was read).
    async fn touch_placement(
        &self,
        key: &DurableObjectKey<'_>,
        p: &Placement,
        now_ms: i64,
    ) -> Result<bool> {
        let r = keyed(
            "UPDATE durable_objects SET last_seen_ms = $7
             WHERE account_id = $1 AND script = $2 AND namespace = $3 AND object_id = $4
               AND machine_id = $5 AND placed_at_ms = $6",
            key,
        )
        .bind(&p.machine_id)
        .bind(p.placed_at_ms)
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(sql("confirm a durable object"))?;
        Ok(r.rows_affected() == 1)
    }

    /// The placement of a Durable Object and its owner's last recorded
    /// heartbeat (Unix ms; `None` if the owner never registered).
    async fn placement(
        &self,
        key: &DurableObjectKey<'_>,
    ) -> Result<Option<(Placement, Option<i64>)>> {
        let row: Option<PlacementRow> = sqlx::query_as(
            "SELECT d.machine_id, d.version_id, d.placed_at_ms, m.last_heartbeat_ms
             FROM durable_objects d LEFT JOIN machines m ON m.id = d.machine_id
             WHERE d.account_id = $1 AND d.script = $2 AND d.namespace = $3 AND d.object_id = $4",
        )
        .bind(key.account)
        .bind(key.script)
        .bind(key.namespace)
        .bind(key.object_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql("look up a durable object"))?;
        Ok(row.map(|r| {
            (
                Placement {
                    machine_id: r.machine_id,
                    version_id: r.version_id,
                    placed_at_ms: r.placed_at_ms,
                    created: false,
                },
                r.last_heartbeat_ms,
            )
        }))
    }

    /// Machine `machine_id` listed `objects` (namespace, id) of
    /// `account/script` in a heartbeat: when `seen_ms` is given, marks those
    /// placed on it as seen then; returns those placed on another machine.
    /// One statement of each kind per 500 objects, as both databases limit
    /// placeholders.
    pub async fn durable_objects_heard(
        &self,
        machine_id: &str,
        account: &str,
        script: &str,
        objects: &[(&str, &str)],
        seen_ms: Option<i64>,
    ) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for ids in objects.chunks(500) {
            // `object_id` alone selects: ids are 64 hex characters, so the
            // namespace is checked on the rows read, and a touch of a
            // same-id object in another namespace only keeps it longer.
            let placeholders: Vec<String> = (0..ids.len()).map(|i| format!("${}", i + 4)).collect();
            let list = placeholders.join(", ");
            if let Some(seen) = seen_ms {
                let text = format!(
                    "UPDATE durable_objects SET last_seen_ms = ${}
                     WHERE account_id = $1 AND script = $2 AND machine_id = $3 AND object_id IN ({list})
                       AND last_seen_ms < ${}",
                    ids.len() + 4,
                    ids.len() + 4
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(text))
                    .bind(account)
                    .bind(script)
                    .bind(machine_id);
                for (_, id) in ids {
                    q = q.bind(*id);
                }
                q.bind(seen)
                    .execute(&self.pool)
                    .await
                    .map_err(sql("mark durable objects seen"))?;
            }
            let text = format!(
                "SELECT namespace, object_id FROM durable_objects
                 WHERE account_id = $1 AND script = $2 AND machine_id <> $3 AND object_id IN ({list})"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text))
                .bind(account)
                .bind(script)
                .bind(machine_id);
            for (_, id) in ids {
                q = q.bind(*id);
            }
            let rows = q
                .fetch_all(&self.pool)
                .await
                .map_err(sql("look up durable objects placed elsewhere"))?;
            for r in rows {
                let e = || sql("read a placement");
                let namespace: String = r.try_get("namespace").map_err(e())?;
                let id: String = r.try_get("object_id").map_err(e())?;
                if ids.iter().any(|(n, i)| *n == namespace && *i == id) {
                    out.push((namespace, id));
                }
            }
        }
        Ok(out)
    }

    /// Marks every object placed on `machine_id` as seen at `seen_ms`: its
    /// heartbeat could not list them all.
    pub async fn durable_objects_all_seen(&self, machine_id: &str, seen_ms: i64) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE durable_objects SET last_seen_ms = $2 WHERE machine_id = $1 AND last_seen_ms < $2",
        )
        .bind(machine_id)
        .bind(seen_ms)
        .execute(&self.pool)
        .await
        .map_err(sql(format!("mark the durable objects of {machine_id} seen")))?;
        Ok(r.rows_affected())
    }

    /// Deletes at most `batch` placements last seen before `cutoff_ms`;
    /// how many it deleted. The age is checked again by the delete itself,
    /// so a placement confirmed meanwhile stays.
    pub async fn delete_durable_objects_unseen_before(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<u64> {
        let _w = self.write.lock().await;
        let r = sqlx::query(
            "DELETE FROM durable_objects WHERE last_seen_ms < $1
               AND (account_id, script, namespace, object_id) IN (
                 SELECT account_id, script, namespace, object_id FROM durable_objects
                 WHERE last_seen_ms < $1 ORDER BY last_seen_ms LIMIT $2)",
        )
        .bind(cutoff_ms)
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await
        .map_err(sql("reclaim unused durable object placements"))?;
        Ok(r.rows_affected())
    }

    /// How many Durable Objects are placed.
    pub async fn durable_object_count(&self) -> Result<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM durable_objects")
            .fetch_one(&self.pool)
            .await
            .map_err(sql("count durable objects"))
    }
}

/// Statement `text` with `key` bound as `$1`–`$4` (account, script,
/// namespace, object id).
fn keyed<'q>(
    text: &'static str,
    key: &DurableObjectKey<'q>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    sqlx::query(text)
        .bind(key.account)
        .bind(key.script)
        .bind(key.namespace)
        .bind(key.object_id)
}
