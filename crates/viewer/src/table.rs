//! The table view: one row per function (or per file:line) with Self, Total
//! and % of the profile, sortable and filterable by a search.

use crate::search::SearchResult;
use crate::tree::{CallTree, FrameId};

/// The column a table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortColumn {
    /// Self value, largest first.
    #[default]
    SelfValue,
    /// Total value, largest first.
    Total,
    /// Function name, A to Z.
    Name,
}

impl SortColumn {
    /// The next column in the cycle Self → Total → Name → Self.
    pub fn next(self) -> SortColumn {
        match self {
            SortColumn::SelfValue => SortColumn::Total,
            SortColumn::Total => SortColumn::Name,
            SortColumn::Name => SortColumn::SelfValue,
        }
    }

    /// Its header, as the table shows it.
    pub fn label(self) -> &'static str {
        match self {
            SortColumn::SelfValue => "Self",
            SortColumn::Total => "Total",
            SortColumn::Name => "Function",
        }
    }
}

/// One function's row; percentages are of the whole profile.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    /// The frame the row is about.
    pub frame: FrameId,
    /// Function name.
    pub function: String,
    /// `file:line`, or `""`.
    pub location: String,
    /// Value of samples whose leaf is this function.
    pub self_value: i64,
    /// Value of samples with this function anywhere on the stack, each
    /// sample counted once however deep it recurses.
    pub total: i64,
    /// Self as % of the profile.
    pub self_percent: f64,
    /// Total as % of the profile.
    pub total_percent: f64,
}

/// Self and total per frame of `tree`, indexed by [`FrameId`].
pub fn frame_totals(tree: &CallTree) -> (Vec<i64>, Vec<i64>) {
    let n = tree.frames.len();
    let mut self_values = vec![0i64; n];
    let mut totals = vec![0i64; n];
    // Depth-first, counting how many ancestors show each frame: a node adds
    // to its frame's total only when it is the outermost occurrence on its
    // path, so a recursive function's samples count once.
    let mut on_path = vec![0u32; n];
    let mut stack: Vec<(u32, bool)> = vec![(CallTree::ROOT, false)];
    while let Some((id, leaving)) = stack.pop() {
        let node = tree.node(id);
        let f = node.frame as usize;
        if leaving {
            on_path[f] -= 1;
            continue;
        }
        if id != CallTree::ROOT {
            self_values[f] = self_values[f].saturating_add(node.self_value);
            if on_path[f] == 0 {
                totals[f] = totals[f].saturating_add(node.total);
            }
        }
        on_path[f] += 1;
        stack.push((id, true));
        stack.extend(tree.children(id).iter().rev().map(|&c| (c, false)));
    }
    (self_values, totals)
}

/// The table's rows, sorted by `sort` (ties by name), keeping only frames
/// `filter` matches when given. Frames no sample reaches are left out.
pub fn table(tree: &CallTree, sort: SortColumn, filter: Option<&SearchResult>) -> Vec<TableRow> {
    let (self_values, totals) = frame_totals(tree);
    let mut rows: Vec<TableRow> = tree
        .frames
        .iter()
        .enumerate()
        .skip(1)
        .filter(|&(f, _)| self_values[f] != 0 || totals[f] != 0)
        .filter(|&(f, _)| filter.is_none_or(|r| r.frame_matches(f as FrameId)))
        .map(|(f, info)| TableRow {
            frame: f as FrameId,
            function: info.function.clone(),
            location: info.location(),
            self_value: self_values[f],
            total: totals[f],
            self_percent: tree.percent(self_values[f]),
            total_percent: tree.percent(totals[f]),
        })
        .collect();
    let by_name = |a: &TableRow, b: &TableRow| {
        a.function
            .cmp(&b.function)
            .then_with(|| a.location.cmp(&b.location))
    };
    match sort {
        SortColumn::SelfValue => rows.sort_by(|a, b| {
            b.self_value
                .cmp(&a.self_value)
                .then_with(|| b.total.cmp(&a.total))
                .then_with(|| by_name(a, b))
        }),
        SortColumn::Total => rows.sort_by(|a, b| {
            b.total
                .cmp(&a.total)
                .then_with(|| b.self_value.cmp(&a.self_value))
                .then_with(|| by_name(a, b))
        }),
        SortColumn::Name => rows.sort_by(by_name),
    }
    rows
}
