//! Sample labels (`data_center`, `machine`, `isolate`, `durable_object`, …):
//! each key's values with their share, as `go tool pprof -tags` lists them,
//! a focus on `KEY=VALUE[,VALUE…]` as pprof's `-tagfocus` and a hide of
//! `KEY!=VALUE[,VALUE…]` as its `-tagignore`, applied through
//! [`edgeprof_pprof::filter_by_label`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use edgeprof_pprof::{Profile, ReportError, SampleIndex};

/// One value of a label key.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelValue {
    /// The value: the string, or a numeric label's number and unit.
    pub value: String,
    /// Sum of |value| of the samples carrying it.
    pub total: i64,
    /// That as a % of the key's total (what pprof's `-tags` prints).
    pub key_percent: f64,
    /// That as a % of the whole profile.
    pub profile_percent: f64,
}

/// A label key with its values, largest first (ties by value).
#[derive(Debug, Clone, PartialEq)]
pub struct LabelKey {
    /// The key, e.g. `data_center`.
    pub key: String,
    /// Sum of |value| of the samples carrying the key.
    pub total: i64,
    /// Its values.
    pub values: Vec<LabelValue>,
}

/// The label keys of `profile`, sorted by name, with the share of each
/// value in the chosen sample type. A sample carrying a key twice counts for
/// each of its values.
pub fn label_shares(
    profile: &Profile,
    sample_index: Option<&SampleIndex>,
) -> Result<Vec<LabelKey>, ReportError> {
    let vi = edgeprof_pprof::resolve_sample_index(profile, sample_index)?;
    let s = |i| edgeprof_pprof::string(profile, i);
    let mut keys: BTreeMap<&str, BTreeMap<String, i64>> = BTreeMap::new();
    let mut profile_total = 0i64;
    for sample in &profile.sample {
        let v = sample.value.get(vi).copied().unwrap_or(0).saturating_abs();
        profile_total = profile_total.saturating_add(v);
        for l in &sample.label {
            let value = if l.str != 0 {
                s(l.str).to_owned()
            } else {
                format!("{}{}", l.num, s(l.num_unit))
            };
            let slot = keys.entry(s(l.key)).or_default().entry(value).or_insert(0);
            *slot = slot.saturating_add(v);
        }
    }
    let pct = |v: i64, of: i64| {
        if of == 0 {
            0.0
        } else {
            v as f64 * 100.0 / of as f64
        }
    };
    Ok(keys
        .into_iter()
        .map(|(key, values)| {
            let total = values.values().fold(0i64, |a, v| a.saturating_add(*v));
            let mut values: Vec<LabelValue> = values
                .into_iter()
                .map(|(value, v)| LabelValue {
                    value,
                    total: v,
                    key_percent: pct(v, total),
                    profile_percent: pct(v, profile_total),
                })
                .collect();
            values.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.value.cmp(&b.value)));
            LabelKey {
                key: key.to_owned(),
                total,
                values,
            }
        })
        .collect())
}

/// Why a label focus does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelFocusError {
    /// No `=`, an empty key or an empty value.
    #[error("{0:?} is not KEY=VALUE[,VALUE…] or KEY!=VALUE[,VALUE…] (e.g. data_center=lhr)")]
    Malformed(String),
}

/// Keep only the samples whose label `key` has one of `values` (pprof's
/// `-tagfocus=KEY=V1,V2`, with exact values rather than regexes), or with
/// `hide` (`KEY!=V1,V2`, pprof's `-tagignore`) drop them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelFocus {
    /// The label key.
    pub key: String,
    /// The values matched, any of them.
    pub values: Vec<String>,
    /// Drop the matching samples instead of keeping only them.
    pub hide: bool,
}

impl std::str::FromStr for LabelFocus {
    type Err = LabelFocusError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || LabelFocusError::Malformed(s.to_owned());
        let (key, values) = s.split_once('=').ok_or_else(malformed)?;
        let (key, hide) = match key.strip_suffix('!') {
            Some(key) => (key, true),
            None => (key, false),
        };
        let values: Vec<String> = values.split(',').map(str::to_owned).collect();
        if key.is_empty() || values.iter().any(String::is_empty) {
            return Err(malformed());
        }
        Ok(LabelFocus {
            key: key.to_owned(),
            values,
            hide,
        })
    }
}

impl LabelFocus {
    /// The samples of `profile` this focus keeps.
    pub fn apply(&self, profile: &Profile) -> Profile {
        let values: Vec<&str> = self.values.iter().map(String::as_str).collect();
        edgeprof_pprof::filter_by_label(profile, &self.key, &values, !self.hide)
    }
}

impl std::fmt::Display for LabelFocus {
    /// As parsed: `KEY=V1,V2` or `KEY!=V1,V2`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = if self.hide { "!=" } else { "=" };
        write!(f, "{}{op}{}", self.key, self.values.join(","))
    }
}

/// `profile` with every focus applied: a sample is kept when it matches all
/// of them. Without focuses, `profile` itself (no copy).
pub fn focus_all<'a>(profile: &'a Profile, focuses: &[LabelFocus]) -> Cow<'a, Profile> {
    match focuses.split_first() {
        None => Cow::Borrowed(profile),
        Some((first, rest)) => Cow::Owned(
            rest.iter()
                .fold(first.apply(profile), |p, focus| focus.apply(&p)),
        ),
    }
}
