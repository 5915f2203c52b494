//! The terminal viewer's diff mode, on hand-built profiles whose diff is
//! known. Snapshots add a style mask: `+` red (more in the new profile), `-`
//! green (less), `=` unchanged, `S` selected, `M` search match.

use edgeprof_viewer::Normalize;
use edgeprof_viewer::terminal::{App, DiffBase, TerminalOptions, UNCHANGED_COLOR, change_color};
use insta::assert_snapshot;
use ratatui::buffer::{Buffer, Cell};
use ratatui::crossterm::event::KeyCode;
use ratatui::style::Color;

use crate::profiles::{folded, image_resizer_heap, json_gateway_cpu};
use crate::terminal::{draw, press, screen_marked};

/// Base: parse 60 ms (50 of them in decode), render 40 ms. New: parse 20 ms
/// (decode 10), render 50 ms and a new encode 30 ms; both total 100 ms.
/// Widths are base + new: render 90, parse 80, encode 30.
fn app() -> App {
    let ms = |stacks: &str| {
        let lines: Vec<String> = stacks
            .lines()
            .map(|l| {
                let (stack, v) = l.trim().rsplit_once(' ').unwrap();
                format!("{stack} {}", v.parse::<i64>().unwrap() * 1_000_000)
            })
            .collect();
        folded(&lines.join("\n"))
    };
    let base = DiffBase {
        profile: ms("main;parse;decode 50
                     main;parse 10
                     main;render 40"),
        name: "before.pprof".into(),
        normalize: Normalize::None,
    };
    let new = ms("main;parse;decode 10
                  main;parse 10
                  main;render 50
                  main;encode 30");
    App::diff(new, base, TerminalOptions::default()).unwrap()
}

/// [`crate::terminal::mark`], and for other cells `=` unchanged, `+` red
/// and `-` green (background, else text).
fn mark(cell: &Cell) -> char {
    let red_or_green = |c: Color| match c {
        Color::Red => Some('+'),
        Color::Green => Some('-'),
        Color::Rgb(r, g, _) if c != UNCHANGED_COLOR && r > g => Some('+'),
        Color::Rgb(r, g, _) if c != UNCHANGED_COLOR && g > r => Some('-'),
        _ => None,
    };
    match crate::terminal::mark(cell) {
        '.' if cell.bg == UNCHANGED_COLOR => '=',
        '.' => red_or_green(cell.bg)
            .or_else(|| red_or_green(cell.fg))
            .unwrap_or('.'),
        other => other,
    }
}

/// The background of the first flamegraph cell that starts `word`.
fn bg_of(buf: &Buffer, word: &str) -> Color {
    let area = buf.area;
    for y in 2..area.height - 3 {
        let row: String = (0..area.width).map(|x| buf[(x, y)].symbol()).collect();
        if let Some(x) = row.find(word) {
            return buf[(x as u16, y)].bg;
        }
    }
    panic!("{word} is not drawn")
}

#[test]
fn diff_flamegraph_is_red_where_the_new_profile_spends_more_and_green_where_less() {
    let mut app = app();
    assert!(app.is_diff());
    let buf = draw(&mut app, 80, 24);
    // parse lost 40 of the base's 100 ms, encode gained 30, render 10; main
    // and all did not change.
    assert_eq!(bg_of(&buf, "parse"), change_color(-0.4));
    assert_eq!(bg_of(&buf, "decode"), change_color(-0.4));
    assert_eq!(bg_of(&buf, "encode"), change_color(0.3));
    assert_eq!(bg_of(&buf, "render"), change_color(0.1));
    assert_eq!(bg_of(&buf, "main"), UNCHANGED_COLOR);
    let Color::Rgb(r, g, _) = bg_of(&buf, "parse") else {
        panic!("parse is not an RGB colour")
    };
    assert!(g > r, "parse is green");
    let Color::Rgb(r, g, _) = bg_of(&buf, "encode") else {
        panic!("encode is not an RGB colour")
    };
    assert!(r > g, "encode is red");
    // A bigger change is a stronger colour: encode (+30) is redder than
    // render (+10).
    let redness = |c| match c {
        Color::Rgb(r, g, _) => i32::from(r) - i32::from(g),
        _ => 0,
    };
    assert!(redness(bg_of(&buf, "encode")) > redness(bg_of(&buf, "render")));

    let s = screen_marked(&mut app, 80, 24, mark);
    assert!(s.contains('+') && s.contains('-'), "{s}");
    assert_snapshot!("diff_flamegraph", s);
}

#[test]
fn diff_details_show_both_sides_of_the_selected_frame() {
    let mut app = app();
    draw(&mut app, 80, 24);
    // all → main → render (widest, 90 ms) → parse.
    assert!(press(
        &mut app,
        &[KeyCode::Down, KeyCode::Down, KeyCode::Right]
    ));
    let s = screen_marked(&mut app, 100, 24, mark);
    let details = s.lines().nth(22).unwrap();
    assert_eq!(
        details,
        " parse  base 60ms  new 20ms  Δ -40ms (-40.0% of base)  src/parse.rs:1"
    );
}

#[test]
fn diff_table_has_base_new_and_delta_columns_sorted_by_the_change() {
    let mut app = app();
    assert!(press(&mut app, &[KeyCode::Char('t')]));
    // By |Δself| first (pprof's default order): decode -40, encode +30,
    // render +10, parse (self unchanged, total -40); main did not change and
    // is no row.
    assert_snapshot!(
        "diff_table_by_delta_self",
        screen_marked(&mut app, 80, 24, mark)
    );
    assert!(press(&mut app, &[KeyCode::Char('s')]));
    // By |Δtotal|: parse moves up to tie with decode (ties by name).
    assert_snapshot!(
        "diff_table_by_delta_total",
        screen_marked(&mut app, 80, 24, mark)
    );
    // Enter shows the selected function (parse) in the flamegraph.
    assert!(press(&mut app, &[KeyCode::Down, KeyCode::Enter]));
    let crumbs: Vec<String> = app
        .view()
        .breadcrumbs()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(crumbs, ["all", "main", "parse"]);
}

#[test]
fn diff_of_profiles_of_different_kinds_fails_before_drawing() {
    let base = DiffBase {
        profile: image_resizer_heap(),
        name: "heap.pprof".into(),
        normalize: Normalize::None,
    };
    let err = App::diff(json_gateway_cpu(), base, TerminalOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the profiles are of different kinds: base has ["),
        "{err}"
    );
}

#[test]
fn diff_per_request_needs_both_request_counts() {
    let base = DiffBase {
        profile: folded("main;work 10"),
        name: "before.pprof".into(),
        normalize: Normalize::Requests,
    };
    let err = App::diff(folded("main;work 20"), base, TerminalOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the base profile has no `requests: N` comment (needed to normalize per request)"
    );
}

#[test]
fn diff_stays_a_diff_across_sample_types_and_granularities() {
    let mut app = app();
    // cpu is the default (last) type; `i` wraps to samples: one per stack,
    // 3 in the base and 4 in the new profile.
    assert!(press(&mut app, &[KeyCode::Char('i')]));
    assert_eq!(app.view().tree().sample_type, "samples");
    assert!(app.is_diff());
    let s = screen_marked(&mut app, 80, 24, mark);
    assert!(s.lines().next().unwrap().ends_with("diff 3 → 4"), "{s}");
    assert!(press(&mut app, &[KeyCode::Char('f'), KeyCode::Char('t')]));
    let s = screen_marked(&mut app, 80, 24, mark);
    assert!(s.contains("+33.33%         0         1  encode"), "{s}");
    assert!(
        s.contains("diff: this profile against base before.pprof"),
        "{s}"
    );
}

#[test]
fn diff_normalized_to_the_base_total_compares_shares() {
    // Base a 10, b 10; new a 30, b 10, scaled by 20 / 40 to a 15, b 5.
    let base = DiffBase {
        profile: folded("main;a 10\nmain;b 10"),
        name: "before.pprof".into(),
        normalize: Normalize::Total,
    };
    let mut app = App::diff(
        folded("main;a 30\nmain;b 10"),
        base,
        TerminalOptions::default(),
    )
    .unwrap();
    let s = screen_marked(&mut app, 80, 24, mark);
    assert!(s.lines().next().unwrap().ends_with("→ 20ns"), "{s}");
    assert!(press(&mut app, &[KeyCode::Char('t')]));
    let s = screen_marked(&mut app, 80, 24, mark);
    assert!(s.contains("+25.00%"), "{s}");
    assert!(s.contains("-25.00%"), "{s}");
    assert!(s.contains("(scaled to the base's total)"), "{s}");
}
