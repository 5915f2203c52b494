//! Whole-profile transformations: label filtering, scaling and subtraction.
//! Each returns a new, compacted profile (unused entries dropped).

use crate::{MergeError, Merger, Profile, string};

/// The samples whose label `key` has one of `values` (pprof's `-tagfocus`
/// for string labels). With `keep = false`, the samples that do *not* match
/// (`-tagignore`).
pub fn filter_by_label(profile: &Profile, key: &str, values: &[&str], keep: bool) -> Profile {
    let mut p = profile.clone();
    p.sample.retain(|s| {
        let matches = s
            .label
            .iter()
            .any(|l| string(profile, l.key) == key && values.contains(&string(profile, l.str)));
        matches == keep
    });
    compact(&p)
}

/// Multiplies every value by `factor`, rounding to the nearest integer;
/// samples that become zero are dropped.
pub fn scale(profile: &Profile, factor: f64) -> Profile {
    let mut p = profile.clone();
    for s in &mut p.sample {
        for v in &mut s.value {
            // `as` saturates on overflow and maps NaN to 0.
            *v = (*v as f64 * factor).round() as i64;
        }
    }
    compact(&p)
}

/// `profile - base` with `go tool pprof -base` semantics: the base's samples
/// are negated and merged in, so equal stacks cancel and what remains is the
/// change (positive = grew, negative = shrank).
pub fn subtract(profile: &Profile, base: &Profile) -> Result<Profile, MergeError> {
    let negated = scale(base, -1.0);
    let mut m = Merger::new();
    m.add(profile)?;
    m.add(&negated)?;
    let mut out = m.finish()?;
    // The difference covers the newer profile's window, not the sum.
    out.time_nanos = profile.time_nanos;
    out.duration_nanos = profile.duration_nanos;
    out.period = profile.period;
    Ok(out)
}

/// A copy with only the strings, mappings, functions and locations samples use.
fn compact(profile: &Profile) -> Profile {
    let mut m = Merger::new();
    m.add(profile).expect("a profile is compatible with itself");
    let mut out = m.finish().expect("one profile was added");
    out.period = profile.period;
    out
}
