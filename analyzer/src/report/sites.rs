//! The report's allocation-site view, as memray's: the sites (call stacks) by bytes allocated
//! and by allocations made, in a table, and their stacks merged into one tree by bytes (the
//! page draws it as an icicle: the outermost frame on top, each frame as wide as the bytes
//! allocated below it).
//!
//! The sites are those of `isolate sites` ([`crate::sites`]: device memory only, stacks with
//! the same shown frames are one site); the tree is made here from their shown Python frames
//! (native frames for sites without any), so that a site's row and its branch of the tree
//! name the same code.

use crate::sites::SiteStats;
use serde::Serialize;

/// Sites the table lists (the page sorts them by bytes or by allocations).
pub const SITES_LISTED: usize = 60;
/// Nodes of the tree; the frames of sites past it add to their deepest node already there.
pub const TREE_NODES: usize = 2000;
/// Frames of a site the tree follows.
const TREE_DEPTH: usize = 48;
/// Frames a site's row shows when opened.
const ROW_LINES: usize = 12;

/// One row of the site table.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SiteRow {
    /// Where in the code (`train.py:39 in main`, [`crate::finding::place`]'s rule), else the
    /// site's name.
    pub place: String,
    /// The site's name (its first shown frame).
    pub site: String,
    pub allocations: u64,
    pub bytes: u64,
    /// The most of its memory live at once.
    pub peak_live_bytes: u64,
    /// Live at the end of the trace.
    pub held_at_end: u64,
    /// Its shown frames, as the text shows them.
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
    /// Sites in all, and their device memory allocations and bytes.
    pub site_count: usize,
    pub allocations: u64,
    pub bytes: u64,
    /// The largest [`SITES_LISTED`] by bytes, then those by allocations not among them.
    pub rows: Vec<SiteRow>,
    pub tree: Tree,
}

struct Node {
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

/// The site view of `sites` (one trace's, from [`crate::sites::Collect::named`]); `None`
/// when no allocation has a stack.
pub(super) fn view(mut sites: Vec<SiteStats>) -> Option<SiteView> {
    if !sites.iter().any(|s| s.stack.is_some()) {
        return None;
    }
    let allocations = sites
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.allocations));
    let bytes = sites.iter().fold(0u64, |a, s| a.saturating_add(s.bytes));
    let site_count = sites.len();

    // The tree, from the outermost shown frame in.
    let mut nodes = vec![Node {
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
                    nodes.push(Node {
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

    // The rows: the largest by bytes, then the most frequent not among them.
    sites.sort_by(|a, b| {
        (b.bytes, b.allocations)
            .cmp(&(a.bytes, a.allocations))
            .then_with(|| a.site.cmp(&b.site))
    });
    let mut rows: Vec<&SiteStats> = sites.iter().take(SITES_LISTED).collect();
    let mut by_count: Vec<&SiteStats> = sites.iter().skip(SITES_LISTED).collect();
    by_count.sort_by(|a, b| {
        (b.allocations, b.bytes)
            .cmp(&(a.allocations, a.bytes))
            .then_with(|| a.site.cmp(&b.site))
    });
    let min_count = rows.iter().map(|s| s.allocations).min().unwrap_or(0);
    rows.extend(
        by_count
            .into_iter()
            .take(SITES_LISTED)
            .filter(|s| s.allocations > min_count),
    );
    let rows = rows
        .into_iter()
        .map(|s| SiteRow {
            place: crate::finding::place(s.stack.as_ref()).unwrap_or_else(|| s.site.clone()),
            site: s.site.clone(),
            allocations: s.allocations,
            bytes: s.bytes,
            peak_live_bytes: s.peak_live_bytes,
            held_at_end: s.held_at_end.bytes,
            lines: s
                .stack
                .as_ref()
                .map(|st| st.text_lines(ROW_LINES))
                .unwrap_or_default(),
        })
        .collect();
    Some(SiteView {
        site_count,
        allocations,
        bytes,
        rows,
        tree,
    })
}
