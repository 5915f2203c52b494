//! The terminal viewer, driven by key presses and rendered into ratatui's
//! `TestBackend`; screens are snapshots (`tests/it/snapshots/`).
//!
//! Each snapshot is the screen's text, then a style mask of the same size:
//! `S` selected (reversed), `M` search match, `…` folded block, `.` other.

use edgeprof_pprof::SampleIndex;
use edgeprof_viewer::terminal::{App, FOLDED_COLOR, MATCH_COLOR, Pane, TerminalOptions};
use insta::assert_snapshot;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::{Buffer, Cell};
use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::style::Modifier;

use crate::profiles::{image_resizer_heap, json_gateway_cpu};

fn cpu() -> App {
    App::new(json_gateway_cpu(), TerminalOptions::default()).unwrap()
}

fn heap() -> App {
    App::new(image_resizer_heap(), TerminalOptions::default()).unwrap()
}

fn screen(app: &mut App, width: u16, height: u16) -> String {
    screen_marked(app, width, height, mark)
}

/// `S` selected (reversed), `M` search match, `…` folded block, `.` other.
pub fn mark(cell: &Cell) -> char {
    if cell.modifier.contains(Modifier::REVERSED) {
        'S'
    } else if cell.bg == MATCH_COLOR {
        'M'
    } else if cell.bg == FOLDED_COLOR {
        '…'
    } else {
        '.'
    }
}

/// The screen drawn into a `TestBackend` buffer.
pub fn draw(app: &mut App, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| app.render(frame)).unwrap();
    terminal.backend().buffer().clone()
}

/// The screen's text, `---`, then one character per cell from `mark`
/// (trailing `.`s trimmed).
pub fn screen_marked(
    app: &mut App,
    width: u16,
    height: u16,
    mark: impl Fn(&Cell) -> char,
) -> String {
    let buf = draw(app, width, height);
    let mut text = String::new();
    let mut mask = String::new();
    for y in 0..height {
        let mut line = String::new();
        let mut marks = String::new();
        for x in 0..width {
            let cell = &buf[(x, y)];
            line.push_str(cell.symbol());
            marks.push(mark(cell));
        }
        text.push_str(line.trim_end());
        text.push('\n');
        mask.push_str(marks.trim_end_matches('.'));
        mask.push('\n');
    }
    format!("{text}---\n{mask}")
}

pub fn press(app: &mut App, keys: &[KeyCode]) -> bool {
    keys.iter()
        .all(|&code| app.handle_key(KeyEvent::new(code, KeyModifiers::NONE)))
}

fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        assert!(press(app, &[KeyCode::Char(c)]));
    }
}

fn crumbs(app: &App) -> String {
    let names: Vec<String> = app
        .view()
        .breadcrumbs()
        .into_iter()
        .map(|c| c.name)
        .collect();
    names.join(" › ")
}

#[test]
fn cpu_profile_opens_on_the_whole_flamegraph() {
    let mut app = cpu();
    assert_snapshot!("cpu_initial", screen(&mut app, 80, 24));
}

#[test]
fn arrows_move_the_selection_and_enter_focuses() {
    let mut app = cpu();
    screen(&mut app, 80, 24);
    // all → dispatch → handle → replace_keys (handle's widest callee).
    assert!(press(
        &mut app,
        &[KeyCode::Down, KeyCode::Down, KeyCode::Down]
    ));
    assert_eq!(
        app.view().tree().frame(app.selected()).function,
        "json_gateway::replace_keys"
    );
    // Right moves to the next frame of the row: from_slice.
    assert!(press(&mut app, &[KeyCode::Right]));
    assert_eq!(
        app.view().tree().frame(app.selected()).function,
        "serde_json::de::from_slice"
    );
    assert!(press(&mut app, &[KeyCode::Left, KeyCode::Enter]));
    assert_eq!(
        crumbs(&app),
        "all › edgeprof_guest::dispatch › json_gateway::handle › json_gateway::replace_keys"
    );
    assert_snapshot!("cpu_focused_on_replace_keys", screen(&mut app, 80, 24));

    // Esc and Backspace each go up one caller; Home resets to all frames.
    assert!(press(&mut app, &[KeyCode::Esc]));
    assert_eq!(
        crumbs(&app),
        "all › edgeprof_guest::dispatch › json_gateway::handle"
    );
    assert!(press(&mut app, &[KeyCode::Backspace]));
    assert_eq!(crumbs(&app), "all › edgeprof_guest::dispatch");
    assert!(press(&mut app, &[KeyCode::Char('a')]));
    assert_eq!(crumbs(&app), "all");
}

#[test]
fn search_highlights_frames_and_shows_their_share() {
    let mut app = cpu();
    assert!(press(&mut app, &[KeyCode::Char('/')]));
    type_text(&mut app, "malloc");
    assert_snapshot!("cpu_search_typing", screen(&mut app, 80, 24));
    assert!(press(&mut app, &[KeyCode::Enter]));
    // malloc is under parse (40 ms) and serialize (25 ms) of 764 ms.
    assert_snapshot!("cpu_searched_malloc", screen(&mut app, 80, 24));

    // The table shows only the matching function.
    assert!(press(&mut app, &[KeyCode::Char('t')]));
    assert_eq!(app.view().table().len(), 1);
}

#[test]
fn a_bad_regex_is_reported_on_the_status_line() {
    let mut app = cpu();
    assert!(press(&mut app, &[KeyCode::Char('/'), KeyCode::Tab]));
    type_text(&mut app, "replace(");
    assert!(press(&mut app, &[KeyCode::Enter]));
    let s = screen(&mut app, 80, 24);
    let status = s.lines().nth(21).unwrap();
    assert!(
        status.starts_with(r#"invalid regular expression "replace(": "#),
        "{status}"
    );
}

#[test]
fn table_toggles_and_cycles_its_sort() {
    let mut app = cpu();
    assert!(press(&mut app, &[KeyCode::Char('t')]));
    assert_eq!(app.pane(), Pane::Table);
    assert_snapshot!("cpu_table_by_self", screen(&mut app, 80, 24));
    assert!(press(&mut app, &[KeyCode::Char('s')]));
    assert_snapshot!("cpu_table_by_total", screen(&mut app, 80, 24));
    // Enter on a row shows that function in the flamegraph.
    assert!(press(
        &mut app,
        &[KeyCode::Down, KeyCode::Down, KeyCode::Enter]
    ));
    assert_eq!(app.pane(), Pane::Flamegraph);
    assert_eq!(
        crumbs(&app),
        "all › edgeprof_guest::dispatch › json_gateway::handle › json_gateway::replace_keys"
    );
}

#[test]
fn heap_profile_opens_on_inuse_space_and_i_changes_the_sample_type() {
    let mut app = heap();
    assert_snapshot!("heap_inuse_space", screen(&mut app, 80, 24));
    // inuse_space is the last of four: `i` wraps to alloc_objects.
    assert!(press(&mut app, &[KeyCode::Char('i')]));
    assert_eq!(app.view().tree().sample_type, "alloc_objects");
    assert!(press(&mut app, &[KeyCode::Char('i')]));
    assert_snapshot!("heap_alloc_space", screen(&mut app, 80, 24));

    // Focused on the resize (handle's widest callee): its subtree fills the
    // width, the percentages stay of the whole profile.
    assert!(press(
        &mut app,
        &[KeyCode::Down, KeyCode::Down, KeyCode::Down, KeyCode::Enter]
    ));
    assert_eq!(
        crumbs(&app),
        "all › edgeprof_guest::dispatch › image_resizer::handle › image_resizer::resize"
    );
    assert_snapshot!(
        "heap_alloc_space_focused_on_resize",
        screen(&mut app, 80, 24)
    );
}

#[test]
fn heap_by_file_line_and_searched_by_path() {
    let mut app = App::new(
        image_resizer_heap(),
        TerminalOptions {
            sample_index: Some(SampleIndex::Name("alloc_space".into())),
            ..TerminalOptions::default()
        },
    )
    .unwrap();
    assert!(press(&mut app, &[KeyCode::Char('f'), KeyCode::Char('/')]));
    type_text(&mut app, "src/resize.rs");
    assert!(press(&mut app, &[KeyCode::Enter]));
    assert_snapshot!("heap_file_line_searched_by_path", screen(&mut app, 80, 24));
}

#[test]
fn the_screen_follows_resizes() {
    let mut app = cpu();
    assert!(press(
        &mut app,
        &[KeyCode::Down, KeyCode::Down, KeyCode::Down, KeyCode::Down]
    ));
    screen(&mut app, 120, 40);
    assert_snapshot!("cpu_resized_to_60x12", screen(&mut app, 60, 12));
    // Too small to draw anything useful: says so instead of panicking.
    assert_eq!(screen(&mut app, 12, 3).lines().next(), Some("terminal too"));
}

#[test]
fn q_and_ctrl_c_quit() {
    let mut app = cpu();
    assert!(!press(&mut app, &[KeyCode::Char('q')]));
    let mut app = cpu();
    assert!(!app.handle_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)));
    // While typing a search, q is text.
    let mut app = cpu();
    assert!(press(&mut app, &[KeyCode::Char('/'), KeyCode::Char('q')]));
}

#[test]
fn an_unknown_sample_index_fails_with_the_list() {
    let err = App::new(
        json_gateway_cpu(),
        TerminalOptions {
            sample_index: Some(SampleIndex::Name("inuse_space".into())),
            ..TerminalOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"sample index "inuse_space" not found; the profile has: 0=samples, 1=cpu"#
    );
}

fn click(app: &mut App, column: u16, row: u16) {
    app.handle_mouse(MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column,
        row,
        modifiers: KeyModifiers::NONE,
    });
}

#[test]
fn a_click_selects_a_frame_and_a_second_click_focuses_it() {
    let mut app = cpu();
    screen(&mut app, 80, 24);
    // Screen row 5 is the flamegraph's depth 3; column 45 is inside
    // from_slice (see the cpu_initial snapshot).
    click(&mut app, 45, 5);
    assert_eq!(
        app.view().tree().frame(app.selected()).function,
        "serde_json::de::from_slice"
    );
    assert_eq!(crumbs(&app), "all");
    click(&mut app, 45, 5);
    assert_eq!(
        crumbs(&app),
        "all › edgeprof_guest::dispatch › json_gateway::handle › serde_json::de::from_slice"
    );
    // Clicks outside the graph (title, details bar) change nothing.
    click(&mut app, 45, 0);
    click(&mut app, 45, 22);
    assert_eq!(
        app.view().tree().frame(app.selected()).function,
        "serde_json::de::from_slice"
    );
}
