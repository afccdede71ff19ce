//! The stale-pointer check at kernel launch. (Being written.)

use crate::cuda::CUfunction;
use std::ffi::c_void;

pub fn check(
    _api: isolate_trace::Api,
    _f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) {
}
