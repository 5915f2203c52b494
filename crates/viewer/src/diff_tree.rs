//! The flamegraph of a comparison: the call trees of both profiles merged
//! into one, each node knowing what the base and the new profile spent in it.
//!
//! Widths are by base + new, as Pyroscope's diff flamegraph lays out its
//! two-sided ("double") trees: code the new profile removed keeps its width,
//! and code it added gets one. The colour is the change, new − base, as a
//! share of the base's total (the total pprof's diff percentages are of).

use edgeprof_pprof::{Profile, SampleIndex};
use rustc_hash::FxHashMap;

use crate::diff::{DiffError, Normalize, Side, normalized};
use crate::tree::{CallTree, FrameId, FrameInfo, Granularity, Node, NodeId, TreeOptions};

/// What each side spent in each node of a merged tree.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffNodes {
    /// The base's total per node of the merged tree, by [`NodeId`].
    pub base: Vec<i64>,
    /// The new profile's (after normalization).
    pub new: Vec<i64>,
    /// What [`DiffNodes::share`] is of: the base's total, or the new
    /// profile's when the base is empty (as [`crate::Diff::total`]).
    pub total: i64,
}

impl DiffNodes {
    /// New minus base in `node`.
    pub fn change(&self, node: NodeId) -> i64 {
        let i = node as usize;
        self.new[i].saturating_sub(self.base[i])
    }

    /// The change in `node` as a signed fraction of [`DiffNodes::total`]
    /// (positive = more in the new profile), 0 when the total is 0.
    pub fn share(&self, node: NodeId) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.change(node) as f64 / self.total as f64
        }
    }
}

/// The merged tree of `base` and `new` (scaled as `normalize` says), whose
/// node totals are base + new, with each side's total per node.
pub fn diff_tree(
    base: &Profile,
    new: &Profile,
    options: &TreeOptions,
    normalize: Normalize,
) -> Result<(CallTree, DiffNodes), DiffError> {
    let (new, _, vi) = normalized(base, new, options.sample_index.as_ref(), normalize)?;
    diff_tree_normalized(base, &new, vi, options.granularity)
}

/// [`diff_tree`] of `new` as [`normalized`] returned it (sample type `vi`
/// resolved): for callers that also build the rows of the same comparison
/// and so normalize once.
pub(crate) fn diff_tree_normalized(
    base: &Profile,
    new: &Profile,
    vi: usize,
    granularity: Granularity,
) -> Result<(CallTree, DiffNodes), DiffError> {
    let options = TreeOptions {
        sample_index: Some(SampleIndex::Position(vi)),
        granularity,
        group_by: None,
    };
    let side_tree = |p: &Profile, side| {
        CallTree::build(p, &options).map_err(|source| DiffError::Report { side, source })
    };
    let base_tree = side_tree(base, Side::Base)?;
    let new_tree = side_tree(new, Side::New)?;

    let root = Node {
        self_value: 0,
        total: 0,
        samples: 0,
        ..new_tree.node(CallTree::ROOT).clone()
    };
    let mut merged = MergedTree {
        granularity: options.granularity,
        frames: vec![new_tree.frames[0].clone()],
        nodes: vec![root],
        frame_ids: FxHashMap::default(),
        child_ids: FxHashMap::default(),
        sides: [vec![0], vec![0]],
    };
    merged.add(&base_tree, 0);
    merged.add(&new_tree, 1);
    let [base_values, new_values] = merged.sides;
    let tree = CallTree::from_nodes(&new_tree, merged.frames, merged.nodes);
    let total = match base_tree.total() {
        0 => new_tree.total(),
        t => t,
    };
    Ok((
        tree,
        DiffNodes {
            base: base_values,
            new: new_values,
            total,
        },
    ))
}

struct MergedTree {
    granularity: Granularity,
    frames: Vec<FrameInfo>,
    nodes: Vec<Node>,
    /// Merged frame of each frame key.
    frame_ids: FxHashMap<(String, String, i64), FrameId>,
    /// Merged node of each (parent, frame).
    child_ids: FxHashMap<(NodeId, FrameId), NodeId>,
    /// Base and new totals per merged node.
    sides: [Vec<i64>; 2],
}

impl MergedTree {
    /// Adds every node of `side` (0 = base, 1 = new) under the same path.
    fn add(&mut self, side_tree: &CallTree, side: usize) {
        let frames: Vec<FrameId> = side_tree
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                if i == 0 {
                    return 0; // the root's `all`, not a function of that name
                }
                let key = match self.granularity {
                    // By function, a function is one frame whatever file the
                    // side's first occurrence named (as `CallTree::build`).
                    Granularity::Function => (f.function.clone(), String::new(), 0),
                    Granularity::FileLine => (f.function.clone(), f.file.clone(), f.line),
                };
                let next = self.frames.len() as FrameId;
                let id = *self.frame_ids.entry(key).or_insert(next);
                if id == next {
                    self.frames.push(f.clone());
                }
                id
            })
            .collect();
        // The roots are one node: merged frame 0 is `all`.
        let mut stack: Vec<(NodeId, NodeId)> = vec![(CallTree::ROOT, CallTree::ROOT)];
        while let Some((from, to)) = stack.pop() {
            let node = side_tree.node(from);
            let merged = &mut self.nodes[to as usize];
            merged.self_value = merged.self_value.saturating_add(node.self_value);
            merged.total = merged.total.saturating_add(node.total);
            merged.samples = merged.samples.saturating_add(node.samples);
            self.sides[side][to as usize] = node.total;
            for &child in side_tree.children(from) {
                let frame = frames[side_tree.node(child).frame as usize];
                let next = self.nodes.len() as NodeId;
                let id = *self.child_ids.entry((to, frame)).or_insert(next);
                if id == next {
                    let depth = self.nodes[to as usize].depth + 1;
                    self.nodes.push(Node {
                        frame,
                        parent: to,
                        depth,
                        self_value: 0,
                        total: 0,
                        samples: 0,
                    });
                    self.sides[0].push(0);
                    self.sides[1].push(0);
                }
                stack.push((child, id));
            }
        }
    }
}
