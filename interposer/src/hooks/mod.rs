//! The exported entry points, declared once each. A hook is thin: enter the per-thread guard,
//! call the policy (which calls the real function), return exactly what the real function
//! returned. Nothing here decides anything; the policies do.
//!
//! One [`hooks!`] row is the one place an entry point is declared: the export (its name and
//! C parameters) and its body in brackets. From it the macro writes the real function the hook
//! stands for (a [`crate::base::real::Real`] in the file's `reals` module, named as the export,
//! with the row's signature, looked up by the export name in the library the table's header
//! names: `in Driver` or `in Runtime`), the exported function, and the row of the file's table.
//! A row whose real function a lower layer also calls (`base/cu.rs`, the recorder, a policy)
//! cannot declare it here, since those layers may not use the hooks: that real function is
//! declared in [`crate::base::real`], with its C signature, and the row names it, `= NAME`,
//! before its body, giving its parameters' names only (`cuMemFree_v2(ptr) = MEM_FREE [...]`):
//! the types come from there ([`crate::base::real::signature_of`]), so the signature is
//! written once. The body is one of —
//! - `[Api, kind, |e| fill]` (optionally `, then |e| after`): a recorded call; `kind` is a
//!   [`crate::policy::Call`], `fill` puts the arguments in the event, `after` what only the
//!   result tells;
//! - `[launch Api, f, stream, params, extra]`: a kernel launch, checked when the launch check
//!   is on (after the deferred poisons are queued), and told to the stream-order check;
//! - `[needs_room]`: a call that may load a kernel (room.rs): passed through, and where it ran
//!   out of memory in isolate mode, called again once the library gave its memory back;
//! - `[stream_work]`: other work on a stream: the deferred poisons are queued, then the call;
//! - `[order op]`: as `[stream_work]`, and the stream-order check is told the call
//!   (`op`, a [`crate::policy::order::Op`]) before it and its result after it;
//! - `[capture_start]`: a stream capture's start: as `[stream_work]`, and the streams' events
//!   recorded after their poisons while nothing captures;
//! - `[unloads]`: a call that can end kernels' lives (module and library unloads), passed
//!   through, then told to the launch check;
//! - `[ctx_ends ctx]`: a call that ends a context and its memory (`cuCtxDestroy_v2`,
//!   `cuDevicePrimaryCtxReset` and `cuDevicePrimaryCtxRelease`, both exports of each, libcudart
//!   13 asking for the first; `ctx` the context, 0 for the current one): isolation checks and
//!   frees its quarantine first (and notes a fault nobody waited for) and forgets what it made
//!   and kept in that context, then the call, then the launch check is told kernels are gone;
//!   always handed out;
//! - `[stream_gone s]`: a stream's destruction, told to isolation first, then passed through;
//! - `[pool_set]`: a device's memory pool set, passed through, then told to isolation;
//! - `[resolver pfn]`: a resolver whose answer in `pfn` is swapped for our hook.
//!
//! The table is what the resolvers and `dlsym` hand hooks out by. What the bodies share is in
//! [`shape`]. `pool.rs` and `process.rs` write their hooks by hand (no table: nothing hands them
//! out by name) and declare their real functions next to them the same way.
//!
//! Layer: hooks, the top. Uses every layer below (policies, process life, recording, base).

#![deny(clippy::undocumented_unsafe_blocks)]

/// The body of one hook; see the module comment for the ten forms.
macro_rules! body {
    ($real:ident, ($($a:ident),*), [$api:ident, $kind:expr, |$e:ident| $fill:expr $(, then |$e2:ident| $after:expr)?]) => {
        $crate::hooks::shape::run(
            isolate_trace::Api::$api,
            $crate::policy::profile_class(&$kind),
            |slot| {
                #[allow(unused_mut)]
                let mut $e = $crate::hooks::shape::proto(isolate_trace::Api::$api);
                #[allow(clippy::no_effect, clippy::unused_unit)]
                $fill;
                $crate::policy::call(
                    $kind,
                    $e,
                    // SAFETY: the real function of this export, called with the caller's arguments as
                    // they came: the caller's contract (the CUDA function's) is the real function's.
                    || $crate::hooks::shape::call(slot, || unsafe { $real($($a),*) }),
                    |_e: &mut isolate_trace::Event| { $( let $e2 = _e; $after; )? },
                )
            },
            // SAFETY: the real function of this export, called with the caller's arguments as
            // they came: the caller's contract (the CUDA function's) is the real function's.
            || unsafe { $real($($a),*) },
        )
    };
    ($real:ident, ($($a:ident),*), [launch $api:ident, $f:ident, $stream:expr, $params:ident, $extra:expr]) => {{
        let _span = $crate::record::profile::span($crate::record::profile::Class::Launch);
        if !$crate::policy::check_launches() || $crate::record::thread::nested() {
            // Deferred poisons go first: the launch runs after them.
            $crate::policy::stream_work();
            // SAFETY: the real function of this export, called with the caller's arguments as
            // they came: the caller's contract (the CUDA function's) is the real function's.
            let r = $crate::record::profile::real(|| unsafe { $real($($a),*) });
            if $crate::record::thread::nested() {
                return r; // the library's own launch: nothing given back from inside a hook
            }
            // SAFETY: as above, the same launch again.
            return $crate::policy::out_of_room(HOOK_NAME, r, &mut || unsafe { $real($($a),*) });
        }
        // SAFETY: the arguments of the launch the driver is about to receive. The deferred
        // poisons it may reach are queued before it.
        let found = unsafe {
            $crate::policy::launch_check(isolate_trace::Api::$api, $f, $stream, $params, $extra)
        };
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = $crate::record::profile::real(|| unsafe { $real($($a),*) });
        // SAFETY: as above, the same launch again.
        let r = $crate::policy::out_of_room(HOOK_NAME, r, &mut || unsafe { $real($($a),*) });
        $crate::policy::launched(isolate_trace::Api::$api, found, r);
        r
    }};
    ($real:ident, ($($a:ident),*), [needs_room]) => {{
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = unsafe { $real($($a),*) };
        if r != $crate::base::cuda::CUDA_ERROR_OUT_OF_MEMORY || $crate::record::thread::nested() {
            return r;
        }
        // SAFETY: as above, the same call again.
        $crate::policy::out_of_room(HOOK_NAME, r, &mut || unsafe { $real($($a),*) })
    }};
    ($real:ident, ($($a:ident),*), [stream_work]) => {{
        let _span = $crate::record::profile::span($crate::record::profile::Class::StreamWork);
        $crate::policy::stream_work();
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = $crate::record::profile::real(|| unsafe { $real($($a),*) });
        // A synchronisation is where a kernel's fault comes back (`cudaDeviceSynchronize`).
        $crate::policy::saw_code(HOOK_NAME, r);
        r
    }};
    ($real:ident, ($($a:ident),*), [order $op:expr]) => {{
        let _span = $crate::record::profile::span($crate::record::profile::Class::StreamWork);
        #[allow(unused_unsafe)]
        let op: $crate::policy::order::Op = $op;
        $crate::policy::stream_op(&op);
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = $crate::record::profile::real(|| unsafe { $real($($a),*) });
        // A synchronisation is where a kernel's fault comes back (`cudaDeviceSynchronize`).
        $crate::policy::stream_op_done(HOOK_NAME, &op, r);
        r
    }};
    ($real:ident, ($($a:ident),*), [capture_start]) => {{
        let _span = $crate::record::profile::span($crate::record::profile::Class::StreamWork);
        $crate::policy::capture_start();
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = $crate::record::profile::real(|| unsafe { $real($($a),*) });
        $crate::policy::order::after(&$crate::policy::order::Op::CaptureBegin, r);
        r
    }};
    ($real:ident, ($($a:ident),*), [stream_gone $s:ident]) => {{
        // Before the call: after it the handle may already name another stream.
        $crate::policy::stream_gone($s as usize);
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        unsafe { $real($($a),*) }
    }};
    ($real:ident, ($($a:ident),*), [pool_set]) => {{
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = unsafe { $real($($a),*) };
        if r == 0 {
            $crate::policy::pool_set();
        }
        r
    }};
    ($real:ident, ($($a:ident),*), [ctx_ends $ctx:expr]) => {{
        // Before the call: its memory is still there to check.
        $crate::policy::context_ends(HOOK_NAME, $ctx);
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = unsafe { $real($($a),*) };
        // After the call: a launch that looks a layout up from now on sees kernels gone, and
        // an event asks its context's device again (the handle may come back for another).
        $crate::policy::kernels_unloaded();
        $crate::policy::contexts_changed();
        r
    }};
    ($real:ident, ($($a:ident),*), [unloads]) => {{
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = unsafe { $real($($a),*) };
        // After the call: a launch that looks a layout up from now on sees kernels gone.
        $crate::policy::kernels_unloaded();
        r
    }};
    ($real:ident, ($($a:ident),*), [resolver $pfn:ident]) => {{
        // SAFETY: the real function of this export, called with the caller's arguments as
        // they came: the caller's contract (the CUDA function's) is the real function's.
        let r = unsafe { $real($($a),*) };
        if r == 0 && !$pfn.is_null() && $crate::policy::intercepting() {
            // SAFETY: `pfn` is the caller's out-parameter, which the real resolver just wrote.
            unsafe { *$pfn = $crate::hooks::driver::substitute(*$pfn) };
        }
        r
    }};
}

/// Whether a hook of this body is one of the launch check's ([`shape::Hooked::launch`]).
macro_rules! launch_check_body {
    ([launch $($x:tt)*]) => {
        true
    };
    ([unloads]) => {
        true
    };
    ($other:tt) => {
        false
    };
}

/// The API row a hook of this body records under ([`shape::Hooked::api`]), if it records.
macro_rules! body_api {
    ([launch $api:ident, $($x:tt)*]) => {
        Some(isolate_trace::Api::$api)
    };
    ([$api:ident, $($x:tt)*]) => {
        Some(isolate_trace::Api::$api)
    };
    ($other:tt) => {
        None
    };
}

/// The real function a row calls: the one the row declares itself (in its file's `reals`), or
/// the one it names in [`crate::base::real`] (`= NAME`).
macro_rules! real_of {
    ($name:ident) => {
        self::reals::$name
    };
    ($name:ident = $real:ident) => {
        $crate::base::real::$real
    };
}

/// A row's own real function, declared from its signature (none when it names one in
/// [`crate::base::real`]).
macro_rules! own_real {
    ($lib:ident, $ret:ty, $name:ident($($a:ident: $t:ty),* $(,)?)) => {
        #[doc = concat!("The real `", stringify!($name), "`, looked up by that export name.")]
        pub static $name: $crate::base::real::Real<unsafe extern "C" fn($($t),*) -> $ret> =
            $crate::base::real::Real::export(
                concat!(stringify!($name), "\0").as_bytes(),
                $crate::base::real::Lib::$lib,
            );
    };
    ($lib:ident, $ret:ty, $name:ident($($p:tt)*) = $real:ident) => {};
}

/// One row's exported function. A row that declares its own real function gives its
/// parameters with their C types; a row that names one of [`crate::base::real`] (`= NAME`)
/// gives their names only, and the types come from there ([`crate::base::real::signature_of`]),
/// so no entry point's signature is written twice.
macro_rules! hook_fn {
    (@shared $ret:ty, $missing:expr, $real:ident; $(#[$doc:meta])* $name:ident ($($a:ident),*) [$($body:tt)*] ($($t:ty),*) -> $ret2:ty) => {
        hook_fn!(@fn $ret, $missing, [$name = $real]; $(#[$doc])* $name ($($a: $t),*) [$($body)*]);
    };
    (@fn $ret:ty, $missing:expr, [$($real:tt)*]; $(#[$doc:meta])* $name:ident ($($a:ident: $t:ty),*) [$($body:tt)*]) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Same contract as the CUDA function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret {
            #[allow(dead_code)]
            const HOOK_NAME: &str = stringify!($name);
            let Some(real) = real_of!($($real)*).get() else {
                return $missing;
            };
            body!(real, ($($a),*), [$($body)*])
        }
    };
    ($ret:ty, $missing:expr; $(#[$doc:meta])* $name:ident ($($a:ident: $t:ty),* $(,)?) [$($body:tt)*]) => {
        hook_fn!(@fn $ret, $missing, [$name]; $(#[$doc])* $name ($($a: $t),*) [$($body)*]);
    };
    ($ret:ty, $missing:expr; $(#[$doc:meta])* $name:ident ($($a:ident),* $(,)?) = $real:ident [$($body:tt)*]) => {
        $crate::base::real::signature_of!($real, $name, hook_fn {
            @shared $ret, $missing, $real; $(#[$doc])* $name ($($a),*) [$($body)*]
        });
    };
    ($ret:ty, $missing:expr; $(#[$doc:meta])* $name:ident ($($a:ident: $t:ty),* $(,)?) = $real:ident [$($body:tt)*]) => {
        compile_error!(concat!(
            "the row of ", stringify!($name), " names base/real.rs's ", stringify!($real),
            ": give its parameters' names only (their types are written there)"
        ));
    };
}

/// Declares hooks, the real functions they stand for, and their table: see the module comment.
macro_rules! hooks {
    (
        $(#[$tdoc:meta])* static $table:ident: $ret:ty = missing $missing:expr, in $lib:ident;
        $( $(#[$doc:meta])* $name:ident($($p:tt)*) $(= $real:ident)? [$($body:tt)*]; )*
    ) => {
        /// The real functions of this file's rows that name none in [`crate::base::real`], each
        /// declared from its row's signature and looked up by the row's export name.
        #[allow(non_upper_case_globals, unused_imports)]
        pub mod reals {
            use super::*;
            $( own_real!($lib, $ret, $name($($p)*) $(= $real)?); )*
        }

        $( hook_fn!($ret, $missing; $(#[$doc])* $name($($p)*) $(= $real)? [$($body)*]); )*

        $(#[$tdoc])*
        pub static $table: &[$crate::hooks::shape::Hooked] = &[
            $( $crate::hooks::shape::Hooked {
                name: real_of!($name $(= $real)?).name,
                export: stringify!($name),
                hook: $name as *const std::ffi::c_void,
                store: |p| real_of!($name $(= $real)?).store(p),
                adopt: |p| real_of!($name $(= $real)?).adopt(p),
                launch: launch_check_body!([$($body)*]),
                api: body_api!([$($body)*]),
            }, )*
        ];
    };
}

pub mod api;
pub mod dl;
pub mod dlopen;
pub mod driver;
pub mod nvtx;
pub mod pool;
pub mod process;
pub mod room;
pub mod runtime;
pub mod shape;
pub mod stream;

#[cfg(test)]
mod tests {
    /// Each hook is exported under the name of the real function it stands for: a table row
    /// that pairs a hook with another function's real pointer would call the wrong function.
    #[test]
    fn every_hook_stands_for_the_real_function_of_its_name() {
        for h in super::driver::HOOKED
            .iter()
            .chain(super::stream::STREAM_HOOKED)
            .chain(super::room::ROOM_HOOKED)
            .chain(super::runtime::RUNTIME_HOOKED)
        {
            assert_eq!(h.name.to_str().unwrap(), h.export);
        }
    }

    /// `base/real.rs` declares only the real functions a layer below the hooks calls: one that
    /// only its hook calls is declared by the hook's row (a line there would be a second place
    /// to keep the entry point's signature).
    #[test]
    fn base_declares_only_the_real_functions_lower_layers_call() {
        fn read_all(dir: &std::path::Path, out: &mut String) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    read_all(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("base/real.rs")
                {
                    let src = std::fs::read_to_string(&path).unwrap();
                    for line in src.lines().filter(|l| !l.trim_start().starts_with("//")) {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut below = String::new();
        for layer in ["base", "record", "policy", "life"] {
            read_all(&src.join(layer), &mut below);
        }
        let real = std::fs::read_to_string(src.join("base/real.rs")).unwrap();
        let declared: Vec<&str> = real
            .lines()
            .filter_map(|l| l.trim().split_once(" = ").map(|(name, _)| name))
            .filter(|n| {
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            })
            .collect();
        assert!(declared.len() > 20, "{declared:?}");
        let word = |text: &str, w: &str| {
            text.match_indices(w).any(|(i, _)| {
                let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
                let before = text
                    .as_bytes()
                    .get(i.wrapping_sub(1))
                    .copied()
                    .is_some_and(ident);
                let after = text.as_bytes().get(i + w.len()).copied().is_some_and(ident);
                !before && !after
            })
        };
        for name in declared {
            assert!(
                word(&below, name),
                "base/real.rs declares {name}, which no layer below the hooks calls: declare it in its hook's row"
            );
        }
    }

    /// An entry point's C signature is written once: a hooked export that `base/real.rs`
    /// declares has a row that names that declaration (`export(names) = NAME`, the types
    /// taken from there), never a row of its own with the types again (which would also
    /// declare a second `Real` for it).
    #[test]
    fn a_signature_in_base_is_not_written_again_in_a_row() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let real = std::fs::read_to_string(src.join("base/real.rs")).unwrap();
        let declared: Vec<(&str, &str)> = real
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().split_once(" = ")?;
                let (export, sig) = rest.split_once(": fn(")?;
                (name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                    && !sig.is_empty())
                .then_some((name, export))
            })
            .collect();
        assert!(declared.len() > 40, "{declared:?}");
        let mut rows = 0;
        for file in ["driver.rs", "runtime.rs", "stream.rs"] {
            let text = std::fs::read_to_string(src.join("hooks").join(file)).unwrap();
            for (name, export) in &declared {
                let open = format!("{export}(");
                for (at, _) in text.match_indices(&open) {
                    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                    if !text[line_start..at].trim().is_empty() {
                        continue; // not a row's start (a call, a comment)
                    }
                    let head = &text[at..at + text[at..].find('[').unwrap()];
                    rows += 1;
                    assert!(
                        head.contains(&format!("= {name}")) && !head.contains(':'),
                        "hooks/{file}: the row of {export} must name base/real.rs's {name} and \
                         give its parameters' names only: {head}"
                    );
                }
            }
        }
        assert!(
            rows > 20,
            "only {rows} rows name a base/real.rs declaration"
        );
    }

    /// A recorded hook names the API row of its own export (a row copied from a neighbour
    /// would record the wrong entry point, and the policies would ask the wrong row), and every
    /// row of the API table is recorded by exactly one hook.
    #[test]
    fn every_recorded_hook_records_under_its_own_row() {
        let all: Vec<&super::shape::Hooked> = super::driver::HOOKED
            .iter()
            .chain(super::stream::STREAM_HOOKED)
            .chain(super::room::ROOM_HOOKED)
            .chain(super::runtime::RUNTIME_HOOKED)
            .collect();
        for h in &all {
            if let Some(api) = h.api {
                assert_eq!(api.name(), h.export, "{}", h.export);
            }
        }
        for &api in isolate_trace::Api::ALL {
            let n = all.iter().filter(|h| h.api == Some(api)).count();
            assert_eq!(n, 1, "{api} is recorded by {n} hooks");
        }
    }
}
