//! The terminal viewer of `edgeprof view FILE`: a flamegraph pane (or the
//! function table), a status line, a details bar and a help line.
//!
//! [`App`] is a pure state machine: [`App::handle_key`] changes it and
//! [`App::render`] draws it into any ratatui [`Frame`], so tests drive it
//! with `TestBackend`. [`run_terminal`] is the only code here that touches a
//! real terminal.

use std::io;

use edgeprof_pprof::{Profile, SampleIndex};
use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event, KeyCode, KeyEvent, KeyEventKind,
    KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::crossterm::execute;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use crate::layout::{BlockKind, Layout, LayoutOptions};
use crate::search::{Search, SearchMode};
use crate::table::TableRow;
use crate::tree::{CallTree, Granularity, NodeId};
use crate::view::View;

/// Background of frames the search matches.
pub const MATCH_COLOR: Color = Color::Magenta;
/// Background of folded "…" blocks.
pub const FOLDED_COLOR: Color = Color::DarkGray;

/// How the viewer starts.
#[derive(Debug, Clone, Default)]
pub struct TerminalOptions {
    /// The sample type shown first; `None` = the profile's default.
    pub sample_index: Option<SampleIndex>,
    /// Merge frames by function or by file:line (`g` toggles it).
    pub granularity: Granularity,
}

/// Which pane fills the middle of the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    /// The flamegraph.
    Flamegraph,
    /// The function table.
    Table,
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
}

impl App {
    /// A viewer of `profile`; fails when the sample index does not exist.
    pub fn new(
        profile: Profile,
        options: TerminalOptions,
    ) -> Result<App, edgeprof_pprof::ReportError> {
        let view = View::new(&profile, options.sample_index, options.granularity)?;
        Ok(App {
            profile,
            view,
            granularity: options.granularity,
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
        })
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
        match key.code {
            KeyCode::Char('q') => return false,
            KeyCode::Char('/') => self.input = Some(String::new()),
            KeyCode::Char('t') => {
                self.pane = match self.pane {
                    Pane::Flamegraph => Pane::Table,
                    Pane::Table => Pane::Flamegraph,
                }
            }
            KeyCode::Char('s') => {
                self.view.set_sort(self.view.sort().next());
                self.table_selected = 0;
                self.table_offset = 0;
            }
            KeyCode::Char('i') => self.next_sample_index(),
            KeyCode::Char('g') => self.toggle_granularity(),
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
                Pane::Flamegraph => self.flame_key(key.code),
                Pane::Table => self.table_key(key.code),
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

    fn table_key(&mut self, code: KeyCode) {
        let rows = self.view.table();
        let page = usize::from(self.pane_size.1.saturating_sub(1)).max(1);
        let last = rows.len().saturating_sub(1);
        match code {
            KeyCode::Up => self.table_selected = self.table_selected.saturating_sub(1),
            KeyCode::Down => self.table_selected = (self.table_selected + 1).min(last),
            KeyCode::PageUp => self.table_selected = self.table_selected.saturating_sub(page),
            KeyCode::PageDown => self.table_selected = (self.table_selected + page).min(last),
            KeyCode::Enter => {
                // Show the function in the flamegraph: focus its heaviest node.
                if let Some(row) = rows.get(self.table_selected) {
                    let tree = self.view.tree();
                    let heaviest = (0..tree.nodes.len() as NodeId)
                        .filter(|&n| tree.node(n).frame == row.frame)
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
        match View::new(&self.profile, index, granularity) {
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
            Err(e) => self.message = Some(e.to_string()),
        }
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

    /// Draws the whole screen into `frame`.
    pub fn render(&mut self, frame: &mut Frame<'_>) {
        let area = frame.area();
        let buf = frame.buffer_mut();
        if area.height < 5 || area.width < 10 {
            buf.set_stringn(
                area.x,
                area.y,
                "terminal too small",
                area.width as usize,
                Style::default(),
            );
            return;
        }
        let pane = Rect::new(area.x, area.y + 2, area.width, area.height - 5);
        let resized = self.pane_size != (pane.width, pane.height);
        self.pane_size = (pane.width, pane.height);
        self.pane_origin = (pane.x, pane.y);
        if resized {
            self.keep_selection_visible();
        }
        let bottom = area.y + area.height;
        self.render_title(buf, Rect::new(area.x, area.y, area.width, 1));
        self.render_breadcrumbs(buf, Rect::new(area.x, area.y + 1, area.width, 1));
        match self.pane {
            Pane::Flamegraph => self.render_flamegraph(buf, pane),
            Pane::Table => self.render_table(buf, pane),
        }
        self.render_status(buf, Rect::new(area.x, bottom - 3, area.width, 1));
        self.render_details(buf, Rect::new(area.x, bottom - 2, area.width, 1));
        let help = match (self.input.is_some(), self.pane) {
            (true, _) => "type a pattern  ⏎ search  tab substring/regex  esc cancel",
            (false, Pane::Flamegraph) => {
                "←↑↓→ move  ⏎ focus  esc up  a all  / search  t table  s sort  i sample  g lines  q quit"
            }
            (false, Pane::Table) => {
                "↑↓ move  ⏎ show in graph  s sort  / search  t graph  i sample  q quit"
            }
        };
        let dim = Style::default().add_modifier(Modifier::DIM);
        buf.set_stringn(area.x, bottom - 1, help, area.width as usize, dim);
    }

    fn render_title(&self, buf: &mut Buffer, area: Rect) {
        let tree = self.view.tree();
        let title = format!(
            " edgeprof view · {} ({}) [{}/{}] · by {} · total {}",
            tree.sample_type,
            tree.unit,
            tree.sample_index + 1,
            tree.sample_types.len(),
            match tree.granularity {
                Granularity::Function => "function",
                Granularity::FileLine => "file:line",
            },
            tree.format(tree.total()),
        );
        let style = Style::default().add_modifier(Modifier::BOLD);
        buf.set_style(area, style);
        buf.set_stringn(area.x, area.y, title, area.width as usize, style);
    }

    fn render_breadcrumbs(&self, buf: &mut Buffer, area: Rect) {
        let crumbs: Vec<String> = self
            .view
            .breadcrumbs()
            .into_iter()
            .map(|c| c.name)
            .collect();
        let mut text = format!(" {}", crumbs.join(" › "));
        let width = area.width as usize;
        if text.chars().count() > width {
            // Keep the end of the path: the focused frame matters most.
            let skip = text.chars().count() - width + 2;
            text = format!(" …{}", text.chars().skip(skip + 1).collect::<String>());
        }
        buf.set_stringn(
            area.x,
            area.y,
            text,
            width,
            Style::default().fg(Color::Cyan),
        );
    }

    fn render_flamegraph(&self, buf: &mut Buffer, area: Rect) {
        let layout = self.layout();
        let tree = self.view.tree();
        for row in 0..area.height as usize {
            let depth = self.flame_offset + row;
            let y = area.y + row as u16;
            for block in layout.row(depth) {
                let x = area.x + block.x as u16;
                let w = block.width as u16;
                let (label, mut style) = match block.kind {
                    BlockKind::Frame(id) => {
                        let name = tree.frame(id).function.as_str();
                        let bg = if self.view.matches(id) {
                            MATCH_COLOR
                        } else {
                            frame_color(name)
                        };
                        (name, Style::default().fg(Color::Black).bg(bg))
                    }
                    BlockKind::Folded { .. } => {
                        ("…", Style::default().fg(Color::White).bg(FOLDED_COLOR))
                    }
                };
                if block.node() == Some(self.selected) {
                    style = style.add_modifier(Modifier::REVERSED | Modifier::BOLD);
                }
                buf.set_style(Rect::new(x, y, w, 1), style);
                // The last cell stays blank so neighbours read apart in
                // monochrome too.
                let room = if w > 1 { w - 1 } else { 1 };
                buf.set_stringn(x, y, label, room as usize, style);
            }
        }
        if layout.depth() == 0 {
            buf.set_stringn(
                area.x,
                area.y,
                " no samples with a non-zero value",
                area.width as usize,
                Style::default(),
            );
        }
    }

    fn render_table(&mut self, buf: &mut Buffer, area: Rect) {
        let tree = self.view.tree();
        let rows = self.view.table();
        let sort = self.view.sort();
        let mark = |col: crate::SortColumn, name: &str| {
            if col == sort {
                format!("{name}▼")
            } else {
                name.to_owned()
            }
        };
        let header = format!(
            "{:>9} {:>7} {:>9} {:>7}  {}",
            mark(crate::SortColumn::SelfValue, "Self"),
            "Self%",
            mark(crate::SortColumn::Total, "Total"),
            "Total%",
            mark(crate::SortColumn::Name, "Function"),
        );
        let bold = Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
        buf.set_style(Rect::new(area.x, area.y, area.width, 1), bold);
        buf.set_stringn(area.x, area.y, header, area.width as usize, bold);
        let visible = usize::from(area.height.saturating_sub(1));
        self.table_selected = self.table_selected.min(rows.len().saturating_sub(1));
        if self.table_selected < self.table_offset {
            self.table_offset = self.table_selected;
        } else if visible > 0 && self.table_selected >= self.table_offset + visible {
            self.table_offset = self.table_selected + 1 - visible;
        }
        if rows.is_empty() {
            let text = match self.view.search() {
                Some(s) => format!(" no function matches {:?}", s.pattern),
                None => " no samples with a non-zero value".into(),
            };
            buf.set_stringn(
                area.x,
                area.y + 1,
                text,
                area.width as usize,
                Style::default(),
            );
        }
        for (i, row) in rows
            .iter()
            .enumerate()
            .skip(self.table_offset)
            .take(visible)
        {
            let y = area.y + 1 + (i - self.table_offset) as u16;
            let style = if i == self.table_selected {
                Style::default().add_modifier(Modifier::REVERSED)
            } else {
                Style::default()
            };
            buf.set_style(Rect::new(area.x, y, area.width, 1), style);
            buf.set_stringn(area.x, y, table_line(tree, row), area.width as usize, style);
        }
    }

    fn render_status(&self, buf: &mut Buffer, area: Rect) {
        let width = area.width as usize;
        if let Some(input) = &self.input {
            let mode = match self.search_mode {
                SearchMode::Substring => "search",
                SearchMode::Regex => "regex",
            };
            let text = format!("{mode}: /{input}▏");
            buf.set_stringn(
                area.x,
                area.y,
                text,
                width,
                Style::default().fg(Color::Yellow),
            );
        } else if let Some(message) = &self.message {
            buf.set_stringn(
                area.x,
                area.y,
                message,
                width,
                Style::default().fg(Color::Red),
            );
        } else if let Some(search) = self.view.search() {
            let text = search.summary(self.view.tree());
            buf.set_stringn(
                area.x,
                area.y,
                text,
                width,
                Style::default().fg(MATCH_COLOR),
            );
        }
    }

    fn render_details(&self, buf: &mut Buffer, area: Rect) {
        let tree = self.view.tree();
        let text = match self.pane {
            Pane::Flamegraph => tree.details(self.selected).to_line(tree),
            Pane::Table => match self.view.table().get(self.table_selected) {
                Some(row) => {
                    let mut t = row.function.clone();
                    if !row.location.is_empty() {
                        t = format!("{t}  {}", row.location);
                    }
                    format!(
                        "{t}  self {} ({:.1}%)  total {} ({:.1}%)",
                        tree.format(row.self_value),
                        row.self_percent,
                        tree.format(row.total),
                        row.total_percent
                    )
                }
                None => String::new(),
            },
        };
        let style = Style::default().add_modifier(Modifier::REVERSED);
        buf.set_style(area, style);
        buf.set_stringn(
            area.x,
            area.y,
            format!(" {text}"),
            area.width as usize,
            style,
        );
    }
}

fn table_line(tree: &CallTree, row: &TableRow) -> String {
    let mut line = format!(
        "{:>9} {:>6.2}% {:>9} {:>6.2}%  {}",
        tree.format(row.self_value),
        row.self_percent,
        tree.format(row.total),
        row.total_percent,
        row.function
    );
    if !row.location.is_empty() {
        line.push_str("  ");
        line.push_str(&row.location);
    }
    line
}

/// A warm colour per function name, stable across runs (FNV-1a), as
/// flamegraphs colour frames.
fn frame_color(name: &str) -> Color {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let r = 205 + (h % 50) as u8;
    let g = 90 + ((h >> 8) % 140) as u8;
    let b = ((h >> 16) % 55) as u8;
    Color::Rgb(r, g, b)
}

/// Runs the viewer on the terminal until `q` or Ctrl-C:
/// what `edgeprof view FILE` calls. Restores the terminal on every exit,
/// panics included.
pub fn run_terminal(profile: Profile, options: TerminalOptions) -> io::Result<()> {
    let mut app =
        App::new(profile, options).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
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
