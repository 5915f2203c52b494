//! The sandwich model: a function's callers (inverted) and callees, on
//! hand-built profiles whose answer is known.

use edgeprof_viewer::{CallTree, FrameId, Granularity, TreeOptions, sandwich, text};
use insta::assert_snapshot;

use crate::profiles::folded;

fn frame(tree: &CallTree, name: &str) -> FrameId {
    tree.frames
        .iter()
        .position(|f| f.function == name)
        .unwrap_or_else(|| panic!("no frame {name}")) as FrameId
}

fn tree(stacks: &str, granularity: Granularity) -> CallTree {
    let options = TreeOptions {
        granularity,
        ..TreeOptions::default()
    };
    CallTree::build(&folded(stacks), &options).unwrap()
}

/// `serialize` is called from two handlers and by itself; it calls two
/// functions, one of them calling back into it.
const SERVER: &str = "
    main;get;serialize;write 10
    main;get;serialize 2
    main;post;parse 20
    main;post;serialize;escape 6
    main;post;serialize;escape;serialize;write 3
    worker;serialize;write 4
    main;get 5
";

#[test]
fn sandwich_of_a_function_called_from_several_places_and_recursively() {
    let t = tree(SERVER, Granularity::Function);
    let s = sandwich(&t, frame(&t, "serialize")).unwrap();
    // Every sample through serialize once: 10 + 2 + 6 + 3 + 4, against the
    // profile's 50; self 2 (the recursive call's self is 0).
    assert_eq!(
        (s.function.as_str(), s.total, s.self_value),
        ("serialize", 25, 2)
    );
    assert_eq!(s.profile_total, 50);
    assert_eq!(s.percent(s.total), 50.0);
    // Callers, inverted: the outermost calls only (escape → serialize is
    // inside serialize already); worker starts its stacks at 4.
    assert_snapshot!(text::tree(&s.callers), @r"
    25 0 serialize
      12 0 get
        12 12 main
      9 0 post
        9 9 main
      4 4 worker
    ");
    // Callees: the recursion stays visible below escape.
    assert_snapshot!(text::tree(&s.callees), @r"
    25 2 serialize
      14 14 write
      9 6 escape
        3 0 serialize
          3 3 write
    ");
    assert_eq!(s.callers.total(), s.total);
    assert_eq!(s.callees.total(), s.total);
}

#[test]
fn sandwich_of_a_root_function_and_of_a_leaf() {
    let t = tree(SERVER, Granularity::Function);
    let main = sandwich(&t, frame(&t, "main")).unwrap();
    // main starts its stacks: no callers, all its value is the root's self.
    assert_snapshot!(text::tree(&main.callers), @"46 46 main");
    assert_eq!(main.callees.total(), 46);

    let write = sandwich(&t, frame(&t, "write")).unwrap();
    assert_eq!((write.total, write.self_value), (17, 17));
    assert_snapshot!(text::tree(&write.callers), @r"
    17 0 write
      17 0 serialize
        10 0 get
          10 10 main
        4 4 worker
        3 0 escape
          3 0 serialize
            3 0 post
              3 3 main
    ");
    assert_snapshot!(text::tree(&write.callees), @"17 17 write");
}

#[test]
fn sandwich_merges_every_line_of_the_function_and_refuses_the_root() {
    // By file:line every call site is a frame of its own; the sandwich is of
    // the function, whichever line was picked.
    let t = tree(SERVER, Granularity::FileLine);
    let s = sandwich(&t, frame(&t, "serialize")).unwrap();
    assert_eq!((s.total, s.self_value), (25, 2));
    assert!(sandwich(&t, 0).is_none(), "the root has no sandwich");
    assert!(sandwich(&t, t.frames.len() as FrameId).is_none());
}
