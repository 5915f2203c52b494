//! The browser dashboard's bridge to the viewer model: [`WebView`] wraps an
//! [`edgeprof_viewer::View`] and answers the page in JSON strings (layout,
//! breadcrumbs, search share, table, hover details), so the page's
//! JavaScript only draws. Built for `wasm32-unknown-unknown` by
//! `cargo xtask dist`; on the host it is an ordinary library, tested here.
//!
//! Architecture invariant: no IO and nothing beyond `edgeprof-viewer`,
//! `edgeprof-pprof`, `serde_json` and `wasm-bindgen` — never tokio, sqlx,
//! tonic or a terminal stack, which do not build for the browser.

use edgeprof_pprof::SampleIndex;
use edgeprof_viewer::{
    BlockKind, Granularity, LayoutOptions, Search, SearchMode, SortColumn, View,
};
use serde_json::{Value, json};
use wasm_bindgen::prelude::*;

/// An error the page shows as text (wasm-bindgen throws a `String` error
/// as a JS string).
fn err(message: impl std::fmt::Display) -> String {
    message.to_string()
}

/// One profile as the dashboard shows it.
#[wasm_bindgen]
pub struct WebView {
    view: View,
}

#[wasm_bindgen]
impl WebView {
    /// Decodes a pprof (gzip'd or not) and builds the view of sample type
    /// `sample_type` (empty = the profile's default). Errors are thrown as
    /// strings the page shows.
    #[wasm_bindgen(constructor)]
    pub fn new(bytes: &[u8], sample_type: &str) -> Result<WebView, String> {
        WebView::open(bytes, sample_type)
    }
}

impl WebView {
    /// Decodes a pprof (gzip'd or not) and builds the view of sample type
    /// `sample_type` (empty = the profile's default).
    pub fn open(bytes: &[u8], sample_type: &str) -> Result<WebView, String> {
        let profile =
            edgeprof_pprof::decode(bytes).map_err(|e| err(format!("not a pprof: {e}")))?;
        let index = (!sample_type.is_empty()).then(|| SampleIndex::Name(sample_type.to_owned()));
        let view = View::new(&profile, index, Granularity::Function).map_err(err)?;
        Ok(WebView { view })
    }
}

#[wasm_bindgen]
impl WebView {
    /// `{"sample_type", "unit", "sample_types": [[type, unit]], "total",
    /// "total_text"}`.
    pub fn summary(&self) -> String {
        let t = self.view.tree();
        json!({
            "sample_type": t.sample_type,
            "unit": t.unit,
            "sample_types": t.sample_types,
            "total": t.total(),
            "total_text": t.format(t.total()),
        })
        .to_string()
    }

    /// The flamegraph of the focused subtree `width` units wide (pixels):
    /// `[{"node", "depth", "x", "width", "name", "folded", "matched"}]`,
    /// depth 0 = the focused node, drawn on top.
    pub fn layout(&self, width: u32, min_width: u32) -> String {
        let layout = self.view.layout(LayoutOptions {
            width: width.max(1),
            min_width: min_width.max(1),
            max_depth: None,
        });
        let tree = self.view.tree();
        let blocks: Vec<Value> = layout
            .blocks
            .iter()
            .map(|b| match b.kind {
                BlockKind::Frame(node) => json!({
                    "node": node,
                    "depth": b.depth,
                    "x": b.x,
                    "width": b.width,
                    "name": tree.frame(node).function,
                    "folded": false,
                    "matched": self.view.matches(node),
                }),
                BlockKind::Folded { parent, frames } => json!({
                    "node": parent,
                    "depth": b.depth,
                    "x": b.x,
                    "width": b.width,
                    "name": format!("… {frames} more"),
                    "folded": true,
                    "matched": false,
                }),
            })
            .collect();
        Value::Array(blocks).to_string()
    }

    /// Hover details of `node`: `{"function", "location", "self", "total",
    /// "self_percent", "total_percent", "samples"}` with values formatted.
    pub fn details(&self, node: u32) -> Result<String, String> {
        let tree = self.view.tree();
        if node as usize >= tree.nodes.len() {
            return Err(err(format!("no node {node}")));
        }
        let d = tree.details(node);
        Ok(json!({
            "function": d.function,
            "location": d.location,
            "self": tree.format(d.self_value),
            "total": tree.format(d.total),
            "self_percent": d.self_percent,
            "total_percent": d.total_percent,
            "samples": d.samples,
        })
        .to_string())
    }

    /// Focuses `node` (a click on a frame).
    pub fn focus(&mut self, node: u32) -> Result<(), String> {
        if node as usize >= self.view.tree().nodes.len() {
            return Err(err(format!("no node {node}")));
        }
        self.view.focus_on(node);
        Ok(())
    }

    /// Back to the whole profile ("All frames").
    pub fn reset(&mut self) {
        self.view.reset();
    }

    /// `[{"node", "name"}]` from the root to the focus.
    pub fn breadcrumbs(&self) -> String {
        let crumbs: Vec<Value> = self
            .view
            .breadcrumbs()
            .into_iter()
            .map(|c| json!({"node": c.node, "name": c.name}))
            .collect();
        Value::Array(crumbs).to_string()
    }

    /// Searches function names and locations (a substring, or a regular
    /// expression when `regex`; smart case; empty clears): `{"pattern",
    /// "covered_percent", "matching_nodes", "summary"}` or `null` when
    /// cleared. An invalid regular expression is thrown as its parser's
    /// message and leaves the previous search in place.
    pub fn search(&mut self, pattern: &str, regex: bool) -> Result<String, String> {
        if pattern.is_empty() {
            self.view.set_search(None);
            return Ok("null".into());
        }
        let mode = if regex {
            SearchMode::Regex
        } else {
            SearchMode::Substring
        };
        let search = Search::new(pattern, mode).map_err(err)?;
        self.view.set_search(Some(&search));
        let tree = self.view.tree();
        let r = self.view.search().expect("just set");
        Ok(json!({
            "pattern": r.pattern,
            "covered_percent": r.covered_percent,
            "matching_nodes": r.matching_nodes,
            "summary": r.summary(tree),
        })
        .to_string())
    }

    /// The table sorted by `sort` (`self`, `total` or `name`), filtered by the
    /// search: `[{"function", "location", "self", "total", "self_percent",
    /// "total_percent"}]`.
    pub fn table(&mut self, sort: &str) -> Result<String, String> {
        let column = match sort {
            "self" => SortColumn::SelfValue,
            "total" => SortColumn::Total,
            "name" => SortColumn::Name,
            other => return Err(err(format!("sort: `{other}` is not self, total or name"))),
        };
        self.view.set_sort(column);
        let tree = self.view.tree();
        let rows: Vec<Value> = self
            .view
            .table()
            .into_iter()
            .map(|r| {
                json!({
                    "function": r.function,
                    "location": r.location,
                    "self": tree.format(r.self_value),
                    "total": tree.format(r.total),
                    "self_percent": r.self_percent,
                    "total_percent": r.total_percent,
                })
            })
            .collect();
        Ok(Value::Array(rows).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgeprof_pprof::{LineSpec, ProfileBuilder};

    fn profile() -> Vec<u8> {
        let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        let mut at = |name: &str| {
            let f = b.function(name, name, "src/lib.rs", 1);
            b.location(
                0,
                0,
                &[LineSpec {
                    function_id: f,
                    line: 7,
                    column: 0,
                }],
            )
        };
        let (main, parse, render) = (at("main"), at("parse"), at("render"));
        b.add_sample(&[parse, main], &[30], &[]);
        b.add_sample(&[render, main], &[10], &[]);
        edgeprof_pprof::encode(&b.build())
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn layout_focus_search_and_table_answer_what_the_page_draws() {
        let mut v = WebView::new(&profile(), "").unwrap();
        assert_eq!(parse(&v.summary())["total"], 40);
        let blocks = parse(&v.layout(400, 1));
        let names: Vec<_> = blocks
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["all", "main", "parse", "render"]);
        let parse_block = &blocks[2];
        assert_eq!(parse_block["width"], 300);

        v.focus(parse_block["node"].as_u64().unwrap() as u32)
            .unwrap();
        let crumbs = parse(&v.breadcrumbs());
        let crumb_names: Vec<_> = crumbs
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(crumb_names, ["all", "main", "parse"]);
        v.reset();
        assert_eq!(parse(&v.breadcrumbs()).as_array().unwrap().len(), 1);

        let s = parse(&v.search("rend", false).unwrap());
        assert_eq!(s["covered_percent"], 25.0);
        let table = parse(&v.table("self").unwrap());
        assert_eq!(table[0]["function"], "render");
        v.search("", false).unwrap();
        let table = parse(&v.table("self").unwrap());
        assert_eq!(table[0]["function"], "parse");
        assert_eq!(
            parse(
                &v.details(parse_block["node"].as_u64().unwrap() as u32)
                    .unwrap()
            )["location"],
            "src/lib.rs:1"
        );
    }

    #[test]
    fn regex_search_reads_the_pattern_as_a_regex_and_substring_does_not() {
        let mut v = WebView::new(&profile(), "").unwrap();
        let share = |v: &mut WebView, p: &str, regex: bool| {
            parse(&v.search(p, regex).unwrap())["covered_percent"].clone()
        };
        assert_eq!(share(&mut v, "^(parse|render)$", true), 100.0);
        assert_eq!(share(&mut v, "^pa", true), 75.0);
        // The same text as a substring matches nothing.
        assert_eq!(share(&mut v, "^pa", false), 0.0);
        let e = v.search("(", true).unwrap_err();
        assert!(e.starts_with("invalid regular expression \"(\""), "{e}");
        // A failed search keeps the one before it.
        assert_eq!(
            parse(&v.table("self").unwrap()).as_array().unwrap().len(),
            0
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(WebView::new(b"not a profile", "").is_err());
        let mut v = WebView::new(&profile(), "").unwrap();
        assert!(v.focus(99).is_err());
        assert!(v.details(99).is_err());
        assert!(v.table("weird").is_err());
        assert!(WebView::new(&profile(), "alloc_space").is_err());
    }
}
