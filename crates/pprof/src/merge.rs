//! Merging profiles as `go tool pprof` does: identical stacks and labels are
//! summed; headers combine (earliest start, summed durations, largest period,
//! distinct comments).

use rustc_hash::FxHashMap;

use crate::report::Lookup;
use crate::{Label, LineSpec, Profile, ProfileBuilder, string};

/// Why profiles cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Nothing to merge.
    #[error("no profiles to merge")]
    Empty,
    /// Sample types differ from the first profile's.
    #[error(
        "profile {index} has sample types [{found}] but the first profile has [{expected}]; only profiles of the same kind can be merged"
    )]
    SampleTypes {
        /// Position of the incompatible profile.
        index: usize,
        /// Its sample types as `type/unit, …`.
        found: String,
        /// The first profile's.
        expected: String,
    },
    /// Period types differ from the first profile's.
    #[error("profile {index} has period type {found} but the first profile has {expected}")]
    PeriodType {
        /// Position of the incompatible profile.
        index: usize,
        /// Its period type as `type/unit`.
        found: String,
        /// The first profile's.
        expected: String,
    },
}

fn describe_types(p: &Profile) -> String {
    p.sample_type
        .iter()
        .map(|vt| format!("{}/{}", string(p, vt.r#type), string(p, vt.unit)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_period(p: &Profile) -> String {
    match &p.period_type {
        Some(vt) => format!("{}/{}", string(p, vt.r#type), string(p, vt.unit)),
        None => "none".into(),
    }
}

/// Merges validated profiles one by one, optionally labelling each one's
/// samples (e.g. with `data_center`, `machine`, `isolate`).
#[derive(Debug)]
pub struct Merger {
    builder: Option<ProfileBuilder>,
    expected_types: String,
    expected_period: String,
    count: usize,
    time_nanos: i64,
    duration_nanos: i64,
    period: i64,
    drop_keep: Option<(String, String)>,
    doc_url: Option<String>,
    default_sample_type: Option<String>,
    // Scratch maps, reused across inputs.
    strings: Vec<i64>,
    functions: FxHashMap<u64, u64>,
    mappings: FxHashMap<u64, u64>,
    locations: FxHashMap<u64, u64>,
}

impl Default for Merger {
    fn default() -> Self {
        Self::new()
    }
}

impl Merger {
    /// An empty merger.
    pub fn new() -> Self {
        Merger {
            builder: None,
            expected_types: String::new(),
            expected_period: String::new(),
            count: 0,
            time_nanos: 0,
            duration_nanos: 0,
            period: 0,
            drop_keep: None,
            doc_url: None,
            default_sample_type: None,
            strings: Vec::new(),
            functions: FxHashMap::default(),
            mappings: FxHashMap::default(),
            locations: FxHashMap::default(),
        }
    }

    /// Adds `profile` (which must be valid, e.g. from [`crate::decode`]).
    pub fn add(&mut self, profile: &Profile) -> Result<(), MergeError> {
        self.add_labeled(profile, &[])
    }

    /// Adds `profile`, with `labels` (key, value) added to each of its samples.
    pub fn add_labeled(
        &mut self,
        profile: &Profile,
        labels: &[(&str, &str)],
    ) -> Result<(), MergeError> {
        let index = self.count;
        if self.builder.is_none() {
            let types: Vec<(&str, &str)> = crate::sample_types(profile);
            let mut b = ProfileBuilder::new(&types);
            if let Some(pt) = &profile.period_type {
                b.period(string(profile, pt.r#type), string(profile, pt.unit), 0);
            }
            self.expected_types = describe_types(profile);
            self.expected_period = describe_period(profile);
            self.builder = Some(b);
        } else {
            let found = describe_types(profile);
            if found != self.expected_types {
                return Err(MergeError::SampleTypes {
                    index,
                    found,
                    expected: self.expected_types.clone(),
                });
            }
            let found = describe_period(profile);
            if found != self.expected_period {
                return Err(MergeError::PeriodType {
                    index,
                    found,
                    expected: self.expected_period.clone(),
                });
            }
        }
        self.count += 1;

        if profile.time_nanos != 0 && (self.time_nanos == 0 || profile.time_nanos < self.time_nanos)
        {
            self.time_nanos = profile.time_nanos;
        }
        self.duration_nanos = self.duration_nanos.saturating_add(profile.duration_nanos);
        self.period = self.period.max(profile.period);
        if self.drop_keep.is_none() && (profile.drop_frames != 0 || profile.keep_frames != 0) {
            self.drop_keep = Some((
                string(profile, profile.drop_frames).to_owned(),
                string(profile, profile.keep_frames).to_owned(),
            ));
        }
        if self.doc_url.is_none() && profile.doc_url != 0 {
            self.doc_url = Some(string(profile, profile.doc_url).to_owned());
        }
        if self.default_sample_type.is_none() && profile.default_sample_type != 0 {
            self.default_sample_type =
                Some(string(profile, profile.default_sample_type).to_owned());
        }

        let b = self.builder.as_mut().expect("set above");
        for &c in &profile.comment {
            b.comment(string(profile, c));
        }

        // Strings are mapped lazily: -1 = not yet interned.
        self.strings.clear();
        self.strings.resize(profile.string_table.len(), -1);
        let strings = &mut self.strings;
        let mut map_str = |b: &mut ProfileBuilder, i: i64| -> i64 {
            let slot = &mut strings[i as usize];
            if *slot < 0 {
                *slot = b.string(&profile.string_table[i as usize]);
            }
            *slot
        };

        // Only what samples use is copied, so the output is compact
        // (pprof's merge also drops unreferenced entries).
        let locations = Lookup::new(&profile.location, |l| l.id);
        let functions = Lookup::new(&profile.function, |f| f.id);
        let mappings = Lookup::new(&profile.mapping, |m| m.id);
        self.mappings.clear();
        self.functions.clear();
        self.locations.clear();
        let mut lines = Vec::new();
        let mut intern_location = |b: &mut ProfileBuilder,
                                   map_str: &mut dyn FnMut(&mut ProfileBuilder, i64) -> i64,
                                   id: u64|
         -> u64 {
            if let Some(&out) = self.locations.get(&id) {
                return out;
            }
            let loc = locations
                .get(id)
                .expect("a validated profile has no dangling ids");
            lines.clear();
            for l in &loc.line {
                let function_id = match self.functions.get(&l.function_id) {
                    Some(&out) => out,
                    None => {
                        let f = functions
                            .get(l.function_id)
                            .expect("a validated profile has no dangling ids");
                        let key = (
                            map_str(b, f.name),
                            map_str(b, f.system_name),
                            map_str(b, f.filename),
                            f.start_line,
                        );
                        let out = b.function_interned(key);
                        self.functions.insert(l.function_id, out);
                        out
                    }
                };
                lines.push(LineSpec {
                    function_id,
                    line: l.line,
                    column: l.column,
                });
            }
            let mapping = match (loc.mapping_id, self.mappings.get(&loc.mapping_id)) {
                (0, _) => 0,
                (_, Some(&out)) => out,
                (in_id, None) => {
                    let m = mappings
                        .get(in_id)
                        .expect("a validated profile has no dangling ids");
                    let key = (
                        m.memory_start,
                        m.memory_limit,
                        m.file_offset,
                        map_str(b, m.filename),
                        map_str(b, m.build_id),
                    );
                    let out = b.mapping_interned(
                        key,
                        [
                            m.has_functions,
                            m.has_filenames,
                            m.has_line_numbers,
                            m.has_inline_frames,
                        ],
                    );
                    self.mappings.insert(in_id, out);
                    out
                }
            };
            let out = b.location_full(mapping, loc.address, &lines, loc.is_folded);
            self.locations.insert(id, out);
            out
        };

        let extra: Vec<Label> = labels.iter().map(|(k, v)| b.label_str(k, v)).collect();
        let mut stack = Vec::new();
        let mut sample_labels = Vec::new();
        for s in &profile.sample {
            if s.value.iter().all(|&v| v == 0) {
                continue;
            }
            stack.clear();
            for &id in &s.location_id {
                stack.push(intern_location(b, &mut map_str, id));
            }
            sample_labels.clear();
            for l in &s.label {
                sample_labels.push(Label {
                    key: map_str(b, l.key),
                    str: map_str(b, l.str),
                    num: l.num,
                    num_unit: map_str(b, l.num_unit),
                });
            }
            // An added label replaces a label of the same key from the input.
            sample_labels.retain(|l| !extra.iter().any(|e| e.key == l.key));
            sample_labels.extend_from_slice(&extra);
            b.add_sample(&stack, &s.value, &sample_labels);
        }
        Ok(())
    }

    /// Number of profiles added so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether nothing was added yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The merged profile.
    pub fn finish(self) -> Result<Profile, MergeError> {
        let mut b = self.builder.ok_or(MergeError::Empty)?;
        b.time_nanos(self.time_nanos)
            .duration_nanos(self.duration_nanos);
        let mut p_period = self.period;
        if p_period < 0 {
            p_period = 0;
        }
        if let Some((drop, keep)) = &self.drop_keep {
            b.drop_keep_frames(drop, keep);
        }
        if let Some(url) = &self.doc_url {
            b.doc_url(url);
        }
        if let Some(t) = &self.default_sample_type {
            b.default_sample_type(t);
        }
        let mut p = b.build();
        p.period = p_period;
        Ok(p)
    }
}

/// Merges validated profiles of one kind into one.
pub fn merge<'a>(profiles: impl IntoIterator<Item = &'a Profile>) -> Result<Profile, MergeError> {
    let mut m = Merger::new();
    for p in profiles {
        m.add(p)?;
    }
    m.finish()
}
