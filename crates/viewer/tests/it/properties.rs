//! Properties of the model on random profiles, against naive oracles and
//! against `edgeprof_pprof::top` (whose flat/cum agree with `go tool pprof`).

use edgeprof_pprof::{TopOptions, top};
use edgeprof_viewer::{
    BlockKind, CallTree, LayoutOptions, Search, SearchMode, SortColumn, TreeOptions, table,
};
use proptest::prelude::*;

use crate::profiles::folded;

/// Stacks over a few names so recursion and shared prefixes are common.
fn stacks() -> impl Strategy<Value = Vec<(Vec<u8>, i64)>> {
    prop::collection::vec((prop::collection::vec(0u8..6, 1..8), 1i64..1000), 0..40)
}

fn text(stacks: &[(Vec<u8>, i64)]) -> String {
    stacks
        .iter()
        .map(|(s, v)| {
            let names: Vec<String> = s.iter().map(|i| format!("f{i}")).collect();
            format!("{} {v}\n", names.join(";"))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn totals_add_up_and_the_table_agrees_with_top(stacks in stacks()) {
        let p = folded(&text(&stacks));
        let tree = CallTree::build(&p, &TreeOptions::default()).unwrap();
        let sum: i64 = stacks.iter().map(|(_, v)| v).sum();
        prop_assert_eq!(tree.total(), sum);
        for id in 0..tree.nodes.len() as u32 {
            let node = tree.node(id);
            let children: i64 = tree.children(id).iter().map(|&c| tree.node(c).total).sum();
            prop_assert_eq!(node.total, node.self_value + children);
        }
        let report = top(&p, &TopOptions { node_fraction: 0.0, ..TopOptions::default() }).unwrap();
        let rows = table(&tree, SortColumn::Name, None);
        let mut ours: Vec<(String, i64, i64)> =
            rows.iter().map(|r| (r.function.clone(), r.self_value, r.total)).collect();
        let mut theirs: Vec<(String, i64, i64)> =
            report.rows.iter().map(|r| (r.function.clone(), r.flat, r.cum)).collect();
        ours.sort();
        theirs.sort();
        prop_assert_eq!(ours, theirs);
    }

    #[test]
    fn search_covers_each_matching_sample_once(stacks in stacks(), target in 0u8..6) {
        let p = folded(&text(&stacks));
        let tree = CallTree::build(&p, &TreeOptions::default()).unwrap();
        let name = format!("f{target}");
        let result = Search::new(&format!("^{name}$"), SearchMode::Regex).unwrap().run(&tree);
        let naive: i64 = stacks.iter().filter(|(s, _)| s.contains(&target)).map(|(_, v)| v).sum();
        prop_assert_eq!(result.covered, naive);
    }

    #[test]
    fn blocks_nest_inside_their_callers(stacks in stacks(), width in 1u32..200, min_width in 1u32..6) {
        let p = folded(&text(&stacks));
        let tree = CallTree::build(&p, &TreeOptions::default()).unwrap();
        let layout = edgeprof_viewer::Layout::new(
            &tree,
            CallTree::ROOT,
            LayoutOptions { width, min_width, max_depth: None },
        );
        for b in &layout.blocks {
            prop_assert!(b.width >= 1 && b.x + b.width <= width);
            let parent = match b.kind {
                BlockKind::Frame(id) => {
                    if id == CallTree::ROOT {
                        continue;
                    }
                    // Only frames at least `min_width` wide are drawn as frames.
                    prop_assert!(
                        b.total * i64::from(width) >= i64::from(min_width) * tree.total()
                    );
                    tree.node(id).parent
                }
                BlockKind::Folded { parent, .. } => parent,
            };
            let p = layout.find(parent).expect("a block's caller is laid out");
            prop_assert_eq!(p.depth + 1, b.depth);
            prop_assert!(b.x >= p.x && b.x + b.width <= p.x + p.width);
        }
        // Blocks of a row never overlap.
        for d in 0..layout.depth() {
            for pair in layout.row(d).windows(2) {
                prop_assert!(pair[0].x + pair[0].width <= pair[1].x);
            }
        }
    }
}
