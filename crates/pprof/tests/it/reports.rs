//! The semantics of `top`, `collapse`, label filtering and scaling, on
//! small hand-made profiles whose right answer is known.

use edgeprof_pprof::{
    Profile, ProfileBuilder, SampleIndex, TopOptions, TopSort, collapse, filter_by_label, scale,
    top,
};

use crate::support::{line, small_cpu};

/// A profile from stacks written root-first as `"main;work;leaf"`, each with
/// a value and an optional `isolate` label.
fn profile(stacks: &[(&str, i64, Option<&str>)]) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count")]);
    for &(stack, value, isolate) in stacks {
        let ids: Vec<u64> = stack
            .split(';')
            .rev()
            .filter(|s| !s.is_empty())
            .map(|name| {
                let f = b.function(name, name, "", 0);
                b.location(0, 0, &[line(f, 1)])
            })
            .collect();
        let labels: Vec<_> = isolate.iter().map(|i| b.label_str("isolate", i)).collect();
        b.add_sample(&ids, &[value], &labels);
    }
    b.build()
}

/// `top` rendered as `function flat cum` lines, in order.
#[track_caller]
fn check_top(p: &Profile, options: &TopOptions, expected: &str) {
    let report = top(p, options).unwrap();
    let got: Vec<String> = report
        .rows
        .iter()
        .map(|r| format!("{} {} {}", r.function, r.flat, r.cum))
        .collect();
    let expected: Vec<&str> = expected
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(got, expected);
}

fn all() -> TopOptions {
    TopOptions {
        node_fraction: 0.0,
        ..Default::default()
    }
}

#[test]
fn recursion_counts_cum_once_per_sample() {
    let p = profile(&[
        ("main;rec;rec;rec", 5, None),
        ("main;rec;other;rec", 2, None),
    ]);
    check_top(
        &p,
        &all(),
        "rec 7 7
         main 0 7
         other 0 2",
    );
}

#[test]
fn ties_sort_by_name_then_the_other_value() {
    let p = profile(&[
        ("main;b", 3, None),
        ("main;a", 3, None),
        ("main;c;d", 3, None),
        ("main;x", 1, None),
    ]);
    check_top(
        &p,
        &all(),
        "a 3 3
         b 3 3
         d 3 3
         x 1 1
         c 0 3
         main 0 10",
    );
    check_top(
        &p,
        &TopOptions {
            sort: TopSort::Cum,
            ..all()
        },
        "main 0 10
         a 3 3
         b 3 3
         c 0 3
         d 3 3
         x 1 1",
    );
}

#[test]
fn node_fraction_drops_cum_below_the_cutoff_and_keeps_it_at_the_cutoff() {
    // Total 200, fraction 0.05 → cutoff 10.
    let p = profile(&[
        ("main;big", 181, None),
        ("main;edge", 10, None),
        ("main;small", 9, None),
    ]);
    let options = TopOptions {
        node_fraction: 0.05,
        ..Default::default()
    };
    check_top(
        &p,
        &options,
        "big 181 181
         edge 10 10
         main 0 200",
    );
    let report = top(&p, &options).unwrap();
    assert_eq!((report.dropped_nodes, report.node_cutoff), (1, 10));
}

#[test]
fn limit_and_sample_index() {
    let p = small_cpu();
    let report = top(
        &p,
        &TopOptions {
            limit: Some(2),
            ..all()
        },
    )
    .unwrap();
    // Default sample index: the last type, as pprof.
    assert_eq!(
        (report.sample_type.as_str(), report.unit.as_str()),
        ("cpu", "nanoseconds")
    );
    assert_eq!((report.rows.len(), report.truncated_nodes), (2, 2));
    for (index, expected) in [("0", "samples"), ("samples", "samples"), ("1", "cpu")] {
        let options = TopOptions {
            sample_index: Some(index.parse().unwrap()),
            ..all()
        };
        assert_eq!(top(&p, &options).unwrap().sample_type, expected);
    }
    let err = top(
        &p,
        &TopOptions {
            sample_index: Some(SampleIndex::Name("alloc_space".into())),
            ..all()
        },
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sample index \"alloc_space\" not found; the profile has: 0=samples, 1=cpu"
    );
}

#[test]
fn inlined_frames_are_their_own_rows() {
    let mut b = ProfileBuilder::new(&[("samples", "count")]);
    let outer = b.function("outer", "outer", "", 0);
    let inner = b.function("inner", "inner", "", 0);
    let main = b.function("main", "main", "", 0);
    let l1 = b.location(0, 0, &[line(inner, 2), line(outer, 1)]);
    let l2 = b.location(0, 0, &[line(main, 1)]);
    b.add_sample(&[l1, l2], &[4], &[]);
    let p = b.build();
    check_top(
        &p,
        &all(),
        "inner 4 4
         main 0 4
         outer 0 4",
    );
    assert_eq!(
        collapse(&p, None).unwrap(),
        vec![("main;outer;inner".to_owned(), 4)]
    );
}

#[test]
fn collapse_folds_stacks_root_first() {
    let p = profile(&[
        ("main;work;leaf", 3, None),
        ("main;work;leaf", 2, Some("i1")),
        ("main;other", 1, None),
        ("main;odd name;x;y", 1, None),
        ("main;zero", 0, None),
    ]);
    let got = collapse(&p, None).unwrap();
    let text: Vec<String> = got.iter().map(|(s, v)| format!("{s} {v}")).collect();
    assert_eq!(
        text,
        [
            "main;odd\u{a0}name;x;y 1",
            "main;other 1",
            "main;work;leaf 5",
        ]
    );
}

#[test]
fn label_filter_keeps_or_drops_matching_samples() {
    let p = profile(&[
        ("main;a", 1, Some("i1")),
        ("main;b", 2, Some("i2")),
        ("main;c", 4, None),
    ]);
    let kept = filter_by_label(&p, "isolate", &["i1", "i2"], true);
    check_top(
        &kept,
        &all(),
        "b 2 2
         a 1 1
         main 0 3",
    );
    let dropped = filter_by_label(&p, "isolate", &["i1"], false);
    check_top(
        &dropped,
        &all(),
        "c 4 4
         b 2 2
         main 0 6",
    );
    // Unused functions are compacted away.
    assert_eq!(kept.function.len(), 3);
}

#[test]
fn scale_rounds_and_drops_zeroes() {
    let p = profile(&[
        ("main;a", 10, None),
        ("main;b", 3, None),
        ("main;c", 1, None),
    ]);
    check_top(
        &scale(&p, 0.25),
        &all(),
        "a 3 3
         b 1 1
         main 0 4",
    );
    check_top(
        &scale(&p, -1.0),
        &all(),
        "a -10 -10
         b -3 -3
         c -1 -1
         main 0 -14",
    );
}
