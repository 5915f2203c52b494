//! The sandwich pane (`c`): the selected function in the middle row, its
//! callers above it (nearest caller just above, stack roots at the top),
//! its callees below, each as wide as its share of the function's total.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use super::draw::{frame_color, paint};
use super::{App, Pane};
use crate::layout::{BlockKind, Layout, LayoutOptions};
use crate::sandwich::{Sandwich, sandwich};
use crate::tree::{CallTree, FrameId};

use super::FOLDED_COLOR;

/// The sandwich shown, and the pane to go back to.
#[derive(Debug)]
pub(super) struct SandwichPane {
    pub(super) sandwich: Sandwich,
    pub(super) back: Pane,
}

impl App {
    /// Opens the sandwich of `frame` (the selected frame or table row).
    pub(super) fn open_sandwich(&mut self, frame: Option<FrameId>) {
        if self.comparison.is_some() {
            self.message = Some("the sandwich is not available in a diff view".into());
            return;
        }
        let Some(frame) = frame.filter(|&f| f != 0) else {
            self.message = Some("select a function first: the root has no sandwich".into());
            return;
        };
        match sandwich(self.view.tree(), frame) {
            Some(sandwich) => {
                self.sandwich = Some(SandwichPane {
                    sandwich,
                    back: self.pane,
                });
                self.pane = Pane::Sandwich;
            }
            None => self.message = Some("no samples reach this function".into()),
        }
    }

    /// Leaves the sandwich for the pane it was opened from.
    pub(super) fn close_sandwich(&mut self) {
        if let Some(s) = self.sandwich.take() {
            self.pane = s.back;
        } else {
            self.pane = Pane::Flamegraph;
        }
    }

    pub(super) fn render_sandwich(&self, buf: &mut Buffer, area: Rect) {
        let Some(pane) = &self.sandwich else {
            return;
        };
        let s = &pane.sandwich;
        let options = LayoutOptions {
            width: u32::from(area.width),
            min_width: 1,
            max_depth: None,
        };
        let callers = Layout::new(&s.callers, CallTree::ROOT, options);
        let callees = Layout::new(&s.callees, CallTree::ROOT, options);
        // The function's row in the middle; callers above (depth 1 just
        // above it), callees below.
        let middle = area.height / 2;
        let bold = Style::default()
            .fg(Color::Black)
            .bg(frame_color(&s.function))
            .add_modifier(Modifier::BOLD | Modifier::REVERSED);
        let y = area.y + middle;
        paint(buf, area.x, y, area.width, &s.function, bold);
        for row in 1..=middle {
            draw_row(buf, area, &s.callers, &callers, row as usize, y - row);
        }
        for row in 1..area.height - middle {
            draw_row(buf, area, &s.callees, &callees, row as usize, y + row);
        }
        if callers.depth() <= 1 && middle > 0 {
            buf.set_stringn(
                area.x,
                y - 1,
                " (no callers: the function starts its stacks)",
                area.width as usize,
                Style::default().add_modifier(Modifier::DIM),
            );
        }
    }

    /// The details bar of the sandwich: where the function is.
    pub(super) fn sandwich_details(&self) -> String {
        let Some(pane) = &self.sandwich else {
            return String::new();
        };
        let tree = &pane.sandwich.callees;
        let frame = tree.frame(CallTree::ROOT);
        let callers = pane.sandwich.callers.children(CallTree::ROOT).len();
        let callees = tree.children(CallTree::ROOT).len();
        let mut text = format!(
            "{}  {callers} direct callers  {callees} direct callees",
            frame.function
        );
        if !frame.location().is_empty() {
            text = format!("{text}  {}", frame.location());
        }
        text
    }

    /// The status line of the sandwich.
    pub(super) fn sandwich_status(&self) -> Option<String> {
        let s = &self.sandwich.as_ref()?.sandwich;
        let tree = self.view.tree();
        Some(format!(
            "sandwich of {}: total {} ({:.1}% of the profile), self {} ({:.1}%) · callers above, callees below",
            s.function,
            tree.format(s.total),
            s.percent(s.total),
            tree.format(s.self_value),
            s.percent(s.self_value),
        ))
    }
}

fn draw_row(buf: &mut Buffer, area: Rect, tree: &CallTree, layout: &Layout, depth: usize, y: u16) {
    for block in layout.row(depth) {
        let (label, style) = match block.kind {
            BlockKind::Frame(id) => {
                let name = tree.frame(id).function.as_str();
                (
                    name,
                    Style::default().fg(Color::Black).bg(frame_color(name)),
                )
            }
            BlockKind::Folded { .. } => ("…", Style::default().fg(Color::White).bg(FOLDED_COLOR)),
        };
        paint(
            buf,
            area.x + block.x as u16,
            y,
            block.width as u16,
            label,
            style,
        );
    }
}
