//! The comparison model, data-driven: two profiles as folded stacks in, the
//! diff table (or label shares) as text out, with values worked out by hand.

use edgeprof_pprof::{LineSpec, Profile, ProfileBuilder, TopOptions, TopSort};
use edgeprof_viewer::{CallTree, TreeOptions};
use edgeprof_viewer::{
    Diff, DiffError, DiffOptions, LabelFocus, Normalize, Side, diff, diff_collapse, focus_all,
    label_shares,
};

use crate::profiles::folded;

/// `function base_flat base_cum new_flat new_cum Δflat Δcum` per row, then
/// the total the percentages are of.
fn render(d: &Diff) -> String {
    let mut out = String::new();
    for r in &d.rows {
        let delta = r.delta();
        out.push_str(&format!(
            "{} {} {} {} {} {:+} {:+}\n",
            r.function, r.base.flat, r.base.cum, r.new.flat, r.new.cum, delta.flat, delta.cum
        ));
    }
    out.push_str(&format!("total {}\n", d.total));
    out
}

fn check(base: &str, new: &str, options: DiffOptions, expect: &str) {
    check_profiles(&folded(base), &folded(new), options, expect);
}

fn check_profiles(base: &Profile, new: &Profile, options: DiffOptions, expect: &str) {
    let d = diff(base, new, &options).expect("diff");
    assert_eq!(render(&d), dedent(expect));
}

/// The expected text: each line trimmed, blank lines dropped.
fn dedent(expect: &str) -> String {
    expect
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

fn all() -> DiffOptions {
    DiffOptions {
        node_fraction: 0.0,
        ..DiffOptions::default()
    }
}

#[test]
fn diff_subtracts_the_base_per_function_and_keeps_both_sides() {
    check(
        "main;parse 60
         main;render 40",
        "main;parse 20
         main;render 50
         main;encode 30",
        all(),
        // Ordered by |Δflat|, ties by name; main did not change, so it is no
        // row (pprof's graph drops nodes with zero flat and cum).
        "parse 60 60 20 20 -40 -40
         encode 0 0 30 30 +30 +30
         render 40 40 50 50 +10 +10
         total 100",
    );
}

#[test]
fn diff_sorted_by_cum_change() {
    check(
        "main;a;x 10
         main;b 50",
        "main;a;x 40
         main;b 45",
        DiffOptions {
            sort: TopSort::Cum,
            ..all()
        },
        "a 0 10 0 40 +0 +30
         x 10 10 40 40 +30 +30
         main 0 60 0 85 +0 +25
         b 50 50 45 45 -5 -5
         total 60",
    );
}

#[test]
fn diff_counts_recursion_once_per_sample() {
    check(
        "main;walk;walk;walk 9",
        "main;walk;walk 4",
        all(),
        "walk 9 9 4 4 -5 -5
         main 0 9 0 4 +0 -5
         total 9",
    );
}

#[test]
fn diff_node_fraction_is_of_the_base_total() {
    // Base total 1000: cutoff 5. tiny's change (4) is below it, edge's (5) is not.
    check(
        "main;big 990
         main;tiny 5
         main;edge 5",
        "main;big 990
         main;tiny 9
         main;edge 10",
        DiffOptions::default(),
        "edge 5 5 10 10 +5 +5
         main 0 1000 0 1009 +0 +9
         total 1000",
    );
}

#[test]
fn diff_normalized_to_the_base_total_compares_shares() {
    // New is twice as long: scaled by 100/200 = 0.5 first, as pprof -normalize.
    check(
        "main;parse 50
         main;render 50",
        "main;parse 60
         main;render 140",
        DiffOptions {
            normalize: Normalize::Total,
            ..all()
        },
        "parse 50 50 30 30 -20 -20
         render 50 50 70 70 +20 +20
         total 100",
    );
}

fn with_requests(stacks: &str, requests: Option<u64>) -> Profile {
    let mut p = folded(stacks);
    if let Some(n) = requests {
        edgeprof_pprof::add_comment(&mut p, &format!("requests: {n}"));
    }
    p
}

#[test]
fn diff_per_request_scales_new_to_the_base_requests() {
    // Base: 10 requests, 100 → 10 per request. New: 40 requests, 200 → 5 per
    // request; scaled by 10/40 it reads 50 at the base's 10 requests.
    let base = with_requests("main;replacer 80\nmain;serialize 20", Some(10));
    let new = with_requests("main;replacer 40\nmain;serialize 160", Some(40));
    let options = DiffOptions {
        normalize: Normalize::Requests,
        ..all()
    };
    check_profiles(
        &base,
        &new,
        options.clone(),
        "replacer 80 80 10 10 -70 -70
         serialize 20 20 40 40 +20 +20
         main 0 100 0 50 +0 -50
         total 100",
    );
    let d = diff(&base, &new, &options).unwrap();
    assert_eq!(d.requests, Some((10, 40)));
    assert_eq!(d.new_scale, 0.25);
}

#[test]
fn diff_per_request_names_the_profile_without_requests() {
    let options = DiffOptions {
        normalize: Normalize::Requests,
        ..all()
    };
    for (b, n, side) in [
        (None, Some(3), Side::Base),
        (Some(3), None, Side::New),
        (Some(3), Some(0), Side::New),
    ] {
        let err = diff(
            &with_requests("main 1", b),
            &with_requests("main 1", n),
            &options,
        )
        .expect_err("no requests");
        assert_eq!(err, DiffError::NoRequests { side });
        assert_eq!(
            err.to_string(),
            format!(
                "the {side} profile has no `requests: N` comment (needed to normalize per request)"
            )
        );
    }
}

#[test]
fn diff_of_different_kinds_is_an_error() {
    let mut b = ProfileBuilder::new(&[("alloc_space", "bytes")]);
    let f = b.function("main", "main", "src/main.rs", 1);
    let l = b.location(
        0,
        0,
        &[LineSpec {
            function_id: f,
            line: 1,
            column: 0,
        }],
    );
    b.add_sample(&[l], &[1], &[]);
    let heap = b.build();
    let err = diff(&heap, &folded("main 1"), &all()).expect_err("kinds differ");
    assert_eq!(
        err.to_string(),
        "the profiles are of different kinds: base has [alloc_space/bytes], new has [samples/count, cpu/nanoseconds]"
    );
    assert_eq!(err.side(), None);
}

#[test]
fn diff_collapse_keeps_both_columns() {
    let rows = diff_collapse(
        &folded("main;a 3\nmain;b 4"),
        &folded("main;b 6\nmain;c 1"),
        None,
        Normalize::None,
    )
    .unwrap();
    assert_eq!(
        rows,
        [
            ("main;a".to_owned(), 3, 0),
            ("main;b".to_owned(), 4, 6),
            ("main;c".to_owned(), 0, 1),
        ]
    );
}

/// `(stack, value, [(key, value)])`: one sample with string labels.
type LabelledSample<'a> = (&'a str, i64, &'a [(&'a str, &'a str)]);

/// A profile of samples with string labels.
fn labelled(samples: &[LabelledSample<'_>]) -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    for (stack, value, labels) in samples {
        let mut ids: Vec<u64> = stack
            .split(';')
            .map(|name| {
                let f = b.function(name, name, "src/lib.rs", 1);
                b.location(
                    0,
                    0,
                    &[LineSpec {
                        function_id: f,
                        line: 1,
                        column: 0,
                    }],
                )
            })
            .collect();
        ids.reverse();
        let labels: Vec<_> = labels.iter().map(|(k, v)| b.label_str(k, v)).collect();
        b.add_sample(&ids, &[*value], &labels);
    }
    b.build()
}

fn check_tags(p: &Profile, expect: &str) {
    let mut out = String::new();
    for k in label_shares(p, None).unwrap() {
        out.push_str(&format!("{} {}\n", k.key, k.total));
        for v in k.values {
            out.push_str(&format!(
                "- {} {} {:.2}% {:.2}%\n",
                v.value, v.total, v.key_percent, v.profile_percent
            ));
        }
    }
    assert_eq!(out, dedent(expect));
}

const LABELLED: &[LabelledSample<'static>] = &[
    ("main;a", 50, &[("data_center", "lhr"), ("isolate", "i1")]),
    ("main;b", 30, &[("data_center", "sjc"), ("isolate", "i2")]),
    ("main;a", 15, &[("data_center", "sjc"), ("isolate", "i3")]),
    ("main;c", 5, &[]),
];

#[test]
fn label_shares_per_key_and_of_the_profile() {
    // data_center: lhr 50, sjc 45 of the key's 95; the unlabelled 5 count
    // only in the profile's 100.
    check_tags(
        &labelled(LABELLED),
        "data_center 95
         - lhr 50 52.63% 50.00%
         - sjc 45 47.37% 45.00%
         isolate 95
         - i1 50 52.63% 50.00%
         - i2 30 31.58% 30.00%
         - i3 15 15.79% 15.00%",
    );
}

#[test]
fn label_focus_keeps_matching_samples() {
    let p = labelled(LABELLED);
    let focus = |s: &str| -> LabelFocus { s.parse().unwrap() };
    let top = |p: &Profile| {
        let options = TopOptions {
            node_fraction: 0.0,
            ..TopOptions::default()
        };
        edgeprof_pprof::top(p, &options)
            .unwrap()
            .rows
            .iter()
            .map(|r| format!("{} {}", r.function, r.cum))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        top(&focus_all(&p, &[focus("data_center=sjc")])),
        ["b 30", "a 15", "main 45"]
    );
    assert_eq!(
        top(&focus_all(&p, &[focus("isolate=i1,i2")])),
        ["a 50", "b 30", "main 80"]
    );
    // Several focuses must all match.
    assert_eq!(
        top(&focus_all(
            &p,
            &[focus("data_center=sjc"), focus("isolate=i1,i3")]
        )),
        ["a 15", "main 15"]
    );
    assert_eq!(
        top(&focus_all(&p, &[focus("data_center=nrt")])),
        Vec::<String>::new()
    );
}

#[test]
fn label_focus_refuses_what_is_not_key_value() {
    for bad in [
        "data_center",
        "=lhr",
        "data_center=",
        "data_center=lhr,",
        "!=lhr",
        "data_center!=",
    ] {
        let err = bad.parse::<LabelFocus>().expect_err(bad);
        assert_eq!(
            err.to_string(),
            format!(
                "{bad:?} is not KEY=VALUE[,VALUE…] or KEY!=VALUE[,VALUE…] (e.g. data_center=lhr)"
            )
        );
    }
}

#[test]
fn label_hide_drops_matching_samples() {
    let p = labelled(LABELLED);
    let focus = |s: &str| -> LabelFocus { s.parse().unwrap() };
    let hide = focus("data_center!=sjc");
    assert!(hide.hide);
    assert_eq!(hide.to_string(), "data_center!=sjc");
    assert_eq!(focus("isolate=i1,i2").to_string(), "isolate=i1,i2");
    let total = |p: &Profile| p.sample.iter().map(|s| s.value[0]).sum::<i64>();
    // sjc's 30 + 15 go; lhr's 50 and the unlabelled 5 stay.
    assert_eq!(total(&focus_all(&p, std::slice::from_ref(&hide))), 55);
    // A focus and a hide together.
    assert_eq!(total(&focus_all(&p, &[focus("isolate=i1,i2"), hide])), 50);
}

#[test]
fn group_by_a_label_gives_a_root_per_value() {
    let p = labelled(LABELLED);
    let options = TreeOptions {
        group_by: Some("data_center".into()),
        ..TreeOptions::default()
    };
    let tree = CallTree::build(&p, &options).unwrap();
    assert_eq!(tree.group_by.as_deref(), Some("data_center"));
    assert_eq!(tree.total(), 100);
    insta::assert_snapshot!(edgeprof_viewer::text::tree(&tree), @r"
    100 0 all
      50 0 data_center=lhr
        50 0 main
          50 50 a
      45 0 data_center=sjc
        45 0 main
          30 30 b
          15 15 a
      5 0 data_center=(none)
        5 0 main
          5 5 c
    ");
}

/// The merged tree as indented lines `name base new change`, widest (base +
/// new) first.
fn render_tree(base: &str, new: &str, normalize: Normalize) -> String {
    let (tree, nodes) = edgeprof_viewer::diff_tree(
        &folded(base),
        &folded(new),
        &TreeOptions::default(),
        normalize,
    )
    .expect("diff tree");
    let mut out = String::new();
    let mut stack = vec![CallTree::ROOT];
    while let Some(id) = stack.pop() {
        let i = id as usize;
        out.push_str(&format!(
            "{:indent$}{} {} {} {:+}\n",
            "",
            tree.frame(id).function,
            nodes.base[i],
            nodes.new[i],
            nodes.change(id),
            indent = tree.node(id).depth as usize * 2
        ));
        assert_eq!(tree.node(id).total, nodes.base[i] + nodes.new[i]);
        stack.extend(tree.children(id).iter().rev());
    }
    out.push_str(&format!("total {}\n", nodes.total));
    out
}

#[test]
fn diff_tree_merges_both_trees_with_widths_of_base_plus_new() {
    let text = render_tree(
        "main;parse 60
         main;render 40
         gc 10",
        "main;parse 20
         main;render 50
         main;encode 30",
        Normalize::None,
    );
    // render 90 is widest under main, then parse 80; encode exists only in
    // the new profile and gc only in the base: both are drawn.
    let expect = "\
all 110 100 -10
  main 100 100 +0
    render 40 50 +10
    parse 60 20 -40
    encode 0 30 +30
  gc 10 0 -10
total 110
";
    assert_eq!(text, expect);
}

#[test]
fn diff_tree_normalized_per_request() {
    let base = with_requests("main;work 100", Some(10));
    let new = with_requests("main;work 300", Some(20));
    // New scaled by 10/20: work costs 15 per request against 10.
    let (tree, nodes) =
        edgeprof_viewer::diff_tree(&base, &new, &TreeOptions::default(), Normalize::Requests)
            .expect("diff tree");
    let work = tree.children(tree.children(CallTree::ROOT)[0])[0];
    assert_eq!(
        (nodes.base[work as usize], nodes.new[work as usize]),
        (100, 150)
    );
    assert_eq!(nodes.share(work), 0.5);
}
