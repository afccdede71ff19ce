//! # libisolate.so
//!
//! An `LD_PRELOAD` library that intercepts every CUDA device-memory allocation of an unmodified
//! process and records it (`ISOLATE_MODE=log`), or also keeps freed memory out of circulation
//! (`ISOLATE_MODE=isolate`). Layers, from the bottom:
//!
//! - [`cuda`]: raw CUDA types and function-pointer types;
//! - [`resolve`]: finding the real functions, and which hook stands for which driver export;
//! - [`hooks`]: the exported entry points, thin;
//! - [`policy`] and [`record`]: what is recorded, and isolation;
//! - [`writer`] and [`lifecycle`]: the writer thread and the ways out of a process.
//!
//! x86-64 Linux with glibc only (the `dlsym` stub is x86-64 assembly).

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("libisolate.so supports x86-64 Linux only");

pub mod config;
pub mod cuda;
pub mod hooks;
pub mod lifecycle;
pub mod policy;
pub mod record;
pub mod resolve;
pub mod writer;
