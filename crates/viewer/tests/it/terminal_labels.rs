//! The terminal's sandwich (`c`) and label picker (`l`, `g`), driven by key
//! presses into ratatui's `TestBackend`; screens are snapshots.

use edgeprof_viewer::label_shares;
use edgeprof_viewer::terminal::{App, Pane, TerminalOptions};
use insta::assert_snapshot;
use ratatui::crossterm::event::KeyCode;

use crate::profiles::{json_gateway_cpu, json_gateway_cpu_labelled};
use crate::terminal::{draw, press, screen_marked};

fn screen(app: &mut App) -> String {
    screen_marked(app, 100, 24, crate::terminal::mark)
}

fn line(app: &mut App, y: u16) -> String {
    let buf = draw(app, 100, 24);
    (0..100).map(|x| buf[(x, y)].symbol()).collect::<String>()
}

fn selected(app: &App) -> String {
    app.view().tree().frame(app.selected()).function.clone()
}

#[test]
fn sandwich_of_malloc_shows_both_callers_above_it() {
    let mut app = App::new(json_gateway_cpu(), TerminalOptions::default()).unwrap();
    draw(&mut app, 100, 24);
    // all → dispatch → handle → replace_keys, → from_slice, → parse_object
    // → malloc.
    let keys = [
        KeyCode::Down,
        KeyCode::Down,
        KeyCode::Down,
        KeyCode::Right,
        KeyCode::Down,
        KeyCode::Down,
    ];
    assert!(press(&mut app, &keys));
    assert_eq!(selected(&app), "dlmalloc::malloc");
    assert!(press(&mut app, &[KeyCode::Char('c')]));
    assert_eq!(app.pane(), Pane::Sandwich);
    // malloc is called under parse_object (40 ms) and to_vec (25 ms): the
    // sandwich has both callers above it, which the flamegraph shows apart.
    assert!(
        line(&mut app, 21).starts_with(
            "sandwich of dlmalloc::malloc: total 65ms (8.5% of the profile), self 65ms (8.5%)"
        ),
        "{}",
        line(&mut app, 21)
    );
    assert_snapshot!("sandwich_of_malloc", screen(&mut app));

    // Esc goes back to the flamegraph, the selection kept.
    assert!(press(&mut app, &[KeyCode::Esc]));
    assert_eq!(app.pane(), Pane::Flamegraph);
    assert_eq!(selected(&app), "dlmalloc::malloc");
}

#[test]
fn sandwich_from_the_table_and_refused_on_the_root() {
    let mut app = App::new(json_gateway_cpu(), TerminalOptions::default()).unwrap();
    draw(&mut app, 100, 24);
    assert!(press(&mut app, &[KeyCode::Char('c')]));
    assert_eq!(app.pane(), Pane::Flamegraph);
    assert!(line(&mut app, 21).starts_with("select a function first: the root has no sandwich"));
    // The table's first row by self is push_str (300 ms), called by the
    // recursive replacer.
    assert!(press(&mut app, &[KeyCode::Char('t'), KeyCode::Char('c')]));
    assert_eq!(app.pane(), Pane::Sandwich);
    assert!(
        line(&mut app, 21).starts_with(
            "sandwich of alloc::string::String::push_str: total 300ms (39.3% of the profile)"
        ),
        "{}",
        line(&mut app, 21)
    );
    // Back to the table it came from.
    assert!(press(&mut app, &[KeyCode::Char('c')]));
    assert_eq!(app.pane(), Pane::Table);
}

#[test]
fn group_by_data_center_gives_a_root_per_data_center() {
    let mut app = App::new(json_gateway_cpu_labelled(), TerminalOptions::default()).unwrap();
    assert!(press(&mut app, &[KeyCode::Char('g')]));
    assert_eq!(app.pane(), Pane::Labels);
    assert_snapshot!("label_picker", screen(&mut app));
    // The first row is the key data_center: ⏎ groups by it.
    assert!(press(&mut app, &[KeyCode::Enter]));
    assert_eq!(app.pane(), Pane::Flamegraph);
    assert_eq!(app.group_by(), Some("data_center"));
    let tree = app.view().tree();
    let roots: Vec<&str> = tree
        .children(0)
        .iter()
        .map(|&c| tree.frame(c).function.as_str())
        .collect();
    assert_eq!(
        roots,
        ["data_center=sjc", "data_center=lhr", "data_center=nrt"]
    );
    assert_snapshot!("cpu_grouped_by_data_center", screen(&mut app));
    // g again ungroups.
    assert!(press(&mut app, &[KeyCode::Char('g')]));
    assert_eq!(app.group_by(), None);
    assert_eq!(app.view().tree().children(0).len(), 1);
}

#[test]
fn picker_keeps_and_hides_label_values() {
    let profile = json_gateway_cpu_labelled();
    let shares = label_shares(&profile, None).unwrap();
    let dc = &shares[0];
    assert_eq!(dc.key, "data_center");
    let total_of = |v: &str| dc.values.iter().find(|x| x.value == v).unwrap().total;
    let mut app = App::new(profile.clone(), TerminalOptions::default()).unwrap();
    // l, ↓ to the largest data center, ⏎ keeps only it.
    assert!(press(
        &mut app,
        &[KeyCode::Char('l'), KeyCode::Down, KeyCode::Enter]
    ));
    let first = dc.values[0].value.clone();
    assert_eq!(app.label_filters(), [format!("data_center={first}")]);
    assert_eq!(app.view().tree().total(), total_of(&first));
    // ⏎ again undoes it; h on the next two values hides both.
    assert!(press(
        &mut app,
        &[
            KeyCode::Enter,
            KeyCode::Down,
            KeyCode::Char('h'),
            KeyCode::Down,
            KeyCode::Char('h')
        ]
    ));
    let (second, third) = (dc.values[1].value.clone(), dc.values[2].value.clone());
    assert_eq!(
        app.label_filters(),
        [format!("data_center!={second},{third}")]
    );
    assert_eq!(app.view().tree().total(), total_of(&first));
    assert!(line(&mut app, 0).contains(&format!("data_center!={second},{third}")));
    // x clears every filter; esc goes back to the flamegraph.
    assert!(press(&mut app, &[KeyCode::Char('x'), KeyCode::Esc]));
    assert!(app.label_filters().is_empty());
    assert_eq!(app.pane(), Pane::Flamegraph);
    assert_eq!(app.view().tree().total(), dc.total);
}

#[test]
fn labels_of_a_profile_without_labels_say_so() {
    let mut app = App::new(json_gateway_cpu(), TerminalOptions::default()).unwrap();
    assert!(press(&mut app, &[KeyCode::Char('l')]));
    assert_eq!(app.pane(), Pane::Flamegraph);
    assert!(line(&mut app, 21).starts_with("the profile's samples carry no labels"));
}
