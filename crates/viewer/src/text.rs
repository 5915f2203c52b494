//! Plain-text renderings of the model: what tests compare and what a log can
//! show. Not a user interface.

use std::fmt::Write;

use crate::layout::{BlockKind, Layout};
use crate::search::SearchResult;
use crate::table::TableRow;
use crate::tree::{CallTree, NodeId};

/// The tree as indented lines `total self name`, children widest first.
pub fn tree(tree: &CallTree) -> String {
    let mut out = String::new();
    let mut stack: Vec<NodeId> = vec![CallTree::ROOT];
    while let Some(id) = stack.pop() {
        let node = tree.node(id);
        let frame = tree.frame(id);
        let _ = write!(
            out,
            "{:indent$}{} {} {}",
            "",
            node.total,
            node.self_value,
            frame.function,
            indent = node.depth as usize * 2
        );
        if tree.granularity == crate::Granularity::FileLine && !frame.file.is_empty() {
            let _ = write!(out, " ({})", frame.location());
        }
        out.push('\n');
        stack.extend(tree.children(id).iter().rev());
    }
    out
}

/// The layout drawn with one character per unit of width: `[name  ]` per
/// block (`{name }` when the search matches it), `|` for a block one unit
/// wide, `…` labels a folded block.
pub fn flamegraph(tree: &CallTree, layout: &Layout, search: Option<&SearchResult>) -> String {
    let width = layout.options.width as usize;
    let mut out = String::new();
    for depth in 0..layout.depth() {
        let mut line: Vec<char> = vec![' '; width];
        for block in layout.row(depth) {
            let (label, matched) = match block.kind {
                BlockKind::Frame(id) => (
                    tree.frame(id).function.as_str(),
                    search.is_some_and(|s| s.node_matches(tree, id)),
                ),
                BlockKind::Folded { .. } => ("…", false),
            };
            let (x, w) = (block.x as usize, block.width as usize);
            if w == 1 {
                line[x] = '|';
                continue;
            }
            let (open, close) = if matched { ('{', '}') } else { ('[', ']') };
            line[x] = open;
            line[x + w - 1] = close;
            for (i, c) in label.chars().take(w - 2).enumerate() {
                line[x + 1 + i] = c;
            }
        }
        let text: String = line.into_iter().collect();
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// Table rows as aligned text: `self self% total total% function location`.
pub fn table(tree: &CallTree, rows: &[TableRow]) -> String {
    let mut out = String::new();
    for r in rows {
        let _ = writeln!(
            out,
            "{:>8} {:>6.2}% {:>8} {:>6.2}%  {}{}{}",
            tree.format(r.self_value),
            r.self_percent,
            tree.format(r.total),
            r.total_percent,
            r.function,
            if r.location.is_empty() { "" } else { "  " },
            r.location
        );
    }
    out
}

/// The layout's blocks one per line: `depth x+width name total`, folded
/// blocks as `… (N frames)`.
pub fn blocks(tree: &CallTree, layout: &Layout) -> String {
    let mut out = String::new();
    for b in &layout.blocks {
        let name = match b.kind {
            BlockKind::Frame(id) => tree.frame(id).function.clone(),
            BlockKind::Folded { frames, .. } => format!("… ({frames} frames)"),
        };
        let _ = writeln!(out, "{} {}+{} {} {}", b.depth, b.x, b.width, name, b.total);
    }
    out
}
