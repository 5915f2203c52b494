//! The sandwich of one function: who calls it (its callers tree, inverted,
//! the function as root) above what it calls (its callees tree, the
//! function as root), as Pyroscope's and Parca's sandwich views show it.
//!
//! Both trees are built from a [`CallTree`], not from the profile: every
//! node of the function that has no ancestor of the same function (its
//! outermost occurrence on a path) contributes its total once, so a
//! recursive function's samples count once and both roots carry the
//! function's total as the table shows it. Recursion stays visible inside
//! the callees tree (`f → g → f`); the callers tree lists the callers of the
//! outermost calls only.

use rustc_hash::FxHashMap;

use crate::tree::{CallTree, FrameId, Node, NodeId};

/// A function's callers above its callees.
#[derive(Debug, Clone)]
pub struct Sandwich {
    /// The function (a frame of the tree it was built from, all of whose
    /// nodes of the same function name are merged).
    pub function: String,
    /// Self of the function in the whole profile (every occurrence).
    pub self_value: i64,
    /// Total of the function in the whole profile, each sample once.
    pub total: i64,
    /// The whole profile's total, for percentages of the profile.
    pub profile_total: i64,
    /// Callers, inverted: the root is the function, its children are its
    /// direct callers, theirs the callers' callers, up to the stack roots.
    /// A node's self is the value of the stacks that start at it.
    pub callers: CallTree,
    /// Callees: the root is the function, below it everything it calls.
    pub callees: CallTree,
}

impl Sandwich {
    /// `value` as a percentage of the whole profile (0 when it is empty).
    pub fn percent(&self, value: i64) -> f64 {
        crate::tree::percent_of(value, self.profile_total)
    }
}

/// Merges paths of frames into a tree whose root shows `root_frame`.
struct Builder {
    nodes: Vec<Node>,
    index: FxHashMap<(NodeId, FrameId), NodeId>,
}

impl Builder {
    fn new(root_frame: FrameId) -> Builder {
        Builder {
            nodes: vec![Node::empty(root_frame, CallTree::ROOT, 0)],
            index: FxHashMap::default(),
        }
    }

    /// The child of `parent` showing `frame`, created when missing.
    fn child(&mut self, parent: NodeId, frame: FrameId) -> NodeId {
        let next = self.nodes.len() as NodeId;
        let id = *self.index.entry((parent, frame)).or_insert(next);
        if id == next {
            let depth = self.nodes[parent as usize].depth + 1;
            self.nodes.push(Node::empty(frame, parent, depth));
        }
        id
    }

    /// Adds `value` and `samples` to what ends at `node`.
    fn add_self(&mut self, node: NodeId, value: i64, samples: i64) {
        let n = &mut self.nodes[node as usize];
        n.self_value = n.self_value.saturating_add(value);
        n.samples = n.samples.saturating_add(samples);
    }

    /// The nodes with totals summed bottom-up (children come after their
    /// parents); `samples` turns from "ending here" into "passing through".
    fn finish(mut self) -> Vec<Node> {
        for i in (0..self.nodes.len()).rev() {
            let node = &mut self.nodes[i];
            node.total = node.total.saturating_add(node.self_value);
            let (total, samples, parent) = (node.total, node.samples, node.parent as usize);
            if i != 0 {
                let p = &mut self.nodes[parent];
                p.total = p.total.saturating_add(total);
                p.samples = p.samples.saturating_add(samples);
            }
        }
        self.nodes
    }
}

/// Samples of `id` that end at it: through it minus through its children.
fn self_samples(tree: &CallTree, id: NodeId) -> i64 {
    let through_children = tree
        .children(id)
        .iter()
        .fold(0i64, |a, &c| a.saturating_add(tree.node(c).samples));
    tree.node(id).samples.saturating_sub(through_children)
}

/// The sandwich of the function frame `frame` of `tree` shows (by its name,
/// as the table's rows at function granularity; at file:line granularity
/// every line of the function is merged too). `None` when `frame` is the
/// root or no sample reaches the function.
pub fn sandwich(tree: &CallTree, frame: FrameId) -> Option<Sandwich> {
    if frame == 0 || frame as usize >= tree.frames.len() {
        return None;
    }
    let name = tree.frames[frame as usize].function.as_str();
    let is_function: Vec<bool> = tree.frames.iter().map(|f| f.function == name).collect();
    let mut callers = Builder::new(frame);
    let mut callees = Builder::new(frame);
    let mut self_value = 0i64;
    let mut total = 0i64;

    // Depth-first. `at` is where a node goes in the callees tree, `inside`
    // whether an ancestor is the function: a node of the function outside
    // any is an outermost occurrence.
    let mut stack: Vec<(NodeId, NodeId, bool)> = vec![(CallTree::ROOT, CallTree::ROOT, false)];
    while let Some((id, at, inside)) = stack.pop() {
        let node = tree.node(id);
        let mine = id != CallTree::ROOT && is_function[node.frame as usize];
        if mine {
            self_value = self_value.saturating_add(node.self_value);
        }
        let at = if inside {
            let c = callees.child(at, node.frame);
            callees.add_self(c, node.self_value, self_samples(tree, id));
            c
        } else if mine {
            total = total.saturating_add(node.total);
            callees.add_self(CallTree::ROOT, node.self_value, self_samples(tree, id));
            // Its callers, nearest first, under the root; the stack's first
            // frame is where its value ends.
            let mut c = CallTree::ROOT;
            let mut p = node.parent;
            while p != CallTree::ROOT {
                c = callers.child(c, tree.node(p).frame);
                p = tree.node(p).parent;
            }
            callers.add_self(c, node.total, node.samples);
            CallTree::ROOT
        } else {
            CallTree::ROOT
        };
        let inside = inside || mine;
        stack.extend(tree.children(id).iter().map(|&c| (c, at, inside)));
    }
    if total == 0 && self_value == 0 {
        return None;
    }
    let frames = tree.frames.clone();
    Some(Sandwich {
        function: name.to_owned(),
        self_value,
        total,
        profile_total: tree.total(),
        callers: CallTree::from_nodes(tree, frames.clone(), callers.finish()),
        callees: CallTree::from_nodes(tree, frames, callees.finish()),
    })
}
