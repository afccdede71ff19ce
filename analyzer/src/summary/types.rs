//! The summary's types. They are also its JSON form (`isolate summary --json`, through serde),
//! so their field names and order are part of the output.

use crate::stacks::ShownStack;
use crate::util::ser_hex;
use isolate_trace::{Event, Header};
use serde::Serialize;
use std::collections::BTreeMap;

/// Count and bytes of what is live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CountBytes {
    pub count: u64,
    pub bytes: u64,
}

impl CountBytes {
    /// Adds `o`, saturating at `u64::MAX`.
    pub(crate) fn add(&mut self, o: CountBytes) {
        self.count = self.count.saturating_add(o.count);
        self.bytes = self.bytes.saturating_add(o.bytes);
    }
}

/// One category of memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CategoryStats {
    /// Nodes started (allocations, reservations, handles created, mappings made).
    pub started: u64,
    /// Nodes ended by a call.
    pub ended: u64,
    /// Bytes handed out over the whole run.
    pub bytes_started: u64,
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
}

/// One device ordinal of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    pub allocations: u64,
    pub frees: u64,
    /// Peak of device + managed + physical handle bytes on this device.
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
}

/// A stale write found in quarantine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoisonViolation {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    pub seq: u64,
    pub ts_ns: u64,
    pub device: i32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    pub size: u64,
    pub first_offset: u64,
    pub changed_bytes: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub freed_at_ns: u64,
    pub free_api: String,
    /// The call that made the allocation, when the summary still knew it (null otherwise).
    pub alloc_api: Option<String>,
    /// Trace format 2: the stacks of the call that made the allocation and of the free
    /// (absent when the trace has none or the summary no longer knew them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_stack: Option<ShownStack>,
    /// Stack ids (allocation, free) until the stacks are symbolised.
    #[serde(skip)]
    pub(crate) stack_ids: [Option<u32>; 2],
}

/// Where a stale launch's pointer led: the allocation and its free.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreedAt {
    pub seq: u64,
    pub ts_ns: u64,
}

/// A kernel launched with a pointer into freed memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StaleLaunchEntry {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    pub kernel: String,
    pub param_index: u32,
    pub param_offset: u32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    /// The `alloc_seq` of the freed allocation.
    pub allocation: u64,
    #[serde(serialize_with = "ser_hex")]
    pub alloc_ptr: u64,
    pub alloc_size: u64,
    pub freed_at: FreedAt,
    /// Guard mode: the pointer led into unmapped memory and a device fault followed (its error
    /// code); null for a pointer into quarantine (found by the launch check alone).
    pub fault: Option<u64>,
    /// The calls that made and freed the allocation, when the summary still knew them.
    pub alloc_api: Option<String>,
    pub free_api: Option<String>,
    /// Trace format 2: the stack of the launch, and of the calls that made and freed the
    /// allocation (absent when unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_stack: Option<ShownStack>,
    /// Stack ids (launch, allocation, free) until the stacks are symbolised.
    #[serde(skip)]
    pub(crate) stack_ids: [Option<u32>; 3],
}

/// An allocation freed on one stream while a use of it on another stream was not ordered before
/// the free (trace format 4's `FreedInUse`: a missing `record_stream` or event wait), decided by
/// the library at the free from the order of streams, events and synchronisations it saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreedInUseEntry {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    #[serde(serialize_with = "ser_hex")]
    pub alloc_ptr: u64,
    pub alloc_size: u64,
    /// The allocation's event, and the call that made it when the summary still knew it.
    pub alloc_seq: u64,
    pub alloc_api: Option<String>,
    pub free_seq: u64,
    pub free_api: String,
    /// The freeing stream (0: the legacy default stream, 2: the per-thread one).
    #[serde(serialize_with = "ser_hex")]
    pub free_stream: u64,
    /// The use: a kernel's name (`use_kernel`), else the copy's or set's export.
    pub use_name: String,
    pub use_kernel: bool,
    #[serde(serialize_with = "ser_hex")]
    pub use_stream: u64,
    /// The last event before the use (a use is no event of its own).
    pub use_after_seq: u64,
    pub use_ts_ns: u64,
    /// The missing edge: the use was operation `use_tick` of its stream, the freeing stream was
    /// ordered after that stream's operations up to `seen_tick` only.
    pub use_tick: u64,
    pub seen_tick: u64,
    /// The stacks of the allocation, the free and the use (absent when unknown; a use on the
    /// allocation's own stream has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_stack: Option<ShownStack>,
    /// Stack ids (allocation, free, use) until the stacks are symbolised.
    #[serde(skip)]
    pub(crate) stack_ids: [Option<u32>; 3],
}

/// A device fault that a call the library saw returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceFault {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    pub seq: u64,
    pub ts_ns: u64,
    /// The CUDA error code (700: illegal address, 719: launch failure, …).
    pub code: u64,
    /// Launches named as suspects: guarded stale values launched since the last device-wide
    /// synchronisation seen to succeed (they follow as stale launches with `fault` set).
    pub suspects: u64,
    /// The first call of the trace that returned a device-fault code (the call that reported
    /// the fault), when there is one.
    pub call: Option<FaultedCall>,
    /// The library's note, as it told the fault on stderr (not in the summary's JSON).
    #[serde(skip)]
    pub text: String,
}

/// A call that returned a device-fault error code (700, 714–719).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FaultedCall {
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub api: String,
    pub code: u64,
}

/// A successful call that gave back something that was not live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InvalidFree {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    /// `free`, `address_free`, `release`, `unmap` or `unregister`.
    pub kind: String,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
    /// What the call returned: a refused free (non-zero) is listed too.
    pub result: i32,
    /// True when what it gave back had already been given back (a double free); `first_free`
    /// names that earlier call and `allocated` the call that made it.
    pub double_free: bool,
    pub first_free: Option<CallRef>,
    pub allocated: Option<CallRef>,
    /// Trace format 2: the stack of this call, of the first free (double frees) and of the
    /// allocation (absent when unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_free_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    /// Stack ids (this call, first free, allocation) until the stacks are symbolised.
    #[serde(skip)]
    pub(crate) stack_ids: [Option<u32>; 3],
}

impl InvalidFree {
    /// What was given back, as the text says it: the handle of a release, else the address.
    pub fn what(&self) -> String {
        if self.kind == "release" {
            format!("handle {}", crate::util::hex(self.handle))
        } else {
            crate::util::hex(self.ptr)
        }
    }
}

/// One call of a trace, as findings name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallRef {
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub api: String,
}

/// How the trace's file order compared with sequence order (analyses use sequence order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sequence {
    /// Records that were not in sequence order in the file (normal with several threads).
    pub reordered: u64,
    /// Sequence numbers never seen: a thread took one and never recorded its call (it was
    /// inside a call when the process ended or died). Nothing is inferred from a gap.
    pub gaps: u64,
    /// Records that arrived too far out of order to be put back in place (more than the
    /// reordering window); findings about them may be off.
    pub late: u64,
}

/// One recent event, for the moments before a fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventEntry {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    pub result: i32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    pub size: u64,
    #[serde(serialize_with = "ser_hex")]
    pub stream: u64,
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
}

impl EventEntry {
    pub(super) fn new(trace: usize, e: &Event) -> Self {
        EventEntry {
            trace,
            seq: e.seq,
            ts_ns: e.ts_ns,
            tid: e.tid,
            device: e.device,
            api: e.api.name().into(),
            result: e.result,
            ptr: e.ptr,
            size: e.size,
            stream: e.stream,
            handle: e.handle,
        }
    }
}

/// What the quarantine did (from the library's Stats and End records and its notes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Quarantine {
    pub peak_bytes: u64,
    pub releases: u64,
    pub early_releases: u64,
    /// Allocations retried after releasing quarantine (OomRetry notes).
    pub oom_retries: u64,
    /// Kernel launches, and calls that load a kernel (occupancy and attribute queries before
    /// its first launch), retried after releasing quarantine (OomRetry notes of size 0: the
    /// driver needed the room, for a lazily loaded module or local memory).
    pub launch_oom_retries: u64,
}

/// What isolation asked of the device (the library's `freed` and `device bytes` exit notes,
/// tenth session on; zeros for older traces and other modes): bytes freed into quarantine, the
/// bytes the poisons wrote and the checks read, and the least device time that takes at
/// [`BANDWIDTH`] (the floor: each byte written once and read once at the memory's speed), per
/// step where the trace has steps (the regions or loop that leaks-as-growth follows).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceWork {
    pub frees: u64,
    pub freed_bytes: u64,
    pub written_bytes: u64,
    pub read_bytes: u64,
    /// Steps found (0: none); for several traces, the most of any one.
    pub steps: u64,
    /// What the steps are (`region "step"`, `iterations of the loop at train.py:12 in main`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_from: Option<String>,
    /// The run's span, first record to last (for several traces, the longest).
    pub run_ns: u64,
    /// Bytes per second the floor assumes ([`BANDWIDTH`]).
    pub bandwidth: u64,
    /// (written + read) / bandwidth: the least device time of this tier's poisons and checks.
    pub floor_ns: u64,
    /// 2 × freed / bandwidth: the least device time of full coverage (every freed byte written
    /// once and read once), whatever the tier.
    pub full_floor_ns: u64,
    /// `floor_ns` and `full_floor_ns` a step (0 without steps).
    pub floor_ns_per_step: u64,
    pub full_floor_ns_per_step: u64,
}

/// The bandwidth the floor assumes: 4.3 TB/s, what the H200 measured for the check's 128-bit
/// reads and a device-to-device copy (docs/performance.md, tests/gpu/verify_bw.py). The trace
/// does not name the device; for another one, scale the floor by 4.3 TB/s over its bandwidth
/// (the GPU benchmark, tests/gpu/tier_bench.py, measures it and does).
pub const BANDWIDTH: u64 = 4_300_000_000_000;

impl DeviceWork {
    /// Fills the derived figures from the counted ones.
    pub fn settle(&mut self) {
        self.bandwidth = BANDWIDTH;
        let ns = |bytes: u64| (bytes as u128 * 1_000_000_000 / BANDWIDTH as u128) as u64;
        self.floor_ns = ns(self.written_bytes.saturating_add(self.read_bytes));
        self.full_floor_ns = ns(self.freed_bytes.saturating_mul(2));
        let per = |v: u64| v.checked_div(self.steps).unwrap_or(0);
        self.floor_ns_per_step = per(self.floor_ns);
        self.full_floor_ns_per_step = per(self.full_floor_ns);
    }

    /// Whether the trace said anything about it.
    pub fn any(&self) -> bool {
        self.frees > 0 || self.written_bytes > 0 || self.read_bytes > 0
    }

    /// Nothing said (what serde leaves out).
    pub fn is_empty(&self) -> bool {
        !self.any()
    }
}

/// Host memory, kept apart from device memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostStats {
    pub allocations: u64,
    pub frees: u64,
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
    /// `cudaHostRegister`ed memory still registered at the end.
    pub registered_at_end: CountBytes,
}

/// The writer's own counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriterStats {
    /// Events the hooks accepted (from the last Stats/End record), to compare with `events`.
    pub events_accepted: u64,
    pub queue_waits: u64,
    pub queue_wait_ns: u64,
}

/// Device memory still held when the process ended, told apart by what explains it. The four
/// shares add up to `count` and `bytes` (which equal `live_at_end`); address space is apart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeldAtExit {
    pub count: u64,
    pub bytes: u64,
    /// Held by a caching allocator, which keeps what it got from CUDA until the process ends
    /// (normal): in a Python process whose PyTorch cache is not known to be off, `cudaMalloc`
    /// segments whose size is a multiple of 2 MiB, and physical handles (`cuMemCreate`,
    /// multiples of 2 MiB) of expandable segments.
    pub caching_allocator: CountBytes,
    /// Of `caching_allocator`: the physical handles of expandable segments.
    pub expandable_segments: CountBytes,
    /// Held by CUDA libraries below the runtime (normal): driver allocations (`cuMemAlloc_v2`,
    /// `cuMemAllocAsync`) in a Python process, cuBLAS's workspaces among them.
    pub library: CountBytes,
    /// Held for the life of the process by the framework (normal), told by the allocation's
    /// call stack: PyTorch's cuBLAS and cuBLASLt workspaces (`at::cuda::setWorkspaceForHandle`,
    /// `getCUDABlasLtWorkspace`), which it allocates through its allocator and never frees.
    /// Only traces with stacks can say so.
    pub framework_workspaces: CountBytes,
    /// The rest, when the process did not exit (killed by a signal, no End record): not judged.
    pub process_died: CountBytes,
    /// The rest, when the process exited: memory nothing explains, held by the program (its
    /// model, its optimizer state, …), listed in `possible_leaks`. Information, not a finding.
    pub possible_leak: CountBytes,
    /// Address space still reserved (`cuMemAddressReserve` ranges): not memory.
    pub address_space: CountBytes,
}

impl HeldAtExit {
    pub(super) fn add(&mut self, o: &HeldAtExit) {
        self.count = self.count.saturating_add(o.count);
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.caching_allocator.add(o.caching_allocator);
        self.expandable_segments.add(o.expandable_segments);
        self.library.add(o.library);
        self.framework_workspaces.add(o.framework_workspaces);
        self.process_died.add(o.process_died);
        self.possible_leak.add(o.possible_leak);
        self.address_space.add(o.address_space);
    }
}

/// One allocation still held at exit that nothing explains (a cache, a library): information,
/// not a finding (a program's model and optimizer state live until exit). The JSON keeps the
/// name `possible_leaks`; leaks are growth ([`LeakEntry`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldAllocation {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    /// The event that made it.
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    /// `device`, `managed` or `handle`.
    pub category: String,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
    pub size: u64,
    /// Trace format 2: the stack of the call that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    #[serde(skip)]
    pub(crate) stack_id: Option<u32>,
}

/// A leak: an allocation site that kept device memory live at exit from every judged step
/// (see [`crate::growth`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeakEntry {
    pub trace: usize,
    /// The process (the trace header's pid).
    pub pid: u32,
    /// What the steps are: `region "step"`, `iterations of the loop at train.py:12 in <module>`.
    pub steps: String,
    /// Steps in all, and those judged (warm-up and the last steps left out).
    pub step_count: u64,
    pub steps_judged: u64,
    /// Bytes the site kept a judged step, on average.
    pub bytes_per_step: u64,
    /// Its allocations made in judged steps and live at exit, and their bytes.
    pub count: u64,
    pub bytes: u64,
    /// The first of them: its event, time, thread, call and size.
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    pub size: u64,
    /// Trace format 2: the site's stack (absent without stacks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    #[serde(skip)]
    pub(crate) stack_id: Option<u32>,
}

/// Device memory of one allocation site (one call stack): how much of it was live at a moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteEntry {
    pub trace: usize,
    /// The site's name: its first shown frame (see [`crate::stacks`]).
    pub site: String,
    /// Live allocations from that site, and their bytes.
    pub count: u64,
    pub bytes: u64,
    pub stack: ShownStack,
}

/// The header of a trace, as the summary shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeaderInfo {
    pub pid: u32,
    pub ppid: u32,
    pub exe: String,
    pub argv: Vec<String>,
    pub hostname: String,
    pub mode: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub library_version: String,
    pub start_unix_ns: u64,
    pub format_version: u32,
    pub config: BTreeMap<String, String>,
}

impl HeaderInfo {
    pub fn new(h: &Header, format_version: u32) -> Self {
        HeaderInfo {
            pid: h.pid,
            ppid: h.ppid,
            exe: h.exe.clone(),
            argv: h.argv.clone(),
            hostname: h.hostname.clone(),
            mode: h.mode.clone(),
            rank: h.rank,
            local_rank: h.local_rank,
            world_size: h.world_size,
            library_version: h.library_version.clone(),
            start_unix_ns: h.start_unix_ns,
            format_version,
            config: h.config.iter().cloned().collect(),
        }
    }
}

/// The figures of one trace, or of several added up (see [`Summary`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// API name → calls, failed ones included.
    pub calls: BTreeMap<String, u64>,
    /// API name → failed calls.
    pub failed: BTreeMap<String, u64>,
    /// API name → what its failed calls returned: error code (decimal) → calls. At most 32
    /// codes an API; further codes are counted under `other`.
    pub failed_results: BTreeMap<String, BTreeMap<String, u64>>,
    /// Event records read.
    pub events: u64,
    /// Device memory allocations: successful device and managed allocations and physical
    /// handles created (`cuMemCreate`), the same things `peak_live_bytes` and `live_at_end`
    /// count. Pinned host memory is in [`Totals::host`], graph memory, reservations and
    /// mappings are in [`Totals::categories`].
    pub allocations: u64,
    /// Calls that ended one of those (frees, `cuMemRelease`).
    pub frees: u64,
    /// Peak device memory in use: device + managed allocations + physical handles. For several
    /// traces, the sum of their peaks (see `peak_is_sum_of_processes`).
    pub peak_live_bytes: u64,
    /// True when `peak_live_bytes` adds up the peaks of several traces: they need not have
    /// happened at the same time, so the figure is not a peak of anything.
    pub peak_is_sum_of_processes: bool,
    /// Device memory still held at the end: of [`Totals::allocations`], those neither freed nor
    /// lost (`allocations = frees + lost device memory + live_at_end.count`).
    pub live_at_end: CountBytes,
    /// `live_at_end` told apart: what a caching allocator or a library holds (normal), what a
    /// process that died held, and what nothing explains (held by the program: information);
    /// and address space still reserved.
    pub held_at_exit: HeldAtExit,
    /// The first [`LIST_CAP`](super::LIST_CAP) allocations of `held_at_exit.possible_leak`.
    pub possible_leaks: Vec<HeldAllocation>,
    /// Leaks (memory growing step by step, [`crate::growth`]): sites in all, the bytes they
    /// grow by a step together, and the first [`LIST_CAP`](super::LIST_CAP), largest first.
    pub leak_count: u64,
    pub leak_bytes_per_step: u64,
    pub leaks: Vec<LeakEntry>,
    /// Trace format 2: device memory held at exit by allocation site, largest first (at most
    /// [`SITES_SHOWN`](super::SITES_SHOWN); several traces: sites of the same name added up).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites_at_end: Vec<SiteEntry>,
    /// The same at the moment of the peak (`peak_live_bytes`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites_at_peak: Vec<SiteEntry>,
    /// Why the findings have no stacks (`no call stacks: the trace is format version 1, …`),
    /// said once in text; not in JSON, where the stack fields are just absent.
    #[serde(skip)]
    pub no_stacks: Option<String>,
    /// Findings, all kinds together: stale writes, stale launches, invalid frees (double frees
    /// included), device faults (a trace whose calls returned a fault code without a
    /// device-fault note counts one) and leaks (sites whose memory grows step by step).
    pub findings: u64,
    pub invalid_free_count: u64,
    /// Of those, frees of something already freed (double frees).
    pub double_free_count: u64,
    /// The first [`LIST_CAP`](super::LIST_CAP) invalid frees.
    pub invalid_frees: Vec<InvalidFree>,
    /// Frees, unmaps, releases, … that the driver accepted, of something the trace never saw
    /// allocated: made before a late load (a `late_load` note), through a call bound before
    /// it, or through an entry point that is not recorded (the CUDA 3.1 `cuMemAlloc` ABI). The
    /// driver's success says the memory was live: not invalid frees.
    pub frees_of_earlier_allocations: u64,
    /// Live allocations whose start address was handed out again: their free was not seen.
    pub lost: u64,
    pub poison_violation_count: u64,
    pub poison_violations: Vec<PoisonViolation>,
    pub stale_launch_count: u64,
    /// Kernels that got a pointer into freed memory and used it: a pointer into quarantine,
    /// or (guard mode) into unmapped memory with a device fault after the launch.
    pub stale_launches: Vec<StaleLaunchEntry>,
    /// Guard mode: pointers into freed, unmapped memory that kernels received but, as no fault
    /// followed, never dereferenced (stale fields a kernel ignores). Not errors.
    pub stale_value_count: u64,
    pub stale_values: Vec<StaleLaunchEntry>,
    /// Allocations freed on one stream while a use on another stream was not ordered before
    /// the free (trace format 4).
    pub freed_in_use_count: u64,
    pub freed_in_use: Vec<FreedInUseEntry>,
    pub device_faults: Vec<DeviceFault>,
    /// Device faults as findings: per trace, its noted device faults, or 1 when none was noted
    /// but a call returned a device-fault code (`first_faulted_call`: traces of older
    /// libraries); for several traces, the sum.
    pub device_fault_count: u64,
    pub quarantine: Quarantine,
    /// What isolation asked of the device, and the floor of its time; absent from the JSON
    /// when the trace says nothing of it (older libraries, log mode).
    #[serde(skip_serializing_if = "DeviceWork::is_empty")]
    pub device_work: DeviceWork,
    /// The library's account of its own cost, as its exit notes give it (isolation's time,
    /// call stacks, kept memory, the hooks' time with `ISOLATE_PROFILE=on`), in trace order.
    pub library_cost: Vec<String>,
    pub host: HostStats,
    /// Category name → its figures (device, managed, graph, host, registered, reservation,
    /// handle, mapping).
    pub categories: BTreeMap<String, CategoryStats>,
    /// Note kind → how many notes of it (marks and regions written with the older `Info`
    /// convention count as `mark`, `region_push` and `region_pop`).
    pub notes: BTreeMap<String, u64>,
    /// Regions the program named (`isolate_region_push`/`_pop`), one entry per name in the
    /// order one of them first closed, at most [`LIST_CAP`](super::LIST_CAP) names. A region still open
    /// at the end of the trace counts up to the trace's last record.
    pub regions: Vec<RegionStats>,
    /// Regions in all (every push that was followed, of every name).
    pub region_count: u64,
    /// The first [`MARKS_CAP`](super::MARKS_CAP) marks (`isolate_mark`).
    pub marks: Vec<MarkEntry>,
    pub mark_count: u64,
    pub writer: WriterStats,
    /// The last events (of all traces, by time).
    pub last_events: Vec<EventEntry>,
    /// Null, or the byte offset where the (first truncated) trace ends inside a record.
    pub truncated: Option<u64>,
    /// True when every trace ends with an End record.
    pub complete: bool,
    pub sequence: Sequence,
}

/// All the regions of one name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RegionStats {
    pub name: String,
    /// How many times a region of that name was opened.
    pub count: u64,
    /// Their time added up (nested regions of one name count each).
    pub total_ns: u64,
    /// The most device memory live while one of them was open (for several traces, the most
    /// of any one).
    pub peak_live_bytes: u64,
}

/// A mark the program made (`isolate_mark`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MarkEntry {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    pub text: String,
}

/// One trace's summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceSummary {
    /// The file name (no directories, so outputs compare across machines).
    pub file: String,
    pub header: HeaderInfo,
    /// `exit`, `signal N`, `exec`, or null when the trace has no End record.
    pub end_reason: Option<String>,
    /// The fatal signal a Signal note or the End record names.
    pub signal: Option<u64>,
    /// The first and the last call's time (trace clock, ns).
    pub first_ts_ns: Option<u64>,
    pub last_ts_ns: Option<u64>,
    /// How long the trace covers: from the first call to the last thing it records (a call, a
    /// mark or region, the process's end). The report's span is the same number.
    pub span_ns: Option<u64>,
    /// Device ordinal → its figures.
    pub devices: BTreeMap<String, DeviceStats>,
    /// The first call that returned a device-fault code (null when none did), whether or not
    /// the library noted a device fault (traces of older libraries have no such note).
    pub first_faulted_call: Option<FaultedCall>,

    #[serde(flatten)]
    pub totals: Totals,
}

/// The summary of one or more traces: the totals, and each trace on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub totals: Totals,
    pub traces: Vec<TraceSummary>,
}

impl std::ops::Deref for Summary {
    type Target = Totals;
    fn deref(&self) -> &Totals {
        &self.totals
    }
}
