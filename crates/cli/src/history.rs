//! `edgeprof history` and `edgeprof timeline`: continuous profiling's stored
//! windows over a range, as one merged pprof or as a timeline per version,
//! data center or machine (`GET …/scripts/{script}/history/{profile,timeline}`).
//!
//! Ranges are passed through as typed (`-15m`, `now`, RFC 3339, Unix ms): the
//! control plane parses them and names a bad field in its 400. The CLI
//! resolves them only to draw the sparkline's axis, best-effort, and never
//! drops a point the control plane sent. Rendering (summary line, table,
//! sparkline) is pure functions of the answer, tested below.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Result, anyhow, bail};
use edgeprof_proto::rest::{self, ProfileKind, TimelineGroup};

use crate::online::{Client, Connection, Kind};

/// Range and filters shared by `history` and `timeline`.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryFilter {
    /// Start of the range: RFC 3339, Unix ms, `now`, or relative (`-15m`, `-2h`, `-1d`).
    #[arg(long, default_value = "-1h", allow_hyphen_values = true)]
    pub from: String,
    /// End of the range (exclusive), in the same forms as --from.
    #[arg(long, default_value = "now", allow_hyphen_values = true)]
    pub to: String,
    /// Which windows: CPU time or heap allocations.
    #[arg(long = "type", value_enum, default_value_t = Kind::Cpu)]
    pub kind: Kind,
    /// Only this version: `latest`, a version id, or a unique prefix.
    #[arg(long)]
    pub version: Option<String>,
    /// Only this data center (e.g. `lhr`).
    #[arg(long, value_name = "CODE")]
    pub data_center: Option<String>,
    /// Only this machine.
    #[arg(long, value_name = "ID")]
    pub machine: Option<String>,
}

/// Flags of `edgeprof history`.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// Script whose history to merge.
    pub script: String,
    #[command(flatten)]
    pub filter: HistoryFilter,
    /// Write the merged gzip'd pprof here (`-` for stdout).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Flags of `edgeprof timeline`.
#[derive(Debug, clap::Args)]
pub struct TimelineArgs {
    /// Script whose timeline to show.
    pub script: String,
    #[command(flatten)]
    pub filter: HistoryFilter,
    /// Width of one point (`10s`, `1m`, `1h`); default: the range over 60,
    /// at least one window.
    #[arg(long)]
    pub step: Option<String>,
    /// One series per version, data center or machine; default: one series `all`.
    #[arg(long, value_enum)]
    pub group_by: Option<Group>,
    /// Print the control plane's JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--group-by` values, spelled as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// One series per version id.
    Version,
    /// One series per data center.
    #[value(name = "data_center", alias = "data-center")]
    DataCenter,
    /// One series per machine.
    Machine,
}

impl From<Group> for TimelineGroup {
    fn from(g: Group) -> TimelineGroup {
        match g {
            Group::Version => TimelineGroup::Version,
            Group::DataCenter => TimelineGroup::DataCenter,
            Group::Machine => TimelineGroup::Machine,
        }
    }
}

/// The query of `…/history/profile`.
fn history_query(f: &HistoryFilter) -> rest::HistoryQuery {
    rest::HistoryQuery {
        kind: f.kind.into(),
        from: f.from.clone(),
        to: Some(f.to.clone()),
        version: f.version.clone(),
        data_center: f.data_center.clone(),
        machine: f.machine.clone(),
    }
}

/// The query of `…/history/timeline`.
fn timeline_query(args: &TimelineArgs) -> rest::TimelineQuery {
    let f = &args.filter;
    rest::TimelineQuery {
        kind: f.kind.into(),
        from: f.from.clone(),
        to: Some(f.to.clone()),
        step: args.step.clone(),
        group_by: args.group_by.map(Into::into),
        version: f.version.clone(),
        data_center: f.data_center.clone(),
        machine: f.machine.clone(),
    }
}

pub fn history(conn: &Connection, args: &HistoryArgs, out: &mut impl Write) -> Result<ExitCode> {
    let to_stdout = args.output == Path::new("-");
    if to_stdout && std::io::stdout().is_terminal() {
        bail!(
            "refusing to write a binary profile to the terminal: pass -o FILE or redirect stdout"
        );
    }
    let client = Client::new(conn)?;
    let script = args.script.as_str();
    let what = format!("history {script}");
    let query = history_query(&args.filter);
    let bytes = while_waiting(
        &format!("merging the {} history of {script}", query.kind),
        || {
            let sent = client
                .request(
                    ureq::Agent::get,
                    &["scripts", script, "history", "profile"],
                    &query,
                )?
                .call();
            crate::online::read_bytes(client.check(sent, &what)?, &what)
        },
    )?;
    // Checked before writing: an answer that is not a profile is not saved as one.
    let summary = ProfileSummary::of(&bytes, query.kind)
        .map_err(|e| anyhow!("{what}: the control plane's answer is not a pprof: {e}"))?;
    if to_stdout {
        out.write_all(&bytes)?;
        eprintln!(
            "edgeprof: {}",
            summary.line("the profile to stdout", bytes.len())
        );
    } else {
        crate::offline::write_output(&args.output, &bytes)?;
        writeln!(
            out,
            "{}",
            summary.line(&args.output.display().to_string(), bytes.len())
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn timeline(conn: &Connection, args: &TimelineArgs, out: &mut impl Write) -> Result<ExitCode> {
    let client = Client::new(conn)?;
    let script = args.script.as_str();
    let query = timeline_query(args);
    let now_ms = unix_ms(SystemTime::now());
    let timeline: rest::Timeline = while_waiting(&format!("timeline of {script}"), || {
        client.get(
            &["scripts", script, "history", "timeline"],
            &query,
            &format!("timeline {script}"),
        )
    })?;
    if args.json {
        serde_json::to_writer(&mut *out, &timeline)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if timeline.series.is_empty() {
        eprintln!(
            "edgeprof: no {} history of {script} from {} to {}",
            query.kind, args.filter.from, args.filter.to
        );
        return Ok(ExitCode::SUCCESS);
    }
    let range = resolve_time(&args.filter.from, now_ms).zip(resolve_time(&args.filter.to, now_ms));
    for line in render_timeline(&timeline, query.kind, range) {
        writeln!(out, "{line}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `f` with a spinner on stderr (drawn only on a terminal): merging a
/// long range can take the control plane a while.
fn while_waiting<T>(message: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(message.to_owned());
    spinner.enable_steady_tick(Duration::from_millis(120));
    let result = f();
    spinner.finish_and_clear();
    result
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What `edgeprof history` says of the profile it wrote.
#[derive(Debug, PartialEq, Eq)]
struct ProfileSummary {
    samples: usize,
    /// The kind's value summed, with its sample type: `1.50 s cpu`.
    total: String,
    /// The `requests: N` comment, as the control plane wrote it.
    requests: Option<String>,
}

impl ProfileSummary {
    fn of(pprof: &[u8], kind: ProfileKind) -> Result<ProfileSummary> {
        let p = edgeprof_pprof::decode(pprof)?;
        let types = edgeprof_pprof::sample_types(&p);
        // The type the control plane sums per window; else pprof's default.
        let wanted = match kind {
            ProfileKind::Cpu => "cpu",
            ProfileKind::Heap => "alloc_space",
        };
        let total = match types
            .iter()
            .position(|(t, _)| *t == wanted)
            .or(types.len().checked_sub(1))
        {
            Some(i) => {
                let sum = p
                    .sample
                    .iter()
                    .filter_map(|s| s.value.get(i))
                    .fold(0i64, |a, v| a.saturating_add(*v));
                let (name, unit) = types[i];
                let value = match unit {
                    "nanoseconds" => cpu(sum as f64),
                    "bytes" => bytes(sum as f64),
                    _ => format!("{sum} {unit}"),
                };
                format!("{value} {name}")
            }
            None => "no sample type".to_owned(),
        };
        let requests = p
            .comment
            .iter()
            .map(|&c| edgeprof_pprof::string(&p, c))
            .find(|c| c.starts_with("requests: "))
            .map(str::to_owned);
        Ok(ProfileSummary {
            samples: p.sample.len(),
            total,
            requests,
        })
    }

    /// `wrote out.pprof: 2345 bytes, 12 samples, 1.50 s cpu, requests: 118`.
    fn line(&self, target: &str, bytes: usize) -> String {
        format!(
            "wrote {target}: {bytes} bytes, {} sample{}, {}, {}",
            self.samples,
            if self.samples == 1 { "" } else { "s" },
            self.total,
            self.requests.as_deref().unwrap_or("requests: unknown")
        )
    }
}

/// CPU nanoseconds as ms or s: `0.250 ms`, `12.3 ms`, `1.50 s`.
fn cpu(ns: f64) -> String {
    let ms = ns / 1e6;
    if ms < 1.0 {
        format!("{ms:.3} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// Bytes as B, KiB, MiB or GiB: `512 B`, `1.5 KiB`, `12.0 MiB`.
fn bytes(b: f64) -> String {
    const KIB: f64 = 1024.0;
    if b < KIB {
        format!("{b:.0} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

/// Widest sparkline, in columns; longer ranges put several steps in a bar.
/// Not 60: the server's default step (a 60th of the range, on a grid of
/// whole steps) touches 61 steps when `from` is not on the grid, and those
/// should still get one bar each.
const SPARKLINE_WIDTH: u64 = 64;
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The steps a sparkline covers: `steps` of `step_ms` from `start_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Axis {
    start_ms: i64,
    step_ms: i64,
    steps: u64,
}

impl Axis {
    /// Every point of `timeline`, and the steps of `range` (resolved
    /// `from`, `to`) on the same grid as the points when it is known and
    /// plausible; `None` when there is no point.
    fn of(timeline: &rest::Timeline, range: Option<(i64, i64)>) -> Option<Axis> {
        let step_ms = i64::try_from(timeline.step_ms).ok().filter(|s| *s > 0)?;
        let times = timeline.series.iter().flat_map(|s| &s.points).map(|p| p.0);
        let first = times.clone().min()?;
        let last = times.max()?;
        let observed = Axis {
            start_ms: first,
            step_ms,
            steps: ((last - first) / step_ms + 1) as u64,
        };
        let Some((from, to)) = range.filter(|(from, to)| from < to) else {
            return Some(observed);
        };
        // The steps on the points' grid from the one holding `from` to the
        // last starting before `to` (as the server widens the range to whole
        // steps); never fewer than the points need (our `now` is not the
        // server's).
        let gap = first.saturating_sub(from).max(0);
        let start_ms = first - (gap / step_ms + i64::from(gap % step_ms != 0)) * step_ms;
        let end_ms = (last + step_ms).max(to);
        let steps = ((end_ms - start_ms) + step_ms - 1) / step_ms;
        if steps as u64 > rest::MAX_TIMELINE_POINTS + 2 {
            // Not the range the server answered for (an unparsed form).
            return Some(observed);
        }
        Some(Axis {
            start_ms,
            step_ms,
            steps: steps as u64,
        })
    }

    /// Steps per bar, so the line is at most [`SPARKLINE_WIDTH`] wide.
    fn steps_per_bar(&self) -> u64 {
        self.steps.div_ceil(SPARKLINE_WIDTH).max(1)
    }
}

/// One bar per step (or per group of steps, averaged), scaled to the
/// series' own peak; a bar with no point is a space, so "no data" differs
/// from "little".
fn sparkline(points: &[(i64, u64, u64)], axis: &Axis) -> String {
    let per = axis.steps_per_bar();
    let bars = axis.steps.div_ceil(per) as usize;
    let mut sums = vec![None::<u64>; bars];
    for &(t, value, _) in points {
        let step = (t - axis.start_ms).div_euclid(axis.step_ms);
        let Some(bar) = u64::try_from(step)
            .ok()
            .map(|s| (s / per) as usize)
            .filter(|b| *b < bars)
        else {
            continue;
        };
        let sum = sums[bar].get_or_insert(0);
        *sum = sum.saturating_add(value);
    }
    let means: Vec<Option<f64>> = sums
        .iter()
        .enumerate()
        .map(|(i, sum)| {
            // The last bar may hold fewer steps.
            let steps = per.min(axis.steps - i as u64 * per);
            sum.map(|s| s as f64 / steps as f64)
        })
        .collect();
    let peak = means.iter().flatten().fold(0.0f64, |a, m| a.max(*m));
    means
        .iter()
        .map(|m| match m {
            None => ' ',
            Some(_) if peak == 0.0 => BARS[0],
            Some(m) => BARS[((m / peak) * 7.0).round() as usize],
        })
        .collect()
}

/// The table of `edgeprof timeline`: one row per series with its total,
/// requests, value per request and sparkline, under a header.
fn render_timeline(
    timeline: &rest::Timeline,
    kind: ProfileKind,
    range: Option<(i64, i64)>,
) -> Vec<String> {
    let human = |v: f64| match kind {
        ProfileKind::Cpu => cpu(v),
        ProfileKind::Heap => bytes(v),
    };
    let (value, per_request) = match kind {
        ProfileKind::Cpu => ("cpu", "cpu/request"),
        ProfileKind::Heap => ("allocated", "bytes/request"),
    };
    let axis = Axis::of(timeline, range);
    let key_width = timeline
        .series
        .iter()
        .map(|s| s.key.chars().count())
        .max()
        .unwrap_or(0)
        .max(3);
    let history = match &axis {
        Some(a) => format!(
            "{} per bar, {} to {}",
            humantime::format_duration(Duration::from_millis(a.step_ms as u64 * a.steps_per_bar())),
            utc(a.start_ms),
            utc(a.start_ms + a.step_ms * a.steps as i64)
        ),
        None => "history".to_owned(),
    };
    let mut lines = vec![format!(
        "{:<key_width$}  {value:>10}  {:>9}  {per_request:>13}  {history}",
        "key", "requests"
    )];
    for s in &timeline.series {
        let total = s.points.iter().fold(0u64, |a, p| a.saturating_add(p.1));
        let requests = s.points.iter().fold(0u64, |a, p| a.saturating_add(p.2));
        let each = if requests == 0 {
            "-".to_owned()
        } else {
            human(total as f64 / requests as f64)
        };
        let line = axis
            .as_ref()
            .map(|a| sparkline(&s.points, a))
            .unwrap_or_default();
        lines.push(
            format!(
                "{:<key_width$}  {:>10}  {requests:>9}  {each:>13}  {line}",
                s.key,
                human(total as f64)
            )
            .trim_end()
            .to_owned(),
        );
    }
    lines
}

/// Unix ms as UTC to the second.
fn utc(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => {
            humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
                .to_string()
        }
        Err(_) => ms.to_string(),
    }
}

/// `--from`/`--to` as Unix ms, for the sparkline's axis only: `now`,
/// `-15m` (any humantime duration after `-`), Unix ms, RFC 3339 with `Z`
/// or an offset. `None` for anything else (the server is the judge).
fn resolve_time(s: &str, now_ms: i64) -> Option<i64> {
    let s = s.trim();
    if s == "now" {
        return Some(now_ms);
    }
    if let Some(ago) = s.strip_prefix('-') {
        let d = humantime::parse_duration(ago).ok()?;
        return now_ms.checked_sub(i64::try_from(d.as_millis()).ok()?);
    }
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    // `…+01:00` / `…-05:30`: humantime reads only UTC, so shift by hand.
    let (utc_part, offset_ms) = match s.len().checked_sub(6).and_then(|i| s.get(i..)) {
        Some(tail) if matches!(tail.as_bytes()[0], b'+' | b'-') && tail.as_bytes()[3] == b':' => {
            let h: i64 = tail.get(1..3)?.parse().ok()?;
            let m: i64 = tail.get(4..6)?.parse().ok()?;
            let sign = if tail.starts_with('-') { -1 } else { 1 };
            (&s[..s.len() - 6], sign * (h * 60 + m) * 60_000)
        }
        _ => (s.strip_suffix(['Z', 'z']).unwrap_or(s), 0),
    };
    let t = humantime::parse_rfc3339_weak(utc_part).ok()?;
    Some(unix_ms(t) - offset_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct HistoryCli {
        #[command(flatten)]
        args: HistoryArgs,
    }

    #[derive(Debug, Parser)]
    struct TimelineCli {
        #[command(flatten)]
        args: TimelineArgs,
    }

    fn client() -> Client {
        Client::new(&Connection {
            url: "https://cp.example/".into(),
            token: Some("t".into()),
            account: Some("acme".into()),
            ca_cert: None,
        })
        .unwrap()
    }

    /// The URL `edgeprof history ARGS` requests.
    fn history_url(args: &[&str]) -> String {
        let cli = HistoryCli::try_parse_from([&["edgeprof"], args].concat()).unwrap();
        client()
            .url(
                &["scripts", &cli.args.script, "history", "profile"],
                &history_query(&cli.args.filter),
            )
            .unwrap()
    }

    /// The URL `edgeprof timeline ARGS` requests.
    fn timeline_url(args: &[&str]) -> String {
        let cli = TimelineCli::try_parse_from([&["edgeprof"], args].concat()).unwrap();
        client()
            .url(
                &["scripts", &cli.args.script, "history", "timeline"],
                &timeline_query(&cli.args),
            )
            .unwrap()
    }

    const BASE: &str = "https://cp.example/v1/accounts/acme/scripts";

    #[test]
    fn history_queries_are_encoded() {
        assert_eq!(
            history_url(&["api", "-o", "x.pprof"]),
            format!("{BASE}/api/history/profile?type=cpu&from=-1h&to=now")
        );
        // A relative time is a value, not a flag, with or without `=`.
        assert_eq!(
            history_url(&[
                "api", "--from", "-15m", "--to=-5m", "--type", "heap", "-o", "-"
            ]),
            format!("{BASE}/api/history/profile?type=heap&from=-15m&to=-5m")
        );
        // `+` of an offset would read as a space if sent as is; `&` and `=`
        // in a filter cannot add a parameter.
        assert_eq!(
            history_url(&[
                "we b",
                "--from",
                "2026-12-04T10:00:00+01:00",
                "--to",
                "1796302217422",
                "--version",
                "v1&machine=m2",
                "--data-center",
                "lhr",
                "--machine",
                "m 1",
                "-o",
                "x",
            ]),
            format!(
                "{BASE}/we%20b/history/profile?type=cpu&from=2026-12-04T10%3A00%3A00%2B01%3A00\
                 &to=1796302217422&version=v1%26machine%3Dm2&data_center=lhr&machine=m+1"
            )
        );
        let missing = HistoryCli::try_parse_from(["edgeprof", "api"]).unwrap_err();
        assert!(missing.to_string().contains("--output"), "{missing}");
    }

    #[test]
    fn timeline_queries_are_encoded() {
        assert_eq!(
            timeline_url(&["api"]),
            format!("{BASE}/api/history/timeline?type=cpu&from=-1h&to=now")
        );
        assert_eq!(
            timeline_url(&[
                "api",
                "--from",
                "-2h",
                "--step",
                "5m",
                "--group-by",
                "data_center",
                "--version",
                "latest",
            ]),
            format!(
                "{BASE}/api/history/timeline?type=cpu&from=-2h&to=now&step=5m\
                 &group_by=data_center&version=latest"
            )
        );
        for (flag, wire) in [
            ("version", "version"),
            ("data-center", "data_center"),
            ("machine", "machine"),
        ] {
            assert!(
                timeline_url(&["api", "--group-by", flag]).ends_with(&format!("group_by={wire}")),
                "{flag}"
            );
        }
    }

    #[test]
    fn times_resolve_for_the_axis() {
        let now = 1_796_302_217_422;
        assert_eq!(resolve_time("now", now), Some(now));
        assert_eq!(resolve_time("-15m", now), Some(now - 15 * 60_000));
        assert_eq!(resolve_time("-1d", now), Some(now - 86_400_000));
        assert_eq!(resolve_time("1700000000000", now), Some(1_700_000_000_000));
        let utc = 1_796_378_400_000; // 2026-12-04T10:00:00Z
        assert_eq!(resolve_time("2026-12-04T10:00:00Z", now), Some(utc));
        assert_eq!(
            resolve_time("2026-12-04T11:00:00+01:00", now),
            Some(utc),
            "an offset is subtracted"
        );
        assert_eq!(resolve_time("2026-12-04T04:30:00-05:30", now), Some(utc));
        assert_eq!(resolve_time("yesterday", now), None);
        assert_eq!(resolve_time("-forever", now), None);
    }

    fn series(key: &str, points: &[(i64, u64, u64)]) -> rest::TimelineSeries {
        rest::TimelineSeries {
            key: key.into(),
            points: points.to_vec(),
        }
    }

    const T0: i64 = 1_796_378_400_000; // 2026-12-04T10:00:00Z
    const MIN: i64 = 60_000;

    #[test]
    fn sparkline_scales_to_the_peak_and_leaves_gaps() {
        let axis = Axis {
            start_ms: T0,
            step_ms: MIN,
            steps: 10,
        };
        let points: Vec<_> = (0..8).map(|i| (T0 + i * MIN, (i as u64) * 10, 1)).collect();
        assert_eq!(sparkline(&points, &axis), "▁▂▃▄▅▆▇█  ");
        // A missing step is a space; a step with 0 is the lowest bar.
        let gappy = [(T0, 0, 0), (T0 + 2 * MIN, 5, 1), (T0 + 9 * MIN, 10, 1)];
        assert_eq!(sparkline(&gappy, &axis), "▁ ▅      █");
        // All zero: lowest bars where there is data.
        assert_eq!(sparkline(&[(T0 + MIN, 0, 3)], &axis), " ▁        ");
        // A point outside the axis is not drawn (and does not panic).
        assert_eq!(sparkline(&[(T0 - MIN, 9, 1)], &axis), " ".repeat(10));
    }

    #[test]
    fn long_ranges_are_bucketed_to_at_most_64_bars() {
        // The server's default step over an hour not on the minute: 61
        // steps, one bar each.
        let hour = Axis {
            start_ms: T0,
            step_ms: MIN,
            steps: 61,
        };
        assert_eq!(hour.steps_per_bar(), 1);
        // 24 h of minutes: 23 steps a bar, 63 bars (the last of 14 steps).
        let axis = Axis {
            steps: 1440,
            ..hour
        };
        assert_eq!(axis.steps_per_bar(), 23);
        let flat: Vec<_> = (0..1440).map(|i| (T0 + i * MIN, 100, 1)).collect();
        assert_eq!(sparkline(&flat, &axis), "█".repeat(63));
        // Only the last 50 minutes busy: 13 of bar 60's 23 steps, then
        // bars 61 and 62 full; the rest gaps.
        let tail: Vec<_> = (1390..1440).map(|i| (T0 + i * MIN, 100, 1)).collect();
        assert_eq!(sparkline(&tail, &axis), format!("{}▅██", " ".repeat(60)));
        // 65 steps: 2 a bar, the last bar holds one step and is averaged
        // over it, not halved.
        let axis = Axis { steps: 65, ..hour };
        let flat: Vec<_> = (0..65).map(|i| (T0 + i * MIN, 100, 1)).collect();
        assert_eq!(sparkline(&flat, &axis), "█".repeat(33));
    }

    #[test]
    fn the_axis_covers_the_range_and_every_point() {
        let t = rest::Timeline {
            step_ms: MIN as u64,
            series: vec![
                series("a", &[(T0 + 10 * MIN, 1, 1)]),
                series("b", &[(T0 + 20 * MIN, 1, 1)]),
            ],
        };
        let observed = Axis {
            start_ms: T0 + 10 * MIN,
            step_ms: MIN,
            steps: 11,
        };
        assert_eq!(Axis::of(&t, None), Some(observed));
        assert_eq!(
            Axis::of(&t, Some((T0, T0 + 60 * MIN))),
            Some(Axis {
                start_ms: T0,
                steps: 60,
                ..observed
            })
        );
        // A `from` inside a step starts the axis at that step.
        assert_eq!(
            Axis::of(&t, Some((T0 + 30_000, T0 + 60 * MIN))),
            Some(Axis {
                start_ms: T0,
                steps: 60,
                ..observed
            })
        );
        // Our `now` trailing the server's: the last point is still drawn.
        assert_eq!(
            Axis::of(&t, Some((T0 + 15 * MIN, T0 + 18 * MIN))),
            Some(observed)
        );
        // A range the server cannot have answered for falls back.
        assert_eq!(Axis::of(&t, Some((0, T0 + 60 * MIN))), Some(observed));
        let empty = rest::Timeline {
            step_ms: MIN as u64,
            series: vec![],
        };
        assert_eq!(Axis::of(&empty, None), None);
    }

    #[test]
    fn timeline_table() {
        let t = rest::Timeline {
            step_ms: MIN as u64,
            series: vec![
                series(
                    "01a236d7-aaa6-7317-b579-e297cd4062f8",
                    &[
                        (T0, 2_000_000, 8),
                        (T0 + MIN, 4_000_000, 8),
                        (T0 + 3 * MIN, 8_000_000, 16),
                    ],
                ),
                series("lhr", &[(T0 + 4 * MIN, 1_500_000_000, 0)]),
            ],
        };
        assert_eq!(
            render_timeline(&t, ProfileKind::Cpu, Some((T0, T0 + 5 * MIN))).join("\n"),
            "\
key                                          cpu   requests    cpu/request  1m per bar, 2026-12-04T10:00:00Z to 2026-12-04T10:05:00Z
01a236d7-aaa6-7317-b579-e297cd4062f8     14.0 ms         32       0.438 ms  ▃▅ █
lhr                                       1.50 s          0              -      █"
        );
        let heap = rest::Timeline {
            step_ms: 10_000,
            series: vec![series("all", &[(T0, 3 << 20, 3), (T0 + 10_000, 1536, 0)])],
        };
        assert_eq!(
            render_timeline(&heap, ProfileKind::Heap, None),
            [
                "key   allocated   requests  bytes/request  10s per bar, 2026-12-04T10:00:00Z to 2026-12-04T10:00:20Z",
                "all     3.0 MiB          3        1.0 MiB  █▁",
            ]
        );
    }

    #[test]
    fn human_values() {
        assert_eq!(cpu(250_000.0), "0.250 ms");
        assert_eq!(cpu(12_340_000.0), "12.3 ms");
        assert_eq!(cpu(1_500_000_000.0), "1.50 s");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(12.0 * 1024.0 * 1024.0), "12.0 MiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.00 GiB");
    }

    /// A profile with one sample of `values[i]` in function `f{i}`.
    fn profile(types: &[(&str, &str)], values: &[&[i64]], comment: Option<&str>) -> Vec<u8> {
        let mut b = edgeprof_pprof::ProfileBuilder::new(types);
        for (i, v) in values.iter().enumerate() {
            let name = format!("f{i}");
            let f = b.function(&name, &name, "main.rs", 1);
            let l = b.location(
                0,
                0,
                &[edgeprof_pprof::LineSpec {
                    function_id: f,
                    line: 1,
                    column: 0,
                }],
            );
            b.add_sample(&[l], v, &[]);
        }
        if let Some(c) = comment {
            b.comment(c);
        }
        edgeprof_pprof::encode(&b.build())
    }

    #[test]
    fn history_summary_line() {
        let cpu_types = [("samples", "count"), ("cpu", "nanoseconds")];
        let p = profile(
            &cpu_types,
            &[&[1, 1_000_000_000], &[1, 500_000_000]],
            Some("requests: 118"),
        );
        let s = ProfileSummary::of(&p, ProfileKind::Cpu).unwrap();
        assert_eq!(
            s.line("out.pprof", p.len()),
            format!(
                "wrote out.pprof: {} bytes, 2 samples, 1.50 s cpu, requests: 118",
                p.len()
            )
        );
        let heap_types = [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ];
        let p = profile(&heap_types, &[&[1, 2048, 1, 512]], None);
        assert_eq!(
            ProfileSummary::of(&p, ProfileKind::Heap)
                .unwrap()
                .line("-", 9),
            "wrote -: 9 bytes, 1 sample, 2.0 KiB alloc_space, requests: unknown"
        );
        let e = ProfileSummary::of(b"not a profile", ProfileKind::Cpu).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
}
