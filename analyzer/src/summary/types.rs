//! The summary's types. They are also its JSON form (`isolate summary --json`, through serde),
//! so their field names and order are part of the output.

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
    pub(super) fn add(&mut self, o: CountBytes) {
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
}

/// A device fault that a call the library saw returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceFault {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    /// The CUDA error code (700: illegal address, 719: launch failure, …).
    pub code: u64,
    /// Launches named as suspects: guarded stale values launched since the last device-wide
    /// synchronisation seen to succeed (they follow as stale launches with `fault` set).
    pub suspects: u64,
}

/// A successful call that gave back something that was not live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InvalidFree {
    pub trace: usize,
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
    /// traces, the sum of their peaks.
    pub peak_live_bytes: u64,
    /// Device memory still held at the end: of [`Totals::allocations`], those neither freed nor
    /// lost (`allocations = frees + lost device memory + live_at_end.count`).
    pub live_at_end: CountBytes,
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
    pub device_faults: Vec<DeviceFault>,
    pub quarantine: Quarantine,
    pub host: HostStats,
    /// Category name → its figures (device, managed, graph, host, registered, reservation,
    /// handle, mapping).
    pub categories: BTreeMap<String, CategoryStats>,
    /// Note kind → how many notes of it.
    pub notes: BTreeMap<String, u64>,
    pub writer: WriterStats,
    /// The last events (of all traces, by time).
    pub last_events: Vec<EventEntry>,
    /// Null, or the byte offset where the (first truncated) trace ends inside a record.
    pub truncated: Option<u64>,
    /// True when every trace ends with an End record.
    pub complete: bool,
    pub sequence: Sequence,
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
    pub first_ts_ns: Option<u64>,
    pub last_ts_ns: Option<u64>,
    /// Device ordinal → its figures.
    pub devices: BTreeMap<String, DeviceStats>,
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
