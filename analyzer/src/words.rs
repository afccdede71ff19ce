//! The words people see: one name for each kind of finding, one way to number events, counts
//! with correct plurals and CUDA error codes with their names. Every text output (summary, graph,
//! report, who, diff, check) takes its words from here so that the same thing is called the same
//! everywhere.
//!
//! ```
//! use isolate_analyzer::words;
//! assert_eq!(words::plural(1, "allocation"), "1 allocation");
//! assert_eq!(words::plural(4096, "byte"), "4,096 bytes");
//! assert_eq!(words::event(12), "event 12");
//! assert_eq!(words::cuda_error(700), "700 (CUDA_ERROR_ILLEGAL_ADDRESS)");
//! assert_eq!(words::cuda_error_for(isolate_trace::Api::CudaMalloc, 2), "2 (cudaErrorMemoryAllocation)");
//! ```

use isolate_trace::Api;

/// A write that landed in memory after it was freed (the device changed poisoned bytes).
/// Older outputs called it "POISON_VIOLATION" / "poison violation".
pub const STALE_WRITE: &str = "stale write";
/// A kernel launched with a pointer argument into memory that had been freed.
pub const STALE_LAUNCH: &str = "stale launch";
/// A read of a freed allocation that returned what the freed allocation had held.
pub const STALE_VALUE: &str = "stale value";
/// A free on one stream while a use of the allocation on another stream was not ordered before
/// it: freed while still in use on another stream (a missing `record_stream` or event wait).
pub const UNORDERED_FREE: &str = "unordered free";
/// What fixes an unordered free, in words.
pub const UNORDERED_FREE_FIX: &str = "in PyTorch: x.record_stream(s) or \
     torch.cuda.current_stream().wait_stream(s) before del x (in CUDA: an event recorded on \
     the using stream after the use, waited on by the freeing stream before the free)";

/// A stream named for people: the legacy default stream, the per-thread one, or its handle.
pub fn stream_name(h: u64) -> String {
    match h {
        0 | 1 => "the legacy default stream".to_string(),
        2 => "the per-thread default stream".to_string(),
        h => format!("stream {}", crate::util::hex(h)),
    }
}

/// A free of an address that was never allocated (or not the start of an allocation).
pub const INVALID_FREE: &str = "invalid free";
/// A second free of an allocation that was already freed.
pub const DOUBLE_FREE: &str = "double free";
/// The device faulted: a kernel touched memory it may not, or died (CUDA error 700, 714–719).
pub const DEVICE_FAULT: &str = "device fault";
/// Memory still allocated when the process ended (whatever the reason).
pub const HELD_AT_EXIT: &str = "held at exit";
/// Memory a caching allocator (PyTorch's, …) still held when the process ended: normal, the
/// allocator keeps what it got from CUDA until the process exits.
pub const HELD_BY_CACHE: &str = "held at exit by a caching allocator (normal)";
/// Address space still reserved at exit (`cuMemAddressReserve`): no memory behind it by itself.
pub const RESERVED_AT_EXIT: &str = "address space reserved at exit";
/// Memory that grows step by step: a site that keeps memory from every step (see
/// [`crate::growth`]). Memory merely held at exit is not a leak.
pub const LEAK: &str = "leak";
/// Memory held at exit that nothing else explains: the program's own (its model, its state).
pub const HELD_BY_PROGRAM: &str = "held by the program (information, not a finding)";

/// The upper-case form used as a heading for a finding: `stale write` → `STALE WRITE`.
pub fn heading(word: &str) -> String {
    word.to_uppercase()
}

/// How people refer to one trace event: its sequence number, `event 12`.
pub fn event(seq: u64) -> String {
    format!("event {seq}")
}

/// A whole number with thousands separators: `4,096`.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut o = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            o.push(',');
        }
        o.push(c);
    }
    o
}

/// The plural of an English noun (regular rules: `process` → `processes`, `entry` → `entries`).
pub fn plural_of(noun: &str) -> String {
    let lower = noun.to_ascii_lowercase();
    if ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        return format!("{noun}es");
    }
    if let Some(stem) = noun.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    format!("{noun}s")
}

/// The noun alone, singular for 1 and plural otherwise: `noun(2, "kernel")` → `kernels`.
pub fn noun(n: u64, noun: &str) -> String {
    if n == 1 {
        noun.to_string()
    } else {
        plural_of(noun)
    }
}

/// A count and its noun: `1 allocation`, `2 allocations`, `4,096 bytes`.
pub fn plural(n: u64, noun_: &str) -> String {
    format!("{} {}", count(n), noun(n, noun_))
}

/// A size for people: exact bytes below 1 KiB (`512 bytes`), binary units above (`4.0 MiB`).
pub fn size(bytes: u64) -> String {
    if bytes < 1024 {
        plural(bytes, "byte")
    } else {
        crate::util::human_bytes(bytes)
    }
}

/// The name of a CUDA error, spelled as the driver API's `CUresult` spells it
/// (`CUDA_ERROR_ILLEGAL_ADDRESS`); `None` for a code this table does not know.
pub fn cuda_error_name(code: u64) -> Option<&'static str> {
    Some(match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        5 => "CUDA_ERROR_PROFILER_DISABLED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        102 => "CUDA_ERROR_DEVICE_NOT_LICENSED",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        202 => "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
        205 => "CUDA_ERROR_MAP_FAILED",
        206 => "CUDA_ERROR_UNMAP_FAILED",
        208 => "CUDA_ERROR_ALREADY_MAPPED",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        211 => "CUDA_ERROR_NOT_MAPPED",
        214 => "CUDA_ERROR_ECC_UNCORRECTABLE",
        215 => "CUDA_ERROR_UNSUPPORTED_LIMIT",
        216 => "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
        217 => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        218 => "CUDA_ERROR_INVALID_PTX",
        220 => "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        300 => "CUDA_ERROR_INVALID_SOURCE",
        301 => "CUDA_ERROR_FILE_NOT_FOUND",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        701 => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        702 => "CUDA_ERROR_LAUNCH_TIMEOUT",
        704 => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        705 => "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        708 => "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
        709 => "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        710 => "CUDA_ERROR_ASSERT",
        712 => "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        713 => "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        714 => "CUDA_ERROR_HARDWARE_STACK_ERROR",
        715 => "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        716 => "CUDA_ERROR_MISALIGNED_ADDRESS",
        717 => "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        718 => "CUDA_ERROR_INVALID_PC",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        720 => "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        900 => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        901 => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

/// The name of a CUDA error as the runtime API's `cudaError_t` spells it
/// (`cudaErrorMemoryAllocation`); `None` for a code this table does not know.
pub fn cuda_runtime_error_name(code: u64) -> Option<&'static str> {
    Some(match code {
        0 => "cudaSuccess",
        1 => "cudaErrorInvalidValue",
        2 => "cudaErrorMemoryAllocation",
        3 => "cudaErrorInitializationError",
        4 => "cudaErrorCudartUnloading",
        5 => "cudaErrorProfilerDisabled",
        9 => "cudaErrorInvalidConfiguration",
        12 => "cudaErrorInvalidPitchValue",
        17 => "cudaErrorInvalidDevicePointer",
        34 => "cudaErrorStubLibrary",
        35 => "cudaErrorInsufficientDriver",
        46 => "cudaErrorDevicesUnavailable",
        100 => "cudaErrorNoDevice",
        101 => "cudaErrorInvalidDevice",
        200 => "cudaErrorInvalidKernelImage",
        201 => "cudaErrorDeviceUninitialized",
        205 => "cudaErrorMapBufferObjectFailed",
        206 => "cudaErrorUnmapBufferObjectFailed",
        209 => "cudaErrorNoKernelImageForDevice",
        214 => "cudaErrorECCUncorrectable",
        400 => "cudaErrorInvalidResourceHandle",
        401 => "cudaErrorIllegalState",
        500 => "cudaErrorSymbolNotFound",
        600 => "cudaErrorNotReady",
        700 => "cudaErrorIllegalAddress",
        701 => "cudaErrorLaunchOutOfResources",
        702 => "cudaErrorLaunchTimeout",
        704 => "cudaErrorPeerAccessAlreadyEnabled",
        705 => "cudaErrorPeerAccessNotEnabled",
        708 => "cudaErrorSetOnActiveProcess",
        709 => "cudaErrorContextIsDestroyed",
        710 => "cudaErrorAssert",
        712 => "cudaErrorHostMemoryAlreadyRegistered",
        713 => "cudaErrorHostMemoryNotRegistered",
        714 => "cudaErrorHardwareStackError",
        715 => "cudaErrorIllegalInstruction",
        716 => "cudaErrorMisalignedAddress",
        717 => "cudaErrorInvalidAddressSpace",
        718 => "cudaErrorInvalidPc",
        719 => "cudaErrorLaunchFailure",
        720 => "cudaErrorCooperativeLaunchTooLarge",
        800 => "cudaErrorNotPermitted",
        801 => "cudaErrorNotSupported",
        802 => "cudaErrorSystemNotReady",
        803 => "cudaErrorSystemDriverMismatch",
        804 => "cudaErrorCompatNotSupportedOnDevice",
        900 => "cudaErrorStreamCaptureUnsupported",
        901 => "cudaErrorStreamCaptureInvalidated",
        999 => "cudaErrorUnknown",
        _ => return None,
    })
}

/// A CUDA error code with its driver-API name: `700 (CUDA_ERROR_ILLEGAL_ADDRESS)`; the bare
/// number for a code without a known name.
pub fn cuda_error(code: u64) -> String {
    match cuda_error_name(code) {
        Some(n) => format!("{code} ({n})"),
        None => code.to_string(),
    }
}

/// A CUDA error code as `api` returned it: runtime APIs (`cuda…`) get the runtime's name
/// (`2 (cudaErrorMemoryAllocation)`), driver APIs (`cu…`) the driver's.
pub fn cuda_error_for(api: Api, code: u64) -> String {
    let name = if api.is_runtime() {
        cuda_runtime_error_name(code)
    } else {
        cuda_error_name(code)
    };
    match name {
        Some(n) => format!("{code} ({n})"),
        None => code.to_string(),
    }
}

/// What a call returned, as a CUDA error code of its API ([`cuda_error_for`]); a negative
/// value (never a CUDA code) as the bare number.
pub fn call_result(api: Api, result: i32) -> String {
    match u64::try_from(result) {
        Ok(code) => cuda_error_for(api, code),
        Err(_) => result.to_string(),
    }
}

/// A signal number with its name: `6 (SIGABRT)`; the bare number for others.
pub fn signal(n: u64) -> String {
    let name = match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return n.to_string(),
    };
    format!("{n} ({name})")
}

/// What a device fault was, in words (`illegal address`); `device fault` for codes the trace
/// crate does not list as faults.
pub fn device_fault(code: u64) -> &'static str {
    isolate_trace::device_fault_name(code).unwrap_or(DEVICE_FAULT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals() {
        assert_eq!(plural(0, "allocation"), "0 allocations");
        assert_eq!(plural(1, "freed allocation"), "1 freed allocation");
        assert_eq!(plural(1, "kernel"), "1 kernel");
        assert_eq!(plural(2, "process"), "2 processes");
        assert_eq!(plural(3, "entry"), "3 entries");
        assert_eq!(plural(3, "key"), "3 keys");
        assert_eq!(plural(1_234_567, "byte"), "1,234,567 bytes");
        assert_eq!(noun(1, "event"), "event");
    }

    #[test]
    fn counts() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn errors() {
        assert_eq!(cuda_error(0), "0 (CUDA_SUCCESS)");
        assert_eq!(cuda_error(2), "2 (CUDA_ERROR_OUT_OF_MEMORY)");
        assert_eq!(cuda_error(719), "719 (CUDA_ERROR_LAUNCH_FAILED)");
        assert_eq!(cuda_error(123_456), "123456");
        assert_eq!(
            cuda_error_for(Api::CuMemAlloc, 2),
            "2 (CUDA_ERROR_OUT_OF_MEMORY)"
        );
        assert_eq!(
            cuda_error_for(Api::CudaMalloc, 2),
            "2 (cudaErrorMemoryAllocation)"
        );
        assert_eq!(
            cuda_error_for(Api::CudaFree, 201),
            "201 (cudaErrorDeviceUninitialized)"
        );
        assert_eq!(device_fault(700), "illegal address");
        assert_eq!(
            call_result(Api::CudaFree, 700),
            "700 (cudaErrorIllegalAddress)"
        );
        assert_eq!(call_result(Api::CudaFree, -5), "-5");
        assert_eq!(device_fault(1), "device fault");
        // Every device fault the trace crate knows has a name in both tables.
        for c in 0..1000 {
            if isolate_trace::device_fault_name(c).is_some() {
                assert!(cuda_error_name(c).is_some() && cuda_runtime_error_name(c).is_some());
            }
        }
    }

    #[test]
    fn sizes_and_events() {
        assert_eq!(size(1), "1 byte");
        assert_eq!(size(512), "512 bytes");
        assert_eq!(size(4 << 20), "4.0 MiB");
        assert_eq!(event(0), "event 0");
        assert_eq!(heading(STALE_WRITE), "STALE WRITE");
        assert_eq!(signal(6), "6 (SIGABRT)");
        assert_eq!(signal(64), "64");
    }
}
