//! Persistent state: accounts, tokens, scripts, versions, deployments,
//! machines, Durable Object placements, capture sessions and their profiles,
//! continuous-profiling windows.
//!
//! One set of migrations and one set of SQL statements serve both embedded
//! SQLite (a file, the default) and PostgreSQL (a `postgres://` URL), through
//! `sqlx::Any`. The SQL therefore sticks to what both dialects share: `$N`
//! placeholders, `BIGINT`/`TEXT`/`BYTEA` columns (times are Unix
//! milliseconds), `ON CONFLICT … DO UPDATE` and no booleans.

use std::path::Path;

use sha2::{Digest, Sha256};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};
use tokio::sync::Mutex;

mod accounts;
mod machines;
mod replicas;
mod rows;
mod schema;
mod scripts;
mod sessions;
mod windows;

pub use accounts::{TOKEN_ID_LEN, token_id};
pub use replicas::{LogEntry, Orphan, SlotRow};
pub use rows::*;
pub use scripts::VersionDeletion;
pub use sessions::RETENTION_BATCH;
pub use windows::{
    BlockKey, NewWindow, Replaced, SourceWindow, TimelineColumn, TimelineRow, WindowBlob,
    WindowFilter,
};

use schema::MIGRATIONS;

/// The PostgreSQL advisory lock replicas take while migrating.
const MIGRATION_LOCK: i64 = 0x6564_6765_7072_6f66; // "edgeprof"

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

pub(crate) type Result<T> = std::result::Result<T, StoreError>;

pub(crate) fn sql(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StoreError {
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
        let sqlite = backend == Backend::Sqlite;
        let pool = AnyPoolOptions::new()
            .max_connections(if sqlite { 4 } else { 8 })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if sqlite {
                        // With WAL, commits no longer wait for an fsync each
                        // (the WAL is synced at checkpoints): the database
                        // stays consistent through a crash, and a power cut
                        // can lose the last commits only.
                        sqlx::query("PRAGMA synchronous=NORMAL")
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            })
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
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(sql("connect to migrate"))?;
        // Replicas starting together on one PostgreSQL take turns (the
        // session lock is released below, or when the connection closes).
        let pg = self.backend == Backend::Postgres;
        if pg {
            sqlx::query("SELECT 1 FROM (SELECT pg_advisory_lock($1)) AS l")
                .bind(MIGRATION_LOCK)
                .fetch_one(&mut *conn)
                .await
                .map_err(sql("wait for other replicas' migrations"))?;
        }
        let result = self.migrate_on(&mut conn).await;
        if pg {
            sqlx::query("SELECT 1 FROM (SELECT pg_advisory_unlock($1)) AS l")
                .bind(MIGRATION_LOCK)
                .fetch_one(&mut *conn)
                .await
                .map_err(sql("release the migration lock"))?;
        }
        result
    }

    async fn migrate_on(&self, conn: &mut sqlx::AnyConnection) -> Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS edgeprof_migrations (
                version BIGINT PRIMARY KEY,
                applied_at_ms BIGINT NOT NULL)",
        )
        .execute(&mut *conn)
        .await
        .map_err(sql("create the migrations table"))?;
        let applied: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) FROM edgeprof_migrations")
            .fetch_one(&mut *conn)
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
            let mut tx = sqlx::Connection::begin(&mut *conn)
                .await
                .map_err(sql("begin migration"))?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pooled SQLite connection runs in WAL mode with
    /// `synchronous=NORMAL` (1): a heartbeat's commit waits for no fsync.
    #[tokio::test]
    async fn every_sqlite_connection_skips_the_fsync_per_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edgeprof.sqlite");
        let store = Store::open(path.to_str().unwrap()).await.unwrap();
        // Hold connections so that the pool opens more than one.
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = store.pool.acquire().await.unwrap();
            let sync: (i64,) = sqlx::query_as("PRAGMA synchronous")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            let journal: (String,) = sqlx::query_as("PRAGMA journal_mode")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!((sync.0, journal.0.as_str()), (1, "wal"));
            held.push(conn);
        }
    }
}
