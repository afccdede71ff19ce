//! # libisolate.so
//!
//! An `LD_PRELOAD` library that intercepts every CUDA device-memory allocation of an unmodified
//! process and records it (`ISOLATE_MODE=log`), or also keeps freed memory out of circulation
//! (`ISOLATE_MODE=isolate`). Layers, from the bottom:
//!
//! - [`base`]: CUDA types, every real function the library calls and how it is found, the
//!   settings;
//! - [`record`]: the "inside a hook" flag, events and sequence numbers, the writer thread;
//! - [`policy`]: log, isolate (with guard mode) and the launch check, side by side;
//! - [`life`]: process life — exit, `_exit`, exec, signals, fork;
//! - [`hooks`]: the exported entry points, thin, declared once each.
//!
//! Arrows point down only: a module uses modules of its own layer or below, never above
//! (`tests/layers.rs` checks every `use`).
//!
//! x86-64 Linux with glibc only (the `dlsym` stub is x86-64 assembly).

// Every unsafe block says why it is sound (docs/design.md, "Unsafe code"): for the whole crate,
// so a new module is covered too.
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("libisolate.so supports x86-64 Linux only");

pub mod base;
pub mod hooks;
pub mod life;
pub mod policy;
pub mod record;
