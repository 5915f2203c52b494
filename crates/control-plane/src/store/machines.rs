//! Machines as last registered, and Durable Object placements.

use sqlx::Row;

use super::rows::*;
use super::{Result, Store, StoreError, now_ms, sql};

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
    pub async fn place_durable_object(
        &self,
        key: &DurableObjectKey<'_>,
        candidate: (&str, &str),
        may_move: impl Fn(&str, Option<i64>) -> bool,
    ) -> Result<Placement> {
        let _w = self.write.lock().await;
        // Each round either returns or saw another writer win a race; a
        // third round would mean a writer racing us continuously.
        for _ in 0..3 {
            let current = self.placement(key).await?;
            let (now, updated) = match current {
                None => {
                    let now = now_ms();
                    let r = sqlx::query(
                        "INSERT INTO durable_objects (account_id, script, namespace, object_id, machine_id, version_id, placed_at_ms)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)
                         ON CONFLICT (account_id, script, namespace, object_id) DO NOTHING",
                    )
                    .bind(key.account)
                    .bind(key.script)
                    .bind(key.namespace)
                    .bind(key.object_id)
                    .bind(candidate.0)
                    .bind(candidate.1)
                    .bind(now)
                    .execute(&self.pool)
                    .await
                    .map_err(sql("place a durable object"))?;
                    (now, r.rows_affected())
                }
                Some((p, owner_heartbeat_ms)) => {
                    if !may_move(&p.machine_id, owner_heartbeat_ms) {
                        return Ok(p);
                    }
                    // Strictly later than the placement it replaces, so
                    // `placed_at_ms` identifies a placement.
                    let now = now_ms().max(p.placed_at_ms + 1);
                    let r = sqlx::query(
                        "UPDATE durable_objects SET machine_id = $5, version_id = $6, placed_at_ms = $7
                         WHERE account_id = $1 AND script = $2 AND namespace = $3 AND object_id = $4
                           AND machine_id = $8 AND placed_at_ms = $9",
                    )
                    .bind(key.account)
                    .bind(key.script)
                    .bind(key.namespace)
                    .bind(key.object_id)
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

    /// Of `objects` (`namespace:id` of `account/script`), those placed on
    /// a machine other than `machine_id`.
    pub async fn durable_objects_elsewhere(
        &self,
        machine_id: &str,
        account: &str,
        script: &str,
        objects: &[&str],
    ) -> Result<Vec<String>> {
        let mut out = Vec::new();
        // Bounded statements: both SQLite and PostgreSQL limit placeholders.
        for chunk in objects.chunks(500) {
            let ids: Vec<(&str, &str)> = chunk.iter().filter_map(|o| o.split_once(':')).collect();
            if ids.is_empty() {
                continue;
            }
            let placeholders: Vec<String> = (0..ids.len()).map(|i| format!("${}", i + 4)).collect();
            let text = format!(
                "SELECT namespace, object_id FROM durable_objects
                 WHERE account_id = $1 AND script = $2 AND machine_id <> $3 AND object_id IN ({})",
                placeholders.join(", ")
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text))
                .bind(account)
                .bind(script)
                .bind(machine_id);
            for (_, id) in &ids {
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
                    out.push(format!("{namespace}:{id}"));
                }
            }
        }
        Ok(out)
    }
}
