//! The invariants every consumer of a profile may rely on, checked once.

use rustc_hash::FxHashSet;

use crate::Profile;

/// A broken pprof invariant, naming the field (with indexes) where it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// `string_table` is empty or its entry 0 is not `""`.
    #[error("string_table[0] must be \"\" (found {found:?})")]
    StringTableStart {
        /// What entry 0 holds, or `None` for an empty table.
        found: Option<String>,
    },
    /// A string index points outside the string table.
    #[error("{field}: string index {index} is out of range (string_table has {len} entries)")]
    StringIndex {
        /// Where the index was found, e.g. `function[3].name`.
        field: String,
        /// The offending index.
        index: i64,
        /// Length of the string table.
        len: usize,
    },
    /// An id of 0, which pprof reserves for "none".
    #[error("{kind}[{position}] has id 0; {kind} ids start at 1")]
    ZeroId {
        /// `mapping`, `location` or `function`.
        kind: &'static str,
        /// Position of the entry in its list.
        position: usize,
    },
    /// Two entries share one id.
    #[error("{kind} id {id} is used more than once")]
    DuplicateId {
        /// `mapping`, `location` or `function`.
        kind: &'static str,
        /// The repeated id.
        id: u64,
    },
    /// A reference to an id that does not exist.
    #[error("{field}: refers to {kind} id {id}, which does not exist")]
    DanglingId {
        /// Where the reference was found, e.g. `sample[4].location_id[2]`.
        field: String,
        /// What kind of entry it should name.
        kind: &'static str,
        /// The missing id.
        id: u64,
    },
    /// A sample does not carry one value per sample type.
    #[error("sample[{sample}] has {got} values but the profile has {expected} sample types")]
    ValueCount {
        /// Position of the sample.
        sample: usize,
        /// Values it has.
        got: usize,
        /// Sample types of the profile.
        expected: usize,
    },
}

/// Checks `profile` against pprof's invariants; the first broken one is returned.
pub fn validate(profile: &Profile) -> Result<(), ValidationError> {
    match profile.string_table.first() {
        Some(s) if s.is_empty() => {}
        other => {
            return Err(ValidationError::StringTableStart {
                found: other.cloned(),
            });
        }
    }
    let len = profile.string_table.len();
    let check = |index: i64, field: &dyn Fn() -> String| {
        if index < 0 || index as u64 >= len as u64 {
            Err(ValidationError::StringIndex {
                field: field(),
                index,
                len,
            })
        } else {
            Ok(())
        }
    };

    for (i, vt) in profile.sample_type.iter().enumerate() {
        check(vt.r#type, &|| format!("sample_type[{i}].type"))?;
        check(vt.unit, &|| format!("sample_type[{i}].unit"))?;
    }
    if let Some(pt) = &profile.period_type {
        check(pt.r#type, &|| "period_type.type".into())?;
        check(pt.unit, &|| "period_type.unit".into())?;
    }
    check(profile.drop_frames, &|| "drop_frames".into())?;
    check(profile.keep_frames, &|| "keep_frames".into())?;
    check(profile.default_sample_type, &|| {
        "default_sample_type".into()
    })?;
    check(profile.doc_url, &|| "doc_url".into())?;
    for (i, &c) in profile.comment.iter().enumerate() {
        check(c, &|| format!("comment[{i}]"))?;
    }

    let mut mappings = FxHashSet::default();
    for (i, m) in profile.mapping.iter().enumerate() {
        if m.id == 0 {
            return Err(ValidationError::ZeroId {
                kind: "mapping",
                position: i,
            });
        }
        if !mappings.insert(m.id) {
            return Err(ValidationError::DuplicateId {
                kind: "mapping",
                id: m.id,
            });
        }
        check(m.filename, &|| format!("mapping[{i}].filename"))?;
        check(m.build_id, &|| format!("mapping[{i}].build_id"))?;
    }

    let mut functions = FxHashSet::default();
    for (i, f) in profile.function.iter().enumerate() {
        if f.id == 0 {
            return Err(ValidationError::ZeroId {
                kind: "function",
                position: i,
            });
        }
        if !functions.insert(f.id) {
            return Err(ValidationError::DuplicateId {
                kind: "function",
                id: f.id,
            });
        }
        check(f.name, &|| format!("function[{i}].name"))?;
        check(f.system_name, &|| format!("function[{i}].system_name"))?;
        check(f.filename, &|| format!("function[{i}].filename"))?;
    }

    let mut locations = FxHashSet::default();
    for (i, loc) in profile.location.iter().enumerate() {
        if loc.id == 0 {
            return Err(ValidationError::ZeroId {
                kind: "location",
                position: i,
            });
        }
        if !locations.insert(loc.id) {
            return Err(ValidationError::DuplicateId {
                kind: "location",
                id: loc.id,
            });
        }
        if loc.mapping_id != 0 && !mappings.contains(&loc.mapping_id) {
            return Err(ValidationError::DanglingId {
                field: format!("location[{i}].mapping_id"),
                kind: "mapping",
                id: loc.mapping_id,
            });
        }
        for (j, line) in loc.line.iter().enumerate() {
            if !functions.contains(&line.function_id) {
                return Err(ValidationError::DanglingId {
                    field: format!("location[{i}].line[{j}].function_id"),
                    kind: "function",
                    id: line.function_id,
                });
            }
        }
    }

    let expected = profile.sample_type.len();
    for (i, s) in profile.sample.iter().enumerate() {
        if s.value.len() != expected {
            return Err(ValidationError::ValueCount {
                sample: i,
                got: s.value.len(),
                expected,
            });
        }
        for (j, &id) in s.location_id.iter().enumerate() {
            if !locations.contains(&id) {
                return Err(ValidationError::DanglingId {
                    field: format!("sample[{i}].location_id[{j}]"),
                    kind: "location",
                    id,
                });
            }
        }
        for (j, l) in s.label.iter().enumerate() {
            check(l.key, &|| format!("sample[{i}].label[{j}].key"))?;
            check(l.str, &|| format!("sample[{i}].label[{j}].str"))?;
            check(l.num_unit, &|| format!("sample[{i}].label[{j}].num_unit"))?;
        }
    }
    Ok(())
}
