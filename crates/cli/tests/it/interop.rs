//! `edgeprof` against `go tool pprof` on real Go-recorded profiles and on
//! files edgeprof writes: same rows (function, flat, cum) in the same order,
//! merged totals equal to the sums, and each tool reads the other's output.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use edgeprof_pprof::{LineSpec, MappingSpec, ProfileBuilder};

use crate::support::{Go, edgeprof, edgeprof_ok, edgeprof_top, edgeprof_top_with, go};

/// Profiles recorded once per test run by the Go oracle.
struct Recorded {
    _dir: tempfile::TempDir,
    cpu: PathBuf,
    cpu_short: PathBuf,
    heap: PathBuf,
}

fn recorded(go: &Go) -> &'static Recorded {
    static REC: OnceLock<Recorded> = OnceLock::new();
    REC.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let rec = Recorded {
            cpu: dir.path().join("cpu.pprof"),
            cpu_short: dir.path().join("cpu-short.pprof"),
            heap: dir.path().join("heap.pprof"),
            _dir: dir,
        };
        go.record("cpu", &rec.cpu, &[]);
        go.record("cpu", &rec.cpu_short, &["600ms"]);
        go.record("heap", &rec.heap, &[]);
        rec
    })
}

/// `edgeprof top --json` and `go tool pprof -top` agree row by row.
fn assert_top_agrees(go: &Go, file: &Path, sample_index: Option<&str>, cum: bool) {
    assert_agrees_with(go, file, sample_index, cum, &[], &[]);
}

#[test]
fn cpu_profile_top_agrees_with_pprof() {
    let Some(go) = go() else { return };
    let rec = recorded(go);
    for index in [None, Some("samples"), Some("cpu"), Some("0")] {
        for cum in [false, true] {
            assert_top_agrees(go, &rec.cpu, index, cum);
        }
    }
    // The workload recurses (main.fib) and has inlined calls (main.mix):
    // make sure the recorded profile exercises both.
    let (top, _) = edgeprof_top(&rec.cpu, Some("samples"), false);
    let names: Vec<&str> = top.rows.iter().map(|r| r.0.as_str()).collect();
    assert!(names.contains(&"main.fib"), "rows: {names:?}");
    assert!(names.contains(&"main.hashLoop"), "rows: {names:?}");
}

#[test]
fn heap_profile_top_agrees_with_pprof() {
    let Some(go) = go() else { return };
    let rec = recorded(go);
    for index in [
        None,
        Some("alloc_objects"),
        Some("alloc_space"),
        Some("inuse_objects"),
        Some("inuse_space"),
    ] {
        for cum in [false, true] {
            assert_top_agrees(go, &rec.heap, index, cum);
        }
    }
    // The default sample index is pprof's: inuse_space for Go heap profiles.
    let (top, _) = edgeprof_top(&rec.heap, None, false);
    assert_eq!(top.sample_type, "inuse_space");
}

#[test]
fn merged_profiles_open_in_pprof_with_summed_totals() {
    let Some(go) = go() else { return };
    let rec = recorded(go);
    let dir = tempfile::tempdir().expect("tempdir");
    let merged = dir.path().join("merged.pprof");
    let m = merged.to_str().unwrap();
    edgeprof_ok(&[
        "merge",
        rec.cpu.to_str().unwrap(),
        rec.cpu_short.to_str().unwrap(),
        "-o",
        m,
    ]);
    for (index, unit) in [("samples", "count"), ("cpu", "nanoseconds")] {
        let a = go.top(&rec.cpu, Some(index), false, unit).total;
        let b = go.top(&rec.cpu_short, Some(index), false, unit).total;
        let sum = go.top(&merged, Some(index), false, unit).total;
        assert_eq!(sum, a + b, "{index}: merged total vs {a} + {b}");
        assert_top_agrees(go, &merged, Some(index), false);
        assert_top_agrees(go, &merged, Some(index), true);
    }

    // A profile merged with itself doubles every heap value.
    let doubled = dir.path().join("heap2.pprof");
    let h = rec.heap.to_str().unwrap();
    edgeprof_ok(&["merge", h, h, "-o", doubled.to_str().unwrap()]);
    for index in [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ] {
        let unit = if index.ends_with("space") {
            "bytes"
        } else {
            "count"
        };
        let one = go.top(&rec.heap, Some(index), false, unit);
        let two = go.top(&doubled, Some(index), false, unit);
        assert_eq!(two.total, 2 * one.total, "{index}");
        // The cutoff doubles too, so rows near it may go: compare the rest.
        for (function, flat, cum) in &two.rows {
            let (_, f1, c1) = one
                .rows
                .iter()
                .find(|r| &r.0 == function)
                .unwrap_or_else(|| panic!("{index}: {function} not in the single profile"));
            assert_eq!((*flat, *cum), (2 * f1, 2 * c1), "{index}: {function}");
        }
        assert_top_agrees(go, &doubled, Some(index), false);
    }
}

#[test]
fn merging_cpu_with_heap_is_a_clear_error() {
    let Some(go) = go() else { return };
    let rec = recorded(go);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("m.pprof");
    let run = edgeprof(&[
        "merge",
        rec.cpu.to_str().unwrap(),
        rec.heap.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(1), "stderr: {}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "stderr: {}", run.stderr);
    assert!(
        run.stderr.contains("heap.pprof") && run.stderr.contains("sample types"),
        "stderr: {}",
        run.stderr
    );
    assert!(!out.exists(), "no output is written on error");
}

#[test]
fn pprof_proto_output_of_our_files_decodes_to_the_same_report() {
    let Some(go) = go() else { return };
    let rec = recorded(go);
    let dir = tempfile::tempdir().expect("tempdir");
    let ours = dir.path().join("ours.pprof");
    edgeprof_ok(&[
        "merge",
        rec.heap.to_str().unwrap(),
        "-o",
        ours.to_str().unwrap(),
    ]);
    let bytes = go.pprof(&["-proto", ours.to_str().unwrap()]);
    let theirs = edgeprof_pprof::decode(&bytes).expect("pprof -proto output decodes");
    let mine = edgeprof_pprof::decode(&std::fs::read(&ours).unwrap()).unwrap();
    for index in ["alloc_space", "inuse_objects"] {
        let options = edgeprof_pprof::TopOptions {
            sample_index: Some(index.parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(
            edgeprof_pprof::top(&theirs, &options).unwrap(),
            edgeprof_pprof::top(&mine, &options).unwrap(),
            "{index}"
        );
    }
    // Go's own files decode as well, through the same path.
    let go_bytes = go.pprof(&["-proto", rec.cpu.to_str().unwrap()]);
    edgeprof_pprof::decode(&go_bytes).expect("pprof -proto of a Go CPU profile decodes");
}

/// A profile made with our builder, aimed at the corners of `top`: ties in
/// flat broken by name, a function recursing through another, inlined frames,
/// a node exactly at the node-fraction cutoff (kept: pprof drops `cum <
/// cutoff`) and one just below it (dropped), a location without lines.
fn corner_profile() -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let m = b.mapping(&MappingSpec {
        memory_start: 0x1000,
        memory_limit: 0x9000,
        filename: "worker.wasm",
        build_id: "abc",
        has_functions: true,
        ..Default::default()
    });
    let f = |b: &mut ProfileBuilder, name: &str| b.function(name, name, "src/lib.rs", 1);
    let main = f(&mut b, "main");
    let a = f(&mut b, "alpha");
    let z = f(&mut b, "zeta");
    let rec = f(&mut b, "rec");
    let inl = f(&mut b, "inlined_helper");
    let edge = f(&mut b, "edge_kept");
    let below = f(&mut b, "below_cutoff");
    let line = |function_id, line| LineSpec {
        function_id,
        line,
        column: 0,
    };
    let loc = |b: &mut ProfileBuilder, addr: u64, lines: &[LineSpec]| b.location(m, addr, lines);
    let l_main = loc(&mut b, 0x1100, &[line(main, 10)]);
    let l_a = loc(&mut b, 0x1200, &[line(a, 20)]);
    let l_z = loc(&mut b, 0x1300, &[line(z, 30)]);
    let l_rec1 = loc(&mut b, 0x1400, &[line(rec, 40)]);
    let l_rec2 = loc(&mut b, 0x1404, &[line(rec, 41)]);
    // inlined_helper inlined into alpha: innermost first.
    let l_inl = loc(&mut b, 0x1500, &[line(inl, 50), line(a, 21)]);
    let l_edge = loc(&mut b, 0x1600, &[line(edge, 60)]);
    let l_below = loc(&mut b, 0x1700, &[line(below, 70)]);
    let l_bare = b.location(m, 0x1800, &[]);
    let ms = 1_000_000;
    // Total samples = 1000 → cutoff at 0.005 is 5.
    b.add_sample(&[l_a, l_main], &[300, 300 * ms], &[]);
    b.add_sample(&[l_z, l_main], &[300, 300 * ms], &[]);
    b.add_sample(
        &[l_rec1, l_rec2, l_rec1, l_z, l_main],
        &[200, 200 * ms],
        &[],
    );
    b.add_sample(&[l_inl, l_main], &[150, 150 * ms], &[]);
    b.add_sample(&[l_edge, l_main], &[5, 5 * ms], &[]);
    b.add_sample(&[l_below, l_main], &[4, 4 * ms], &[]);
    b.add_sample(&[l_bare, l_main], &[41, 41 * ms], &[]);
    edgeprof_pprof::encode(&b.build())
}

#[test]
fn builder_corner_cases_agree_with_pprof() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("corner.pprof");
    std::fs::write(&file, corner_profile()).unwrap();
    for index in [None, Some("samples"), Some("cpu")] {
        for cum in [false, true] {
            assert_top_agrees(go, &file, index, cum);
        }
    }
    let (top, _) = edgeprof_top(&file, Some("samples"), false);
    let names: Vec<&str> = top.rows.iter().map(|r| r.0.as_str()).collect();
    assert!(names.contains(&"edge_kept"), "rows: {names:?}");
    assert!(!names.contains(&"below_cutoff"), "rows: {names:?}");
}

/// `edgeprof top FILE OURS` and `go tool pprof -top THEIRS FILE` agree row
/// by row (with a diff, flat and cum are the change, the total the base's).
fn assert_agrees_with(
    go: &Go,
    file: &Path,
    sample_index: Option<&str>,
    cum: bool,
    ours: &[&str],
    theirs: &[&str],
) {
    let (mine, unit) = edgeprof_top_with(file, sample_index, cum, ours);
    let pprof = go.top_with(file, sample_index, cum, &unit, theirs);
    assert!(
        !pprof.rows.is_empty(),
        "pprof printed no rows for {} {theirs:?}",
        file.display()
    );
    assert_eq!(
        mine,
        pprof,
        "edgeprof top {ours:?} vs go tool pprof -top {theirs:?} on {} (sample index {sample_index:?}, cum {cum})",
        file.display()
    );
}

#[test]
fn diff_base_top_agrees_with_pprof() {
    let Some(go) = go() else { return };
    let rec = recorded(go);
    let base = rec.cpu_short.to_str().unwrap();
    let diff_base = format!("-diff_base={base}");
    for index in ["samples", "cpu"] {
        for cum in [false, true] {
            assert_agrees_with(
                go,
                &rec.cpu,
                Some(index),
                cum,
                &["--diff-base", base],
                &[&diff_base],
            );
        }
        // -normalize: the same values per function. Go 1.19's pprof (the
        // oracle here) also lists nodes below the cutoff when normalizing;
        // those must be the only rows we leave out.
        let (ours, unit) = edgeprof_top_with(
            &rec.cpu,
            Some(index),
            false,
            &["--diff-base", base, "--normalize", "total"],
        );
        let theirs = go.top_with(
            &rec.cpu,
            Some(index),
            false,
            &unit,
            &[&diff_base, "-normalize"],
        );
        assert_eq!(ours.total, theirs.total, "{index}: total");
        let cutoff = (ours.total as f64 * 0.005) as i64;
        for row in &theirs.rows {
            match ours.rows.iter().find(|r| r.0 == row.0) {
                Some(mine) => assert_eq!(mine, row, "{index}: -normalize row"),
                None => assert!(row.2.abs() < cutoff, "{index}: missing {row:?}"),
            }
        }
        assert!(
            ours.rows.iter().all(|r| theirs.rows.contains(r)),
            "{index}: ours {:?} theirs {:?}",
            ours.rows,
            theirs.rows
        );
    }
    // The 1500 ms profile against the 600 ms one: most functions grew.
    let (top, _) = edgeprof_top_with(&rec.cpu, Some("cpu"), false, &["--diff-base", base]);
    assert!(top.rows.iter().any(|r| r.1 > 0), "rows: {:?}", top.rows);
}

/// A CPU profile whose samples carry `data_center` and `isolate` labels.
fn labelled_profile() -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let line = |function_id| LineSpec {
        function_id,
        line: 1,
        column: 0,
    };
    let at = |b: &mut ProfileBuilder, name: &str| {
        let f = b.function(name, name, "src/lib.rs", 1);
        b.location(0, 0, &[line(f)])
    };
    let (main, parse, render, encode) = (
        at(&mut b, "main"),
        at(&mut b, "parse"),
        at(&mut b, "render"),
        at(&mut b, "encode"),
    );
    let ms = 1_000_000;
    for (stack, n, dc, isolate) in [
        (&[parse, main][..], 50, "lhr", "i1"),
        (&[render, main][..], 30, "sjc", "i2"),
        (&[parse, main][..], 15, "sjc", "i3"),
        (&[encode, render, main][..], 5, "nrt", "i4"),
    ] {
        let labels = [
            b.label_str("data_center", dc),
            b.label_str("isolate", isolate),
        ];
        b.add_sample(stack, &[n, n * ms], &labels);
    }
    edgeprof_pprof::encode(&b.build())
}

#[test]
fn tag_focus_agrees_with_pprof_tagfocus() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("labelled.pprof");
    std::fs::write(&file, labelled_profile()).unwrap();
    for tag in ["data_center=sjc", "data_center=lhr,nrt", "isolate=i3"] {
        let tagfocus = format!("-tagfocus={tag}");
        for cum in [false, true] {
            assert_agrees_with(go, &file, Some("cpu"), cum, &["--tag", tag], &[&tagfocus]);
        }
    }
    // KEY!=V as -tagignore, alone and with a focus.
    for tag in ["data_center!=sjc", "isolate!=i1,i3"] {
        let tagignore = format!("-tagignore={}", tag.replace("!=", "="));
        for cum in [false, true] {
            assert_agrees_with(go, &file, Some("cpu"), cum, &["--tag", tag], &[&tagignore]);
        }
    }
    assert_agrees_with(
        go,
        &file,
        Some("cpu"),
        false,
        &["--tag", "data_center=sjc,lhr", "--tag", "isolate!=i2"],
        &["-tagfocus=data_center=sjc,lhr", "-tagignore=isolate=i2"],
    );
    // Focused on both sides of a diff.
    let base = dir.path().join("base.pprof");
    std::fs::write(&base, halved_base()).unwrap();
    let b = base.to_str().unwrap();
    assert_agrees_with(
        go,
        &file,
        Some("cpu"),
        false,
        &["--diff-base", b, "--tag", "data_center=sjc"],
        &[&format!("-diff_base={b}"), "-tagfocus=data_center=sjc"],
    );
}

/// The labelled profile with every value halved: a base for a focused diff.
fn halved_base() -> Vec<u8> {
    let mut p = edgeprof_pprof::decode(&labelled_profile()).unwrap();
    for s in &mut p.sample {
        for v in &mut s.value {
            *v /= 2;
        }
    }
    edgeprof_pprof::encode(&p)
}

/// Label shares as `go tool pprof -tags` prints them: per key in order, its
/// values in order with their percentage of the key's total (two decimals).
type Shares = Vec<(String, Vec<(String, String)>)>;

/// Parses `go tool pprof -tags` output (` key: Total …` headers, then
/// `VALUE (PCT%): NAME` lines).
fn parse_pprof_tags(out: &str) -> Shares {
    let mut shares: Shares = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((key, _)) = line.split_once(": Total ") {
            shares.push((key.to_owned(), Vec::new()));
        } else if let Some((left, name)) = line.split_once("%): ") {
            let pct = left.rsplit('(').next().unwrap().trim();
            let (_, values) = shares.last_mut().expect("a value line before any key");
            values.push((name.to_owned(), pct.to_owned()));
        }
    }
    shares
}

/// `edgeprof tags --json` as [`Shares`].
fn edgeprof_tags(file: &Path, extra: &[&str]) -> Shares {
    let mut args = vec!["tags", "--json", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let doc: serde_json::Value = serde_json::from_str(&edgeprof_ok(&args)).unwrap();
    doc["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let total = k["total"].as_f64().unwrap();
            let values = k["values"].as_array().unwrap().iter().map(|v| {
                let pct = v["total"].as_f64().unwrap() / total * 100.0;
                (v["value"].as_str().unwrap().to_owned(), format!("{pct:.2}"))
            });
            (k["key"].as_str().unwrap().to_owned(), values.collect())
        })
        .collect()
}

#[test]
fn tags_agree_with_pprof_tags() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("labelled.pprof");
    std::fs::write(&file, labelled_profile()).unwrap();
    let f = file.to_str().unwrap();
    for (ours, theirs) in [
        (vec!["-i", "cpu"], vec!["-sample_index=cpu"]),
        (vec!["-i", "samples"], vec!["-sample_index=samples"]),
        (
            vec!["-i", "cpu", "--tag", "data_center=sjc,nrt"],
            vec!["-sample_index=cpu", "-tagfocus=data_center=sjc,nrt"],
        ),
    ] {
        let mut args = vec!["-tags"];
        args.extend_from_slice(&theirs);
        args.push(f);
        let pprof = parse_pprof_tags(&String::from_utf8(go.pprof(&args)).unwrap());
        assert_eq!(
            pprof.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["data_center", "isolate"],
            "go tool pprof {args:?}"
        );
        assert!(pprof.iter().all(|(_, v)| !v.is_empty()), "{pprof:?}");
        assert_eq!(
            edgeprof_tags(&file, &ours),
            pprof,
            "edgeprof tags {ours:?} vs go tool pprof {args:?}"
        );
    }
}
