//! The terminal viewer of `edgeprof view FILE`: a flamegraph pane (or the
//! function table), a status line, a details bar and a help line.
//!
//! `c` opens the sandwich of the selected function (callers above, callees
//! below, see `sandwich`); `l` the label picker, where a value can be kept
//! or hidden, and `g` groups the flamegraph by a label key (see `labels`).
//!
//! With a base profile ([`App::diff`], `edgeprof view FILE --diff-base
//! BASE`) the viewer shows the comparison: frames coloured by their change,
//! the table with base, new and delta columns (see `compare`).
//!
//! [`App`] is a pure state machine: [`App::handle_key`] changes it and
//! [`App::render`] draws it into any ratatui [`Frame`](ratatui::Frame), so tests drive it
//! with `TestBackend`. [`run_app`] is the only code here that touches a
//! real terminal ([`run_terminal`] builds an [`App`] for it).

use std::io;

mod compare;
mod draw;
mod labels;
mod sandwich;

pub use compare::{DiffBase, UNCHANGED_COLOR, change_color};

use edgeprof_pprof::{Profile, SampleIndex};
use ratatui::crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event, KeyCode, KeyEvent, KeyEventKind,
    KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::crossterm::execute;
use ratatui::style::Color;

use crate::diff::DiffError;
use crate::labels::{LabelFocus, focus_all};
use crate::layout::{Layout, LayoutOptions};
use crate::search::{Search, SearchMode};
use crate::tree::{CallTree, FrameId, Granularity, NodeId, TreeOptions};
use crate::view::View;
use compare::Comparison;
use labels::LabelPicker;
use sandwich::SandwichPane;

/// Background of frames the search matches.
pub const MATCH_COLOR: Color = Color::Magenta;
/// Background of folded "…" blocks.
pub const FOLDED_COLOR: Color = Color::DarkGray;

/// How the viewer starts.
#[derive(Debug, Clone, Default)]
pub struct TerminalOptions {
    /// The sample type shown first; `None` = the profile's default.
    pub sample_index: Option<SampleIndex>,
    /// Merge frames by function or by file:line (`f` toggles it).
    pub granularity: Granularity,
}

/// Which pane fills the middle of the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    /// The flamegraph.
    Flamegraph,
    /// The function table.
    Table,
    /// The selected function's callers above its callees (`c`).
    Sandwich,
    /// The label keys and values, to keep, hide or group by (`l`, `g`).
    Labels,
}

/// The viewer's state.
#[derive(Debug)]
pub struct App {
    profile: Profile,
    view: View,
    granularity: Granularity,
    pane: Pane,
    selected: NodeId,
    /// The search being typed, when `/` was pressed.
    input: Option<String>,
    search_mode: SearchMode,
    table_selected: usize,
    table_offset: usize,
    flame_offset: usize,
    /// Last error or notice, shown on the status line until the next key.
    message: Option<String>,
    /// Size of the middle pane at the last render (80×19 before the first).
    pane_size: (u16, u16),
    /// Screen position of the middle pane's top-left cell at the last render.
    pane_origin: (u16, u16),
    /// The base and the change per node, in diff mode.
    comparison: Option<Comparison>,
    /// The sandwich shown in [`Pane::Sandwich`].
    sandwich: Option<SandwichPane>,
    /// The label picker's state.
    labels: LabelPicker,
    /// Label filters applied to the profile (`KEY=V` keeps, `KEY!=V` hides).
    focuses: Vec<LabelFocus>,
    /// The label key the flamegraph is grouped by.
    group_by: Option<String>,
}

impl App {
    /// A viewer of `profile`; fails when the sample index does not exist.
    pub fn new(
        profile: Profile,
        options: TerminalOptions,
    ) -> Result<App, edgeprof_pprof::ReportError> {
        let view = View::new(&profile, options.sample_index, options.granularity)?;
        Ok(App::with_view(profile, view, options.granularity, None))
    }

    /// A viewer of `profile` compared with `base` (`base` subtracted);
    /// fails when the profiles are of different kinds, the sample index does
    /// not exist or a per-request normalization lacks a request count.
    pub fn diff(
        profile: Profile,
        base: DiffBase,
        options: TerminalOptions,
    ) -> Result<App, DiffError> {
        let (view, nodes, diff) =
            Comparison::compute(&base, &profile, options.sample_index, options.granularity)?;
        let comparison = Comparison { base, nodes, diff };
        Ok(App::with_view(
            profile,
            view,
            options.granularity,
            Some(comparison),
        ))
    }

    fn with_view(
        profile: Profile,
        view: View,
        granularity: Granularity,
        comparison: Option<Comparison>,
    ) -> App {
        App {
            profile,
            view,
            granularity,
            pane: Pane::Flamegraph,
            selected: CallTree::ROOT,
            input: None,
            search_mode: SearchMode::Substring,
            table_selected: 0,
            table_offset: 0,
            flame_offset: 0,
            message: None,
            pane_size: (80, 19),
            pane_origin: (0, 2),
            comparison,
            sandwich: None,
            labels: LabelPicker::default(),
            focuses: Vec::new(),
            group_by: None,
        }
    }

    /// Whether the viewer shows a diff.
    pub fn is_diff(&self) -> bool {
        self.comparison.is_some()
    }

    /// The model shown.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The selected node.
    pub fn selected(&self) -> NodeId {
        self.selected
    }

    /// The pane shown.
    pub fn pane(&self) -> Pane {
        self.pane
    }

    /// The label filters applied, as `KEY=V` / `KEY!=V`.
    pub fn label_filters(&self) -> Vec<String> {
        self.focuses.iter().map(ToString::to_string).collect()
    }

    /// The label key the flamegraph is grouped by.
    pub fn group_by(&self) -> Option<&str> {
        self.group_by.as_deref()
    }

    fn layout(&self) -> Layout {
        self.view.layout(LayoutOptions {
            width: u32::from(self.pane_size.0),
            min_width: 1,
            max_depth: None,
        })
    }

    /// Applies one key press; returns false when the viewer should quit.
    pub fn handle_key(&mut self, key: KeyEvent) -> bool {
        if key.kind == KeyEventKind::Release {
            return true;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return false;
        }
        if self.input.is_some() {
            self.search_key(key);
            return true;
        }
        self.message = None;
        match (self.pane, key.code) {
            (_, KeyCode::Char('q')) => return false,
            (Pane::Sandwich, KeyCode::Esc | KeyCode::Backspace | KeyCode::Char('c')) => {
                self.close_sandwich();
            }
            (Pane::Sandwich, _) => {}
            (Pane::Labels, KeyCode::Esc | KeyCode::Backspace) => self.pane = Pane::Flamegraph,
            (Pane::Labels, code) => self.labels_key(code),
            _ => return self.graph_or_table_key(key),
        }
        true
    }

    /// A key in the flamegraph or the table.
    fn graph_or_table_key(&mut self, key: KeyEvent) -> bool {
        match key.code {
            KeyCode::Char('q') => return false,
            KeyCode::Char('/') => self.input = Some(String::new()),
            KeyCode::Char('t') => {
                self.pane = match self.pane {
                    Pane::Table => Pane::Flamegraph,
                    _ => Pane::Table,
                }
            }
            KeyCode::Char('s') => {
                self.view.set_sort(self.view.sort().next());
                self.table_selected = 0;
                self.table_offset = 0;
            }
            KeyCode::Char('i') => self.next_sample_index(),
            KeyCode::Char('f') => self.toggle_granularity(),
            KeyCode::Char('c') => {
                let frame = match self.pane {
                    Pane::Table => match self.table_selection().1 {
                        Some(TableTarget::Frame(f)) => Some(f),
                        _ => None,
                    },
                    _ => Some(self.view.tree().node(self.selected).frame),
                };
                self.open_sandwich(frame);
            }
            KeyCode::Char('l') => self.open_labels(),
            KeyCode::Char('g') if self.group_by.is_some() && self.comparison.is_none() => {
                self.group_by = None;
                self.rebuild_current();
            }
            KeyCode::Char('g') => self.open_labels(),
            KeyCode::Char('a') | KeyCode::Home => {
                self.view.reset();
                self.selected = CallTree::ROOT;
                self.flame_offset = 0;
            }
            KeyCode::Esc | KeyCode::Backspace => {
                if self.pane == Pane::Table {
                    self.pane = Pane::Flamegraph;
                } else if !self.view.focus_up() && self.view.search().is_some() {
                    self.view.set_search(None);
                }
                self.keep_selection_visible();
            }
            _ => match self.pane {
                Pane::Table => self.table_key(key.code),
                _ => self.flame_key(key.code),
            },
        }
        true
    }

    /// Applies one mouse event: a click selects the frame under it, a click
    /// on the selected frame focuses it, the wheel moves up and down callers.
    pub fn handle_mouse(&mut self, mouse: MouseEvent) {
        if self.input.is_some() || self.pane != Pane::Flamegraph {
            return;
        }
        match mouse.kind {
            MouseEventKind::Down(MouseButton::Left) => {
                let (x0, y0) = self.pane_origin;
                if mouse.column < x0 || mouse.row < y0 || mouse.row >= y0 + self.pane_size.1 {
                    return;
                }
                let depth = self.flame_offset + usize::from(mouse.row - y0);
                let layout = self.layout();
                let Some(node) = layout
                    .hit(u32::from(mouse.column - x0), depth)
                    .and_then(|b| b.node())
                else {
                    return;
                };
                self.message = None;
                if node == self.selected {
                    self.view.focus_on(node);
                    self.flame_offset = 0;
                } else {
                    self.selected = node;
                }
                self.keep_selection_visible();
            }
            MouseEventKind::ScrollUp => self.flame_key(KeyCode::Up),
            MouseEventKind::ScrollDown => self.flame_key(KeyCode::Down),
            _ => {}
        }
    }

    fn search_key(&mut self, key: KeyEvent) {
        let Some(input) = self.input.as_mut() else {
            return;
        };
        match key.code {
            KeyCode::Esc => self.input = None,
            KeyCode::Tab => {
                self.search_mode = match self.search_mode {
                    SearchMode::Substring => SearchMode::Regex,
                    SearchMode::Regex => SearchMode::Substring,
                }
            }
            KeyCode::Backspace => {
                input.pop();
            }
            KeyCode::Enter => {
                let pattern = std::mem::take(input);
                self.input = None;
                self.table_selected = 0;
                self.table_offset = 0;
                if pattern.is_empty() {
                    self.view.set_search(None);
                    return;
                }
                match Search::new(&pattern, self.search_mode) {
                    Ok(search) => self.view.set_search(Some(&search)),
                    Err(e) => self.message = Some(e.to_string()),
                }
            }
            KeyCode::Char(c) => input.push(c),
            _ => {}
        }
    }

    fn flame_key(&mut self, code: KeyCode) {
        let layout = self.layout();
        let Some(current) = layout.find(self.selected).copied() else {
            self.selected = layout.focus;
            return;
        };
        let tree = self.view.tree();
        match code {
            KeyCode::Up if self.selected != layout.focus => {
                self.selected = tree.node(self.selected).parent;
            }
            KeyCode::Down => {
                if let Some(child) = tree
                    .children(self.selected)
                    .iter()
                    .find(|&&c| layout.find(c).is_some())
                {
                    self.selected = *child;
                }
            }
            KeyCode::Left | KeyCode::Right => {
                let row = layout.row(current.depth as usize);
                let frames = row.iter().filter_map(|b| b.node());
                let next = if code == KeyCode::Left {
                    frames.take_while(|&n| n != self.selected).last()
                } else {
                    frames.skip_while(|&n| n != self.selected).nth(1)
                };
                if let Some(n) = next {
                    self.selected = n;
                }
            }
            KeyCode::Enter => {
                self.view.focus_on(self.selected);
                self.flame_offset = 0;
            }
            _ => {}
        }
        self.keep_selection_visible();
    }

    /// The number of table rows, and what the selected row is about.
    fn table_selection(&self) -> (usize, Option<TableTarget>) {
        let i = self.table_selected;
        match &self.comparison {
            Some(c) => {
                let rows = c.rows(&self.view);
                let target = rows
                    .get(i)
                    .map(|r| TableTarget::Function(r.function.clone()));
                (rows.len(), target)
            }
            None => {
                let rows = self.view.table();
                (rows.len(), rows.get(i).map(|r| TableTarget::Frame(r.frame)))
            }
        }
    }

    fn table_key(&mut self, code: KeyCode) {
        let (len, target) = self.table_selection();
        let page = usize::from(self.pane_size.1.saturating_sub(1)).max(1);
        let last = len.saturating_sub(1);
        match code {
            KeyCode::Up => self.table_selected = self.table_selected.saturating_sub(1),
            KeyCode::Down => self.table_selected = (self.table_selected + 1).min(last),
            KeyCode::PageUp => self.table_selected = self.table_selected.saturating_sub(page),
            KeyCode::PageDown => self.table_selected = (self.table_selected + page).min(last),
            KeyCode::Enter => {
                // Show the function in the flamegraph: focus its heaviest node.
                if let Some(target) = target {
                    let tree = self.view.tree();
                    let heaviest = (0..tree.nodes.len() as NodeId)
                        .filter(|&n| match &target {
                            TableTarget::Frame(f) => tree.node(n).frame == *f,
                            TableTarget::Function(name) => tree.frame(n).function == *name,
                        })
                        .max_by_key(|&n| (tree.node(n).total, std::cmp::Reverse(n)));
                    if let Some(n) = heaviest {
                        self.view.focus_on(n);
                        self.selected = n;
                        self.flame_offset = 0;
                        self.pane = Pane::Flamegraph;
                    }
                }
            }
            _ => {}
        }
    }

    fn next_sample_index(&mut self) {
        let tree = self.view.tree();
        let next = (tree.sample_index + 1) % tree.sample_types.len();
        self.rebuild(Some(SampleIndex::Position(next)), self.granularity);
    }

    fn toggle_granularity(&mut self) {
        let granularity = match self.granularity {
            Granularity::Function => Granularity::FileLine,
            Granularity::FileLine => Granularity::Function,
        };
        let index = Some(SampleIndex::Position(self.view.tree().sample_index));
        self.rebuild(index, granularity);
    }

    /// A new tree for another sample type or granularity; the search and the
    /// sort carry over, focus and selection go back to the root.
    fn rebuild(&mut self, index: Option<SampleIndex>, granularity: Granularity) {
        let built = match &mut self.comparison {
            Some(c) => Comparison::compute(&c.base, &self.profile, index, granularity)
                .map(|(view, nodes, diff)| {
                    c.nodes = nodes;
                    c.diff = diff;
                    view
                })
                .map_err(|e| e.to_string()),
            None => {
                let options = TreeOptions {
                    sample_index: index,
                    granularity,
                    group_by: self.group_by.clone(),
                };
                View::with_options(&focus_all(&self.profile, &self.focuses), &options)
                    .map_err(|e| e.to_string())
            }
        };
        match built {
            Ok(mut view) => {
                let pattern = self.view.search().map(|s| s.pattern.clone());
                if let Some(search) = pattern.and_then(|p| Search::new(&p, self.search_mode).ok()) {
                    view.set_search(Some(&search));
                }
                view.set_sort(self.view.sort());
                self.view = view;
                self.granularity = granularity;
                self.selected = CallTree::ROOT;
                self.flame_offset = 0;
                self.table_selected = 0;
                self.table_offset = 0;
            }
            Err(e) => self.message = Some(e),
        }
    }

    /// [`App::rebuild`] at the current sample type and granularity: after
    /// a label filter or grouping changed.
    fn rebuild_current(&mut self) {
        let index = Some(SampleIndex::Position(self.view.tree().sample_index));
        self.rebuild(index, self.granularity);
    }

    fn keep_selection_visible(&mut self) {
        let layout = self.layout();
        let Some(block) = layout.find(self.selected) else {
            self.selected = layout.focus;
            self.flame_offset = 0;
            return;
        };
        let depth = block.depth as usize;
        let height = usize::from(self.pane_size.1).max(1);
        if depth < self.flame_offset {
            self.flame_offset = depth;
        } else if depth >= self.flame_offset + height {
            self.flame_offset = depth + 1 - height;
        }
    }
}

/// Runs the viewer of `profile` on the terminal until `q` or Ctrl-C (as
/// [`run_app`] with an [`App::new`]). Restores the terminal on every exit,
/// panics included.
pub fn run_terminal(profile: Profile, options: TerminalOptions) -> io::Result<()> {
    let app =
        App::new(profile, options).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    run_app(app)
}

/// Runs `app` on the terminal until `q` or Ctrl-C: what `edgeprof view`
/// calls, with an [`App::new`] or (`--diff-base`) an [`App::diff`].
/// Restores the terminal on every exit, panics included.
pub fn run_app(mut app: App) -> io::Result<()> {
    let mut terminal = ratatui::try_init()?;
    let result = execute!(io::stdout(), EnableMouseCapture).and_then(|()| {
        loop {
            terminal.draw(|frame| app.render(frame))?;
            match event::read()? {
                Event::Key(key) if !app.handle_key(key) => return Ok(()),
                Event::Mouse(mouse) => app.handle_mouse(mouse),
                // Other keys changed the state and resizes the size: both show
                // at the next draw.
                _ => {}
            }
        }
    });
    let released = execute!(io::stdout(), DisableMouseCapture);
    let restored = ratatui::try_restore();
    result.and(released).and(restored)
}

/// What a table row shows in the flamegraph on Enter.
enum TableTarget {
    /// The nodes of one frame (the plain table, by function or file:line).
    Frame(FrameId),
    /// The nodes of one function (the diff table's rows are by function).
    Function(String),
}
