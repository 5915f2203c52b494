//! The comparison of two profiles of one kind, with `go tool pprof
//! -diff_base` semantics: the base's samples are subtracted from the new
//! profile's, per function, and both sides are kept so a row says what each
//! profile had as well as the change.
//!
//! Percentages and the node-fraction cutoff are of the base's total, as
//! pprof's diff reports are. [`Normalize::Total`] first scales the new
//! profile to the base's total (pprof's `-normalize`), so the rows compare
//! shares; [`Normalize::Requests`] scales it to the base's request count
//! (from the `requests: N` comment the control plane writes), so the rows
//! compare cost per request.

use std::borrow::Cow;
use std::collections::BTreeMap;

use edgeprof_pprof::{Profile, ReportError, SampleIndex, TopOptions, TopRow, TopSort};
use rustc_hash::FxHashMap;

/// Which of the two profiles of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The profile subtracted (`--diff-base`).
    Base,
    /// The profile compared against it.
    New,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Base => "base",
            Side::New => "new",
        })
    }
}

/// How the new profile is scaled before the base is subtracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Normalize {
    /// Raw values.
    #[default]
    None,
    /// The new profile scaled to the base's total of the reported sample
    /// type (pprof's `-normalize`): a row's change is a change of share.
    Total,
    /// The new profile scaled by base requests / new requests: a row's
    /// change divided by the base's requests is the change per request.
    Requests,
}

/// Why two profiles cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// Their sample types differ (a CPU profile against a heap profile).
    #[error("the profiles are of different kinds: base has [{base}], new has [{new}]")]
    KindsDiffer {
        /// The base's sample types, as `type/unit, …`.
        base: String,
        /// The new profile's.
        new: String,
    },
    /// Per-request normalization needs a `requests: N` comment (N > 0).
    #[error("the {side} profile has no `requests: N` comment (needed to normalize per request)")]
    NoRequests {
        /// The profile without it.
        side: Side,
    },
    /// The sample index does not exist, or the profile has no sample types.
    #[error("{side}: {source}")]
    Report {
        /// The profile the error is about.
        side: Side,
        /// What is wrong.
        source: ReportError,
    },
}

impl DiffError {
    /// The profile the error is about, when it is about one.
    pub fn side(&self) -> Option<Side> {
        match self {
            DiffError::KindsDiffer { .. } => None,
            DiffError::NoRequests { side } | DiffError::Report { side, .. } => Some(*side),
        }
    }
}

/// Options of [`diff`].
#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// Which sample value; `None` = the profiles' default.
    pub sample_index: Option<SampleIndex>,
    /// How the new profile is scaled first.
    pub normalize: Normalize,
    /// Row order, by the change: `Flat` by |Δflat| (pprof's default),
    /// `Cum` by |Δcum|; ties by name.
    pub sort: TopSort,
    /// Functions whose |Δcum| is below this fraction of the base's total are
    /// left out (pprof's `-nodefraction`, default 0.005).
    pub node_fraction: f64,
    /// Keep at most this many rows.
    pub limit: Option<usize>,
    /// What percentages and the cutoff are of, instead of the base's total:
    /// pprof takes it before any focus, so a front that focuses (`--tag`)
    /// passes the unfocused base's total.
    pub total: Option<i64>,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            sample_index: None,
            normalize: Normalize::None,
            sort: TopSort::Flat,
            node_fraction: 0.005,
            limit: None,
            total: None,
        }
    }
}

/// One function in either profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiffValues {
    /// Value of samples whose leaf is the function.
    pub flat: i64,
    /// Value of samples with the function on the stack, once per sample.
    pub cum: i64,
}

/// One function's row: what each side had and the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffRow {
    /// Function name (`[module]` when unsymbolized, as `top`).
    pub function: String,
    /// The base's values.
    pub base: DiffValues,
    /// The new profile's values (after normalization).
    pub new: DiffValues,
}

impl DiffRow {
    /// New minus base.
    pub fn delta(&self) -> DiffValues {
        DiffValues {
            flat: self.new.flat.saturating_sub(self.base.flat),
            cum: self.new.cum.saturating_sub(self.base.cum),
        }
    }
}

/// The result of [`diff`].
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    /// Position of the sample type reported.
    pub sample_index: usize,
    /// Its type name, e.g. `cpu`.
    pub sample_type: String,
    /// Its unit, e.g. `nanoseconds`.
    pub unit: String,
    /// What percentages are of: the base's total (sum of |value|), or the
    /// new profile's when the base is empty, as pprof.
    pub total: i64,
    /// The base's and the new profile's totals (the new one after scaling).
    pub base_total: i64,
    /// See [`Diff::base_total`].
    pub new_total: i64,
    /// The factor the new profile was scaled by (1 without normalization).
    pub new_scale: f64,
    /// `(base, new)` requests, when both profiles say.
    pub requests: Option<(u64, u64)>,
    /// The rows, in the requested order.
    pub rows: Vec<DiffRow>,
    /// Functions left out by the node fraction.
    pub dropped_nodes: usize,
    /// The |Δcum| below which functions were left out.
    pub node_cutoff: i64,
    /// Functions left out by the row limit.
    pub truncated_nodes: usize,
}

impl Diff {
    /// `value` as a percentage of [`Diff::total`].
    pub fn percent(&self, value: i64) -> f64 {
        crate::tree::percent_of(value, self.total)
    }
}

/// The `N` of a profile's `requests: N` comment.
pub fn requests(profile: &Profile) -> Option<u64> {
    profile
        .comment
        .iter()
        .filter_map(|&c| edgeprof_pprof::string(profile, c).strip_prefix("requests: "))
        .find_map(|n| n.trim().parse().ok())
}

fn check_kinds(base: &Profile, new: &Profile) -> Result<(), DiffError> {
    let (b, n) = (
        edgeprof_pprof::sample_types(base),
        edgeprof_pprof::sample_types(new),
    );
    if b == n {
        return Ok(());
    }
    let show = |types: Vec<(&str, &str)>| {
        types
            .iter()
            .map(|(t, u)| format!("{t}/{u}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(DiffError::KindsDiffer {
        base: show(b),
        new: show(n),
    })
}

/// The new profile as the comparison reads it: scaled as `normalize` says
/// (values rounded, as pprof's `-normalize`), with the factor used. Checks
/// that the two profiles are of one kind and resolves the sample index.
pub fn normalized<'a>(
    base: &Profile,
    new: &'a Profile,
    sample_index: Option<&SampleIndex>,
    normalize: Normalize,
) -> Result<(Cow<'a, Profile>, f64, usize), DiffError> {
    check_kinds(base, new)?;
    let vi = edgeprof_pprof::resolve_sample_index(new, sample_index).map_err(|source| {
        DiffError::Report {
            side: Side::New,
            source,
        }
    })?;
    let factor = match normalize {
        Normalize::None => 1.0,
        Normalize::Total => {
            // pprof: the new profile times base total / new total, 0 when
            // the new profile is empty.
            let (b, n) = (
                edgeprof_pprof::total(base, vi),
                edgeprof_pprof::total(new, vi),
            );
            if n == 0 { 0.0 } else { b as f64 / n as f64 }
        }
        Normalize::Requests => {
            let side_requests = |p: &Profile, side| {
                requests(p)
                    .filter(|&n| n > 0)
                    .ok_or(DiffError::NoRequests { side })
            };
            let b = side_requests(base, Side::Base)?;
            let n = side_requests(new, Side::New)?;
            b as f64 / n as f64
        }
    };
    let scaled = if factor == 1.0 {
        Cow::Borrowed(new)
    } else {
        Cow::Owned(edgeprof_pprof::scale(new, factor))
    };
    Ok((scaled, factor, vi))
}

/// Every function of either profile whose flat or cum changed, with its
/// flat and cum on both sides, as `go tool pprof -top -diff_base BASE NEW`
/// reports the change.
pub fn diff(base: &Profile, new: &Profile, options: &DiffOptions) -> Result<Diff, DiffError> {
    let (new, new_scale, vi) =
        normalized(base, new, options.sample_index.as_ref(), options.normalize)?;
    diff_normalized(base, &new, new_scale, vi, options)
}

/// [`diff`] of `new` as [`normalized`] returned it (scaled by `new_scale`,
/// sample type `vi` resolved): for callers that also build other views of
/// the same comparison and so normalize once.
pub(crate) fn diff_normalized(
    base: &Profile,
    new: &Profile,
    new_scale: f64,
    vi: usize,
    options: &DiffOptions,
) -> Result<Diff, DiffError> {
    let all = TopOptions {
        sample_index: Some(SampleIndex::Position(vi)),
        node_fraction: 0.0,
        ..TopOptions::default()
    };
    let side_top = |p: &Profile, side| {
        edgeprof_pprof::top(p, &all).map_err(|source| DiffError::Report { side, source })
    };
    let b = side_top(base, Side::Base)?;
    let n = side_top(new, Side::New)?;

    // A function is a row when a nonzero sample of either side reaches it,
    // which is what `top` with no cutoff lists.
    let mut rows: Vec<DiffRow> = Vec::with_capacity(b.rows.len().max(n.rows.len()));
    let mut at: FxHashMap<String, usize> = FxHashMap::default();
    let values = |r: &TopRow| DiffValues {
        flat: r.flat,
        cum: r.cum,
    };
    for r in b.rows {
        at.insert(r.function.clone(), rows.len());
        rows.push(DiffRow {
            base: values(&r),
            new: DiffValues::default(),
            function: r.function,
        });
    }
    for r in n.rows {
        match at.get(&r.function) {
            Some(&i) => rows[i].new = values(&r),
            None => rows.push(DiffRow {
                new: values(&r),
                base: DiffValues::default(),
                function: r.function,
            }),
        }
    }

    let total = match options.total {
        Some(t) => t,
        None if b.total > 0 => b.total,
        None => n.total,
    };
    let node_cutoff = ((total as f64) * options.node_fraction).abs() as i64;
    let before = rows.len();
    // pprof's graph has no node whose change is zero in both flat and cum.
    rows.retain(|r| {
        let d = r.delta();
        (d.flat != 0 || d.cum != 0) && d.cum.saturating_abs() >= node_cutoff
    });
    let dropped_nodes = before - rows.len();
    sort_rows(&mut rows, options.sort);
    let mut truncated_nodes = 0;
    if let Some(limit) = options.limit
        && rows.len() > limit
    {
        truncated_nodes = rows.len() - limit;
        rows.truncate(limit);
    }
    Ok(Diff {
        sample_index: vi,
        sample_type: b.sample_type,
        unit: b.unit,
        total,
        base_total: b.total,
        new_total: n.total,
        new_scale,
        requests: requests(base).zip(requests(new)),
        rows,
        dropped_nodes,
        node_cutoff,
        truncated_nodes,
    })
}

/// Orders rows by the change, largest |Δ| first, as pprof orders a diff.
pub fn sort_rows(rows: &mut [DiffRow], sort: TopSort) {
    let key = |r: &DiffRow| {
        let d = r.delta();
        match sort {
            TopSort::Flat => (d.flat.saturating_abs(), d.cum.saturating_abs()),
            TopSort::Cum => (d.cum.saturating_abs(), d.flat.saturating_abs()),
        }
    };
    rows.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        kb.0.cmp(&ka.0)
            .then_with(|| a.function.cmp(&b.function))
            .then_with(|| kb.1.cmp(&ka.1))
    });
}

/// Folded stacks of both sides, `(stack, base, new)` sorted by stack, for
/// `difffolded`-style tools: every stack either side has, 0 where one lacks
/// it. The new side is normalized as `normalize` says.
pub fn diff_collapse(
    base: &Profile,
    new: &Profile,
    sample_index: Option<&SampleIndex>,
    normalize: Normalize,
) -> Result<Vec<(String, i64, i64)>, DiffError> {
    let (new, _, vi) = normalized(base, new, sample_index, normalize)?;
    let index = SampleIndex::Position(vi);
    let side_collapse = |p: &Profile, side| {
        edgeprof_pprof::collapse(p, Some(&index))
            .map_err(|source| DiffError::Report { side, source })
    };
    let mut stacks: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (stack, v) in side_collapse(base, Side::Base)? {
        stacks.entry(stack).or_default().0 = v;
    }
    for (stack, v) in side_collapse(&new, Side::New)? {
        stacks.entry(stack).or_default().1 = v;
    }
    Ok(stacks.into_iter().map(|(s, (b, n))| (s, b, n)).collect())
}
