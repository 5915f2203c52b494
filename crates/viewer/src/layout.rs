//! Flamegraph layout: the focused node on top spanning the full width, its
//! callees in the row below, each as wide as its share of the focused total.
//! Horizontal position is not time: callees are ordered widest first.

use crate::tree::{CallTree, NodeId};

/// How to lay a tree out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutOptions {
    /// Width of the whole graph, in cells or pixels.
    pub width: u32,
    /// Frames narrower than this (in the same unit) fold into one "…" block
    /// per caller; at least 1.
    pub min_width: u32,
    /// Rows below the focused node to lay out (`None` = all).
    pub max_depth: Option<u32>,
}

impl Default for LayoutOptions {
    fn default() -> Self {
        LayoutOptions {
            width: 1000,
            min_width: 1,
            max_depth: None,
        }
    }
}

/// What a block draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// One node.
    Frame(NodeId),
    /// The callees of `parent` too narrow to draw, folded into one "…".
    Folded {
        /// Their caller.
        parent: NodeId,
        /// How many callees were folded.
        frames: u32,
    },
}

/// One rectangle of the flamegraph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// What it draws.
    pub kind: BlockKind,
    /// Row, 0 = the focused node.
    pub depth: u32,
    /// Left edge.
    pub x: u32,
    /// Width, at least 1.
    pub width: u32,
    /// Value the block stands for (a folded block: the sum of its frames).
    pub total: i64,
}

impl Block {
    /// The node drawn, `None` for a folded block.
    pub fn node(&self) -> Option<NodeId> {
        match self.kind {
            BlockKind::Frame(id) => Some(id),
            BlockKind::Folded { .. } => None,
        }
    }

    /// Whether `x` falls inside the block.
    pub fn contains(&self, x: u32) -> bool {
        x >= self.x && x < self.x + self.width
    }
}

/// A laid-out flamegraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The node spanning the full width.
    pub focus: NodeId,
    /// The options it was made with.
    pub options: LayoutOptions,
    /// Blocks, row by row, left to right.
    pub blocks: Vec<Block>,
    /// `rows[d]`: the range of `blocks` in row `d`.
    pub rows: Vec<std::ops::Range<usize>>,
}

impl Layout {
    /// Lays out the subtree of `focus`. A focus whose total is not positive
    /// gives an empty layout.
    pub fn new(tree: &CallTree, focus: NodeId, options: LayoutOptions) -> Layout {
        let width = options.width;
        let min_width = options.min_width.max(1);
        let mut layout = Layout {
            focus,
            options,
            blocks: Vec::new(),
            rows: Vec::new(),
        };
        let focus_total = tree.node(focus).total;
        if focus_total <= 0 || width == 0 {
            return layout;
        }
        let scale = |v: i64| (v as i128 * width as i128 / focus_total as i128) as u32;
        let narrow =
            |v: i64| (v as i128) * (width as i128) < (min_width as i128) * (focus_total as i128);
        if narrow(focus_total) {
            return layout;
        }

        // Breadth-first, one row at a time; `offsets` holds each frame
        // block's value offset from the focus's left edge, so positions are
        // computed from exact sums and children never overhang parents.
        layout.blocks.push(Block {
            kind: BlockKind::Frame(focus),
            depth: 0,
            x: 0,
            width,
            total: focus_total,
        });
        layout.rows.push(0..1);
        let mut offsets: Vec<i64> = vec![0];
        let mut row = 0..1;
        let mut depth = 0;
        while !row.is_empty() && options.max_depth.is_none_or(|m| depth < m) {
            depth += 1;
            let start = layout.blocks.len();
            for b in row.clone() {
                let BlockKind::Frame(parent) = layout.blocks[b].kind else {
                    continue;
                };
                let mut off = offsets[b];
                let mut folded: Option<(i64, i64, u32)> = None; // (offset, total, frames)
                for &child in tree.children(parent) {
                    let total = tree.node(child).total;
                    if total <= 0 {
                        break; // children are sorted widest first
                    }
                    if let Some(f) = folded.as_mut() {
                        f.1 = f.1.saturating_add(total);
                        f.2 += 1;
                    } else if narrow(total) {
                        folded = Some((off, total, 1));
                    } else {
                        let (x0, x1) = (scale(off), scale(off.saturating_add(total)));
                        layout.blocks.push(Block {
                            kind: BlockKind::Frame(child),
                            depth,
                            x: x0,
                            width: (x1 - x0).max(1),
                            total,
                        });
                        offsets.push(off);
                    }
                    off = off.saturating_add(total);
                }
                if let Some((off, total, frames)) = folded {
                    let (x0, x1) = (scale(off), scale(off.saturating_add(total)));
                    if x1 > x0 {
                        layout.blocks.push(Block {
                            kind: BlockKind::Folded { parent, frames },
                            depth,
                            x: x0,
                            width: x1 - x0,
                            total,
                        });
                        offsets.push(off);
                    }
                }
            }
            row = start..layout.blocks.len();
            if !row.is_empty() {
                layout.rows.push(row.clone());
            }
        }
        layout
    }

    /// Number of rows.
    pub fn depth(&self) -> usize {
        self.rows.len()
    }

    /// The blocks of row `depth` (empty past the last row).
    pub fn row(&self, depth: usize) -> &[Block] {
        self.rows
            .get(depth)
            .map_or(&[][..], |r| &self.blocks[r.clone()])
    }

    /// The block drawing `node`, if it is laid out.
    pub fn find(&self, node: NodeId) -> Option<&Block> {
        self.blocks.iter().find(|b| b.node() == Some(node))
    }

    /// The block under `(x, depth)`, for hover and click.
    pub fn hit(&self, x: u32, depth: usize) -> Option<&Block> {
        let row = self.row(depth);
        let i = row.partition_point(|b| b.x + b.width <= x);
        row.get(i).filter(|b| b.contains(x))
    }
}
