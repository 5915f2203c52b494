//! The model, data-driven: a profile as folded stacks in, a text rendering
//! out.

use edgeprof_pprof::SampleIndex;
use edgeprof_viewer::{
    CallTree, Granularity, LayoutOptions, NodeId, Search, SearchMode, SortColumn, TreeOptions,
    View, text,
};
use insta::assert_snapshot;

use crate::profiles::folded;

fn tree(stacks: &str) -> CallTree {
    CallTree::build(&folded(stacks), &TreeOptions::default()).unwrap()
}

fn view(stacks: &str) -> View {
    View::from_tree(tree(stacks))
}

/// The node reached by following function names from the root.
fn node(tree: &CallTree, path: &str) -> NodeId {
    let mut id = CallTree::ROOT;
    for name in path.split(';') {
        id = *tree
            .children(id)
            .iter()
            .find(|&&c| tree.frame(c).function == name)
            .unwrap_or_else(|| panic!("no {name} under {}", tree.frame(id).function));
    }
    id
}

fn layout(view: &View, width: u32, min_width: u32) -> String {
    let l = view.layout(LayoutOptions {
        width,
        min_width,
        max_depth: None,
    });
    text::flamegraph(view.tree(), &l, view.search())
}

const RECURSIVE: &str = "
    main;walk;walk;walk;leaf 3
    main;walk;leaf 2
    main;walk;walk 1
    main;other 4
";

#[test]
fn tree_totals_under_recursion() {
    assert_snapshot!(text::tree(&tree(RECURSIVE)), @r"
    10 0 all
      10 0 main
        6 0 walk
          4 1 walk
            3 0 walk
              3 3 leaf
          2 2 leaf
        4 4 other
    ");
}

#[test]
fn table_counts_a_recursive_function_once_per_sample() {
    let t = tree(RECURSIVE);
    let rows = edgeprof_viewer::table(&t, SortColumn::Total, None);
    // walk's total is 6 (the samples under it), not 6 + 4 + 3.
    assert_snapshot!(text::table(&t, &rows), @r"
           0   0.00%     10ns 100.00%  main  src/main.rs:1
         1ns  10.00%      6ns  60.00%  walk  src/walk.rs:1
         5ns  50.00%      5ns  50.00%  leaf  src/leaf.rs:1
         4ns  40.00%      4ns  40.00%  other  src/other.rs:1
    ");
}

#[test]
fn table_sorts_by_any_column() {
    let t = tree(RECURSIVE);
    let names = |sort| {
        edgeprof_viewer::table(&t, sort, None)
            .iter()
            .map(|r| r.function.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(names(SortColumn::SelfValue), "leaf other walk main");
    assert_eq!(names(SortColumn::Total), "main walk leaf other");
    assert_eq!(names(SortColumn::Name), "leaf main other walk");
}

#[test]
fn layout_puts_the_root_on_top_and_callees_below_widest_first() {
    let v = view(RECURSIVE);
    assert_snapshot!(layout(&v, 20, 1), @r"
    [all               ]
    [main              ]
    [walk      ][other ]
    [walk  ][le]
    [walk]
    [leaf]
    ");
}

const WIDE_AND_NARROW: &str = "
    main;a 50
    main;b 30
    main;c 5
    main;d 5
    main;e 10
    main;d;deep 5
";

#[test]
fn narrow_frames_fold_into_one_block_with_their_total() {
    let v = view(WIDE_AND_NARROW);
    // 105 over 20 cells; with min width 3 a frame needs 105 * 3 / 20 = 15.75.
    assert_snapshot!(layout(&v, 20, 3), @r"
    [all               ]
    [main              ]
    [a      ][b   ][…  ]
    ");
    let l = v.layout(LayoutOptions {
        width: 20,
        min_width: 3,
        max_depth: None,
    });
    assert_snapshot!(text::blocks(v.tree(), &l), @r"
    0 0+20 all 105
    1 0+20 main 105
    2 0+9 a 50
    2 9+6 b 30
    2 15+5 … (3 frames) 25
    ");
}

#[test]
fn focus_fills_the_width_and_keeps_whole_profile_percentages() {
    let mut v = view(WIDE_AND_NARROW);
    let b = node(v.tree(), "main;b");
    v.focus_on(b);
    assert_snapshot!(layout(&v, 12, 1), @"[b         ]");
    let crumbs: Vec<String> = v.breadcrumbs().into_iter().map(|c| c.name).collect();
    assert_eq!(crumbs.join(" › "), "all › main › b");
    let d = v.tree().details(b);
    assert_eq!(
        d.to_line(v.tree()),
        "b  total 30ns (28.6%)  self 30ns (28.6%)  1 samples  src/b.rs:1"
    );
    assert!(v.focus_up());
    assert_eq!(v.focus(), node(v.tree(), "main"));
    v.reset();
    assert_eq!(v.focus(), CallTree::ROOT);
    assert!(!v.focus_up());
}

const JSON: &str = "
    main;json_parse;alloc 10
    main;json_parse;json_value 20
    main;render;json_encode 30
    main;render 40
";

fn share(stacks: &str, pattern: &str, mode: SearchMode) -> String {
    let t = tree(stacks);
    let s = Search::new(pattern, mode).unwrap();
    s.run(&t).summary(&t)
}

#[test]
fn search_counts_each_sample_once_however_many_frames_match() {
    // json_parse (30) covers json_value (20) below it: 30 + 30, not 80.
    assert_eq!(
        share(JSON, "json", SearchMode::Substring),
        r#""json" matches 3 frames, 60.0% of the profile (60ns)"#
    );
    assert_eq!(
        share(JSON, "^json_(parse|encode)$", SearchMode::Regex),
        r#""^json_(parse|encode)$" matches 2 frames, 60.0% of the profile (60ns)"#
    );
    // File paths match too: render lives in src/render.rs.
    assert_eq!(
        share(JSON, "src/render", SearchMode::Substring),
        r#""src/render" matches 1 frame, 70.0% of the profile (70ns)"#
    );
    // Smart case: an upper-case letter makes the search case-sensitive.
    assert_eq!(
        share(JSON, "JSON", SearchMode::Substring),
        r#""JSON": no matching frames"#
    );
    assert_eq!(
        share(JSON, "JSON", SearchMode::Regex),
        r#""JSON": no matching frames"#
    );
    assert_eq!(
        share(JSON, "(?i)JSON", SearchMode::Regex),
        r#""(?i)JSON" matches 3 frames, 60.0% of the profile (60ns)"#
    );
}

#[test]
fn search_highlights_matching_frames_and_filters_the_table() {
    let mut v = view(JSON);
    v.set_search(Some(&Search::new("json", SearchMode::Substring).unwrap()));
    assert_snapshot!(layout(&v, 30, 1), @r"
    [all                         ]
    [main                        ]
    [render             ]{json_pa}
    {json_en}            {json}[a]
    ");
    v.set_sort(SortColumn::Total);
    assert_snapshot!(text::table(v.tree(), &v.table()), @r"
        30ns  30.00%     30ns  30.00%  json_encode  src/json_encode.rs:1
           0   0.00%     30ns  30.00%  json_parse  src/json_parse.rs:1
        20ns  20.00%     20ns  20.00%  json_value  src/json_value.rs:1
    ");
}

#[test]
fn a_bad_regex_is_an_error_naming_the_pattern() {
    let err = Search::new("json(", SearchMode::Regex).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(r#"invalid regular expression "json(": "#),
        "{err}"
    );
    // As a substring the same text is fine.
    assert!(Search::new("json(", SearchMode::Substring).is_ok());
}

#[test]
fn sample_index_by_name_or_number_and_unknown_names_listed() {
    let p = folded("main;a 7");
    let by = |index: SampleIndex| {
        let t = CallTree::build(
            &p,
            &TreeOptions {
                sample_index: Some(index),
                granularity: Granularity::Function,
                group_by: None,
            },
        );
        t.map(|t| format!("{} {}", t.sample_type, t.total()))
            .unwrap_or_else(|e| e.to_string())
    };
    assert_eq!(by("samples".parse().unwrap()), "samples 1");
    assert_eq!(by("1".parse().unwrap()), "cpu 7");
    assert_eq!(
        by("alloc_space".parse().unwrap()),
        r#"sample index "alloc_space" not found; the profile has: 0=samples, 1=cpu"#
    );
}

#[test]
fn file_line_granularity_splits_a_function_by_call_site() {
    use edgeprof_pprof::{LineSpec, ProfileBuilder};
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let main = b.function("main", "", "src/main.rs", 1);
    let work = b.function("work", "", "src/work.rs", 5);
    let at = |b: &mut ProfileBuilder, f, line| {
        b.location(
            0,
            0,
            &[LineSpec {
                function_id: f,
                line,
                column: 0,
            }],
        )
    };
    let (m3, m4, w7) = (
        at(&mut b, main, 3),
        at(&mut b, main, 4),
        at(&mut b, work, 7),
    );
    b.add_sample(&[w7, m3], &[5], &[]);
    b.add_sample(&[w7, m4], &[2], &[]);
    b.add_sample(&[m4], &[1], &[]);
    let p = b.build();
    let by = |granularity| {
        let t = CallTree::build(
            &p,
            &TreeOptions {
                sample_index: None,
                granularity,
                group_by: None,
            },
        )
        .unwrap();
        text::tree(&t)
    };
    assert_snapshot!(by(Granularity::Function), @r"
    8 0 all
      8 1 main
        7 7 work
    ");
    assert_snapshot!(by(Granularity::FileLine), @r"
    8 0 all
      5 0 main (src/main.rs:3)
        5 5 work (src/work.rs:7)
      3 1 main (src/main.rs:4)
        2 2 work (src/work.rs:7)
    ");
}

#[test]
fn inlined_frames_expand_into_their_own_nodes() {
    use edgeprof_pprof::{LineSpec, ProfileBuilder};
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let main = b.function("main", "", "src/main.rs", 1);
    let inner = b.function("inlined_helper", "", "src/helper.rs", 1);
    // Lines innermost first: the helper was inlined into main.
    let loc = b.location(
        0,
        0x10,
        &[
            LineSpec {
                function_id: inner,
                line: 2,
                column: 0,
            },
            LineSpec {
                function_id: main,
                line: 9,
                column: 0,
            },
        ],
    );
    b.add_sample(&[loc], &[4], &[]);
    let t = CallTree::build(&b.build(), &TreeOptions::default()).unwrap();
    assert_snapshot!(text::tree(&t), @r"
    4 0 all
      4 0 main
        4 4 inlined_helper
    ");
}

#[test]
fn an_empty_profile_lays_out_nothing() {
    let v = view("");
    assert_eq!(v.tree().total(), 0);
    assert_eq!(layout(&v, 10, 1), "");
    assert!(v.table().is_empty());
}

#[test]
fn hit_testing_finds_the_block_under_a_point() {
    let v = view(WIDE_AND_NARROW);
    let l = v.layout(LayoutOptions {
        width: 20,
        min_width: 3,
        max_depth: None,
    });
    let name = |x, d| {
        l.hit(x, d).map(|b| match b.node() {
            Some(n) => v.tree().frame(n).function.clone(),
            None => "…".into(),
        })
    };
    assert_eq!(name(0, 2).as_deref(), Some("a"));
    assert_eq!(name(9, 2).as_deref(), Some("b"));
    assert_eq!(name(14, 2).as_deref(), Some("b"));
    assert_eq!(name(15, 2).as_deref(), Some("…"));
    assert_eq!(name(19, 2).as_deref(), Some("…"));
    assert_eq!(name(0, 3), None);
}
