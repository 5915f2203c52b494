//! The schema: migrations, applied in order by [`super::Store::open`].

/// Migrations, applied in order; each one's index + 1 is its version.
/// Never edit an applied migration: append a new one.
pub(super) const MIGRATIONS: &[&[&str]] = &[
    INITIAL_SCHEMA,
    // Requests the profiled isolates began during the capture (NULL: not known).
    &["ALTER TABLE capture_sessions ADD COLUMN requests BIGINT"],
    // Retention deletes by age across accounts.
    &["CREATE INDEX capture_sessions_by_age ON capture_sessions (created_at_ms)"],
    // Durable Object placements no machine reports any more are reclaimed:
    // when each was last placed, confirmed or listed by its owner.
    &[
        "ALTER TABLE durable_objects ADD COLUMN last_seen_ms BIGINT NOT NULL DEFAULT 0",
        "UPDATE durable_objects SET last_seen_ms = placed_at_ms",
        "CREATE INDEX durable_objects_by_last_seen ON durable_objects (last_seen_ms)",
        "CREATE INDEX durable_objects_by_machine ON durable_objects (machine_id)",
    ],
    PROFILE_WINDOWS,
    REPLICAS,
];

/// Migration 6: what several control-plane replicas on one database share.
/// `replicas`: each running replica and when it last said it was alive;
/// `capture_sessions.replica_id`: the replica running a session, so the
/// others can fail it when that replica stops; `capture_slots`: the
/// captures running, per script, with the isolates (`machine/isolate`, a
/// JSON array) each profiles (the per-script limit and the one capture per
/// isolate rule, checked in one transaction); `fleet_log`: every
/// registration and heartbeat a replica received (the wire message), in
/// commit order, so every replica's fleet is built from all of them.
const REPLICAS: &[&str] = &[
    "CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        started_at_ms BIGINT NOT NULL,
        heartbeat_ms BIGINT NOT NULL)",
    "ALTER TABLE capture_sessions ADD COLUMN replica_id TEXT",
    "CREATE INDEX capture_sessions_by_status ON capture_sessions (status)",
    "CREATE TABLE capture_slots (
        session_id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        script TEXT NOT NULL,
        replica_id TEXT NOT NULL,
        end_ms BIGINT NOT NULL,
        isolates TEXT NOT NULL)",
    "CREATE INDEX capture_slots_by_script ON capture_slots (account_id, script)",
    "CREATE TABLE fleet_log (
        seq BIGINT PRIMARY KEY,
        replica_id TEXT NOT NULL,
        received_ms BIGINT NOT NULL,
        kind TEXT NOT NULL,
        payload BYTEA NOT NULL)",
    "CREATE INDEX fleet_log_by_age ON fleet_log (received_ms)",
];

/// Migration 5: continuous-profiling windows. `value` is the sum of the
/// profile's primary sample value (CPU nanoseconds, or sampled bytes
/// allocated), `bytes` its stored (gzip'd) size, so timelines and query
/// bounds never read a blob; `level` 0 is a window as an agent sent it, 1
/// and 2 are for compacted blocks (not built yet; `profile_windows_by_level`
/// is for them).
const PROFILE_WINDOWS: &[&str] = &[
    "CREATE TABLE profile_windows (
        account_id TEXT NOT NULL,
        script TEXT NOT NULL,
        version_id TEXT NOT NULL,
        data_center TEXT NOT NULL,
        machine_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        level BIGINT NOT NULL,
        start_ms BIGINT NOT NULL,
        end_ms BIGINT NOT NULL,
        samples BIGINT NOT NULL,
        requests BIGINT NOT NULL,
        value BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        pprof BYTEA NOT NULL)",
    "CREATE UNIQUE INDEX profile_windows_key ON profile_windows
        (machine_id, account_id, script, version_id, kind, level, start_ms)",
    "CREATE INDEX profile_windows_by_script ON profile_windows (account_id, script, kind, start_ms)",
    "CREATE INDEX profile_windows_by_level ON profile_windows (level, start_ms)",
    "CREATE INDEX profile_windows_by_age ON profile_windows (end_ms)",
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
