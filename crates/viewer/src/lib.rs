//! The model behind edgeprof's profile viewers: what a flamegraph, a
//! function table and their interactions show, computed from a pprof
//! [`Profile`](edgeprof_pprof::Profile), with no IO.
//!
//! - [`CallTree`]: every root-to-leaf path merged by function (or file:line),
//!   self and total per node; recursion never counts a sample twice.
//! - [`Layout`]: the flamegraph, root on top and callers above callees,
//!   widths proportional to value, narrow frames folded into one "…" block.
//! - [`View`]: focus with breadcrumbs and reset, [`Search`] with highlight and
//!   covered share, the [`table`] sorted by any column.
//! - [`diff`](diff()): two profiles of one kind compared with `go tool pprof
//!   -diff_base` semantics (both sides and the change per function), raw or
//!   normalized by total or per request; [`diff_collapse`] for two-column
//!   folded stacks; [`diff_tree`] merges both call trees for a diff
//!   flamegraph (widths by base + new, colour by the change).
//! - [`label_shares`] and [`LabelFocus`]: label keys and values with their
//!   share (`go tool pprof -tags`), a `KEY=VALUE` focus (`-tagfocus`) or
//!   `KEY!=VALUE` hide (`-tagignore`); [`TreeOptions::group_by`] hangs the
//!   tree from a root per value of a label (`-tagroot`).
//! - [`sandwich()`]: a function's callers (inverted) above its callees.
//! - [`text`]: plain-text renderings of the above, for tests and logs.
//! - [`synthetic`]: deterministic large profiles for benchmarks and load
//!   tests (the 1 M samples / 100 k stacks figure).
//! - `terminal` (feature `terminal`): the ratatui viewer of `edgeprof view`,
//!   and of `edgeprof view --diff-base` (frames coloured by change).
//!
//! ```
//! use edgeprof_pprof::{LineSpec, ProfileBuilder};
//! use edgeprof_viewer::{Granularity, LayoutOptions, Search, SearchMode, View, text};
//!
//! let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
//! let mut at = |name: &str| {
//!     let f = b.function(name, name, "src/lib.rs", 1);
//!     b.location(0, 0, &[LineSpec { function_id: f, line: 1, column: 0 }])
//! };
//! let (main, parse, render) = (at("main"), at("parse"), at("render"));
//! b.add_sample(&[parse, main], &[30], &[]); // leaf first
//! b.add_sample(&[render, main], &[10], &[]);
//! let mut view = View::new(&b.build(), None, Granularity::Function).unwrap();
//!
//! view.set_search(Some(&Search::new("parse", SearchMode::Substring).unwrap()));
//! let layout = view.layout(LayoutOptions { width: 16, min_width: 1, max_depth: None });
//! assert_eq!(
//!     text::flamegraph(view.tree(), &layout, view.search()),
//!     "[all           ]\n[main          ]\n{parse     }[re]\n"
//! );
//! assert_eq!(view.search().unwrap().covered_percent, 75.0);
//! ```
//!
//! Architecture invariant: without the `terminal` feature this crate does no
//! IO (no files, sockets, threads or clocks) and never depends on tokio, sqlx
//! or tonic, so it compiles for `wasm32-unknown-unknown` for the browser
//! dashboard. Only `terminal` may touch a terminal.

mod diff;
mod diff_tree;
mod labels;
mod layout;
mod sandwich;
mod search;
pub mod synthetic;
mod table;
pub mod text;
mod tree;
mod view;

#[cfg(feature = "terminal")]
pub mod terminal;

pub use diff::{
    Diff, DiffError, DiffOptions, DiffRow, DiffValues, Normalize, Side, diff, diff_collapse,
    normalized, requests, sort_rows,
};
pub use diff_tree::{DiffNodes, diff_tree};
pub use labels::{LabelFocus, LabelFocusError, LabelKey, LabelValue, focus_all, label_shares};
pub use layout::{Block, BlockKind, Layout, LayoutOptions};
pub use sandwich::{Sandwich, sandwich};
pub use search::{Search, SearchError, SearchMode, SearchResult};
pub use table::{SortColumn, TableRow, frame_totals, table};
pub use tree::{CallTree, Details, FrameId, FrameInfo, Granularity, Node, NodeId, TreeOptions};
pub use view::{Crumb, View};
