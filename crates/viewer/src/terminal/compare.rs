//! Diff mode (`edgeprof view FILE --diff-base BASE`): the flamegraph of both
//! profiles merged ([`crate::diff_tree`]), each frame coloured by its change,
//! and the table of [`crate::diff`]'s rows with base, new and delta columns.

use std::collections::HashSet;

use edgeprof_pprof::{Profile, SampleIndex, TopSort};
use ratatui::style::Color;

use crate::diff::{Diff, DiffError, DiffOptions, DiffRow, Normalize, diff_normalized, normalized};
use crate::diff_tree::{DiffNodes, diff_tree_normalized};
use crate::table::SortColumn;
use crate::tree::{CallTree, Granularity, NodeId};
use crate::view::View;

/// Background of frames whose value did not change.
pub const UNCHANGED_COLOR: Color = Color::Rgb(190, 190, 190);
/// Background of frames at the largest increase ("more in the new profile").
const MORE: (u8, u8, u8) = (225, 40, 40);
/// Background of frames at the largest decrease.
const LESS: (u8, u8, u8) = (40, 175, 70);

/// The profile a diff subtracts, as `--diff-base` names it.
#[derive(Debug, Clone)]
pub struct DiffBase {
    /// The base profile, of the same kind as the one viewed.
    pub profile: Profile,
    /// How the viewer names it (its path).
    pub name: String,
    /// How the viewed profile is scaled before the base is subtracted.
    pub normalize: Normalize,
}

/// What diff mode adds to the viewer: the base, each merged node's sides,
/// and the rows of the table.
#[derive(Debug)]
pub(super) struct Comparison {
    pub(super) base: DiffBase,
    pub(super) nodes: DiffNodes,
    /// Every function whose flat or cum changed (no node fraction).
    pub(super) diff: Diff,
}

impl Comparison {
    /// The merged tree's view, each node's sides and the function rows of
    /// `new` against `base` for one sample type and granularity.
    pub(super) fn compute(
        base: &DiffBase,
        new: &Profile,
        sample_index: Option<SampleIndex>,
        granularity: Granularity,
    ) -> Result<(View, DiffNodes, Diff), DiffError> {
        // Normalized once, for the flamegraph and the rows alike.
        let (scaled, factor, vi) =
            normalized(&base.profile, new, sample_index.as_ref(), base.normalize)?;
        let (tree, nodes) = diff_tree_normalized(&base.profile, &scaled, vi, granularity)?;
        let options = DiffOptions {
            sample_index: Some(SampleIndex::Position(vi)),
            node_fraction: 0.0,
            ..DiffOptions::default()
        };
        let rows = diff_normalized(&base.profile, &scaled, factor, vi, &options)?;
        Ok((View::from_tree(tree), nodes, rows))
    }

    /// The table's rows: sorted as the plain table's column says (Self = by
    /// |Δself|, Total = by |Δtotal|, as pprof orders a diff), filtered by
    /// the view's search (a row matches when a frame of its function does).
    pub(super) fn rows(&self, view: &View) -> Vec<DiffRow> {
        let mut rows = self.diff.rows.clone();
        if let Some(search) = view.search() {
            let tree = view.tree();
            let matched: HashSet<&str> = (0..tree.frames.len())
                .filter(|&f| search.frame_matches(f as u32))
                .map(|f| tree.frames[f].function.as_str())
                .collect();
            rows.retain(|r| matched.contains(r.function.as_str()));
        }
        match view.sort() {
            SortColumn::SelfValue => crate::diff::sort_rows(&mut rows, TopSort::Flat),
            SortColumn::Total => crate::diff::sort_rows(&mut rows, TopSort::Cum),
            SortColumn::Name => rows.sort_by(|a, b| a.function.cmp(&b.function)),
        }
        rows
    }

    /// What the status line says when nothing else is to say.
    pub(super) fn status(&self) -> String {
        let scaled = match self.base.normalize {
            Normalize::None => "",
            Normalize::Total => " (scaled to the base's total)",
            Normalize::Requests => " (scaled to the base's requests)",
        };
        format!(
            "diff: this profile{scaled} against base {}  red = more, green = less",
            self.base.name
        )
    }

    /// The title's totals: `diff BASE → NEW`.
    pub(super) fn totals(&self, tree: &CallTree) -> String {
        let (b, n) = (self.nodes.base[0], self.nodes.new[0]);
        format!("diff {} → {}", tree.format(b), tree.format(n))
    }

    /// The details bar of a selected frame.
    pub(super) fn node_details(&self, tree: &CallTree, node: NodeId) -> String {
        let i = node as usize;
        let frame = tree.frame(node);
        let mut line = format!(
            "{}  base {}  new {}  Δ {} ({:+.1}% of base)",
            frame.function,
            tree.format(self.nodes.base[i]),
            tree.format(self.nodes.new[i]),
            signed(tree, self.nodes.change(node)),
            self.nodes.share(node) * 100.0,
        );
        let location = frame.location();
        if !location.is_empty() {
            line.push_str("  ");
            line.push_str(&location);
        }
        line
    }

    /// The details bar of a selected table row.
    pub(super) fn row_details(&self, tree: &CallTree, row: &DiffRow) -> String {
        let d = row.delta();
        format!(
            "{}  self {} → {} (Δ {})  total {} → {} (Δ {})",
            row.function,
            tree.format(row.base.flat),
            tree.format(row.new.flat),
            signed(tree, d.flat),
            tree.format(row.base.cum),
            tree.format(row.new.cum),
            signed(tree, d.cum),
        )
    }

    /// The table's header, the sort column marked.
    pub(super) fn header(sort: SortColumn) -> String {
        let mark = |col, name| super::draw::marked(sort, col, name);
        format!(
            "{:>9} {:>9} {:>7} {:>9} {:>9}  {}",
            mark(SortColumn::SelfValue, "ΔSelf"),
            mark(SortColumn::Total, "ΔTotal"),
            "ΔTotal%",
            "Base",
            "New",
            mark(SortColumn::Name, "Function"),
        )
    }

    /// One row: Δself, Δtotal, Δtotal as % of the base, base and new totals.
    pub(super) fn line(&self, tree: &CallTree, row: &DiffRow) -> String {
        let d = row.delta();
        format!(
            "{:>9} {:>9} {:>+6.2}% {:>9} {:>9}  {}",
            signed(tree, d.flat),
            signed(tree, d.cum),
            self.diff.percent(d.cum),
            tree.format(row.base.cum),
            tree.format(row.new.cum),
            row.function,
        )
    }
}

/// `value` with its sign: `+40ms`, `-3ms`, `0`.
fn signed(tree: &CallTree, value: i64) -> String {
    let text = tree.format(value);
    if value > 0 { format!("+{text}") } else { text }
}

/// The colour of a change that is `share` of the base's total (positive =
/// more in the new profile): red for more, green for less, as Pyroscope and
/// Parca colour diffs, from grey at no change to full at a quarter of the
/// total. The square root keeps a change of 1 % visible (a fifth of the way).
pub fn change_color(share: f64) -> Color {
    if share == 0.0 || !share.is_finite() {
        return UNCHANGED_COLOR;
    }
    let t = (share.abs() * 4.0).min(1.0).sqrt();
    let (r, g, b) = if share > 0.0 { MORE } else { LESS };
    let Color::Rgb(r0, g0, b0) = UNCHANGED_COLOR else {
        unreachable!("UNCHANGED_COLOR is an Rgb colour")
    };
    let mix = |from: u8, to: u8| (f64::from(from) + (f64::from(to) - f64::from(from)) * t) as u8;
    Color::Rgb(mix(r0, r), mix(g0, g), mix(b0, b))
}
