//! The label picker (`l`, `g`): every label key of the profile with its
//! values and their share, as `edgeprof tags` lists them. On a value, ⏎
//! keeps only that value (pprof's `-tagfocus`) and `h` hides it
//! (`-tagignore`); on a key, ⏎ or `g` groups the flamegraph by it (a root
//! per value, `-tagroot`); `x` clears every filter and the grouping.

use ratatui::buffer::Buffer;
use ratatui::crossterm::event::KeyCode;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use super::{App, Pane};
use crate::labels::{LabelFocus, LabelKey, label_shares};

/// The picker's state: the keys of the whole profile (not of the filtered
/// one, so a hidden value can be shown again), and the selected row.
#[derive(Debug, Default)]
pub(super) struct LabelPicker {
    keys: Vec<LabelKey>,
    /// Sum of |value| of the whole profile in the picker's sample type,
    /// counted once when it opens.
    total: i64,
    selected: usize,
    offset: usize,
}

/// One row of the picker.
#[derive(Clone, Copy)]
enum Row<'a> {
    Key(&'a LabelKey),
    Value(&'a LabelKey, usize),
}

impl LabelPicker {
    fn rows(&self) -> Vec<Row<'_>> {
        let mut rows = Vec::new();
        for key in &self.keys {
            rows.push(Row::Key(key));
            rows.extend((0..key.values.len()).map(|i| Row::Value(key, i)));
        }
        rows
    }
}

impl App {
    /// Opens the picker on the labels of the profile's current sample type.
    pub(super) fn open_labels(&mut self) {
        if self.comparison.is_some() {
            self.message = Some("label filters are not available in a diff view".into());
            return;
        }
        let index = edgeprof_pprof::SampleIndex::Position(self.view.tree().sample_index);
        match label_shares(&self.profile, Some(&index)) {
            Ok(keys) if keys.is_empty() => {
                self.message = Some("the profile's samples carry no labels".into());
            }
            Ok(keys) => {
                let selected = self.labels.selected.min(keys.len().saturating_sub(1));
                self.labels = LabelPicker {
                    keys,
                    total: self.profile_total(),
                    selected,
                    offset: 0,
                };
                self.pane = Pane::Labels;
            }
            Err(e) => self.message = Some(e.to_string()),
        }
    }

    /// A key in the picker.
    pub(super) fn labels_key(&mut self, code: KeyCode) {
        let rows = self.labels.rows();
        let last = rows.len().saturating_sub(1);
        let picked = rows.get(self.labels.selected).copied().map(|r| match r {
            Row::Key(k) => (k.key.clone(), None),
            Row::Value(k, i) => (k.key.clone(), Some(k.values[i].value.clone())),
        });
        drop(rows);
        match code {
            KeyCode::Up => self.labels.selected = self.labels.selected.saturating_sub(1),
            KeyCode::Down => self.labels.selected = (self.labels.selected + 1).min(last),
            KeyCode::Char('l') => self.pane = Pane::Flamegraph,
            KeyCode::Char('x') => {
                self.focuses.clear();
                self.group_by = None;
                self.rebuild_current();
            }
            KeyCode::Enter | KeyCode::Char('g') | KeyCode::Char('h') => {
                let Some((key, value)) = picked else {
                    return;
                };
                match (code, value) {
                    (KeyCode::Enter, Some(value)) => self.toggle_focus(key, value, false),
                    (KeyCode::Char('h'), Some(value)) => self.toggle_focus(key, value, true),
                    (KeyCode::Char('h'), None) => {
                        self.message = Some("h hides a value: pick one below its key".into());
                    }
                    (_, _) => {
                        self.group_by = match self.group_by.take() {
                            Some(current) if current == key => None,
                            _ => Some(key),
                        };
                        self.rebuild_current();
                        if self.message.is_none() {
                            self.pane = Pane::Flamegraph;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Keeps only (or with `hide`, drops) `key=value`; the same again undoes
    /// it. A focus replaces whatever else filtered `key`; hides of one key
    /// add up.
    fn toggle_focus(&mut self, key: String, value: String, hide: bool) {
        let existing = self.focuses.iter().position(|f| f.key == key);
        match existing.map(|i| &mut self.focuses[i]) {
            Some(f) if f.hide && hide => {
                if let Some(at) = f.values.iter().position(|v| *v == value) {
                    f.values.remove(at);
                } else {
                    f.values.push(value);
                }
                if f.values.is_empty() {
                    self.focuses.retain(|f| f.key != key);
                }
            }
            Some(f) if !f.hide && !hide && f.values == [value.clone()] => {
                self.focuses.retain(|f| f.key != key);
            }
            _ => {
                self.focuses.retain(|f| f.key != key);
                self.focuses.push(LabelFocus {
                    key,
                    values: vec![value],
                    hide,
                });
            }
        }
        self.rebuild_current();
    }

    /// What filters and groups the flamegraph, for the title: `focus
    /// data_center=sjc · group by machine`, or `None`.
    pub(super) fn label_summary(&self) -> Option<String> {
        let mut parts: Vec<String> = self.focuses.iter().map(|f| f.to_string()).collect();
        if let Some(key) = &self.group_by {
            parts.push(format!("group by {key}"));
        }
        (!parts.is_empty()).then(|| parts.join(" · "))
    }

    pub(super) fn render_labels(&mut self, buf: &mut Buffer, area: Rect) {
        let rows = self.labels.rows();
        let bold = Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
        buf.set_style(Rect::new(area.x, area.y, area.width, 1), bold);
        buf.set_stringn(
            area.x,
            area.y,
            format!("{:<32} {:>8} {:>9}  State", "Label", "Share", "Profile%"),
            area.width as usize,
            bold,
        );
        let visible = usize::from(area.height.saturating_sub(1));
        let selected = self.labels.selected.min(rows.len().saturating_sub(1));
        let mut offset = self.labels.offset.min(selected);
        if visible > 0 && selected >= offset + visible {
            offset = selected + 1 - visible;
        }
        let total = self.labels.total;
        for (i, row) in rows.iter().enumerate().skip(offset).take(visible) {
            let y = area.y + 1 + (i - offset) as u16;
            let (text, mut style) = match *row {
                Row::Key(k) => {
                    let grouped = self.group_by.as_deref() == Some(k.key.as_str());
                    let share = if total == 0 {
                        0.0
                    } else {
                        k.total as f64 * 100.0 / total as f64
                    };
                    let text = format!(
                        "{:<32} {:>8} {:>8.2}%  {}",
                        format!("{} ({} values)", k.key, k.values.len()),
                        "",
                        share,
                        if grouped { "grouped" } else { "" }
                    );
                    (text, Style::default().fg(Color::Cyan))
                }
                Row::Value(k, vi) => {
                    let v = &k.values[vi];
                    let state = self.focuses.iter().find(|f| f.key == k.key).map(|f| {
                        match (f.hide, f.values.contains(&v.value)) {
                            (false, true) => "kept",
                            (false, false) => "filtered out",
                            (true, true) => "hidden",
                            (true, false) => "",
                        }
                    });
                    let text = format!(
                        "  {:<30} {:>7.2}% {:>8.2}%  {}",
                        v.value,
                        v.key_percent,
                        v.profile_percent,
                        state.unwrap_or("")
                    );
                    let style = match state {
                        Some("hidden" | "filtered out") => {
                            Style::default().add_modifier(Modifier::DIM)
                        }
                        Some("kept") => Style::default().fg(Color::Green),
                        _ => Style::default(),
                    };
                    (text, style)
                }
            };
            if i == selected {
                style = style.add_modifier(Modifier::REVERSED);
            }
            buf.set_style(Rect::new(area.x, y, area.width, 1), style);
            buf.set_stringn(area.x, y, text, area.width as usize, style);
        }
        drop(rows);
        self.labels.selected = selected;
        self.labels.offset = offset;
    }

    /// The details bar of the picker: what the selected row would do.
    pub(super) fn labels_details(&self) -> String {
        match self.labels.rows().get(self.labels.selected) {
            Some(Row::Key(k)) => format!(
                "{}: {} values  ⏎/g group the flamegraph by {}",
                k.key,
                k.values.len(),
                k.key
            ),
            Some(Row::Value(k, i)) => {
                let v = &k.values[*i];
                format!(
                    "{}={}: {:.2}% of the key, {:.2}% of the profile  ⏎ keep only it  h hide it",
                    k.key, v.value, v.key_percent, v.profile_percent
                )
            }
            None => String::new(),
        }
    }

    /// Sum of |value| of the whole (unfiltered) profile in the current
    /// sample type.
    fn profile_total(&self) -> i64 {
        let vi = self.view.tree().sample_index;
        self.profile.sample.iter().fold(0i64, |a, s| {
            a.saturating_add(s.value.get(vi).copied().unwrap_or(0).saturating_abs())
        })
    }
}
