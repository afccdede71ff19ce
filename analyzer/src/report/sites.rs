//! The report's allocation-site view, as memray's: the sites (call stacks) by bytes allocated
//! and by allocations made, in a table, and their stacks merged into one tree by bytes (the
//! page draws it as an icicle: the outermost frame on top, each frame as wide as the bytes
//! allocated below it).
//!
//! The sites are those of `isolate sites` ([`crate::sites`]: device memory only, stacks with
//! the same shown frames are one site); the tree is made here from their shown Python frames
//! (native frames for sites without any), so that a site's row and its branch of the tree
//! name the same code.

use crate::sites::{Collect, SiteStats};
use crate::track::{Ended, Live, Node, Observer};
use isolate_trace::{Frame, Record};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Sites the table lists (the page sorts them by bytes or by allocations).
pub const SITES_LISTED: usize = 60;
/// Nodes of the tree; the frames of sites past it add to their deepest node already there.
pub const TREE_NODES: usize = 2000;
/// Frames of a site the tree follows.
const TREE_DEPTH: usize = 48;
/// Frames a site's row shows when opened.
const ROW_LINES: usize = 12;

/// What a row of the table is: the innermost Python frame of a stack (code, line), or, for a
/// stack without one, the stack itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Place {
    Python(u32, u32),
    Stack(u32),
}

/// The observer of the site view: [`Collect`]'s counts per stack, and the device memory live
/// per place (what a row is), for the most of it in use at once.
#[derive(Default)]
pub(super) struct SiteObs {
    collect: Collect,
    place_of: FxHashMap<u32, Place>,
    /// Place → (live bytes, the most live at once).
    live: FxHashMap<Place, (u64, u64)>,
}

impl SiteObs {
    fn place(&mut self, stack: u32) -> Place {
        let table = self.collect.table();
        *self.place_of.entry(stack).or_insert_with(|| {
            table
                .stack(stack)
                .and_then(|(frames, _)| {
                    frames.iter().find_map(|f| match *f {
                        Frame::Python { code, line } => Some(Place::Python(code, line)),
                        Frame::Native(_) => None,
                    })
                })
                .unwrap_or(Place::Stack(stack))
        })
    }

    /// The stacks read.
    pub(super) fn table(&self) -> &crate::stacks::StackTable {
        self.collect.table()
    }

    /// The site view ([`view`]).
    pub(super) fn view(self) -> Option<SiteView> {
        let table = self.collect.table();
        let mut peak: FxHashMap<String, u64> = FxHashMap::default();
        for (p, (_, most)) in &self.live {
            let name = match *p {
                Place::Python(code, line) => table
                    .code(code)
                    .map(|c| format!("{}:{line} in {}", c.file, c.name)),
                Place::Stack(_) => None,
            };
            if let Some(n) = name {
                let e = peak.entry(n).or_default();
                *e = (*e).max(*most);
            }
        }
        view(self.collect.named(), &peak)
    }
}

impl Observer for SiteObs {
    fn started(&mut self, n: &Node, live: &Live) {
        self.collect.started(n, live);
        if n.category.is_device_memory() && n.stack != 0 {
            let p = self.place(n.stack);
            let e = self.live.entry(p).or_default();
            e.0 = e.0.saturating_add(n.size);
            e.1 = e.1.max(e.0);
        }
    }

    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        self.collect.ended(n, e, live);
        if n.category.is_device_memory()
            && n.stack != 0
            && let Some(p) = self.place_of.get(&n.stack)
            && let Some(l) = self.live.get_mut(p)
        {
            l.0 = l.0.saturating_sub(n.size);
        }
    }

    fn other(&mut self, rec: &Record, live: &Live) {
        self.collect.other(rec, live);
    }
}

/// One row of the site table: the sites (stacks) of one place in the code, as memray's table
/// has one row a location.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SiteRow {
    /// Where in the code (`train.py:39 in main`, [`crate::finding::place`]'s rule: the
    /// innermost Python frame), else the site's name (stacks without Python frames: one row
    /// a stack).
    pub place: String,
    /// How many distinct stacks (sites) it holds.
    pub stacks: u64,
    pub allocations: u64,
    pub bytes: u64,
    /// The most of its memory live at once.
    pub peak_live_bytes: u64,
    /// Live at the end of the trace.
    pub held_at_end: u64,
    /// The shown frames of its largest stack, as the text shows them.
    pub lines: Vec<String>,
}

/// The stacks of every site merged, as flat arrays (node 0 is the root, all device memory):
/// node `i`'s frame is `name[i]`, its parent `parent[i]` (the root's is 0), and the bytes and
/// allocations of the sites at or below it `bytes[i]`, `count[i]`. Children come after their
/// parent, largest first.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Tree {
    pub name: Vec<String>,
    pub parent: Vec<u32>,
    pub bytes: Vec<u64>,
    pub count: Vec<u64>,
}

/// The site view of one trace.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SiteView {
    /// Sites (stacks) in all, the places they are at (rows of the table in all), and their
    /// device memory allocations and bytes.
    pub site_count: usize,
    pub place_count: usize,
    pub allocations: u64,
    pub bytes: u64,
    /// The largest [`SITES_LISTED`] by bytes, then those by allocations not among them.
    pub rows: Vec<SiteRow>,
    pub tree: Tree,
}

struct TreeNode {
    name: String,
    bytes: u64,
    count: u64,
    kids: Vec<usize>,
}

/// What a site's branch of the tree is, outermost first: its shown Python frames when it has
/// any (the code that asked, as memray shows it; the native frames below the innermost one
/// are in the site's row); else, for allocations made with no Python frame on the thread (an
/// autograd thread's, a C library's), one node for all of those and the site's name.
fn tree_frames(s: &SiteStats) -> Vec<String> {
    let Some(st) = &s.stack else {
        return vec![s.site.clone()];
    };
    let mut v: Vec<String> = st
        .visible()
        .filter(|f| f.kind == "python")
        .map(|f| f.label())
        .collect();
    if v.is_empty() {
        return vec![NO_PYTHON.to_owned(), s.site.clone()];
    }
    v.reverse();
    v
}

/// The tree's node for the allocations made without a Python frame.
const NO_PYTHON: &str = "no Python frames (native code, another thread)";

/// The site view of `sites` (one trace's, from [`crate::sites::Collect::named`]), with the most
/// each Python place had live at once (`peak`, by its place); `None` when no allocation has a
/// stack.
fn view(sites: Vec<SiteStats>, peak: &FxHashMap<String, u64>) -> Option<SiteView> {
    if !sites.iter().any(|s| s.stack.is_some()) {
        return None;
    }
    let allocations = sites
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.allocations));
    let bytes = sites.iter().fold(0u64, |a, s| a.saturating_add(s.bytes));
    let site_count = sites.len();

    // The tree, from the outermost shown frame in.
    let mut nodes = vec![TreeNode {
        name: "all device memory".into(),
        bytes: 0,
        count: 0,
        kids: Vec::new(),
    }];
    for s in &sites {
        let frames = tree_frames(s);
        let mut at = 0;
        nodes[0].bytes = nodes[0].bytes.saturating_add(s.bytes);
        nodes[0].count = nodes[0].count.saturating_add(s.allocations);
        for f in frames.into_iter().take(TREE_DEPTH) {
            let next = match nodes[at].kids.iter().find(|&&k| nodes[k].name == f) {
                Some(&k) => k,
                None if nodes.len() < TREE_NODES => {
                    nodes.push(TreeNode {
                        name: f,
                        bytes: 0,
                        count: 0,
                        kids: Vec::new(),
                    });
                    let k = nodes.len() - 1;
                    nodes[at].kids.push(k);
                    k
                }
                None => break,
            };
            at = next;
            nodes[at].bytes = nodes[at].bytes.saturating_add(s.bytes);
            nodes[at].count = nodes[at].count.saturating_add(s.allocations);
        }
    }
    // Flattened breadth-first, children largest first.
    let mut tree = Tree::default();
    let mut queue = std::collections::VecDeque::from([(0usize, 0u32)]);
    while let Some((i, parent)) = queue.pop_front() {
        let me = tree.name.len() as u32;
        let n = &mut nodes[i];
        tree.name.push(std::mem::take(&mut n.name));
        tree.parent.push(parent);
        tree.bytes.push(n.bytes);
        tree.count.push(n.count);
        let mut kids = std::mem::take(&mut n.kids);
        kids.sort_by(|&a, &b| {
            nodes[b]
                .bytes
                .cmp(&nodes[a].bytes)
                .then(nodes[b].count.cmp(&nodes[a].count))
        });
        queue.extend(kids.into_iter().map(|k| (k, me)));
    }

    // The rows: one a place, its largest stack first.
    let mut rows: Vec<(SiteRow, u64)> = Vec::new();
    let mut at: FxHashMap<String, usize> = FxHashMap::default();
    let mut sites = sites;
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    for s in &sites {
        let python = s
            .stack
            .as_ref()
            .is_some_and(|st| st.visible().any(|f| f.kind == "python"));
        let place = crate::finding::place(s.stack.as_ref()).unwrap_or_else(|| s.site.clone());
        // Stacks without Python frames are a row each (their place is only their first frame).
        let key = if python { place.clone() } else { s.key.clone() };
        match at.get(&key) {
            Some(&i) => {
                let (r, held) = &mut rows[i];
                r.stacks += 1;
                r.allocations = r.allocations.saturating_add(s.allocations);
                r.bytes = r.bytes.saturating_add(s.bytes);
                *held = held.saturating_add(s.held_at_end.bytes);
                r.peak_live_bytes = r.peak_live_bytes.max(s.peak_live_bytes);
            }
            None => {
                at.insert(key, rows.len());
                rows.push((
                    SiteRow {
                        peak_live_bytes: if python {
                            peak.get(&place).copied().unwrap_or(s.peak_live_bytes)
                        } else {
                            s.peak_live_bytes
                        },
                        place,
                        stacks: 1,
                        allocations: s.allocations,
                        bytes: s.bytes,
                        held_at_end: 0,
                        lines: s
                            .stack
                            .as_ref()
                            .map(|st| st.text_lines(ROW_LINES))
                            .unwrap_or_default(),
                    },
                    s.held_at_end.bytes,
                ));
            }
        }
    }
    let place_count = rows.len();
    let mut rows: Vec<SiteRow> = rows
        .into_iter()
        .map(|(mut r, held)| {
            r.held_at_end = held;
            r
        })
        .collect();
    // The largest by bytes, then the most frequent not among them.
    rows.sort_by(|a, b| {
        (b.bytes, b.allocations)
            .cmp(&(a.bytes, a.allocations))
            .then_with(|| a.place.cmp(&b.place))
    });
    let mut rest = rows.split_off(rows.len().min(SITES_LISTED));
    rest.sort_by(|a, b| {
        (b.allocations, b.bytes)
            .cmp(&(a.allocations, a.bytes))
            .then_with(|| a.place.cmp(&b.place))
    });
    let min_count = rows.iter().map(|s| s.allocations).min().unwrap_or(0);
    rows.extend(
        rest.into_iter()
            .take(SITES_LISTED)
            .filter(|s| s.allocations > min_count),
    );
    Some(SiteView {
        site_count,
        place_count,
        allocations,
        bytes,
        rows,
        tree,
    })
}
