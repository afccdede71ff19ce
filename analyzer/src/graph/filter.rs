//! Which nodes a filtered graph keeps (`--address`, `--size-class`, `--from`, `--to`): what can
//! be decided when a node starts, and the whole decision once it has ended.

use crate::track::{Category, Ended, Node};
use crate::util::{hex, size_class};
use serde::Serialize;

/// Which chains to keep. Every filter set must hold; edges and anomalies stay when the nodes
/// they name do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Filter {
    /// Keep nodes that cover this address (and the handles mapped there).
    #[serde(serialize_with = "ser_opt_hex")]
    pub address: Option<u64>,
    /// Keep nodes whose [`size_class`] is that of this size.
    pub size_class: Option<u64>,
    /// Keep nodes live at some time in `[from, to]` (trace clock, ns, as in `alloc_ts_ns`).
    pub from_ns: Option<u64>,
    pub to_ns: Option<u64>,
}

fn ser_opt_hex<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&hex(*v)),
        None => s.serialize_none(),
    }
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    /// What can be decided when the node starts (handles wait for their mappings).
    pub(super) fn keep_at_start(&self, n: &Node) -> bool {
        if let Some(a) = self.address
            && n.category != Category::Handle
            && !n.covers(a)
        {
            return false;
        }
        if let Some(c) = self.size_class
            && size_class(n.size) != size_class(c)
        {
            return false;
        }
        if let Some(t) = self.to_ns
            && n.ts_ns > t
        {
            return false;
        }
        true
    }

    /// The whole decision, once the node has ended (or the trace has).
    pub(super) fn keep(&self, n: &Node, end: Option<&Ended>, wanted_handle: bool) -> bool {
        if self.address.is_some() && n.category == Category::Handle && !wanted_handle {
            return false;
        }
        if let Some(f) = self.from_ns
            && end.is_some_and(|e| e.ts_ns < f)
        {
            return false;
        }
        self.keep_at_start(n)
    }
}
