//! Reports over a validated profile: `top` (flat/cum per function, with
//! `go tool pprof -top` semantics) and collapsed stacks.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::{Function, Location, Mapping, Profile, string};

/// Which value of each sample a report reads: a sample type by name
/// (`cpu`, `alloc_space`) or by 0-based position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleIndex {
    /// The sample type whose `type` is this name.
    Name(String),
    /// The sample type at this position.
    Position(usize),
}

impl std::str::FromStr for SampleIndex {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.parse::<usize>() {
            Ok(n) => SampleIndex::Position(n),
            Err(_) => SampleIndex::Name(s.to_owned()),
        })
    }
}

/// Why a report cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The profile has no sample types at all.
    #[error("the profile has no sample types")]
    NoSampleTypes,
    /// The requested sample index does not exist.
    #[error("sample index {requested:?} not found; the profile has: {available}")]
    UnknownSampleIndex {
        /// What was asked for.
        requested: String,
        /// The sample types there are, as `0=samples, 1=cpu`.
        available: String,
    },
}

/// The position of the sample type `index` names; `None` picks the
/// profile's default (its `default_sample_type`, else the last type, as pprof).
pub fn resolve_sample_index(
    profile: &Profile,
    index: Option<&SampleIndex>,
) -> Result<usize, ReportError> {
    let n = profile.sample_type.len();
    if n == 0 {
        return Err(ReportError::NoSampleTypes);
    }
    let by_name = |name: &str| {
        profile
            .sample_type
            .iter()
            .position(|vt| string(profile, vt.r#type) == name)
    };
    let unknown = |requested: String| ReportError::UnknownSampleIndex {
        requested,
        available: profile
            .sample_type
            .iter()
            .enumerate()
            .map(|(i, vt)| format!("{i}={}", string(profile, vt.r#type)))
            .collect::<Vec<_>>()
            .join(", "),
    };
    match index {
        None => {
            if profile.default_sample_type != 0
                && let Some(i) = by_name(string(profile, profile.default_sample_type))
            {
                return Ok(i);
            }
            Ok(n - 1)
        }
        Some(SampleIndex::Position(i)) if *i < n => Ok(*i),
        Some(SampleIndex::Position(i)) => Err(unknown(i.to_string())),
        Some(SampleIndex::Name(name)) => by_name(name).ok_or_else(|| unknown(name.clone())),
    }
}

/// One frame of a stack, after expanding inlined calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Function name (`<unknown>` or `[module]` when the location has no lines).
    pub function: &'a str,
    /// Source file, `""` if unknown.
    pub file: &'a str,
    /// Source line, 0 if unknown.
    pub line: i64,
    /// Whether this frame was inlined into its caller.
    pub inlined: bool,
    /// The location has no lines: `function` is the base name of its
    /// mapping's file, which reports show as `[name]`, as pprof does.
    pub unsymbolized: bool,
}

impl Frame<'_> {
    /// The name reports show: `function`, or `[function]` when unsymbolized.
    pub fn display_name(&self) -> std::borrow::Cow<'_, str> {
        if self.unsymbolized {
            format!("[{}]", self.function).into()
        } else {
            self.function.into()
        }
    }
}

/// Id → entry lookups for a validated profile.
pub(crate) struct Index<'a> {
    profile: &'a Profile,
    locations: Lookup<'a, Location>,
    functions: Lookup<'a, Function>,
    mappings: Lookup<'a, Mapping>,
}

pub(crate) enum Lookup<'a, T> {
    /// Ids are 1..=n in order: id - 1 is the position.
    Dense(&'a [T]),
    Sparse(FxHashMap<u64, &'a T>),
}

impl<'a, T> Lookup<'a, T> {
    pub(crate) fn new(items: &'a [T], id: impl Fn(&T) -> u64) -> Self {
        if items.iter().enumerate().all(|(i, x)| id(x) == i as u64 + 1) {
            Lookup::Dense(items)
        } else {
            Lookup::Sparse(items.iter().map(|x| (id(x), x)).collect())
        }
    }
    pub(crate) fn get(&self, id: u64) -> Option<&'a T> {
        match self {
            Lookup::Dense(items) => id.checked_sub(1).and_then(|i| items.get(i as usize)),
            Lookup::Sparse(map) => map.get(&id).copied(),
        }
    }
}

impl<'a> Index<'a> {
    pub(crate) fn new(profile: &'a Profile) -> Self {
        Index {
            profile,
            locations: Lookup::new(&profile.location, |l| l.id),
            functions: Lookup::new(&profile.function, |f| f.id),
            mappings: Lookup::new(&profile.mapping, |m| m.id),
        }
    }

    /// Frames of one location, innermost first.
    pub(crate) fn location_frames(&self, id: u64, out: &mut Vec<Frame<'a>>) {
        let p = self.profile;
        let Some(loc) = self.locations.get(id) else {
            out.push(Frame {
                function: "<unknown>",
                file: "",
                line: 0,
                inlined: false,
                unsymbolized: false,
            });
            return;
        };
        if loc.line.is_empty() {
            let module = self
                .mappings
                .get(loc.mapping_id)
                .map(|m| string(p, m.filename))
                .unwrap_or("");
            // pprof names such a frame by the base name of the mapping's
            // file, shown in brackets (`[worker.wasm]`).
            let base = module.rsplit('/').next().unwrap_or(module);
            out.push(Frame {
                function: if base.is_empty() { "<unknown>" } else { base },
                file: "",
                line: 0,
                inlined: false,
                unsymbolized: !base.is_empty(),
            });
            return;
        }
        let last = loc.line.len() - 1;
        for (i, line) in loc.line.iter().enumerate() {
            let (function, file) = match self.functions.get(line.function_id) {
                Some(f) => (string(p, f.name), string(p, f.filename)),
                None => ("<unknown>", ""),
            };
            out.push(Frame {
                function,
                file,
                line: line.line,
                inlined: i != last,
                unsymbolized: false,
            });
        }
    }
}

/// Frames of `sample`, leaf (innermost) first, inlined calls expanded.
pub fn stack_frames<'a>(profile: &'a Profile, sample: &crate::Sample) -> Vec<Frame<'a>> {
    let index = Index::new(profile);
    let mut out = Vec::new();
    for &id in &sample.location_id {
        index.location_frames(id, &mut out);
    }
    out
}

/// How `top` orders its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TopSort {
    /// By flat, then name, then cum (pprof's default).
    #[default]
    Flat,
    /// By cum, then name, then flat (pprof's `-cum`).
    Cum,
}

/// Options of [`top`].
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// Which sample value; `None` = the profile's default.
    pub sample_index: Option<SampleIndex>,
    /// Row order.
    pub sort: TopSort,
    /// Functions whose |cum| is below this fraction of the total are left out,
    /// as pprof's `-nodefraction` (default 0.005).
    pub node_fraction: f64,
    /// Keep at most this many rows.
    pub limit: Option<usize>,
    /// What percentages and the node-fraction cutoff are of, instead of
    /// the profile's [`total`]: pprof takes them before a `-tagfocus`, so a
    /// front that focuses passes the unfocused profile's total.
    pub total: Option<i64>,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            sample_index: None,
            sort: TopSort::Flat,
            node_fraction: 0.005,
            limit: None,
            total: None,
        }
    }
}

/// Sum of |value| at sample index `vi` over all samples: what `top`'s
/// percentages are of.
pub fn total(profile: &Profile, vi: usize) -> i64 {
    profile
        .sample
        .iter()
        .filter_map(|s| s.value.get(vi))
        .fold(0i64, |acc, v| acc.saturating_add(v.saturating_abs()))
}

/// One function's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopRow {
    /// Function name.
    pub function: String,
    /// Value of samples whose leaf frame is this function.
    pub flat: i64,
    /// Value of samples with this function anywhere on the stack, counted
    /// once per sample however often it recurs.
    pub cum: i64,
}

/// The result of [`top`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopReport {
    /// Position of the sample type reported.
    pub sample_index: usize,
    /// Its type name, e.g. `cpu`.
    pub sample_type: String,
    /// Its unit, e.g. `nanoseconds`.
    pub unit: String,
    /// What percentages and the cutoff are of: [`TopOptions::total`], or
    /// the sum of |value| over all samples.
    pub total: i64,
    /// The rows, in the requested order.
    pub rows: Vec<TopRow>,
    /// Functions left out by the node fraction.
    pub dropped_nodes: usize,
    /// The |cum| below which functions were left out.
    pub node_cutoff: i64,
    /// Functions left out by the row limit.
    pub truncated_nodes: usize,
}

/// Flat and cum per function, as `go tool pprof -top` computes them
/// (granularity: function name).
pub fn top<'a>(profile: &'a Profile, options: &TopOptions) -> Result<TopReport, ReportError> {
    let vi = resolve_sample_index(profile, options.sample_index.as_ref())?;
    let index = Index::new(profile);

    // Node per distinct function name (pprof's default granularity).
    let mut nodes: FxHashMap<(&str, bool), usize> = FxHashMap::default();
    let mut names: Vec<(&str, bool)> = Vec::new();
    let mut node_of = |key: (&'a str, bool)| -> usize {
        *nodes.entry(key).or_insert_with(|| {
            names.push(key);
            names.len() - 1
        })
    };

    // Each location's nodes (innermost first), resolved once, so the loop
    // over samples only indexes arrays.
    let dense = profile
        .location
        .iter()
        .enumerate()
        .all(|(i, l)| l.id == i as u64 + 1);
    let mut slot_of_id: FxHashMap<u64, usize> = FxHashMap::default();
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(profile.location.len());
    let mut location_nodes: Vec<usize> = Vec::new();
    let mut frames = Vec::new();
    for loc in &profile.location {
        frames.clear();
        index.location_frames(loc.id, &mut frames);
        let start = location_nodes.len();
        location_nodes.extend(frames.iter().map(|f| node_of((f.function, f.unsymbolized))));
        if !dense {
            slot_of_id.insert(loc.id, ranges.len());
        }
        ranges.push((start, location_nodes.len()));
    }
    // Only an unvalidated profile can name a location that does not exist.
    let unknown = [node_of(("<unknown>", false))];

    let n = names.len();
    let mut flat: Vec<i64> = vec![0; n];
    let mut cum: Vec<i64> = vec![0; n];
    let mut last_seen: Vec<usize> = vec![usize::MAX; n];
    let mut sum: i64 = 0;
    for (si, s) in profile.sample.iter().enumerate() {
        let Some(&v) = s.value.get(vi) else { continue };
        sum = sum.saturating_add(v.saturating_abs());
        if v == 0 {
            continue;
        }
        let mut leaf = true;
        for &id in &s.location_id {
            let slot = if dense {
                id.checked_sub(1)
                    .map(|i| i as usize)
                    .filter(|&i| i < ranges.len())
            } else {
                slot_of_id.get(&id).copied()
            };
            let loc_nodes = match slot {
                Some(i) => &location_nodes[ranges[i].0..ranges[i].1],
                None => &unknown[..],
            };
            for &node in loc_nodes {
                if leaf {
                    flat[node] = flat[node].saturating_add(v);
                    leaf = false;
                }
                if last_seen[node] != si {
                    last_seen[node] = si;
                    cum[node] = cum[node].saturating_add(v);
                }
            }
        }
    }

    let total = options.total.unwrap_or(sum);
    let node_cutoff = ((total as f64) * options.node_fraction).abs() as i64;
    let mut rows: Vec<TopRow> = Vec::with_capacity(names.len());
    let mut dropped_nodes = 0;
    for (i, &(name, unsymbolized)) in names.iter().enumerate() {
        if last_seen[i] == usize::MAX {
            // In no sample with a nonzero value: not a node at all.
            continue;
        }
        if cum[i].saturating_abs() < node_cutoff {
            dropped_nodes += 1;
            continue;
        }
        rows.push(TopRow {
            function: if unsymbolized {
                format!("[{name}]")
            } else {
                name.to_owned()
            },
            flat: flat[i],
            cum: cum[i],
        });
    }
    match options.sort {
        TopSort::Flat => rows.sort_by(|a, b| {
            b.flat
                .saturating_abs()
                .cmp(&a.flat.saturating_abs())
                .then_with(|| a.function.cmp(&b.function))
                .then_with(|| b.cum.saturating_abs().cmp(&a.cum.saturating_abs()))
        }),
        TopSort::Cum => rows.sort_by(|a, b| {
            b.cum
                .saturating_abs()
                .cmp(&a.cum.saturating_abs())
                .then_with(|| a.function.cmp(&b.function))
                .then_with(|| b.flat.saturating_abs().cmp(&a.flat.saturating_abs()))
        }),
    }
    let mut truncated_nodes = 0;
    if let Some(limit) = options.limit
        && rows.len() > limit
    {
        truncated_nodes = rows.len() - limit;
        rows.truncate(limit);
    }
    let vt = &profile.sample_type[vi];
    Ok(TopReport {
        sample_index: vi,
        sample_type: string(profile, vt.r#type).to_owned(),
        unit: string(profile, vt.unit).to_owned(),
        total,
        rows,
        dropped_nodes,
        node_cutoff,
        truncated_nodes,
    })
}

/// Collapsed ("folded") stacks: `root;caller;leaf` → summed value, sorted by
/// stack, zero values left out. The format of Brendan Gregg's
/// `flamegraph.pl` and of inferno.
pub fn collapse(
    profile: &Profile,
    sample_index: Option<&SampleIndex>,
) -> Result<Vec<(String, i64)>, ReportError> {
    let vi = resolve_sample_index(profile, sample_index)?;
    let index = Index::new(profile);
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    let mut frames = Vec::new();
    let mut key = String::new();
    for s in &profile.sample {
        let v = s.value[vi];
        if v == 0 {
            continue;
        }
        frames.clear();
        for &id in &s.location_id {
            index.location_frames(id, &mut frames);
        }
        key.clear();
        for (i, f) in frames.iter().rev().enumerate() {
            if i > 0 {
                key.push(';');
            }
            // `;` separates frames and a space ends the stack in this format.
            key.extend(
                f.display_name()
                    .chars()
                    .map(|c| if c == ';' { ':' } else { c }),
            );
        }
        if key.is_empty() {
            key.push_str("<empty>");
        }
        let slot = stacks.entry(key.replace(' ', "\u{a0}")).or_insert(0);
        *slot = slot.saturating_add(v);
    }
    Ok(stacks.into_iter().filter(|(_, v)| *v != 0).collect())
}

/// `value` in `unit` scaled to a readable unit as pprof prints it
/// (`1.50s`, `12ms`, `3.20MB`, `42`).
pub fn format_value(value: i64, unit: &str) -> String {
    const TIME: &[(&str, f64)] = &[
        ("ns", 1.0),
        ("us", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
        ("hrs", 3.6e12),
    ];
    const BYTES: &[(&str, f64)] = &[
        ("B", 1.0),
        ("kB", 1024.0),
        ("MB", 1048576.0),
        ("GB", 1073741824.0),
        ("TB", 1099511627776.0),
    ];
    let (table, base) = match unit {
        "nanoseconds" | "nanosecond" | "ns" => (TIME, 1.0),
        "microseconds" | "us" => (TIME, 1e3),
        "milliseconds" | "ms" => (TIME, 1e6),
        "seconds" | "s" => (TIME, 1e9),
        "bytes" | "byte" | "B" => (BYTES, 1.0),
        "kilobytes" | "kB" => (BYTES, 1024.0),
        "megabytes" | "MB" => (BYTES, 1048576.0),
        _ => return value.to_string(),
    };
    let base_value = value as f64 * base;
    let mut chosen = table[0];
    for &entry in table {
        if base_value.abs() >= entry.1 {
            chosen = entry;
        }
    }
    let scaled = base_value / chosen.1;
    let text = format!("{scaled:.2}");
    let text = text.strip_suffix(".00").unwrap_or(&text);
    if text == "0" || text == "-0" {
        return "0".into();
    }
    format!("{text}{}", chosen.0)
}
