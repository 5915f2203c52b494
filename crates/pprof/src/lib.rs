//! The pprof profile model of edgeprof: everything that reads, writes,
//! combines or reports on a `.pprof` file, as pure functions over bytes and
//! values.
//!
//! - [`decode`] / [`encode`]: gzip'd or raw protobuf in, gzip'd protobuf out,
//!   with deterministic bytes for equal input.
//! - [`validate`]: precise errors for dangling ids, out-of-range string indexes,
//!   zero ids and value counts; [`decode`] runs it, so a decoded [`Profile`] is
//!   always safe to walk.
//! - [`ProfileBuilder`]: deduplicates strings, mappings, functions, locations
//!   and samples; what the sampler and [`Merger`] build profiles with.
//! - [`Merger`] / [`merge`], [`filter_by_label`], [`scale`], [`subtract`]:
//!   pprof's merge and `-base` semantics.
//! - [`top`] and [`collapse`]: `go tool pprof -top` flat/cum rows and folded
//!   stacks for flamegraph tools.
//!
//! How it is checked: `tests/it` holds a malformed-file corpus (one
//! specific error per way a file can be broken), proptests (no panic on any
//! bytes, round trips, merge associativity) and report semantics;
//! `crates/cli/tests/it/interop.rs` compares `top` and `merge` with
//! `go tool pprof` on Go-recorded profiles. `fuzz/` has a cargo-fuzz target
//! for decode + validate (`cd fuzz && cargo +nightly fuzz run decode`, see
//! `fuzz/README.md`). Benchmarks: `cargo bench -p edgeprof-pprof` (criterion)
//! and `cargo xtask bench pprof` (decode + merge of 100 profiles beside
//! `go tool pprof -proto`).
//!
//! Architecture invariant: this crate does no IO (no files, sockets, clocks or
//! threads) and never depends on tonic, tokio or any other edgeprof crate but
//! `edgeprof-proto`, whose profile types it uses as its model.

mod builder;
mod codec;
mod merge;
mod report;
mod transform;
mod validate;

pub use builder::{LineSpec, MappingSpec, ProfileBuilder};
pub use codec::{
    DEFAULT_MAX_DECODED_BYTES, DecodeError, decode, decode_with_limit, encode, encode_raw,
};
pub use edgeprof_proto::pprof::{
    Function, Label, Line, Location, Mapping, Profile, Sample, ValueType,
};
pub use merge::{MergeError, Merger, merge};
pub use report::{
    Frame, ReportError, SampleIndex, TopOptions, TopReport, TopRow, TopSort, collapse,
    format_value, resolve_sample_index, stack_frames, top, total,
};
pub use transform::{filter_by_label, scale, subtract};
pub use validate::{ValidationError, validate};

/// The string at `index` in the profile's string table, or `""` when out of
/// range (never the case in a validated profile).
pub fn string(profile: &Profile, index: i64) -> &str {
    usize::try_from(index)
        .ok()
        .and_then(|i| profile.string_table.get(i))
        .map_or("", String::as_str)
}

/// Adds a header comment (`go tool pprof` prints it above its report),
/// reusing the string if the table has it, and never twice.
pub fn add_comment(profile: &mut Profile, text: &str) {
    let index = match profile.string_table.iter().position(|s| s == text) {
        Some(i) => i,
        None => {
            profile.string_table.push(text.to_owned());
            profile.string_table.len() - 1
        }
    };
    let index = index as i64;
    if !profile.comment.contains(&index) {
        profile.comment.push(index);
    }
}

/// `(type, unit)` of each sample type, as strings.
pub fn sample_types(profile: &Profile) -> Vec<(&str, &str)> {
    profile
        .sample_type
        .iter()
        .map(|vt| (string(profile, vt.r#type), string(profile, vt.unit)))
        .collect()
}
