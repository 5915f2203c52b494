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
//! - [`text`]: plain-text renderings of the above, for tests and logs.
//! - `terminal` (feature `terminal`): the ratatui viewer of `edgeprof view`.
//!
//! Architecture invariant: without the `terminal` feature this crate does no
//! IO (no files, sockets, threads or clocks) and never depends on tokio, sqlx
//! or tonic, so it compiles for `wasm32-unknown-unknown` for the browser
//! dashboard. Only `terminal` may touch a terminal.

mod layout;
mod search;
mod table;
pub mod text;
mod tree;
mod view;

#[cfg(feature = "terminal")]
pub mod terminal;

pub use layout::{Block, BlockKind, Layout, LayoutOptions};
pub use search::{Search, SearchError, SearchMode, SearchResult};
pub use table::{SortColumn, TableRow, frame_totals, table};
pub use tree::{CallTree, Details, FrameId, FrameInfo, Granularity, Node, NodeId, TreeOptions};
pub use view::{Crumb, View};
