//! The call tree: every distinct root-to-leaf path of the profile, merged by
//! function (or by file:line), with self and total per node.

use edgeprof_pprof::{Function, Location, Profile, ReportError, SampleIndex};
use rustc_hash::FxHashMap;

/// Index of a node in [`CallTree::nodes`]; [`CallTree::ROOT`] is the
/// synthetic root that every stack hangs from.
pub type NodeId = u32;

/// Index of a frame in [`CallTree::frames`].
pub type FrameId = u32;

/// What makes two frames the same node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Granularity {
    /// One node per function name, as `go tool pprof` does by default.
    #[default]
    Function,
    /// One node per function, file and line.
    FileLine,
}

/// How to build a [`CallTree`].
#[derive(Debug, Clone, Default)]
pub struct TreeOptions {
    /// Which sample value to read; `None` = the profile's default.
    pub sample_index: Option<SampleIndex>,
    /// What makes two frames the same node.
    pub granularity: Granularity,
    /// Group by this label key: every stack hangs from a frame named
    /// `KEY=VALUE` (`KEY=(none)` for samples without the key), so the
    /// flamegraph has a root per value, as pprof's `-tagroot`.
    pub group_by: Option<String>,
}

/// One distinct frame: what a node shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameInfo {
    /// Function name.
    pub function: String,
    /// Source file, `""` when unknown.
    pub file: String,
    /// Source line, 0 when unknown: the call's line with
    /// [`Granularity::FileLine`], the function's first line otherwise.
    pub line: i64,
}

impl FrameInfo {
    /// `file:line`, `file`, or `""`, as the details bar prints it.
    pub fn location(&self) -> String {
        match (self.file.is_empty(), self.line) {
            (true, _) => String::new(),
            (false, 0) => self.file.clone(),
            (false, line) => format!("{}:{line}", self.file),
        }
    }
}

/// One node of the call tree: a frame reached by one particular path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// What this node shows.
    pub frame: FrameId,
    /// The caller; the root is its own parent.
    pub parent: NodeId,
    /// Distance from the root (the root is 0).
    pub depth: u32,
    /// Value of samples whose leaf is this node.
    pub self_value: i64,
    /// Value of samples passing through this node. A path visits a node once,
    /// so recursion never counts a sample twice here.
    pub total: i64,
    /// Samples passing through this node (see [`CallTree::samples_type`]).
    pub samples: i64,
}

impl Node {
    /// A node of `frame` under `parent` with no value yet.
    pub(crate) fn empty(frame: FrameId, parent: NodeId, depth: u32) -> Node {
        Node {
            frame,
            parent,
            depth,
            self_value: 0,
            total: 0,
            samples: 0,
        }
    }
}

/// The call tree of one sample type of a profile.
#[derive(Debug, Clone)]
pub struct CallTree {
    /// Distinct frames; `frames[0]` is the root's, named `all`.
    pub frames: Vec<FrameInfo>,
    /// Nodes; `nodes[0]` is the root. Parents come before their children.
    pub nodes: Vec<Node>,
    /// `children[child_start[n]..child_start[n + 1]]`: the callees of node
    /// `n`, widest first (then by name) so layouts are deterministic. One
    /// array rather than a `Vec` per node: a big tree has a million nodes.
    children: Vec<NodeId>,
    child_start: Vec<u32>,
    /// Position of the sample type read.
    pub sample_index: usize,
    /// Its type, e.g. `cpu`.
    pub sample_type: String,
    /// Its unit, e.g. `nanoseconds`.
    pub unit: String,
    /// Every sample type of the profile as `(type, unit)`, for pickers.
    pub sample_types: Vec<(String, String)>,
    /// What [`Node::samples`] counts: the `samples` sample type when the
    /// profile has one, else sample records.
    pub samples_type: String,
    /// The granularity the tree was built with.
    pub granularity: Granularity,
    /// The label key the tree is grouped by, if any.
    pub group_by: Option<String>,
}

/// The identity of a frame `(function, file, line)`, then the file and line
/// it shows.
type FrameKey<'a> = ((&'a str, &'a str, i64), &'a str, i64);

struct Lookup<'a> {
    profile: &'a Profile,
    locations: FxHashMap<u64, &'a Location>,
    functions: FxHashMap<u64, &'a Function>,
}

impl CallTree {
    /// The root node.
    pub const ROOT: NodeId = 0;

    /// Builds the tree of `profile` (which should be validated, as
    /// [`edgeprof_pprof::decode`] does; dangling ids show as `<unknown>`).
    pub fn build(profile: &Profile, options: &TreeOptions) -> Result<CallTree, ReportError> {
        let vi = edgeprof_pprof::resolve_sample_index(profile, options.sample_index.as_ref())?;
        let sample_types: Vec<(String, String)> = edgeprof_pprof::sample_types(profile)
            .into_iter()
            .map(|(t, u)| (t.to_owned(), u.to_owned()))
            .collect();
        let samples_vi = sample_types.iter().position(|(t, _)| t == "samples");
        let lookup = Lookup {
            profile,
            locations: profile.location.iter().map(|l| (l.id, l)).collect(),
            functions: profile.function.iter().map(|f| (f.id, f)).collect(),
        };

        let mut tree = CallTree {
            frames: vec![FrameInfo {
                function: "all".into(),
                file: String::new(),
                line: 0,
            }],
            nodes: vec![Node {
                frame: 0,
                parent: Self::ROOT,
                depth: 0,
                self_value: 0,
                total: 0,
                samples: 0,
            }],
            children: Vec::new(),
            child_start: Vec::new(),
            sample_index: vi,
            sample_type: sample_types[vi].0.clone(),
            unit: sample_types[vi].1.clone(),
            samples_type: match samples_vi {
                Some(_) => "samples".into(),
                None => "sample records".into(),
            },
            sample_types,
            granularity: options.granularity,
            group_by: options.group_by.clone(),
        };

        // Frames of each location, outermost first, as frame ids: computed
        // once per location, not once per sample.
        let mut frame_ids: FxHashMap<(&str, &str, i64), FrameId> = FxHashMap::default();
        let mut location_frames: FxHashMap<u64, Vec<FrameId>> = FxHashMap::default();
        for loc in &profile.location {
            let frames = lookup.frames(loc.id, options.granularity);
            let ids = frames
                .into_iter()
                .rev()
                .map(|(key, file, line)| {
                    *frame_ids.entry(key).or_insert_with(|| {
                        tree.frames.push(FrameInfo {
                            function: key.0.to_owned(),
                            file: file.to_owned(),
                            line,
                        });
                        (tree.frames.len() - 1) as FrameId
                    })
                })
                .collect();
            location_frames.insert(loc.id, ids);
        }
        let unknown_frame = {
            let key = ("<unknown>", "", 0);
            *frame_ids.entry(key).or_insert_with(|| {
                tree.frames.push(FrameInfo {
                    function: key.0.into(),
                    file: String::new(),
                    line: 0,
                });
                (tree.frames.len() - 1) as FrameId
            })
        };
        let unknown = vec![unknown_frame];

        // 0. With a group-by, the frame of each sample's label value.
        let mut group_frames: FxHashMap<String, FrameId> = FxHashMap::default();
        let mut group_of = |sample: &edgeprof_pprof::Sample, frames: &mut Vec<FrameInfo>| {
            let key = options.group_by.as_deref()?;
            let s = |i| edgeprof_pprof::string(profile, i);
            let value = sample.label.iter().find(|l| s(l.key) == key).map_or_else(
                || "(none)".to_owned(),
                |l| {
                    if l.str != 0 {
                        s(l.str).to_owned()
                    } else {
                        format!("{}{}", l.num, s(l.num_unit))
                    }
                },
            );
            Some(*group_frames.entry(value).or_insert_with_key(|value| {
                frames.push(FrameInfo {
                    function: format!("{key}={value}"),
                    file: String::new(),
                    line: 0,
                });
                (frames.len() - 1) as FrameId
            }))
        };

        // 1. Merge samples with the same stack (and group): a big profile
        //    repeats few stacks many times (1 M samples over 100 k stacks).
        type StackKey<'a> = (Option<FrameId>, &'a [u64]);
        let mut by_stack: FxHashMap<StackKey, usize> = FxHashMap::default();
        let mut stacks: Vec<(StackKey, i64, i64)> = Vec::new();
        for sample in &profile.sample {
            let v = sample.value.get(vi).copied().unwrap_or(0);
            let n = match samples_vi {
                Some(si) => sample.value.get(si).copied().unwrap_or(0),
                None => 1,
            };
            if v == 0 && n == 0 {
                continue;
            }
            let key = (
                group_of(sample, &mut tree.frames),
                sample.location_id.as_slice(),
            );
            let i = *by_stack.entry(key).or_insert_with(|| {
                stacks.push((key, 0, 0));
                stacks.len() - 1
            });
            let slot = &mut stacks[i];
            slot.1 = slot.1.saturating_add(v);
            slot.2 = slot.2.saturating_add(n);
        }
        drop(by_stack);

        // 2. Each stack as frame ids, root first, in one arena.
        let mut arena: Vec<FrameId> = Vec::new();
        let mut paths: Vec<(std::ops::Range<usize>, i64, i64)> = Vec::with_capacity(stacks.len());
        for &((group, ids), v, n) in &stacks {
            let start = arena.len();
            arena.extend(group);
            for id in ids.iter().rev() {
                arena.extend_from_slice(location_frames.get(id).unwrap_or(&unknown));
            }
            paths.push((start..arena.len(), v, n));
        }
        drop(stacks);

        // 3. In sorted order, a path shares the longest prefix it can share
        //    with any other path with the one just before it: walk down that
        //    prefix and create the rest, no lookups needed.
        paths.sort_unstable_by(|a, b| arena[a.0.clone()].cmp(&arena[b.0.clone()]));
        let mut path: Vec<NodeId> = vec![Self::ROOT];
        let mut previous: &[FrameId] = &[];
        let mut samples = vec![0i64];
        for (range, v, n) in paths {
            let frames = &arena[range];
            let common = frames
                .iter()
                .zip(previous)
                .take_while(|(a, b)| a == b)
                .count();
            path.truncate(common + 1);
            for &frame in &frames[common..] {
                let parent = *path.last().unwrap_or(&Self::ROOT);
                let id = tree.nodes.len() as NodeId;
                let depth = tree.nodes[parent as usize].depth + 1;
                tree.nodes.push(Node::empty(frame, parent, depth));
                samples.push(0);
                path.push(id);
            }
            let leaf = *path.last().unwrap_or(&Self::ROOT) as usize;
            tree.nodes[leaf].self_value = tree.nodes[leaf].self_value.saturating_add(v);
            samples[leaf] = samples[leaf].saturating_add(n);
            previous = frames;
        }

        // 4. Totals bottom-up: children come after their parents.
        for i in (0..tree.nodes.len()).rev() {
            let node = &mut tree.nodes[i];
            node.total = node.total.saturating_add(node.self_value);
            node.samples = node.samples.saturating_add(samples[i]);
            let (total, count, parent) = (node.total, node.samples, node.parent as usize);
            if i != 0 {
                let p = &mut tree.nodes[parent];
                p.total = p.total.saturating_add(total);
                p.samples = p.samples.saturating_add(count);
            }
        }
        // Unused frames (locations no sample reaches) stay in the table; they
        // cost little and keep frame ids independent of the sample index.
        tree.index_children();
        Ok(tree)
    }

    /// A tree of `frames` and `nodes` (`frames[0]` and `nodes[0]` the root,
    /// parents before children) of the sample type and granularity of `like`.
    pub(crate) fn from_nodes(
        like: &CallTree,
        frames: Vec<FrameInfo>,
        nodes: Vec<Node>,
    ) -> CallTree {
        let mut tree = CallTree {
            frames,
            nodes,
            children: Vec::new(),
            child_start: Vec::new(),
            sample_index: like.sample_index,
            sample_type: like.sample_type.clone(),
            unit: like.unit.clone(),
            sample_types: like.sample_types.clone(),
            samples_type: like.samples_type.clone(),
            granularity: like.granularity,
            group_by: like.group_by.clone(),
        };
        tree.index_children();
        tree
    }

    fn index_children(&mut self) {
        let n = self.nodes.len();
        let mut start = vec![0u32; n + 1];
        for node in &self.nodes[1..] {
            start[node.parent as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut children = vec![0 as NodeId; n.saturating_sub(1)];
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            let slot = &mut fill[node.parent as usize];
            children[*slot as usize] = i as NodeId;
            *slot += 1;
        }
        for i in 0..n {
            let slice = &mut children[start[i] as usize..start[i + 1] as usize];
            if slice.len() < 2 {
                continue;
            }
            slice.sort_by(|&a, &b| {
                let (na, nb) = (&self.nodes[a as usize], &self.nodes[b as usize]);
                nb.total.cmp(&na.total).then_with(|| {
                    let (fa, fb) = (
                        &self.frames[na.frame as usize],
                        &self.frames[nb.frame as usize],
                    );
                    fa.function
                        .cmp(&fb.function)
                        .then_with(|| fa.file.cmp(&fb.file))
                        .then_with(|| fa.line.cmp(&fb.line))
                })
            });
        }
        self.children = children;
        self.child_start = start;
    }

    /// The callees of `id`, widest first (then by name).
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        let i = id as usize;
        &self.children[self.child_start[i] as usize..self.child_start[i + 1] as usize]
    }

    /// The node `id`; panics if it is not from this tree.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// The frame node `id` shows.
    pub fn frame(&self, id: NodeId) -> &FrameInfo {
        &self.frames[self.nodes[id as usize].frame as usize]
    }

    /// Total of the whole profile: the root's total.
    pub fn total(&self) -> i64 {
        self.nodes[0].total
    }

    /// `value` as a percentage of the whole profile (0 when it is empty).
    pub fn percent(&self, value: i64) -> f64 {
        percent_of(value, self.total())
    }

    /// `value` in the profile's unit, readable (`1.50s`, `3.20MB`).
    pub fn format(&self, value: i64) -> String {
        edgeprof_pprof::format_value(value, &self.unit)
    }

    /// The path from the root to `id`, root first: the breadcrumbs of a
    /// focus on `id`.
    pub fn path(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = vec![id];
        let mut node = id;
        while node != Self::ROOT {
            node = self.nodes[node as usize].parent;
            path.push(node);
        }
        path.reverse();
        path
    }

    /// What a hover or selection of `id` shows.
    pub fn details(&self, id: NodeId) -> Details {
        let node = self.node(id);
        let frame = self.frame(id);
        Details {
            function: frame.function.clone(),
            location: frame.location(),
            self_value: node.self_value,
            total: node.total,
            self_percent: self.percent(node.self_value),
            total_percent: self.percent(node.total),
            samples: node.samples,
        }
    }
}

/// Hover/selection details of one node; percentages are of the whole profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Details {
    /// Function name.
    pub function: String,
    /// `file:line`, or `""` when unknown.
    pub location: String,
    /// Self value.
    pub self_value: i64,
    /// Total value.
    pub total: i64,
    /// Self as % of the profile.
    pub self_percent: f64,
    /// Total as % of the profile.
    pub total_percent: f64,
    /// Samples through the node.
    pub samples: i64,
}

impl Details {
    /// One line, most important first so a narrow screen cuts the least
    /// useful part: `handle  total 40ms (52.0%)  self 1.20ms (3.1%)  17 samples  src/lib.rs:12`.
    pub fn to_line(&self, tree: &CallTree) -> String {
        let mut line = format!(
            "{}  total {} ({:.1}%)  self {} ({:.1}%)  {} {}",
            self.function,
            tree.format(self.total),
            self.total_percent,
            tree.format(self.self_value),
            self.self_percent,
            self.samples,
            if tree.samples_type == "samples" {
                "samples"
            } else {
                "records"
            },
        );
        if !self.location.is_empty() {
            line.push_str("  ");
            line.push_str(&self.location);
        }
        line
    }
}

impl<'a> Lookup<'a> {
    /// `(function, file, line)` keys of location `id`, innermost first,
    /// as `edgeprof_pprof::stack_frames` expands them.
    fn frames(&self, id: u64, granularity: Granularity) -> Vec<FrameKey<'a>> {
        let p = self.profile;
        let s = |i: i64| edgeprof_pprof::string(p, i);
        let Some(loc) = self.locations.get(&id) else {
            return vec![(("<unknown>", "", 0), "", 0)];
        };
        if loc.line.is_empty() {
            let module = p
                .mapping
                .iter()
                .find(|m| m.id == loc.mapping_id)
                .map(|m| s(m.filename))
                .unwrap_or("");
            let name = if module.is_empty() {
                "<unknown>"
            } else {
                module
            };
            return vec![((name, "", 0), "", 0)];
        }
        loc.line
            .iter()
            .map(|line| {
                let (name, file, start) = match self.functions.get(&line.function_id) {
                    Some(f) => (s(f.name), s(f.filename), f.start_line),
                    None => ("<unknown>", "", 0),
                };
                match granularity {
                    // By function, two functions of one name are one node
                    // (as pprof's `-top`), whatever their files; the node
                    // shows the first one's file and first line.
                    Granularity::Function => ((name, "", 0), file, start),
                    Granularity::FileLine => ((name, file, line.line), file, line.line),
                }
            })
            .collect()
    }
}

/// `value` as a percentage of `total` (0 when `total` is 0).
pub(crate) fn percent_of(value: i64, total: i64) -> f64 {
    if total == 0 {
        0.0
    } else {
        value as f64 * 100.0 / total as f64
    }
}
