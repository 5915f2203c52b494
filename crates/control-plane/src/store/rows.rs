//! What the store reads and writes: rows (read with `sqlx::FromRow`, by
//! column name, so a query's column list and its row type cannot drift
//! apart silently) and the keys it is asked about.

use edgeprof_proto::rest::{ProfileKind, SessionStatus};

/// A stored script version (without its wasm bytes).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
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

/// The columns of [`ScriptVersion`], for `SELECT`.
pub(super) const VERSION_COLUMNS: &str =
    "id, script, seq, created_at_ms, wasm_sha256, CAST(LENGTH(wasm) AS BIGINT) AS wasm_bytes";

/// One version's weight, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct DeploymentRow {
    pub version_id: String,
    pub weight: i64,
}

/// A deployed version as agents fetch it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct DeployedRow {
    pub account_id: String,
    pub script: String,
    pub version_id: String,
    pub weight: i64,
    pub wasm_sha256: String,
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
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ScriptRow {
    /// Script name.
    pub name: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Number of versions uploaded.
    pub versions: i64,
}

/// A machine as last registered.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
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

/// A placement as stored, with its owner's last recorded heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct PlacementRow {
    pub machine_id: String,
    pub version_id: String,
    pub placed_at_ms: i64,
    pub last_heartbeat_ms: Option<i64>,
}

/// A capture session as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionRow {
    /// Session id (UUID).
    pub id: String,
    /// Owning account.
    #[sqlx(rename = "account_id")]
    pub account: String,
    /// Script profiled.
    pub script: String,
    /// Resolved version id.
    pub version_id: String,
    /// The selector as asked (`latest`, id or prefix).
    pub version_selector: String,
    /// What is profiled.
    #[sqlx(try_from = "String")]
    pub kind: ProfileKind,
    /// Capture duration.
    pub duration_ms: i64,
    /// Data-center filter, if any.
    pub data_center: Option<String>,
    /// `namespace:id` of the profiled Durable Object, if any.
    pub durable_object: Option<String>,
    /// Where the session is.
    #[sqlx(try_from = "String")]
    pub status: SessionStatus,
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

/// The columns of [`SessionRow`], for `SELECT`.
pub(super) const SESSION_COLUMNS: &str =
    "id, account_id, script, version_id, version_selector, kind, duration_ms,
    data_center, durable_object, status, error, targets_json, failures_json, machines_total,
    machines_answered, created_at_ms, updated_at_ms, requests";

/// One state change of a session.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionEvent {
    /// The state entered.
    #[sqlx(try_from = "String")]
    pub status: SessionStatus,
    /// Unix milliseconds.
    pub at_ms: i64,
    /// Why, when there is something to say.
    pub detail: Option<String>,
}

/// An API token, by its public id.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenRow {
    /// The first 16 hex characters of the token's SHA-256.
    pub id: String,
    /// Owning account.
    pub account_id: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
}

/// What one retention pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Sessions (with their events).
    pub sessions: u64,
    /// Profiles.
    pub profiles: u64,
}

/// A capture slot as stored (its isolates a JSON list).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct SlotDbRow {
    pub session_id: String,
    pub end_ms: i64,
    pub isolates: String,
}

/// An unfinished session joined with its replica's liveness row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(super) struct OrphanRow {
    pub id: String,
    pub status: String,
    pub replica_id: Option<String>,
    pub last_heartbeat_ms: Option<i64>,
}
