//! Persistent state: accounts, tokens, scripts, versions, deployments,
//! machines, Durable Object placements, capture sessions and their profiles.
//!
//! One set of migrations and one set of SQL statements serve both embedded
//! SQLite (a file, the default) and PostgreSQL (a `postgres://` URL), through
//! `sqlx::Any`. The SQL therefore sticks to what both dialects share: `$N`
//! placeholders, `BIGINT`/`TEXT`/`BYTEA` columns (times are Unix
//! milliseconds), `ON CONFLICT … DO UPDATE` and no booleans.

use std::path::Path;

use sha2::{Digest, Sha256};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use tokio::sync::Mutex;

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL or path is not usable.
    #[error("database `{url}`: {reason}")]
    Config {
        /// The URL as given (password removed).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The database refused or failed an operation.
    #[error("database: {context}: {source}")]
    Sql {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// A row holds a value this version cannot read.
    #[error("database: {0}")]
    Corrupt(String),
}

type Result<T> = std::result::Result<T, StoreError>;

fn sql(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Sql { context, source }
}

/// Which database engine backs the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file.
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// Migrations, applied in order; each one's index + 1 is its version.
/// Never edit an applied migration: append a new one.
const MIGRATIONS: &[&[&str]] = &[
    INITIAL_SCHEMA,
    // Requests the profiled isolates began during the capture (NULL: not known).
    &["ALTER TABLE capture_sessions ADD COLUMN requests BIGINT"],
];

/// Migration 1.
const INITIAL_SCHEMA: &[&str] = &[
    "CREATE TABLE accounts (
        id TEXT PRIMARY KEY,
        created_at_ms BIGINT NOT NULL)",
    "CREATE TABLE api_tokens (
        token_sha256 TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id),
        created_at_ms BIGINT NOT NULL)",
    "CREATE TABLE scripts (
        account_id TEXT NOT NULL REFERENCES accounts(id),
        name TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        PRIMARY KEY (account_id, name))",
    "CREATE TABLE script_versions (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        script TEXT NOT NULL,
        seq BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        wasm BYTEA NOT NULL,
        wasm_sha256 TEXT NOT NULL,
        FOREIGN KEY (account_id, script) REFERENCES scripts(account_id, name))",
    "CREATE INDEX script_versions_by_script ON script_versions (account_id, script, seq)",
    "CREATE TABLE deployments (
        account_id TEXT NOT NULL,
        script TEXT NOT NULL,
        version_id TEXT NOT NULL REFERENCES script_versions(id),
        weight BIGINT NOT NULL,
        PRIMARY KEY (account_id, script, version_id))",
    "CREATE TABLE counters (
        name TEXT PRIMARY KEY,
        value BIGINT NOT NULL)",
    "CREATE TABLE machines (
        id TEXT PRIMARY KEY,
        data_center TEXT NOT NULL,
        grpc_address TEXT NOT NULL,
        http_address TEXT NOT NULL,
        registered_at_ms BIGINT NOT NULL,
        last_heartbeat_ms BIGINT NOT NULL)",
    "CREATE TABLE durable_objects (
        account_id TEXT NOT NULL,
        script TEXT NOT NULL,
        namespace TEXT NOT NULL,
        object_id TEXT NOT NULL,
        machine_id TEXT NOT NULL,
        version_id TEXT NOT NULL,
        placed_at_ms BIGINT NOT NULL,
        PRIMARY KEY (account_id, script, namespace, object_id))",
    "CREATE TABLE capture_sessions (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        script TEXT NOT NULL,
        version_id TEXT NOT NULL,
        version_selector TEXT NOT NULL,
        kind TEXT NOT NULL,
        duration_ms BIGINT NOT NULL,
        data_center TEXT,
        durable_object TEXT,
        status TEXT NOT NULL,
        error TEXT,
        targets_json TEXT NOT NULL,
        failures_json TEXT NOT NULL,
        machines_total BIGINT NOT NULL,
        machines_answered BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL)",
    "CREATE INDEX capture_sessions_by_account ON capture_sessions (account_id, created_at_ms)",
    "CREATE TABLE capture_session_events (
        session_id TEXT NOT NULL REFERENCES capture_sessions(id),
        seq BIGINT NOT NULL,
        status TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        detail TEXT,
        PRIMARY KEY (session_id, seq))",
    "CREATE TABLE profiles (
        session_id TEXT PRIMARY KEY REFERENCES capture_sessions(id),
        pprof BYTEA NOT NULL,
        sha256 TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL)",
];

/// A stored script version (without its wasm bytes).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScriptVersion {
    /// UUID.
    pub id: String,
    /// Owning script.
    pub script: String,
    /// 1 for the script's first version, then counting up.
    pub seq: i64,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Hex SHA-256 of the wasm bytes.
    pub wasm_sha256: String,
    /// Size of the wasm bytes.
    pub wasm_bytes: i64,
}

/// One version's share of a script's traffic.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeploymentEntry {
    /// Version id.
    pub version_id: String,
    /// Weight against the script's other deployed versions.
    pub weight: u32,
}

/// A script with its deployment, as agents fetch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployedScript {
    /// Owning account.
    pub account: String,
    /// Script name.
    pub script: String,
    /// `(version, weight, wasm sha256)`.
    pub versions: Vec<(String, u32, String)>,
}

/// A script of an account.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScriptSummary {
    /// Script name.
    pub name: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Number of versions uploaded.
    pub versions: i64,
}

/// A machine as last registered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MachineRecord {
    /// Machine id.
    pub id: String,
    /// Data center code.
    pub data_center: String,
    /// host:port of its NodeAgent service.
    pub grpc_address: String,
    /// Base URL of its HTTP ingress.
    pub http_address: String,
    /// Unix milliseconds of its last heartbeat.
    pub last_heartbeat_ms: i64,
}

/// Which Durable Object: `namespace:object_id` of `account/script`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableObjectKey<'a> {
    /// Owning account.
    pub account: &'a str,
    /// Script implementing it.
    pub script: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// 64 lowercase hex characters.
    pub object_id: &'a str,
}

/// Where a Durable Object lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Owning machine.
    pub machine_id: String,
    /// Version it runs.
    pub version_id: String,
    /// When it was placed on that machine (Unix ms); strictly increases
    /// with every new placement of the object, so it names the placement.
    pub placed_at_ms: i64,
    /// Whether this call created the placement.
    pub created: bool,
}

/// A capture session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// Session id (UUID).
    pub id: String,
    /// Owning account.
    pub account: String,
    /// Script profiled.
    pub script: String,
    /// Resolved version id.
    pub version_id: String,
    /// The selector as asked (`latest`, id or prefix).
    pub version_selector: String,
    /// `cpu` or `heap`.
    pub kind: String,
    /// Capture duration.
    pub duration_ms: i64,
    /// Data-center filter, if any.
    pub data_center: Option<String>,
    /// `namespace:id` of the profiled Durable Object, if any.
    pub durable_object: Option<String>,
    /// `pending`, `capturing`, `merging`, `done`, `partial` or `failed`.
    pub status: String,
    /// Why the session failed, if it did.
    pub error: Option<String>,
    /// JSON array of the targets.
    pub targets_json: String,
    /// JSON array of machine/isolate failures.
    pub failures_json: String,
    /// Machines asked.
    pub machines_total: i64,
    /// Machines that answered (successfully or not).
    pub machines_answered: i64,
    /// Requests the isolates in the merged profile began while it was
    /// captured; `None` until merged, or if an agent did not report them.
    pub requests: Option<i64>,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Unix milliseconds of the last change.
    pub updated_at_ms: i64,
}

/// One state change of a session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SessionEvent {
    /// The state entered.
    pub status: String,
    /// Unix milliseconds.
    pub at_ms: i64,
    /// Why, when there is something to say.
    pub detail: Option<String>,
}

/// The database, migrated and ready.
#[derive(Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    // Serializes this process's read-modify-write sequences (deploys,
    // placements), which SQLite could otherwise fail with SQLITE_BUSY.
    write: Mutex<()>,
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn redact(url: &str) -> String {
    // postgres://user:password@host → postgres://user:***@host
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((creds, host)) = rest.split_once('@')
        && let Some((user, _)) = creds.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_owned()
}

/// Turns a database setting into a sqlx URL: `postgres://…` and
/// `sqlite:…` pass through; anything else is a SQLite file path, created if
/// missing.
pub fn database_url(setting: &str) -> std::result::Result<(String, Backend), StoreError> {
    if setting.starts_with("postgres://") || setting.starts_with("postgresql://") {
        return Ok((setting.to_owned(), Backend::Postgres));
    }
    if setting.starts_with("sqlite:") {
        return Ok((setting.to_owned(), Backend::Sqlite));
    }
    if setting.contains("://") {
        return Err(StoreError::Config {
            url: redact(setting),
            reason: "unsupported scheme; use a SQLite file path or a postgres:// URL".into(),
        });
    }
    if setting.is_empty() {
        return Err(StoreError::Config {
            url: String::new(),
            reason: "empty path".into(),
        });
    }
    if setting.contains('?') || setting.contains('#') {
        return Err(StoreError::Config {
            url: setting.to_owned(),
            reason: "a SQLite path must not contain `?` or `#`".into(),
        });
    }
    Ok((format!("sqlite://{setting}?mode=rwc"), Backend::Sqlite))
}

impl Store {
    /// Opens (creating a SQLite file if needed) and migrates the database.
    pub async fn open(setting: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (url, backend) = database_url(setting)?;
        if backend == Backend::Sqlite && !setting.starts_with("sqlite:") {
            let parent = Path::new(setting).parent();
            if let Some(parent) = parent.filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| StoreError::Config {
                    url: setting.to_owned(),
                    reason: format!("cannot create directory {}: {e}", parent.display()),
                })?;
            }
        }
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 4 } else { 8 })
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(&url)
            .await
            .map_err(|e| StoreError::Config {
                url: redact(setting),
                reason: format!("cannot connect: {e}"),
            })?;
        if backend == Backend::Sqlite {
            sqlx::query("PRAGMA journal_mode=WAL")
                .fetch_all(&pool)
                .await
                .map_err(sql("enable WAL"))?;
        }
        let store = Store {
            pool,
            backend,
            write: Mutex::new(()),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Which engine this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    async fn migrate(&self) -> Result<()> {
        let _w = self.write.lock().await;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS edgeprof_migrations (
                version BIGINT PRIMARY KEY,
                applied_at_ms BIGINT NOT NULL)",
        )
        .execute(&self.pool)
        .await
        .map_err(sql("create the migrations table"))?;
        let applied: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) FROM edgeprof_migrations")
            .fetch_one(&self.pool)
            .await
            .map_err(sql("read the schema version"))?
            .try_get(0)
            .map_err(sql("read the schema version"))?;
        if applied > MIGRATIONS.len() as i64 {
            return Err(StoreError::Corrupt(format!(
                "the schema is at version {applied} but this build knows only {}; run a newer edgeprof-control-plane",
                MIGRATIONS.len()
            )));
        }
        for (i, statements) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
            let version = i as i64 + 1;
            let mut tx = self.pool.begin().await.map_err(sql("begin migration"))?;
            for s in *statements {
                sqlx::query(*s)
                    .execute(&mut *tx)
                    .await
                    .map_err(sql(format!("migration {version}")))?;
            }
            sqlx::query("INSERT INTO edgeprof_migrations (version, applied_at_ms) VALUES ($1, $2)")
                .bind(version)
                .bind(now_ms())
                .execute(&mut *tx)
                .await
                .map_err(sql(format!("record migration {version}")))?;
            tx.commit()
                .await
                .map_err(sql(format!("commit migration {version}")))?;
        }
        Ok(())
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .fetch_one(&self.pool)
            .await
            .map_err(sql("ping"))?;
        Ok(())
    }

    // ---- accounts and tokens ----

    /// Creates the account if it does not exist.
    pub async fn ensure_account(&self, account: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO accounts (id, created_at_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        )
        .bind(account)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(sql(format!("create account {account}")))?;
        Ok(())
    }

    /// Stores the hash of `token` as a token of `account` (which must exist).
    pub async fn add_token(&self, account: &str, token: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_tokens (token_sha256, account_id, created_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (token_sha256) DO NOTHING",
        )
        .bind(sha256_hex(token.as_bytes()))
        .bind(account)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(sql(format!("store a token of account {account}")))?;
        Ok(())
    }

    /// Creates a fresh random token for `account` (creating the account)
    /// and returns it; only its hash is stored.
    pub async fn create_token(&self, account: &str) -> Result<String> {
        self.ensure_account(account).await?;
        let token = format!("edp_{}", hex::encode(rand::random::<[u8; 24]>()));
        self.add_token(account, &token).await?;
        Ok(token)
    }

    /// The account a token belongs to.
    pub async fn token_account(&self, token: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT account_id FROM api_tokens WHERE token_sha256 = $1")
            .bind(sha256_hex(token.as_bytes()))
            .fetch_optional(&self.pool)
            .await
            .map_err(sql("look up a token"))?;
        row.map(|r| r.try_get::<String, _>(0).map_err(sql("read a token")))
            .transpose()
    }

    // ---- scripts, versions, deployments ----

    /// Scripts of an account, by name.
    pub async fn scripts(&self, account: &str) -> Result<Vec<ScriptSummary>> {
        let rows = sqlx::query(
            "SELECT s.name, s.created_at_ms,
                    (SELECT COUNT(*) FROM script_versions v WHERE v.account_id = s.account_id AND v.script = s.name)
             FROM scripts s WHERE s.account_id = $1 ORDER BY s.name",
        )
        .bind(account)
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list scripts"))?;
        rows.iter()
            .map(|r| {
                Ok(ScriptSummary {
                    name: r.try_get(0).map_err(sql("read a script"))?,
                    created_at_ms: r.try_get(1).map_err(sql("read a script"))?,
                    versions: r.try_get(2).map_err(sql("read a script"))?,
                })
            })
            .collect()
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
        let rows = sqlx::query(
            "SELECT id, script, seq, created_at_ms, wasm_sha256, CAST(LENGTH(wasm) AS BIGINT) FROM script_versions
             WHERE account_id = $1 AND script = $2 ORDER BY seq DESC",
        )
        .bind(account)
        .bind(script)
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("list versions of {script}")))?;
        rows.iter().map(version_row).collect()
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
        let rows = sqlx::query(
            "SELECT id, script, seq, created_at_ms, wasm_sha256, CAST(LENGTH(wasm) AS BIGINT) FROM script_versions
             WHERE account_id = $1 AND script = $2 AND id LIKE $3 ORDER BY seq DESC",
        )
        .bind(account)
        .bind(script)
        .bind(format!("{prefix}%"))
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("find versions of {script}")))?;
        rows.iter().map(version_row).collect()
    }

    /// A version and its wasm bytes, with the account that owns it.
    pub async fn version_wasm(
        &self,
        version_id: &str,
    ) -> Result<Option<(String, ScriptVersion, Vec<u8>)>> {
        let row = sqlx::query(
            "SELECT id, script, seq, created_at_ms, wasm_sha256, CAST(LENGTH(wasm) AS BIGINT), account_id, wasm
             FROM script_versions WHERE id = $1",
        )
        .bind(version_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("read version {version_id}")))?;
        let Some(r) = row else { return Ok(None) };
        let v = version_row(&r)?;
        let account: String = r.try_get(6).map_err(sql("read a version"))?;
        let wasm: Vec<u8> = r.try_get(7).map_err(sql("read a version"))?;
        Ok(Some((account, v, wasm)))
    }

    /// The deployment of a script, by weight then version.
    pub async fn deployment(&self, account: &str, script: &str) -> Result<Vec<DeploymentEntry>> {
        let rows = sqlx::query(
            "SELECT d.version_id, d.weight FROM deployments d
             WHERE d.account_id = $1 AND d.script = $2 ORDER BY d.weight DESC, d.version_id",
        )
        .bind(account)
        .bind(script)
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("read the deployment of {script}")))?;
        rows.iter()
            .map(|r| {
                let weight: i64 = r.try_get(1).map_err(sql("read a deployment"))?;
                Ok(DeploymentEntry {
                    version_id: r.try_get(0).map_err(sql("read a deployment"))?,
                    weight: u32::try_from(weight)
                        .map_err(|_| StoreError::Corrupt(format!("deployment weight {weight}")))?,
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
        let rows = sqlx::query(
            "SELECT d.account_id, d.script, d.version_id, d.weight, v.wasm_sha256
             FROM deployments d JOIN script_versions v ON v.id = d.version_id
             ORDER BY d.account_id, d.script, d.weight DESC, d.version_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql("read deployments"))?;
        let mut out: Vec<DeployedScript> = Vec::new();
        for r in &rows {
            let account: String = r.try_get(0).map_err(sql("read deployments"))?;
            let script: String = r.try_get(1).map_err(sql("read deployments"))?;
            let version: String = r.try_get(2).map_err(sql("read deployments"))?;
            let weight: i64 = r.try_get(3).map_err(sql("read deployments"))?;
            let sha: String = r.try_get(4).map_err(sql("read deployments"))?;
            match out.last_mut() {
                Some(last) if last.account == account && last.script == script => {
                    last.versions.push((version, weight as u32, sha));
                }
                _ => out.push(DeployedScript {
                    account,
                    script,
                    versions: vec![(version, weight as u32, sha)],
                }),
            }
        }
        Ok(out)
    }

    // ---- machines and Durable Objects ----

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
        let rows = sqlx::query(
            "SELECT id, data_center, grpc_address, http_address, last_heartbeat_ms FROM machines ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list machines"))?;
        rows.iter().map(machine_row).collect()
    }

    /// One machine as last recorded, if it ever registered.
    pub async fn machine(&self, id: &str) -> Result<Option<MachineRecord>> {
        let row = sqlx::query(
            "SELECT id, data_center, grpc_address, http_address, last_heartbeat_ms FROM machines WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("look up machine {id}")))?;
        row.as_ref().map(machine_row).transpose()
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
        let row = sqlx::query(
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
        row.map(|r| {
            let e = || sql("read a placement");
            Ok((
                Placement {
                    machine_id: r.try_get(0).map_err(e())?,
                    version_id: r.try_get(1).map_err(e())?,
                    placed_at_ms: r.try_get(2).map_err(e())?,
                    created: false,
                },
                r.try_get::<Option<i64>, _>(3).map_err(e())?,
            ))
        })
        .transpose()
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
                let namespace: String = r.try_get(0).map_err(sql("read a placement"))?;
                let id: String = r.try_get(1).map_err(sql("read a placement"))?;
                if ids.iter().any(|(n, i)| *n == namespace && *i == id) {
                    out.push(format!("{namespace}:{id}"));
                }
            }
        }
        Ok(out)
    }

    // ---- capture sessions and profiles ----

    /// Stores a new session and its first event.
    pub async fn create_session(&self, s: &SessionRow) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(sql("begin a session"))?;
        sqlx::query(
            "INSERT INTO capture_sessions (id, account_id, script, version_id, version_selector, kind,
                duration_ms, data_center, durable_object, status, error, targets_json, failures_json,
                machines_total, machines_answered, created_at_ms, updated_at_ms, requests)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
        )
        .bind(&s.id)
        .bind(&s.account)
        .bind(&s.script)
        .bind(&s.version_id)
        .bind(&s.version_selector)
        .bind(&s.kind)
        .bind(s.duration_ms)
        .bind(s.data_center.clone())
        .bind(s.durable_object.clone())
        .bind(&s.status)
        .bind(s.error.clone())
        .bind(&s.targets_json)
        .bind(&s.failures_json)
        .bind(s.machines_total)
        .bind(s.machines_answered)
        .bind(s.created_at_ms)
        .bind(s.updated_at_ms)
        .bind(s.requests)
        .execute(&mut *tx)
        .await
        .map_err(sql(format!("create session {}", s.id)))?;
        Self::add_event(&mut tx, &s.id, &s.status, s.created_at_ms, None).await?;
        tx.commit()
            .await
            .map_err(sql(format!("commit session {}", s.id)))
    }

    async fn add_event(
        conn: &mut sqlx::AnyConnection,
        id: &str,
        status: &str,
        at: i64,
        detail: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO capture_session_events (session_id, seq, status, at_ms, detail)
             VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM capture_session_events WHERE session_id = $1), $2, $3, $4)",
        )
        .bind(id)
        .bind(status)
        .bind(at)
        .bind(detail.map(str::to_owned))
        .execute(conn)
        .await
        .map_err(sql(format!("record a state change of session {id}")))?;
        Ok(())
    }

    /// Moves a session to `status`, recording the change.
    pub async fn set_session_status(
        &self,
        id: &str,
        status: &str,
        error: Option<&str>,
        detail: Option<&str>,
    ) -> Result<()> {
        let now = now_ms();
        // The state and its event are written together, so a crash never
        // leaves one without the other.
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(sql("begin a state change"))?;
        sqlx::query(
            "UPDATE capture_sessions SET status = $2, error = COALESCE($3, error), updated_at_ms = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(status)
        .bind(error.map(str::to_owned))
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(sql(format!("update session {id}")))?;
        Self::add_event(&mut tx, id, status, now, detail.or(error)).await?;
        tx.commit()
            .await
            .map_err(sql(format!("commit a state change of session {id}")))
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
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM capture_sessions WHERE account_id = $1 AND id = $2"
        )))
        .bind(account)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(sql(format!("read session {id}")))?;
        row.as_ref().map(session_row).transpose()
    }

    /// Sessions of an account, newest first.
    pub async fn sessions(
        &self,
        account: &str,
        script: Option<&str>,
        limit: i64,
    ) -> Result<Vec<SessionRow>> {
        // Only constants are spliced in.
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM capture_sessions
             WHERE account_id = $1 AND ($2 = '' OR script = $2)
             ORDER BY created_at_ms DESC, id DESC LIMIT $3"
        )))
        .bind(account)
        .bind(script.unwrap_or("").to_owned())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list sessions"))?;
        rows.iter().map(session_row).collect()
    }

    /// State changes of a session, oldest first.
    pub async fn session_events(&self, id: &str) -> Result<Vec<SessionEvent>> {
        let rows = sqlx::query(
            "SELECT status, at_ms, detail FROM capture_session_events WHERE session_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(sql(format!("read events of session {id}")))?;
        rows.iter()
            .map(|r| {
                Ok(SessionEvent {
                    status: r.try_get(0).map_err(sql("read an event"))?,
                    at_ms: r.try_get(1).map_err(sql("read an event"))?,
                    detail: r.try_get(2).map_err(sql("read an event"))?,
                })
            })
            .collect()
    }

    /// Marks sessions left unfinished by a previous process as failed;
    /// returns their ids.
    pub async fn fail_interrupted_sessions(&self) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id, status FROM capture_sessions WHERE status IN ('pending', 'capturing', 'merging')",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(sql("find interrupted sessions"))?;
        let mut ids = Vec::new();
        for r in &rows {
            let id: String = r.try_get(0).map_err(sql("read a session"))?;
            let status: String = r.try_get(1).map_err(sql("read a session"))?;
            let reason =
                format!("interrupted: the control plane restarted while the session was {status}");
            self.set_session_status(&id, "failed", Some(&reason), None)
                .await?;
            ids.push(id);
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
}

const SESSION_COLUMNS: &str =
    "id, account_id, script, version_id, version_selector, kind, duration_ms,
    data_center, durable_object, status, error, targets_json, failures_json, machines_total,
    machines_answered, created_at_ms, updated_at_ms, requests";

/// `id, data_center, grpc_address, http_address, last_heartbeat_ms`.
fn machine_row(r: &AnyRow) -> Result<MachineRecord> {
    let e = || sql("read a machine");
    Ok(MachineRecord {
        id: r.try_get(0).map_err(e())?,
        data_center: r.try_get(1).map_err(e())?,
        grpc_address: r.try_get(2).map_err(e())?,
        http_address: r.try_get(3).map_err(e())?,
        last_heartbeat_ms: r.try_get(4).map_err(e())?,
    })
}

fn session_row(r: &AnyRow) -> Result<SessionRow> {
    let e = || sql("read a session");
    Ok(SessionRow {
        id: r.try_get(0).map_err(e())?,
        account: r.try_get(1).map_err(e())?,
        script: r.try_get(2).map_err(e())?,
        version_id: r.try_get(3).map_err(e())?,
        version_selector: r.try_get(4).map_err(e())?,
        kind: r.try_get(5).map_err(e())?,
        duration_ms: r.try_get(6).map_err(e())?,
        data_center: r.try_get(7).map_err(e())?,
        durable_object: r.try_get(8).map_err(e())?,
        status: r.try_get(9).map_err(e())?,
        error: r.try_get(10).map_err(e())?,
        targets_json: r.try_get(11).map_err(e())?,
        failures_json: r.try_get(12).map_err(e())?,
        machines_total: r.try_get(13).map_err(e())?,
        machines_answered: r.try_get(14).map_err(e())?,
        created_at_ms: r.try_get(15).map_err(e())?,
        updated_at_ms: r.try_get(16).map_err(e())?,
        requests: r.try_get(17).map_err(e())?,
    })
}

fn version_row(r: &AnyRow) -> Result<ScriptVersion> {
    let e = || sql("read a version");
    Ok(ScriptVersion {
        id: r.try_get(0).map_err(e())?,
        script: r.try_get(1).map_err(e())?,
        seq: r.try_get(2).map_err(e())?,
        created_at_ms: r.try_get(3).map_err(e())?,
        wasm_sha256: r.try_get(4).map_err(e())?,
        wasm_bytes: r.try_get(5).map_err(e())?,
    })
}
