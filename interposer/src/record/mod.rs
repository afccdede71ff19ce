//! The recording layer: the per-thread "inside a hook" flag, the trace header, the writer
//! thread, events (sequence numbers, timing) handed to it, and running counters over what it
//! was handed (tally), call stacks (stacks). Below the policies: it records what it is given and decides nothing.

// Every unsafe block in this layer says why it is sound (issue 29, item 5).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod event;
pub mod header;
pub mod profile;
pub mod stacks;
pub mod tally;
pub mod thread;
pub mod writer;
