//! The state one viewer shows: a call tree with a focus, a search and a table
//! sort. Both fronts (terminal, browser) drive this and only draw it.

use edgeprof_pprof::{Profile, ReportError, SampleIndex};

use crate::layout::{Layout, LayoutOptions};
use crate::search::{Search, SearchResult};
use crate::table::{SortColumn, TableRow, table};
use crate::tree::{CallTree, Granularity, NodeId, TreeOptions};

/// One step of the breadcrumbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crumb {
    /// The node to focus when the crumb is picked.
    pub node: NodeId,
    /// Its function name (`all` for the root).
    pub name: String,
}

/// A tree plus what the user did to it.
#[derive(Debug, Clone)]
pub struct View {
    tree: CallTree,
    focus: NodeId,
    search: Option<SearchResult>,
    sort: SortColumn,
}

impl View {
    /// A view of `profile`'s `sample_index` (None = default) at `granularity`.
    pub fn new(
        profile: &Profile,
        sample_index: Option<SampleIndex>,
        granularity: Granularity,
    ) -> Result<View, ReportError> {
        View::with_options(
            profile,
            &TreeOptions {
                sample_index,
                granularity,
                group_by: None,
            },
        )
    }

    /// A view of `profile`'s tree built with `options` (a group-by, say).
    pub fn with_options(profile: &Profile, options: &TreeOptions) -> Result<View, ReportError> {
        Ok(View::from_tree(CallTree::build(profile, options)?))
    }

    /// A view of an already built tree, unfocused, with no search.
    pub fn from_tree(tree: CallTree) -> View {
        View {
            tree,
            focus: CallTree::ROOT,
            search: None,
            sort: SortColumn::default(),
        }
    }

    /// The tree.
    pub fn tree(&self) -> &CallTree {
        &self.tree
    }

    /// The focused node (the root when nothing is focused).
    pub fn focus(&self) -> NodeId {
        self.focus
    }

    /// Focuses `node`: its subtree fills the width. Unknown ids are ignored.
    pub fn focus_on(&mut self, node: NodeId) {
        if (node as usize) < self.tree.nodes.len() {
            self.focus = node;
        }
    }

    /// Focuses the caller of the focused node; false when already at the root.
    pub fn focus_up(&mut self) -> bool {
        if self.focus == CallTree::ROOT {
            return false;
        }
        self.focus = self.tree.node(self.focus).parent;
        true
    }

    /// Back to all frames.
    pub fn reset(&mut self) {
        self.focus = CallTree::ROOT;
    }

    /// From the root to the focused node.
    pub fn breadcrumbs(&self) -> Vec<Crumb> {
        self.tree
            .path(self.focus)
            .into_iter()
            .map(|node| Crumb {
                node,
                name: self.tree.frame(node).function.clone(),
            })
            .collect()
    }

    /// The flamegraph of the focused subtree.
    pub fn layout(&self, options: LayoutOptions) -> Layout {
        Layout::new(&self.tree, self.focus, options)
    }

    /// Sets (or with `None` clears) the search.
    pub fn set_search(&mut self, search: Option<&Search>) {
        self.search = search.map(|s| s.run(&self.tree));
    }

    /// The current search's result.
    pub fn search(&self) -> Option<&SearchResult> {
        self.search.as_ref()
    }

    /// Whether `node` is highlighted by the search.
    pub fn matches(&self, node: NodeId) -> bool {
        self.search
            .as_ref()
            .is_some_and(|s| s.node_matches(&self.tree, node))
    }

    /// The table's sort column.
    pub fn sort(&self) -> SortColumn {
        self.sort
    }

    /// Sorts the table by `sort`.
    pub fn set_sort(&mut self, sort: SortColumn) {
        self.sort = sort;
    }

    /// The table, sorted and filtered by the search.
    pub fn table(&self) -> Vec<TableRow> {
        table(&self.tree, self.sort, self.search.as_ref())
    }
}
