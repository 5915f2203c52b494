//! [`ProfileBuilder`]: the one way edgeprof makes profiles.
//!
//! Strings are interned in insertion order with `""` at index 0, ids are
//! assigned 1, 2, 3… in first-use order, and samples with the same stack and
//! labels are summed, so equal inputs give byte-identical output.

use rustc_hash::FxHashMap;

use crate::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// A mapping (binary or module) as the builder takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingSpec<'a> {
    /// Start of the mapped range.
    pub memory_start: u64,
    /// End of the mapped range.
    pub memory_limit: u64,
    /// Offset in the file the range maps.
    pub file_offset: u64,
    /// The file or module name.
    pub filename: &'a str,
    /// A unique identifier of the file's contents (edgeprof: a hash of the module bytes).
    pub build_id: &'a str,
    /// Locations carry function names.
    pub has_functions: bool,
    /// Locations carry file names.
    pub has_filenames: bool,
    /// Locations carry line numbers.
    pub has_line_numbers: bool,
    /// Locations carry inlined frames.
    pub has_inline_frames: bool,
}

/// One line of a location: a function id from [`ProfileBuilder::function`] and a position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LineSpec {
    /// Id returned by [`ProfileBuilder::function`].
    pub function_id: u64,
    /// Source line, 0 if unknown.
    pub line: i64,
    /// Source column, 0 if unknown.
    pub column: i64,
}

type MappingKey = (u64, u64, u64, i64, i64);
type FunctionKey = (i64, i64, i64, i64);
type LocationKey = (u64, u64, Box<[LineSpec]>, bool);
type SampleKey = (Box<[u64]>, Box<[(i64, i64, i64, i64)]>);

/// Builds a [`Profile`], deduplicating everything it is given.
#[derive(Debug)]
pub struct ProfileBuilder {
    profile: Profile,
    strings: FxHashMap<Box<str>, i64>,
    mappings: FxHashMap<MappingKey, u64>,
    functions: FxHashMap<FunctionKey, u64>,
    locations: FxHashMap<LocationKey, u64>,
    samples: FxHashMap<SampleKey, usize>,
}

impl ProfileBuilder {
    /// A builder for a profile with these `(type, unit)` sample types, e.g.
    /// `[("samples", "count"), ("cpu", "nanoseconds")]`.
    pub fn new(sample_types: &[(&str, &str)]) -> Self {
        let mut b = ProfileBuilder {
            profile: Profile::default(),
            strings: FxHashMap::default(),
            mappings: FxHashMap::default(),
            functions: FxHashMap::default(),
            locations: FxHashMap::default(),
            samples: FxHashMap::default(),
        };
        b.string("");
        for &(ty, unit) in sample_types {
            let vt = b.value_type(ty, unit);
            b.profile.sample_type.push(vt);
        }
        b
    }

    /// Number of sample types each sample must carry.
    pub fn sample_type_count(&self) -> usize {
        self.profile.sample_type.len()
    }

    /// Interns `s`, returning its string-table index.
    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.into(), i);
        i
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(ty),
            unit: self.string(unit),
        }
    }

    /// Sets what one sampling period measures and how long it is.
    pub fn period(&mut self, ty: &str, unit: &str, period: i64) -> &mut Self {
        self.profile.period_type = Some(self.value_type(ty, unit));
        self.profile.period = period;
        self
    }

    /// Sets the collection start (ns since the Unix epoch).
    pub fn time_nanos(&mut self, t: i64) -> &mut Self {
        self.profile.time_nanos = t;
        self
    }

    /// Sets the collection length in nanoseconds.
    pub fn duration_nanos(&mut self, d: i64) -> &mut Self {
        self.profile.duration_nanos = d;
        self
    }

    /// Adds a comment (once per distinct text).
    pub fn comment(&mut self, c: &str) -> &mut Self {
        let i = self.string(c);
        if !self.profile.comment.contains(&i) {
            self.profile.comment.push(i);
        }
        self
    }

    /// Sets the sample type a viewer shows by default, by its type name.
    pub fn default_sample_type(&mut self, ty: &str) -> &mut Self {
        self.profile.default_sample_type = self.string(ty);
        self
    }

    /// Sets the regexes of frames pprof drops from (and keeps in) stacks.
    pub fn drop_keep_frames(&mut self, drop: &str, keep: &str) -> &mut Self {
        self.profile.drop_frames = self.string(drop);
        self.profile.keep_frames = self.string(keep);
        self
    }

    /// Sets the documentation link.
    pub fn doc_url(&mut self, url: &str) -> &mut Self {
        self.profile.doc_url = self.string(url);
        self
    }

    /// The id of this mapping, adding it on first use.
    pub fn mapping(&mut self, m: &MappingSpec<'_>) -> u64 {
        let filename = self.string(m.filename);
        let build_id = self.string(m.build_id);
        let flags = [
            m.has_functions,
            m.has_filenames,
            m.has_line_numbers,
            m.has_inline_frames,
        ];
        self.mapping_interned(
            (
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                filename,
                build_id,
            ),
            flags,
        )
    }

    pub(crate) fn mapping_interned(&mut self, key: MappingKey, flags: [bool; 4]) -> u64 {
        if let Some(&id) = self.mappings.get(&key) {
            let m = &mut self.profile.mapping[id as usize - 1];
            m.has_functions |= flags[0];
            m.has_filenames |= flags[1];
            m.has_line_numbers |= flags[2];
            m.has_inline_frames |= flags[3];
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        self.profile.mapping.push(Mapping {
            id,
            memory_start: key.0,
            memory_limit: key.1,
            file_offset: key.2,
            filename: key.3,
            build_id: key.4,
            has_functions: flags[0],
            has_filenames: flags[1],
            has_line_numbers: flags[2],
            has_inline_frames: flags[3],
        });
        self.mappings.insert(key, id);
        id
    }

    /// The id of this function, adding it on first use.
    pub fn function(
        &mut self,
        name: &str,
        system_name: &str,
        filename: &str,
        start_line: i64,
    ) -> u64 {
        let key = (
            self.string(name),
            self.string(system_name),
            self.string(filename),
            start_line,
        );
        self.function_interned(key)
    }

    pub(crate) fn function_interned(&mut self, key: FunctionKey) -> u64 {
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(Function {
            id,
            name: key.0,
            system_name: key.1,
            filename: key.2,
            start_line: key.3,
        });
        self.functions.insert(key, id);
        id
    }

    /// The id of this location (`mapping_id` 0 = none; `lines` innermost
    /// first), adding it on first use.
    pub fn location(&mut self, mapping_id: u64, address: u64, lines: &[LineSpec]) -> u64 {
        self.location_full(mapping_id, address, lines, false)
    }

    pub(crate) fn location_full(
        &mut self,
        mapping_id: u64,
        address: u64,
        lines: &[LineSpec],
        is_folded: bool,
    ) -> u64 {
        let key = (
            mapping_id,
            address,
            Box::<[LineSpec]>::from(lines),
            is_folded,
        );
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line: lines
                .iter()
                .map(|l| Line {
                    function_id: l.function_id,
                    line: l.line,
                    column: l.column,
                })
                .collect(),
            is_folded,
        });
        self.locations.insert(key, id);
        id
    }

    /// A string label for [`ProfileBuilder::add_sample`].
    pub fn label_str(&mut self, key: &str, value: &str) -> Label {
        Label {
            key: self.string(key),
            str: self.string(value),
            num: 0,
            num_unit: 0,
        }
    }

    /// A numeric label for [`ProfileBuilder::add_sample`] (`unit` may be `""`).
    pub fn label_num(&mut self, key: &str, value: i64, unit: &str) -> Label {
        Label {
            key: self.string(key),
            str: 0,
            num: value,
            num_unit: self.string(unit),
        }
    }

    /// Adds `values` (one per sample type) for the stack `location_ids`
    /// (leaf first) with `labels`; a sample with the same stack and labels is
    /// summed into the existing one.
    ///
    /// # Panics
    /// If `values.len()` differs from the number of sample types: that is a
    /// bug in the caller, not bad input.
    pub fn add_sample(&mut self, location_ids: &[u64], values: &[i64], labels: &[Label]) {
        assert_eq!(
            values.len(),
            self.profile.sample_type.len(),
            "one value per sample type"
        );
        let mut label_key: Vec<(i64, i64, i64, i64)> = labels
            .iter()
            .map(|l| (l.key, l.str, l.num, l.num_unit))
            .collect();
        label_key.sort_unstable();
        let key: SampleKey = (location_ids.into(), label_key.into());
        if let Some(&i) = self.samples.get(&key) {
            let s = &mut self.profile.sample[i];
            for (acc, v) in s.value.iter_mut().zip(values) {
                *acc = acc.saturating_add(*v);
            }
            return;
        }
        self.samples.insert(key, self.profile.sample.len());
        self.profile.sample.push(Sample {
            location_id: location_ids.to_vec(),
            value: values.to_vec(),
            label: labels.to_vec(),
        });
    }

    /// Number of distinct samples so far.
    pub fn sample_count(&self) -> usize {
        self.profile.sample.len()
    }

    /// The finished profile. Samples whose values are all zero are dropped,
    /// as pprof drops them when merging.
    pub fn build(mut self) -> Profile {
        self.profile
            .sample
            .retain(|s| s.value.iter().any(|&v| v != 0));
        self.profile
    }
}
