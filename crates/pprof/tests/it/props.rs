//! Properties over random input: decoding never panics, builder-made
//! profiles round-trip, merge is associative on totals, `p - p` is empty and
//! encoding is deterministic.

use edgeprof_pprof::{
    Profile, ProfileBuilder, TopOptions, collapse, decode, encode, encode_raw, merge, subtract, top,
};
use proptest::prelude::*;

use crate::support::{line, small_cpu};

/// More cases under `EDGEPROF_SLOW_TESTS=1` (what `cargo xtask ci` sets):
/// the bounded stand-in for a fuzzing pass.
fn cases(normal: u32) -> ProptestConfig {
    let slow = std::env::var_os("EDGEPROF_SLOW_TESTS").is_some_and(|v| v == "1");
    ProptestConfig::with_cases(if slow { normal * 8 } else { normal })
}

/// A random profile, described as data so proptest can shrink it: each
/// sample is a stack (leaf first) of locations, each location one or two
/// `(function, line)` pairs (two = an inlined call), values for the two
/// sample types and an optional label value.
#[derive(Debug, Clone)]
struct Spec {
    samples: Vec<SampleSpec>,
}

/// Stack of locations (each a list of `(function, line)`), values, label.
type SampleSpec = (Vec<Vec<(u8, u8)>>, [i64; 2], Option<u8>);

fn spec(values: std::ops::Range<i64>) -> impl Strategy<Value = Spec> {
    let location = prop::collection::vec((0u8..12, 0u8..4), 1..=2);
    let stack = prop::collection::vec(location, 0..8);
    let sample = (stack, [values.clone(), values], prop::option::of(0u8..3));
    prop::collection::vec(sample, 0..40).prop_map(|samples| Spec { samples })
}

fn build(spec: &Spec) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    for (stack, values, label) in &spec.samples {
        let ids: Vec<u64> = stack
            .iter()
            .map(|lines| {
                let lines: Vec<_> = lines
                    .iter()
                    .map(|&(f, l)| {
                        let name = format!("f{f}");
                        let id = b.function(&name, &name, "lib.rs", 0);
                        line(id, i64::from(l))
                    })
                    .collect();
                b.location(0, 0, &lines)
            })
            .collect();
        let labels: Vec<_> = label
            .iter()
            .map(|l| b.label_str("isolate", &format!("i{l}")))
            .collect();
        b.add_sample(&ids, values, &labels);
    }
    b.build()
}

fn totals(p: &Profile) -> Vec<i64> {
    (0..p.sample_type.len())
        .map(|i| p.sample.iter().map(|s| s.value[i]).sum())
        .collect()
}

/// Reports must not panic on anything that decodes.
fn exercise(p: &Profile) {
    for i in 0..p.sample_type.len() {
        let options = TopOptions {
            sample_index: Some(edgeprof_pprof::SampleIndex::Position(i)),
            ..Default::default()
        };
        let _ = top(p, &options);
        let _ = collapse(p, options.sample_index.as_ref());
    }
    let _ = merge([p, p]);
    let _ = edgeprof_pprof::filter_by_label(p, "isolate", &["i1"], true);
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(p) = decode(&bytes) {
            exercise(&p);
        }
        let mut gz = vec![0x1f, 0x8b];
        gz.extend_from_slice(&bytes);
        let _ = decode(&gz);
    }

    #[test]
    fn mutated_profiles_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        // Byte flips of a valid profile reach far more of the decoder and the
        // validator than random bytes do.
        let mut raw = encode_raw(&small_cpu());
        for (at, byte) in edits {
            let i = at.index(raw.len());
            raw[i] = byte;
        }
        if truncate {
            raw.truncate(cut.index(raw.len()));
        }
        if let Ok(p) = decode(&raw) {
            exercise(&p);
        }
    }

    #[test]
    fn builder_profiles_round_trip(spec in spec(-1000..1000)) {
        let p = build(&spec);
        prop_assert_eq!(&decode(&encode(&p)).unwrap(), &p);
        prop_assert_eq!(&decode(&encode_raw(&p)).unwrap(), &p);
    }

    #[test]
    fn encoding_is_deterministic(spec in spec(0..1000)) {
        let bytes = encode(&build(&spec));
        prop_assert_eq!(&encode(&build(&spec)), &bytes);
        prop_assert_eq!(&encode(&decode(&bytes).unwrap()), &bytes);
    }

    #[test]
    fn merge_is_associative_on_totals(
        a in spec(0..1_000_000),
        b in spec(0..1_000_000),
        c in spec(0..1_000_000),
    ) {
        let (a, b, c) = (build(&a), build(&b), build(&c));
        let left = merge([&merge([&a, &b]).unwrap(), &c]).unwrap();
        let right = merge([&a, &merge([&b, &c]).unwrap()]).unwrap();
        let flat = merge([&a, &b, &c]).unwrap();
        let sum: Vec<i64> = [&a, &b, &c]
            .iter()
            .map(|p| totals(p))
            .fold(vec![0, 0], |acc, t| vec![acc[0] + t[0], acc[1] + t[1]]);
        prop_assert_eq!(totals(&left), sum.clone());
        prop_assert_eq!(totals(&right), sum.clone());
        prop_assert_eq!(totals(&flat), sum);
        let options = TopOptions { node_fraction: 0.0, ..Default::default() };
        prop_assert_eq!(top(&left, &options).unwrap(), top(&right, &options).unwrap());
    }

    #[test]
    fn subtracting_a_profile_from_itself_is_empty(spec in spec(-1000..1000)) {
        let p = build(&spec);
        let d = subtract(&p, &p).unwrap();
        prop_assert!(d.sample.is_empty(), "left: {:?}", d.sample);
        prop_assert_eq!(top(&d, &TopOptions::default()).unwrap().total, 0);
    }

    #[test]
    fn top_flat_sums_to_the_total_and_cum_bounds_flat(spec in spec(0..1000)) {
        let p = build(&spec);
        for i in 0..2 {
            let options = TopOptions {
                sample_index: Some(edgeprof_pprof::SampleIndex::Position(i)),
                node_fraction: 0.0,
                ..Default::default()
            };
            let report = top(&p, &options).unwrap();
            let stacked: i64 = p
                .sample
                .iter()
                .filter(|s| !s.location_id.is_empty())
                .map(|s| s.value[i])
                .sum();
            prop_assert_eq!(report.rows.iter().map(|r| r.flat).sum::<i64>(), stacked);
            for r in &report.rows {
                prop_assert!(r.flat <= r.cum && r.cum <= report.total, "{:?}", r);
            }
        }
    }
}
