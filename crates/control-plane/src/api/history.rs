//! Continuous-profiling history: `GET …/history/profile` (the windows of a
//! range merged into one gzip'd pprof) and `GET …/history/timeline` (their
//! values and requests summed per step and group, from the index columns
//! only).
//!
//! Both are bounded before a blob is read: a range of at most
//! [`rest::MAX_HISTORY_RANGE_MS`], a merge of at most [`MAX_QUERY_WINDOWS`]
//! windows and [`MAX_QUERY_BYTES`] stored bytes (decoded one at a time, each
//! within the ingest limit), a timeline of at most
//! [`rest::MAX_TIMELINE_POINTS`] steps and [`MAX_TIMELINE_SERIES`] series.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use edgeprof_proto::rest::{self, ProfileKind, TimelineGroup};

use super::error::{ApiError, ApiResult};
use super::extract::{Authorized, Path, Query};
use super::scripts::{require_script, resolve_version};
use super::{AppState, unsigned};
use crate::history::{decode_window, set_requests_comment};
use crate::store::{TimelineColumn, WindowBlob, WindowFilter};
use crate::text::echo;

/// Most windows one merged history profile reads.
pub const MAX_QUERY_WINDOWS: i64 = 20_000;
/// Most stored (gzip'd) bytes one merged history profile reads.
pub const MAX_QUERY_BYTES: i64 = 512 << 20;
/// Most series one timeline answers with.
pub const MAX_TIMELINE_SERIES: usize = 500;
/// Step of a timeline without `step` when the range is short: the agents'
/// default window length.
const MIN_DEFAULT_STEP_MS: i64 = 10_000;
/// Skipped windows named in a merged profile's comments (the rest counted).
const MAX_SKIPPED_NAMED: usize = 5;
/// Windows in flight between the database and the merging thread.
const MERGE_QUEUE: usize = 8;
/// Longest label value accepted in a filter (as at ingest).
const MAX_FILTER_BYTES: usize = 128;

const TIME_FORMS: &str =
    "RFC 3339 (`2026-12-04T10:00:00Z`), Unix milliseconds, `now`, or relative to now (`-15m`)";

fn bad_time(field: &str, text: &str) -> ApiError {
    ApiError::bad_request(
        "invalid_time",
        format!("{field}: `{}` is not {TIME_FORMS}", echo(text)),
    )
}

/// Parses a time of a history query (see [`rest::HistoryQuery`]) as Unix
/// milliseconds.
pub fn parse_time(field: &str, text: &str, now_ms: i64) -> ApiResult<i64> {
    let t = text.trim();
    if t == "now" {
        return Ok(now_ms);
    }
    if let Some(ago) = t.strip_prefix('-') {
        let d = humantime::parse_duration(ago.trim()).map_err(|_| bad_time(field, text))?;
        let ms = i64::try_from(d.as_millis()).map_err(|_| bad_time(field, text))?;
        return Ok(now_ms.saturating_sub(ms));
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| bad_time(field, text));
    }
    parse_rfc3339(t).ok_or_else(|| bad_time(field, text))
}

/// RFC 3339 with `Z` or a numeric offset (`+02:00`), to Unix milliseconds.
fn parse_rfc3339(t: &str) -> Option<i64> {
    let (local, offset_s) = match t.strip_suffix(['Z', 'z']) {
        Some(local) => (local, 0i64),
        None => {
            // The offset is the last 6 characters: `+hh:mm` or `-hh:mm`.
            let split = t.len().checked_sub(6)?;
            let (local, off) = (t.get(..split)?, t.get(split..)?);
            let sign = match off.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = off[1..].split_once(':')?;
            let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
            if h > 23 || m > 59 {
                return None;
            }
            (local, sign * (h * 3600 + m * 60))
        }
    };
    // humantime reads `YYYY-MM-DDTHH:MM:SS[.fff]` as UTC when given `Z`.
    let utc = humantime::parse_rfc3339(&format!("{}Z", local.replacen(' ', "T", 1))).ok()?;
    let ms = utc.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()?.checked_sub(offset_s * 1000)
}

/// `[from, to)` of a query: `to` after `from`, at most the longest range.
fn range(from: &str, to: Option<&str>, now_ms: i64) -> ApiResult<(i64, i64)> {
    let from_ms = parse_time("from", from, now_ms)?;
    let to_ms = match to {
        Some(t) => parse_time("to", t, now_ms)?,
        None => now_ms,
    };
    if to_ms <= from_ms {
        return Err(ApiError::bad_request(
            "invalid_range",
            format!("to: must be after from (from = {from_ms} ms, to = {to_ms} ms)"),
        ));
    }
    if to_ms - from_ms > rest::MAX_HISTORY_RANGE_MS {
        return Err(ApiError::bad_request(
            "invalid_range",
            format!(
                "from, to: the range is {} h, at most {} h (31 days)",
                (to_ms - from_ms) / 3_600_000,
                rest::MAX_HISTORY_RANGE_MS / 3_600_000
            ),
        ));
    }
    Ok((from_ms, to_ms))
}

/// A `data_center` or `machine` filter: 1–128 bytes.
fn label_filter(field: &str, v: Option<String>) -> ApiResult<Option<String>> {
    match v {
        Some(v) if v.is_empty() || v.len() > MAX_FILTER_BYTES => Err(ApiError::bad_request(
            "invalid_filter",
            format!(
                "{field}: must be 1–{MAX_FILTER_BYTES} bytes (got {})",
                v.len()
            ),
        )),
        v => Ok(v),
    }
}

/// What both routes filter by, checked.
struct Selection {
    script: String,
    kind: ProfileKind,
    from_ms: i64,
    to_ms: i64,
    version_id: Option<String>,
    data_center: Option<String>,
    machine: Option<String>,
}

impl Selection {
    fn filter<'a>(&'a self, account: &'a str) -> WindowFilter<'a> {
        WindowFilter {
            account,
            script: &self.script,
            kind: self.kind,
            from_ms: self.from_ms,
            to_ms: self.to_ms,
            version_id: self.version_id.as_deref(),
            data_center: self.data_center.as_deref(),
            machine_id: self.machine.as_deref(),
        }
    }

    /// `cpu of `api` from … to …` (with filters), for messages.
    fn describe(&self) -> String {
        let mut s = format!(
            "{} windows of `{}` from {} to {}",
            self.kind.as_str(),
            self.script,
            rfc3339(self.from_ms),
            rfc3339(self.to_ms)
        );
        for (k, v) in [
            ("version", &self.version_id),
            ("data_center", &self.data_center),
            ("machine", &self.machine),
        ] {
            if let Some(v) = v {
                s.push_str(&format!(", {k} {v}"));
            }
        }
        s
    }
}

fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unsigned(ms));
    humantime::format_rfc3339_millis(t).to_string()
}

#[allow(clippy::too_many_arguments)]
async fn select(
    state: &AppState,
    auth: &Authorized,
    script: &str,
    kind: ProfileKind,
    range_ms: (i64, i64),
    version: Option<String>,
    data_center: Option<String>,
    machine: Option<String>,
) -> ApiResult<Selection> {
    let script = require_script(state, auth, script).await?;
    let version_id = match version {
        Some(v) => Some(resolve_version(state, &auth.account, &script, &v).await?.id),
        None => None,
    };
    Ok(Selection {
        script: script.to_string(),
        kind,
        from_ms: range_ms.0,
        to_ms: range_ms.1,
        version_id,
        data_center: label_filter("data_center", data_center)?,
        machine: label_filter("machine", machine)?,
    })
}

/// What merging a range's windows made.
struct Merged {
    pprof: Vec<u8>,
    windows: u64,
    skipped: usize,
}

/// Decodes and merges windows as they arrive, labelled with their data
/// center and machine; the summed `requests` becomes one comment.
fn merge_windows(
    rx: &mut tokio::sync::mpsc::Receiver<WindowBlob>,
    header: &str,
) -> Result<Option<Merged>, String> {
    let mut merger = edgeprof_pprof::Merger::new();
    let (mut windows, mut requests) = (0u64, 0u64);
    let mut skipped = Vec::new();
    while let Some(w) = rx.blocking_recv() {
        let at = format!("window of {} at {} ms", w.machine_id, w.start_ms);
        let profile = match decode_window(&w.pprof) {
            Ok(p) => p,
            // Checked at ingest; a blob that no longer decodes is skipped
            // and named, not fatal.
            Err(e) => {
                skipped.push(format!("{at}: {e}"));
                continue;
            }
        };
        let labels = [
            ("data_center", w.data_center.as_str()),
            ("machine", w.machine_id.as_str()),
        ];
        match merger.add_labeled(&profile, &labels) {
            Ok(()) => {
                windows += 1;
                requests = requests.saturating_add(unsigned(w.requests));
            }
            Err(e) => skipped.push(format!("{at}: {e}")),
        }
    }
    if windows == 0 {
        return Ok(None);
    }
    let mut merged = merger.finish().map_err(|e| e.to_string())?;
    // Each window says its own `requests: N`; the merge says the sum.
    edgeprof_pprof::add_comment(&mut merged, header);
    set_requests_comment(&mut merged, requests);
    if !skipped.is_empty() {
        edgeprof_pprof::add_comment(
            &mut merged,
            &format!(
                "skipped {} windows that could not be merged:",
                skipped.len()
            ),
        );
        for reason in skipped.iter().take(MAX_SKIPPED_NAMED) {
            edgeprof_pprof::add_comment(&mut merged, &crate::text::truncate(reason, 300));
        }
    }
    Ok(Some(Merged {
        pprof: edgeprof_pprof::encode(&merged),
        windows,
        skipped: skipped.len(),
    }))
}

/// `GET /scripts/{script}/history/profile`.
pub async fn profile(
    State(state): State<AppState>,
    auth: Authorized,
    Path((_, script)): Path<(String, String)>,
    Query(q): Query<rest::HistoryQuery>,
) -> ApiResult<Response> {
    let now = state.clock.now_ms();
    let range_ms = range(&q.from, q.to.as_deref(), now)?;
    let sel = select(
        &state,
        &auth,
        &script,
        q.kind,
        range_ms,
        q.version,
        q.data_center,
        q.machine,
    )
    .await?;
    let filter = sel.filter(&auth.account);
    let (count, bytes) = state.store.window_totals(&filter).await?;
    if count == 0 {
        return Err(ApiError::not_found(
            "no_history",
            format!(
                "no continuous-profiling {}; agents ship one every window (10 s by default) unless they run with --continuous-hz 0",
                sel.describe()
            ),
        ));
    }
    if count > MAX_QUERY_WINDOWS || bytes > MAX_QUERY_BYTES {
        return Err(ApiError::bad_request(
            "range_too_large",
            format!(
                "from, to: the {} are {count} windows of {} MiB; one merge reads at most \
                 {MAX_QUERY_WINDOWS} windows and {} MiB: narrow the range or filter by version, \
                 data_center or machine",
                sel.describe(),
                bytes >> 20,
                MAX_QUERY_BYTES >> 20
            ),
        ));
    }

    let header = format!("edgeprof history: {} ({count} windows)", sel.describe());
    let (tx, mut rx) = tokio::sync::mpsc::channel(MERGE_QUEUE);
    let merging = tokio::task::spawn_blocking(move || merge_windows(&mut rx, &header));
    let read = state
        .store
        .for_each_window(&filter, |w| {
            let tx = tx.clone();
            async move { tx.send(w).await.map_err(|_| ()) }
        })
        .await;
    drop(tx);
    let merged = merging
        .await
        .map_err(|e| ApiError::internal(format_args!("history merge: {e}")))?
        .map_err(|e| ApiError::internal(format_args!("history merge: {e}")))?;
    // A closed channel means the merge ended early; its own error wins.
    read?.ok();
    let Some(merged) = merged else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unmergeable_history",
            format!(
                "none of the {count} {} could be merged (stored blobs unreadable)",
                sel.describe()
            ),
        ));
    };
    let name = format!("{}-{}-history.pprof", sel.script, sel.kind.as_str());
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
            (
                header::HeaderName::from_static("x-edgeprof-windows"),
                merged.windows.to_string(),
            ),
            (
                header::HeaderName::from_static("x-edgeprof-skipped-windows"),
                merged.skipped.to_string(),
            ),
        ],
        merged.pprof,
    )
        .into_response())
}

/// The step of a timeline: given (whole milliseconds, at least 1 s), or the
/// range over 60 rounded up to a whole second, at least 10 s; at most
/// [`rest::MAX_TIMELINE_POINTS`] steps.
fn step_ms(step: Option<&str>, from_ms: i64, to_ms: i64) -> ApiResult<i64> {
    let span = to_ms - from_ms;
    let step = match step {
        Some(text) => {
            let d = humantime::parse_duration(text.trim()).map_err(|_| {
                ApiError::bad_request(
                    "invalid_step",
                    format!(
                        "step: `{}` is not a duration (`10s`, `1m`, `1h`)",
                        echo(text)
                    ),
                )
            })?;
            let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            if ms < 1000 || d.subsec_nanos() % 1_000_000 != 0 {
                return Err(ApiError::bad_request(
                    "invalid_step",
                    format!(
                        "step: `{}` must be whole milliseconds of at least 1s",
                        echo(text)
                    ),
                ));
            }
            ms
        }
        None => ceil_div(span / 60, 1000)
            .saturating_mul(1000)
            .max(MIN_DEFAULT_STEP_MS),
    };
    let points = ceil_div(span, step);
    if unsigned(points) > rest::MAX_TIMELINE_POINTS {
        return Err(ApiError::bad_request(
            "invalid_step",
            format!(
                "step: {step} ms makes {points} points over the range; at most {} (a larger step or a shorter range)",
                rest::MAX_TIMELINE_POINTS
            ),
        ));
    }
    Ok(step)
}

/// `a / b` rounded up, for `a >= 0`, `b > 0`.
fn ceil_div(a: i64, b: i64) -> i64 {
    a / b + i64::from(a % b != 0)
}

/// `GET /scripts/{script}/history/timeline`.
pub async fn timeline(
    State(state): State<AppState>,
    auth: Authorized,
    Path((_, script)): Path<(String, String)>,
    Query(q): Query<rest::TimelineQuery>,
) -> ApiResult<Response> {
    let now = state.clock.now_ms();
    let (from_ms, to_ms) = range(&q.from, q.to.as_deref(), now)?;
    let step = step_ms(q.step.as_deref(), from_ms, to_ms)?;
    // Steps start at multiples of the step, so the points of successive
    // queries line up; the range widens to whole steps.
    let aligned = (
        from_ms.div_euclid(step) * step,
        to_ms.div_euclid(step) * step + if to_ms % step == 0 { 0 } else { step },
    );
    let sel = select(
        &state,
        &auth,
        &script,
        q.kind,
        aligned,
        q.version,
        q.data_center,
        q.machine,
    )
    .await?;
    let column = match q.group_by {
        None => TimelineColumn::All,
        Some(TimelineGroup::Version) => TimelineColumn::Version,
        Some(TimelineGroup::DataCenter) => TimelineColumn::DataCenter,
        Some(TimelineGroup::Machine) => TimelineColumn::Machine,
    };
    let points = unsigned((aligned.1 - aligned.0) / step);
    let limit = usize::try_from(points)
        .unwrap_or(usize::MAX)
        .saturating_mul(MAX_TIMELINE_SERIES)
        .saturating_add(1);
    let rows = state
        .store
        .window_timeline(&sel.filter(&auth.account), column, step, limit)
        .await?;
    let mut series: Vec<rest::TimelineSeries> = Vec::new();
    for r in rows {
        if series.last().is_none_or(|s| s.key != r.key) {
            if series.len() == MAX_TIMELINE_SERIES {
                return Err(ApiError::bad_request(
                    "too_many_series",
                    format!(
                        "group_by: more than {MAX_TIMELINE_SERIES} series in the range; filter by version, data_center or machine"
                    ),
                ));
            }
            series.push(rest::TimelineSeries {
                key: r.key.clone(),
                points: Vec::new(),
            });
        }
        let s = series.last_mut().expect("pushed above");
        s.points.push((
            aligned.0 + r.step * step,
            unsigned(r.value),
            unsigned(r.requests),
        ));
    }
    Ok(axum::Json(rest::Timeline {
        step_ms: unsigned(step),
        series,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_780_000_000_000;

    #[test]
    fn times_parse_in_every_documented_form() {
        assert_eq!(parse_time("from", "now", NOW).unwrap(), NOW);
        assert_eq!(parse_time("from", "-15m", NOW).unwrap(), NOW - 900_000);
        assert_eq!(parse_time("from", "-1d", NOW).unwrap(), NOW - 86_400_000);
        assert_eq!(
            parse_time("from", "1700000000123", NOW).unwrap(),
            1_700_000_000_123
        );
        assert_eq!(
            parse_time("from", "2026-12-04T10:00:00Z", NOW).unwrap(),
            1_796_378_400_000
        );
        assert_eq!(
            parse_time("from", "2026-12-04T12:00:00.250+02:00", NOW).unwrap(),
            1_796_378_400_250
        );
        assert_eq!(
            parse_time("from", "2026-12-04T05:30:00-04:30", NOW).unwrap(),
            1_796_378_400_000
        );
        for bad in [
            "",
            "yesterday",
            "-",
            "-15 parsecs",
            "2026-13-01T00:00:00Z",
            "2026-12-04T10:00:00+25:00",
        ] {
            let e = parse_time("to", bad, NOW).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, "invalid_time"),
                "{bad}"
            );
            assert!(e.message.starts_with("to: "), "{}", e.message);
        }
    }

    #[test]
    fn ranges_must_be_forward_and_at_most_31_days() {
        assert_eq!(range("-1h", None, NOW).unwrap(), (NOW - 3_600_000, NOW));
        let e = range("now", Some("-1h"), NOW).unwrap_err();
        assert!(
            e.message.starts_with("to: must be after from"),
            "{}",
            e.message
        );
        let e = range("-32d", None, NOW).unwrap_err();
        assert!(e.message.contains("at most 744 h"), "{}", e.message);
    }

    #[test]
    fn steps_default_to_a_60th_of_the_range_and_are_bounded() {
        assert_eq!(step_ms(None, 0, 3_600_000).unwrap(), 60_000);
        assert_eq!(step_ms(None, 0, 60_000).unwrap(), MIN_DEFAULT_STEP_MS);
        assert_eq!(step_ms(Some("2m"), 0, 3_600_000).unwrap(), 120_000);
        let e = step_ms(Some("1s"), 0, 86_400_000).unwrap_err();
        assert!(e.message.contains("86400 points"), "{}", e.message);
        let e = step_ms(Some("500ms"), 0, 60_000).unwrap_err();
        assert!(e.message.contains("at least 1s"), "{}", e.message);
        let e = step_ms(Some("soon"), 0, 60_000).unwrap_err();
        assert_eq!(e.code, "invalid_step");
    }
}
