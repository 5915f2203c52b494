//! The REST contract of the control plane: every request and response body
//! (and query string) of `/v1/accounts/{account}/…`, as serde types the
//! control plane, the CLI, the dashboard's tests and the e2e suite share.
//! `docs/api.md` describes the routes; this module is what they carry.
//!
//! Rules of the contract:
//! - Requests (bodies and query strings) are `deny_unknown_fields`: a typo
//!   is a 400 naming the field, never silently ignored.
//! - Responses tolerate fields added later (no `deny_unknown_fields`), so
//!   an older CLI keeps working against a newer control plane.
//! - Times are Unix milliseconds in fields ending `_ms`; durations are
//!   whole milliseconds in `duration_ms`, seconds in `window_s`.
//! - Every error is [`ErrorBody`]: `{"error": {"code", "message"}}`, with a
//!   stable machine-readable `code` and a message naming the field and the
//!   limit.
//!
//! Plain data only: no IO, no validation beyond what serde checks (ranges
//! and names are the control plane's to check, with its messages).

use serde::{Deserialize, Serialize};

/// Shortest capture accepted, in milliseconds.
pub const MIN_DURATION_MS: u64 = 1_000;
/// Longest capture accepted, in milliseconds.
pub const MAX_DURATION_MS: u64 = 50_000;
/// Capture duration when a request gives none, in milliseconds.
pub const DEFAULT_DURATION_MS: u64 = 10_000;
/// Most sessions one `GET /profiles` lists (and its default).
pub const MAX_SESSIONS_LIMIT: u32 = 1_000;
/// Sessions `GET /profiles` lists without `limit`.
pub const DEFAULT_SESSIONS_LIMIT: u32 = 100;

/// Response header of the synchronous capture: the session id.
pub const SESSION_HEADER: &str = "x-edgeprof-session";
/// Response header of the synchronous capture: the session's
/// [`SessionStatus`] (`done` or `partial`).
pub const STATUS_HEADER: &str = "x-edgeprof-status";
/// Response header of a partial synchronous capture: the machines that
/// gave no profile, comma-separated.
pub const MISSING_MACHINES_HEADER: &str = "x-edgeprof-missing-machines";

// ---- enums ----

/// What a capture profiles (`profile_type` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileKind {
    /// CPU time.
    #[default]
    Cpu,
    /// Allocations and live heap.
    Heap,
}

impl ProfileKind {
    /// Every kind.
    pub const ALL: [ProfileKind; 2] = [ProfileKind::Cpu, ProfileKind::Heap];

    /// `cpu` or `heap`, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::Heap => "heap",
        }
    }
}

impl std::fmt::Display for ProfileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProfileKind {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or(UnknownVariant)
    }
}

impl TryFrom<String> for ProfileKind {
    type Error = UnknownVariant;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Where a capture session is: `pending → capturing → merging → done |
/// partial | failed` (`failed` may follow any earlier state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Stored, not started.
    Pending,
    /// Agents are profiling.
    Capturing,
    /// The agents' profiles are being merged.
    Merging,
    /// Every target returned a profile.
    Done,
    /// Some targets returned a profile, some did not (see `failures`).
    Partial,
    /// No profile (see `error`).
    Failed,
}

impl SessionStatus {
    /// Every status, in the order a session goes through them.
    pub const ALL: [SessionStatus; 6] = [
        SessionStatus::Pending,
        SessionStatus::Capturing,
        SessionStatus::Merging,
        SessionStatus::Done,
        SessionStatus::Partial,
        SessionStatus::Failed,
    ];

    /// As on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Pending => "pending",
            SessionStatus::Capturing => "capturing",
            SessionStatus::Merging => "merging",
            SessionStatus::Done => "done",
            SessionStatus::Partial => "partial",
            SessionStatus::Failed => "failed",
        }
    }

    /// Whether the session has ended (`done`, `partial` or `failed`).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            SessionStatus::Done | SessionStatus::Partial | SessionStatus::Failed
        )
    }

    /// Whether the session ended with a profile (`done` or `partial`).
    pub fn has_profile(self) -> bool {
        matches!(self, SessionStatus::Done | SessionStatus::Partial)
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SessionStatus {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or(UnknownVariant)
    }
}

impl TryFrom<String> for SessionStatus {
    type Error = UnknownVariant;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A string that names no variant of the enum it was parsed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownVariant;

impl std::fmt::Display for UnknownVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("unknown variant")
    }
}

impl std::error::Error for UnknownVariant {}

// ---- errors ----

/// Every error response: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_duration`.
    pub code: String,
    /// For people: names the field and the rule or limit.
    pub message: String,
}

// ---- scripts, versions, deployments ----

/// `GET /scripts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptList {
    /// By name.
    pub scripts: Vec<ScriptSummary>,
}

/// A script of an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptSummary {
    /// Script name.
    pub name: String,
    /// When its first version was uploaded.
    pub created_at_ms: i64,
    /// Versions uploaded.
    pub versions: u64,
}

/// Query of `POST /scripts/{script}/versions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    /// Share of traffic for the new version, 0–100; without it the new
    /// version takes all traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// `POST /scripts/{script}/versions` → 201.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedVersion {
    /// Version id (UUID).
    pub id: String,
    /// Script.
    pub script: String,
    /// 1 for the script's first version, then counting up.
    pub seq: u64,
    /// Upload time.
    pub created_at_ms: i64,
    /// Hex SHA-256 of the wasm bytes.
    pub wasm_sha256: String,
    /// Size of the wasm bytes.
    pub wasm_bytes: u64,
    /// The deployment after the upload.
    pub deployment: Vec<DeploymentEntry>,
}

/// `GET /scripts/{script}/versions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionList {
    /// Script.
    pub script: String,
    /// Newest first.
    pub versions: Vec<VersionInfo>,
    /// The current deployment.
    pub deployment: Vec<DeploymentEntry>,
}

/// A version of a script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// Version id (UUID).
    pub id: String,
    /// 1 for the script's first version, then counting up.
    pub seq: u64,
    /// Upload time.
    pub created_at_ms: i64,
    /// Hex SHA-256 of the wasm bytes.
    pub wasm_sha256: String,
    /// Size of the wasm bytes.
    pub wasm_bytes: u64,
    /// Its weight in the deployment (0: not deployed).
    pub weight: u32,
}

/// One version's share of a script's traffic, as the control plane stores
/// and answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentEntry {
    /// Version id.
    pub version_id: String,
    /// Weight against the script's other deployed versions (1–100).
    pub weight: u32,
}

/// `GET|PUT /scripts/{script}/deployment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// Script.
    pub script: String,
    /// By weight, then version id; versions of weight 0 are left out.
    pub versions: Vec<DeploymentEntry>,
}

/// Body of `PUT /scripts/{script}/deployment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentRequest {
    /// The new deployment; entries of weight 0 are dropped.
    pub versions: Vec<DeploymentRequestEntry>,
}

/// One entry of a [`DeploymentRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentRequestEntry {
    /// Any version selector: `latest`, a version id or a unique prefix of
    /// at least 8 characters (stored resolved).
    pub version_id: String,
    /// 0–100.
    pub weight: u32,
}

// ---- fleet ----

/// Query of `GET /scripts/{script}/targets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetsQuery {
    /// Only isolates running this version (any selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Only isolates in this data center.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_center: Option<String>,
}

/// `GET /scripts/{script}/targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetList {
    /// Script.
    pub script: String,
    /// The resolved version, when one was asked for.
    pub version_id: Option<String>,
    /// By data center, machine, isolate.
    pub targets: Vec<Target>,
}

/// An isolate a capture can profile, with where it lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Data center code.
    pub data_center: String,
    /// Machine id.
    pub machine: String,
    /// host:port of the machine's NodeAgent service.
    pub grpc_address: String,
    /// Isolate id, unique on its machine.
    pub isolate: String,
    /// Script.
    pub script: String,
    /// Version the isolate runs.
    pub version_id: String,
    /// Requests in the last 60 s.
    pub requests_last_60s: u64,
    /// The same number, as a rate.
    pub requests_per_minute: u64,
    /// Its last request (0: none).
    pub last_request_unix_ms: i64,
    /// Hosted Durable Objects, `namespace:id`.
    pub durable_objects: Vec<String>,
    /// Linear memory in use.
    pub memory_bytes: u64,
}

/// Query of `GET /scripts/{script}/memory`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryQuery {
    /// Only this version (any selector); without it, every version with
    /// something to report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Window of heartbeat readings, 1–300 s (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<u64>,
}

/// `GET /scripts/{script}/memory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Script.
    pub script: String,
    /// Newest version first.
    pub versions: Vec<VersionMemory>,
}

/// The memory view of one script version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionMemory {
    /// Version id.
    pub version_id: String,
    /// Its isolates on live machines now, by data center, machine, isolate.
    pub isolates: Vec<IsolateMemory>,
    /// Nearest-rank percentiles of the window's readings.
    pub memory_bytes: MemoryStats,
    /// Eviction counters as last reported, summed over machines.
    pub evictions: EvictionCounts,
    /// The window, seconds.
    pub window_s: u64,
}

/// One isolate's memory as its agent last reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolateMemory {
    /// Machine id.
    pub machine: String,
    /// Data center code.
    pub data_center: String,
    /// Isolate id.
    pub isolate: String,
    /// Linear memory in use.
    pub memory_bytes: u64,
}

/// Percentiles of memory readings (nearest rank; `None` for no reading).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Median.
    pub p50: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
    /// 99.9th percentile.
    pub p999: Option<u64>,
    /// Largest reading.
    pub max: Option<u64>,
    /// Readings in the window (one per isolate per heartbeat).
    pub samples: u64,
}

/// Eviction counters of a version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictionCounts {
    /// Evictions for exceeding the memory limit ("Exceeded Memory").
    pub exceeded_memory: u64,
    /// Evictions for any reason.
    pub total: u64,
}

// ---- captures ----

/// Body of a capture: `POST /profiles` (with `script`, and `version`
/// defaulting to `latest`) and `POST /scripts/{script}/versions/{version}/profile`
/// (without them: they are in the URL). Every field is optional on the
/// synchronous route; an empty body means all defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    /// Script to profile (`POST /profiles` only; required there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Version selector (`POST /profiles` only): `latest` (default), an id
    /// or a unique prefix of at least 8 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// [`MIN_DURATION_MS`]–[`MAX_DURATION_MS`]; default
    /// [`DEFAULT_DURATION_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Default `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_type: Option<ProfileKind>,
    /// Durable Object namespace (with `actor_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<String>,
    /// Durable Object id, 64 hex characters (with `namespace_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
    /// Only isolates in this data center (not with a Durable Object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_center: Option<String>,
}

/// `POST /profiles` → 202.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStarted {
    /// Session id (UUID).
    pub id: String,
    /// `pending`.
    pub status: SessionStatus,
}

/// Query of `GET /profiles`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsQuery {
    /// Only sessions of this script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// At most this many, 1–[`MAX_SESSIONS_LIMIT`]; default
    /// [`DEFAULT_SESSIONS_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /profiles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionList {
    /// Newest first.
    pub profiles: Vec<Session>,
}

/// A capture session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Session id (UUID).
    pub id: String,
    /// Script profiled.
    pub script: String,
    /// Resolved version id.
    pub version_id: String,
    /// The version selector as asked.
    pub version: String,
    /// Kind.
    pub profile_type: ProfileKind,
    /// Capture duration.
    pub duration_ms: u64,
    /// Data-center filter, if any.
    pub data_center: Option<String>,
    /// `namespace:id` of the profiled Durable Object, if any.
    pub durable_object: Option<String>,
    /// Where the session is.
    pub status: SessionStatus,
    /// Why it failed, when it did (bounded in length).
    pub error: Option<String>,
    /// Creation time.
    pub created_at_ms: i64,
    /// Time of the last change.
    pub updated_at_ms: i64,
    /// Machines asked and answered.
    pub progress: Progress,
    /// Machines (ids, sorted) that gave no profile for some target.
    pub missing_machines: Vec<String>,
    /// Requests the merged isolates began during the capture; `None`
    /// until merged, or when an agent does not count them.
    pub requests: Option<u64>,
}

/// How far a session's fan-out is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Machines asked.
    pub machines_total: u64,
    /// Machines that answered, successfully or not.
    pub machines_answered: u64,
}

/// `GET /profiles/{id}`: the session, its targets, failures and history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionDetail {
    /// The session as `GET /profiles` lists it.
    #[serde(flatten)]
    pub session: Session,
    /// The isolates asked for.
    pub targets: Vec<Target>,
    /// The machines and isolates that gave no profile, and why.
    pub failures: Vec<Failure>,
    /// State changes, oldest first.
    pub events: Vec<SessionEvent>,
}

/// A machine or isolate that gave no profile, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Machine id.
    pub machine: String,
    /// Its data center.
    pub data_center: String,
    /// The isolate, when only one isolate of the machine failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate: Option<String>,
    /// What went wrong (bounded in length).
    pub reason: String,
}

/// One state change of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEvent {
    /// The state entered.
    pub status: SessionStatus,
    /// When.
    pub at_ms: i64,
    /// Why, when there is something to say.
    pub detail: Option<String>,
}

// ---- tokens ----

/// `GET /tokens`: the account's API tokens (never the secrets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenList {
    /// Oldest first.
    pub tokens: Vec<TokenInfo>,
}

/// An API token, by its public id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// Public id (the first 16 hex characters of the token's SHA-256):
    /// what `DELETE /tokens/{id}` and `token revoke` take.
    pub id: String,
    /// Creation time.
    pub created_at_ms: i64,
    /// Whether this is the token the request was made with.
    pub current: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_are_snake_case_on_the_wire() {
        for s in SessionStatus::ALL {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(s.as_str().parse::<SessionStatus>(), Ok(s));
        }
        for k in ProfileKind::ALL {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(k.as_str().parse::<ProfileKind>(), Ok(k));
        }
        assert_eq!("CPU".parse::<ProfileKind>(), Err(UnknownVariant));
    }

    #[test]
    fn requests_refuse_unknown_fields_and_responses_tolerate_them() {
        let e = serde_json::from_str::<CaptureRequest>(r#"{"duration": 5}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `duration`"), "{e}");
        let empty: CaptureRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, CaptureRequest::default());
        let started: SessionStarted =
            serde_json::from_str(r#"{"id": "x", "status": "pending", "new_field": 1}"#).unwrap();
        assert_eq!(started.status, SessionStatus::Pending);
    }

    #[test]
    fn session_detail_flattens_the_session() {
        let session = Session {
            id: "s".into(),
            script: "api".into(),
            version_id: "v".into(),
            version: "latest".into(),
            profile_type: ProfileKind::Heap,
            duration_ms: 1000,
            data_center: None,
            durable_object: None,
            status: SessionStatus::Partial,
            error: None,
            created_at_ms: 1,
            updated_at_ms: 2,
            progress: Progress {
                machines_total: 2,
                machines_answered: 2,
            },
            missing_machines: vec!["m2".into()],
            requests: Some(7),
        };
        let detail = SessionDetail {
            session,
            targets: Vec::new(),
            failures: vec![Failure {
                machine: "m2".into(),
                data_center: "lhr".into(),
                isolate: None,
                reason: "down".into(),
            }],
            events: Vec::new(),
        };
        let v: serde_json::Value = serde_json::to_value(&detail).unwrap();
        assert_eq!(v["created_at_ms"], 1);
        assert_eq!(v["profile_type"], "heap");
        assert_eq!(v["progress"]["machines_total"], 2);
        assert!(v["failures"][0].get("isolate").is_none());
        let back: SessionDetail = serde_json::from_value(v).unwrap();
        assert_eq!(back, detail);
    }
}

// ---- continuous profiling history ----
//
// The contract of the history routes (served by the control plane's
// `api::history`, called by the CLI's `history` and `timeline`).

/// Longest range one history query covers, in milliseconds (31 days).
pub const MAX_HISTORY_RANGE_MS: i64 = 31 * 24 * 3_600_000;
/// Most points one timeline series holds; a `step` that would make more is
/// a 400.
pub const MAX_TIMELINE_POINTS: u64 = 2_000;

/// Query of `GET /scripts/{script}/history/profile`.
///
/// `from` and `to` are RFC 3339 (`2026-12-04T10:00:00Z`), Unix milliseconds,
/// `now`, or relative to now (`-15m`, `-2h`, `-1d`); `to` defaults to `now`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// `cpu` or `heap`.
    #[serde(rename = "type", default)]
    pub kind: ProfileKind,
    /// Start of the range (inclusive).
    pub from: String,
    /// End of the range (exclusive); default `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Only this version (any selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Only this data center.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_center: Option<String>,
    /// Only this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// What a timeline groups its series by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineGroup {
    /// One series per version id.
    Version,
    /// One series per data center.
    DataCenter,
    /// One series per machine.
    Machine,
}

/// Query of `GET /scripts/{script}/history/timeline`: the range as in
/// [`HistoryQuery`], `step` a duration (`10s`, `1m`, `1h`; default: the
/// range over 60, at least the window length).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineQuery {
    /// `cpu` (nanoseconds per step) or `heap` (sampled bytes per step).
    #[serde(rename = "type", default)]
    pub kind: ProfileKind,
    /// Start of the range (inclusive).
    pub from: String,
    /// End of the range (exclusive); default `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Width of one point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// One series per value of this; without it, one series `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<TimelineGroup>,
    /// Only this version (any selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Only this data center.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_center: Option<String>,
    /// Only this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// `GET /scripts/{script}/history/timeline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Width of one point, milliseconds.
    pub step_ms: u64,
    /// Sorted by key.
    pub series: Vec<TimelineSeries>,
}

/// One series of a [`Timeline`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineSeries {
    /// The group's value (a version id, data center or machine), or `all`.
    pub key: String,
    /// `[t_ms, value, requests]` per step that has data, in time order:
    /// `t_ms` the step's start, `value` CPU nanoseconds (or sampled bytes),
    /// `requests` the requests begun in it, so `value / requests` is CPU per
    /// request.
    pub points: Vec<(i64, u64, u64)>,
}
