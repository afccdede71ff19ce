//! The base layer: CUDA types, every real function the library calls and how it is found, the
//! settings, and thin OS helpers. Nothing here knows about recording, policies, hooks or process
//! life.

// Every unsafe block in this layer says why it is sound (issue 29, item 5).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod cu;
pub mod cuda;
pub mod got;
pub mod loader;
pub mod real;
pub mod resolve;
pub mod sys;
