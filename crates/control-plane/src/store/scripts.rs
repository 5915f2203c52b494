//! Scripts, versions and deployments.

use sqlx::Row;

use edgeprof_proto::rest::DeploymentEntry;

use super::rows::*;
use super::{Result, Store, StoreError, now_ms, sha256_hex, sql};

impl Store {
    /// Scripts of an account, by name.
    pub async fn scripts(&self, account: &str) -> Result<Vec<ScriptRow>> {
        sqlx::query_as(
            "SELECT s.name, s.created_at_ms,
                    (SELECT COUNT(*) FROM script_versions v WHERE v.account_id = s.account_id AND v.script = s.name) AS versions
             FROM scripts s WHERE s.account_id = $1 ORDER BY s.name",
        )
        .bind(account)
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list scripts"))
    }

    /// Whether the account has this script.
    pub async fn script_exists(&self, account: &str, script: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM scripts WHERE account_id = $1 AND name = $2")
            .bind(account)
            .bind(script)
            .fetch_optional(&self.pool)
            .await
            .map_err(sql(format!("look up script {script}")))?;
        Ok(row.is_some())
    }

    /// Stores a new version (creating the script) and updates the
    /// deployment: without `weight` the new version takes all traffic; with
    /// `weight` N (0–100) it takes N % and the versions already deployed
    /// share the rest in proportion to their weights (N = 100 when none is).
    pub async fn add_version(
        &self,
        account: &str,
        script: &str,
        wasm: &[u8],
        weight: Option<u32>,
    ) -> Result<(ScriptVersion, Vec<DeploymentEntry>)> {
        let _w = self.write.lock().await;
        let now = now_ms();
        sqlx::query(
            "INSERT INTO scripts (account_id, name, created_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (account_id, name) DO NOTHING",
        )
        .bind(account)
        .bind(script)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(sql(format!("create script {script}")))?;
        let seq: i64 = sqlx::query(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM script_versions WHERE account_id = $1 AND script = $2",
        )
        .bind(account)
        .bind(script)
        .fetch_one(&self.pool)
        .await
        .map_err(sql("number the version"))?
        .try_get(0)
        .map_err(sql("number the version"))?;
        let version = ScriptVersion {
            id: uuid::Uuid::now_v7().to_string(),
            script: script.to_owned(),
            seq,
            created_at_ms: now,
            wasm_sha256: sha256_hex(wasm),
            wasm_bytes: wasm.len() as i64,
        };
        sqlx::query(
            "INSERT INTO script_versions (id, account_id, script, seq, created_at_ms, wasm, wasm_sha256)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&version.id)
        .bind(account)
        .bind(script)
        .bind(seq)
        .bind(now)
        .bind(wasm.to_vec())
        .bind(&version.wasm_sha256)
        .execute(&self.pool)
        .await
        .map_err(sql(format!("store a version of {script}")))?;

        let current = self.deployment(account, script).await?;
        let mut next = Vec::new();
        match weight {
            Some(w) if !current.is_empty() && w < 100 => {
                let rest = 100 - w;
                let total: u64 = current.iter().map(|d| u64::from(d.weight)).sum();
                for d in &current {
                    let share = (u64::from(d.weight) * u64::from(rest))
                        .checked_div(total)
                        .unwrap_or(0) as u32;
                    if share > 0 {
                        next.push(DeploymentEntry {
                            version_id: d.version_id.clone(),
                            weight: share,
                        });
                    }
                }
                if w > 0 {
                    next.push(DeploymentEntry {
                        version_id: version.id.clone(),
                        weight: w,
                    });
                }
            }
            Some(0) if !current.is_empty() => next = current,
            _ => next.push(DeploymentEntry {
                version_id: version.id.clone(),
                weight: 100,
            }),
        }
        self.write_deployment(account, script, &next).await?;
        Ok((version, next))
    }

    /// Versions of a script, newest first.
    pub async fn versions(&self, account: &str, script: &str) -> Result<Vec<ScriptVersion>> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM script_versions
             WHERE account_id = $1 AND script = $2 ORDER BY seq DESC"
        )))
        .bind(account)
        .bind(script)
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("list versions of {script}")))
    }

    /// Versions of a script whose id starts with `prefix` (lowercase hex and
    /// dashes only, checked by the caller).
    pub async fn versions_with_prefix(
        &self,
        account: &str,
        script: &str,
        prefix: &str,
    ) -> Result<Vec<ScriptVersion>> {
        debug_assert!(prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM script_versions
             WHERE account_id = $1 AND script = $2 AND id LIKE $3 ORDER BY seq DESC"
        )))
        .bind(account)
        .bind(script)
        .bind(format!("{prefix}%"))
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("find versions of {script}")))
    }

    /// A version and its wasm bytes, with the account that owns it.
    pub async fn version_wasm(
        &self,
        version_id: &str,
    ) -> Result<Option<(String, ScriptVersion, Vec<u8>)>> {
        #[derive(sqlx::FromRow)]
        struct WithWasm {
            #[sqlx(flatten)]
            version: ScriptVersion,
            account_id: String,
            wasm: Vec<u8>,
        }
        let row: Option<WithWasm> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS}, account_id, wasm FROM script_versions WHERE id = $1"
        )))
        .bind(version_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("read version {version_id}")))?;
        Ok(row.map(|r| (r.account_id, r.version, r.wasm)))
    }

    /// The deployment of a script, by weight then version.
    pub async fn deployment(&self, account: &str, script: &str) -> Result<Vec<DeploymentEntry>> {
        let rows: Vec<DeploymentRow> = sqlx::query_as(
            "SELECT d.version_id, d.weight FROM deployments d
             WHERE d.account_id = $1 AND d.script = $2 ORDER BY d.weight DESC, d.version_id",
        )
        .bind(account)
        .bind(script)
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("read the deployment of {script}")))?;
        rows.into_iter()
            .map(|r| {
                Ok(DeploymentEntry {
                    weight: weight(r.weight)?,
                    version_id: r.version_id,
                })
            })
            .collect()
    }

    /// Replaces the deployment of a script (versions must belong to it).
    pub async fn set_deployment(
        &self,
        account: &str,
        script: &str,
        entries: &[DeploymentEntry],
    ) -> Result<()> {
        let _w = self.write.lock().await;
        self.write_deployment(account, script, entries).await
    }

    async fn write_deployment(
        &self,
        account: &str,
        script: &str,
        entries: &[DeploymentEntry],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(sql("begin deployment"))?;
        sqlx::query("DELETE FROM deployments WHERE account_id = $1 AND script = $2")
            .bind(account)
            .bind(script)
            .execute(&mut *tx)
            .await
            .map_err(sql(format!("clear the deployment of {script}")))?;
        for e in entries {
            sqlx::query(
                "INSERT INTO deployments (account_id, script, version_id, weight) VALUES ($1, $2, $3, $4)",
            )
            .bind(account)
            .bind(script)
            .bind(&e.version_id)
            .bind(i64::from(e.weight))
            .execute(&mut *tx)
            .await
            .map_err(sql(format!("deploy {} of {script}", e.version_id)))?;
        }
        sqlx::query(
            "INSERT INTO counters (name, value) VALUES ('deployment_generation', 1)
             ON CONFLICT (name) DO UPDATE SET value = counters.value + 1",
        )
        .execute(&mut *tx)
        .await
        .map_err(sql("bump the deployment generation"))?;
        tx.commit().await.map_err(sql("commit deployment"))?;
        Ok(())
    }

    /// Deletes a version of a script unless it is deployed (has weight).
    pub async fn delete_version(
        &self,
        account: &str,
        script: &str,
        version_id: &str,
    ) -> Result<VersionDeletion> {
        let _w = self.write.lock().await;
        let deployed = self
            .deployment(account, script)
            .await?
            .into_iter()
            .find(|d| d.version_id == version_id && d.weight > 0);
        if let Some(d) = deployed {
            return Ok(VersionDeletion::Deployed(d.weight));
        }
        let r = sqlx::query(
            "DELETE FROM script_versions WHERE account_id = $1 AND script = $2 AND id = $3",
        )
        .bind(account)
        .bind(script)
        .bind(version_id)
        .execute(&self.pool)
        .await
        .map_err(sql(format!("delete version {version_id} of {script}")))?;
        Ok(if r.rows_affected() == 0 {
            VersionDeletion::NotFound
        } else {
            VersionDeletion::Deleted
        })
    }

    /// Bumped at every deployment change.
    pub async fn deployment_generation(&self) -> Result<u64> {
        let row = sqlx::query("SELECT value FROM counters WHERE name = 'deployment_generation'")
            .fetch_optional(&self.pool)
            .await
            .map_err(sql("read the deployment generation"))?;
        let v: i64 = match row {
            Some(r) => r
                .try_get(0)
                .map_err(sql("read the deployment generation"))?,
            None => 0,
        };
        Ok(v as u64)
    }

    /// Every script with a deployment, for agents.
    pub async fn all_deployments(&self) -> Result<Vec<DeployedScript>> {
        let rows: Vec<DeployedRow> = sqlx::query_as(
            "SELECT d.account_id, d.script, d.version_id, d.weight, v.wasm_sha256
             FROM deployments d JOIN script_versions v ON v.id = d.version_id
             ORDER BY d.account_id, d.script, d.weight DESC, d.version_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql("read deployments"))?;
        let mut out: Vec<DeployedScript> = Vec::new();
        for r in rows {
            let entry = (r.version_id, weight(r.weight)?, r.wasm_sha256);
            match out.last_mut() {
                Some(last) if last.account == r.account_id && last.script == r.script => {
                    last.versions.push(entry);
                }
                _ => out.push(DeployedScript {
                    account: r.account_id,
                    script: r.script,
                    versions: vec![entry],
                }),
            }
        }
        Ok(out)
    }
}

/// What [`Store::delete_version`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionDeletion {
    /// Deleted.
    Deleted,
    /// No such version of the script.
    NotFound,
    /// Refused: the version has this weight in the deployment.
    Deployed(u32),
}

fn weight(w: i64) -> Result<u32> {
    u32::try_from(w).map_err(|_| StoreError::Corrupt(format!("deployment weight {w}")))
}
