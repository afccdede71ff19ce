//! The recording layer: the per-thread "inside a hook" flag, the trace header, the writer
//! thread, events (sequence numbers, timing) handed to it, and running counters over what it
//! was handed (tally), call stacks (stacks). Below the policies: it records what it is given and decides nothing.

pub mod event;
pub mod header;
pub mod profile;
pub mod stacks;
pub mod tally;
pub mod thread;
pub mod writer;
