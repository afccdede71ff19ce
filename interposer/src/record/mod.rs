//! The recording layer: the per-thread "inside a hook" flag, the trace header, the writer
//! thread, and events (sequence numbers, timing) handed to it. Below the policies: it records
//! what it is given and decides nothing.

pub mod event;
pub mod header;
pub mod thread;
pub mod writer;
