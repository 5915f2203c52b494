//! Drawing the viewer's screen: title, breadcrumbs, the flamegraph or the
//! table, status, details and help lines.

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use super::compare::{Comparison, change_color};
use super::{App, FOLDED_COLOR, MATCH_COLOR, Pane};
use crate::diff::DiffRow;
use crate::layout::BlockKind;
use crate::search::SearchMode;
use crate::table::{SortColumn, TableRow};
use crate::tree::{CallTree, Granularity};

impl App {
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
            Pane::Sandwich => self.render_sandwich(buf, pane),
            Pane::Labels => self.render_labels(buf, pane),
        }
        self.render_status(buf, Rect::new(area.x, bottom - 3, area.width, 1));
        self.render_details(buf, Rect::new(area.x, bottom - 2, area.width, 1));
        let help = match (self.input.is_some(), self.pane) {
            (true, _) => "type a pattern  ⏎ search  tab substring/regex  esc cancel",
            (false, Pane::Flamegraph) => {
                "q quit  ←↑↓→ move  ⏎ focus  esc up  a all  / search  t table  c sandwich  l labels  g group  s sort  i sample  f lines"
            }
            (false, Pane::Table) => {
                "q quit  ↑↓ move  ⏎ show in graph  s sort  / search  t graph  c sandwich  l labels  i sample"
            }
            (false, Pane::Sandwich) => "q quit  esc/c back",
            (false, Pane::Labels) => {
                "q quit  esc back  ↑↓ move  ⏎ keep value / group by key  h hide value  x clear all"
            }
        };
        let dim = Style::default().add_modifier(Modifier::DIM);
        buf.set_stringn(area.x, bottom - 1, help, area.width as usize, dim);
    }

    fn render_title(&self, buf: &mut Buffer, area: Rect) {
        let tree = self.view.tree();
        let totals = match &self.comparison {
            Some(c) => c.totals(tree),
            None => format!("total {}", tree.format(tree.total())),
        };
        let mut title = format!(
            " edgeprof view · {} ({}) [{}/{}] · by {} · {totals}",
            tree.sample_type,
            tree.unit,
            tree.sample_index + 1,
            tree.sample_types.len(),
            match tree.granularity {
                Granularity::Function => "function",
                Granularity::FileLine => "file:line",
            },
        );
        if let Some(labels) = self.label_summary() {
            title = format!("{title} · {labels}");
        }
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
                        } else if let Some(c) = &self.comparison {
                            change_color(c.nodes.share(id))
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
                paint(buf, x, y, w, label, style);
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
        let sort = self.view.sort();
        let (header, rows) = match &self.comparison {
            Some(c) => (Comparison::header(sort), Rows::Diff(c, c.rows(&self.view))),
            None => (plain_header(sort), Rows::Plain(self.view.table())),
        };
        let len = rows.len();
        let bold = Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
        buf.set_style(Rect::new(area.x, area.y, area.width, 1), bold);
        buf.set_stringn(area.x, area.y, header, area.width as usize, bold);
        let visible = usize::from(area.height.saturating_sub(1));
        self.table_selected = self.table_selected.min(len.saturating_sub(1));
        if self.table_selected < self.table_offset {
            self.table_offset = self.table_selected;
        } else if visible > 0 && self.table_selected >= self.table_offset + visible {
            self.table_offset = self.table_selected + 1 - visible;
        }
        if len == 0 {
            let text = match (self.view.search(), &self.comparison) {
                (Some(s), _) => format!(" no function matches {:?}", s.pattern),
                (None, Some(_)) => " no function changed".into(),
                (None, None) => " no samples with a non-zero value".into(),
            };
            buf.set_stringn(
                area.x,
                area.y + 1,
                text,
                area.width as usize,
                Style::default(),
            );
        }
        for i in (self.table_offset..len).take(visible) {
            let y = area.y + 1 + (i - self.table_offset) as u16;
            let (line, fg) = rows.line(tree, i);
            let mut style = Style::default();
            if let Some(fg) = fg {
                style = style.fg(fg);
            }
            if i == self.table_selected {
                style = style.add_modifier(Modifier::REVERSED);
            }
            buf.set_style(Rect::new(area.x, y, area.width, 1), style);
            buf.set_stringn(area.x, y, line, area.width as usize, style);
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
        } else if let Some(text) = self
            .sandwich_status()
            .filter(|_| self.pane == Pane::Sandwich)
        {
            buf.set_stringn(area.x, area.y, text, width, Style::default());
        } else if let Some(c) = &self.comparison {
            buf.set_stringn(area.x, area.y, c.status(), width, Style::default());
        }
    }

    fn render_details(&self, buf: &mut Buffer, area: Rect) {
        let tree = self.view.tree();
        let text = match (self.pane, &self.comparison) {
            (Pane::Labels, _) => self.labels_details(),
            (Pane::Sandwich, _) => self.sandwich_details(),
            (Pane::Flamegraph, Some(c)) => c.node_details(tree, self.selected),
            (Pane::Table, Some(c)) => c
                .rows(&self.view)
                .get(self.table_selected)
                .map(|row| c.row_details(tree, row))
                .unwrap_or_default(),
            (Pane::Flamegraph, None) => tree.details(self.selected).to_line(tree),
            (Pane::Table, None) => match self.view.table().get(self.table_selected) {
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

/// The rows of the table shown: the plain table's or the diff's.
enum Rows<'a> {
    Plain(Vec<TableRow>),
    Diff(&'a Comparison, Vec<DiffRow>),
}

impl Rows<'_> {
    fn len(&self) -> usize {
        match self {
            Rows::Plain(rows) => rows.len(),
            Rows::Diff(_, rows) => rows.len(),
        }
    }

    /// Row `i`'s text, and its colour: a diff row is red when its total
    /// grew, green when it shrank, as the flamegraph.
    fn line(&self, tree: &CallTree, i: usize) -> (String, Option<Color>) {
        match self {
            Rows::Plain(rows) => (table_line(tree, &rows[i]), None),
            Rows::Diff(c, rows) => {
                let row = &rows[i];
                let fg = match row.delta().cum.signum() {
                    1 => Some(Color::Red),
                    -1 => Some(Color::Green),
                    _ => None,
                };
                (c.line(tree, row), fg)
            }
        }
    }
}

/// A table header's `name`, marked `▼` when `col` is the sort column.
pub(super) fn marked(sort: SortColumn, col: SortColumn, name: &str) -> String {
    if col == sort {
        format!("{name}▼")
    } else {
        name.to_owned()
    }
}

fn plain_header(sort: SortColumn) -> String {
    let mark = |col, name| marked(sort, col, name);
    format!(
        "{:>9} {:>7} {:>9} {:>7}  {}",
        mark(SortColumn::SelfValue, "Self"),
        "Self%",
        mark(SortColumn::Total, "Total"),
        "Total%",
        mark(SortColumn::Name, "Function"),
    )
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

/// Draws one flamegraph block: `label` in `style`, `w` cells wide.
pub(super) fn paint(buf: &mut Buffer, x: u16, y: u16, w: u16, label: &str, style: Style) {
    buf.set_style(Rect::new(x, y, w, 1), style);
    // The last cell stays blank so neighbours read apart in monochrome too.
    let room = if w > 1 { w - 1 } else { 1 };
    buf.set_stringn(x, y, label, room as usize, style);
}

/// A warm colour per function name, stable across runs (FNV-1a), as
/// flamegraphs colour frames.
pub(super) fn frame_color(name: &str) -> Color {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let r = 205 + (h % 50) as u8;
    let g = 90 + ((h >> 8) % 140) as u8;
    let b = ((h >> 16) % 55) as u8;
    Color::Rgb(r, g, b)
}
