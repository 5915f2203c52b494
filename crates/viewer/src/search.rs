//! Search over function names and source locations: which frames match, and
//! the share of the profile the matching frames cover.

use regex::{Regex, RegexBuilder};

use crate::tree::{CallTree, FrameId, NodeId};

/// How a search pattern is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SearchMode {
    /// The pattern is a plain substring.
    #[default]
    Substring,
    /// The pattern is a regular expression (Rust `regex` syntax).
    Regex,
}

/// Why a pattern cannot be searched for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    /// The regular expression does not parse.
    #[error("invalid regular expression {pattern:?}: {message}")]
    InvalidRegex {
        /// The pattern as typed.
        pattern: String,
        /// What the regex parser said.
        message: String,
    },
}

/// A compiled search. Case-insensitive unless the pattern has an upper-case
/// letter ("smart case", as ripgrep).
#[derive(Debug, Clone)]
pub struct Search {
    pattern: String,
    regex: Regex,
}

impl Search {
    /// Compiles `pattern` read as `mode`.
    pub fn new(pattern: &str, mode: SearchMode) -> Result<Search, SearchError> {
        let source = match mode {
            SearchMode::Substring => regex::escape(pattern),
            SearchMode::Regex => pattern.to_owned(),
        };
        let regex = RegexBuilder::new(&source)
            .case_insensitive(!pattern.chars().any(char::is_uppercase))
            .build()
            .map_err(|e| SearchError::InvalidRegex {
                pattern: pattern.to_owned(),
                message: e.to_string(),
            })?;
        Ok(Search {
            pattern: pattern.to_owned(),
            regex,
        })
    }

    /// The pattern as given.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Which frames of `tree` match (by function name, file path or
    /// `file:line`) and what share of the profile they cover.
    pub fn run(&self, tree: &CallTree) -> SearchResult {
        let frames: Vec<bool> = tree
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                i != 0
                    && (self.regex.is_match(&f.function)
                        || (!f.file.is_empty() && self.regex.is_match(&f.location())))
            })
            .collect();
        // A sample is covered once, however many of its frames match: sum the
        // totals of matching nodes that have no matching ancestor. Nodes are
        // created after their parents, so one forward pass sees every
        // ancestor first.
        let mut under_match = vec![false; tree.nodes.len()];
        let mut covered: i64 = 0;
        let mut nodes = 0;
        for (i, node) in tree.nodes.iter().enumerate().skip(1) {
            let matched = frames[node.frame as usize];
            let inherited = under_match[node.parent as usize];
            if matched {
                nodes += 1;
                if !inherited {
                    covered = covered.saturating_add(node.total);
                }
            }
            under_match[i] = matched || inherited;
        }
        SearchResult {
            pattern: self.pattern.clone(),
            frames,
            covered,
            covered_percent: tree.percent(covered),
            matching_nodes: nodes,
        }
    }
}

/// The outcome of a [`Search`] over one tree.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// The pattern searched for.
    pub pattern: String,
    /// `frames[f]`: whether frame `f` matches.
    pub frames: Vec<bool>,
    /// Value of the samples with at least one matching frame.
    pub covered: i64,
    /// `covered` as % of the whole profile.
    pub covered_percent: f64,
    /// How many nodes match (for "no matches" messages).
    pub matching_nodes: usize,
}

impl SearchResult {
    /// Whether frame `frame` matches.
    pub fn frame_matches(&self, frame: FrameId) -> bool {
        self.frames.get(frame as usize).copied().unwrap_or(false)
    }

    /// Whether node `node` of `tree` is highlighted.
    pub fn node_matches(&self, tree: &CallTree, node: NodeId) -> bool {
        self.frame_matches(tree.node(node).frame)
    }

    /// `"json" matches 12 frames, 41.0% of the profile (410ms)`.
    pub fn summary(&self, tree: &CallTree) -> String {
        if self.matching_nodes == 0 {
            return format!("{:?}: no matching frames", self.pattern);
        }
        format!(
            "{:?} matches {} frame{}, {:.1}% of the profile ({})",
            self.pattern,
            self.matching_nodes,
            if self.matching_nodes == 1 { "" } else { "s" },
            self.covered_percent,
            tree.format(self.covered)
        )
    }
}
