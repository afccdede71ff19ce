//! What a trace holds: one [`Header`], then [`Record`]s.

use crate::api::Api;
use bincode::{Decode, Encode};

/// Written once, right after the magic and version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct Header {
    pub pid: u32,
    pub ppid: u32,
    /// `/proc/self/exe` as the process saw it.
    pub exe: String,
    pub argv: Vec<String>,
    /// Wall-clock time the trace was opened, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// `CLOCK_MONOTONIC` at the same moment; event timestamps use this clock.
    pub start_mono_ns: u64,
    pub hostname: String,
    /// Version of `libisolate.so` that wrote the trace.
    pub library_version: String,
    /// `log`, `isolate` or `off`.
    pub mode: String,
    /// `RANK`, `LOCAL_RANK` and `WORLD_SIZE` when the launcher set them.
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Every setting in force, as `(name, value)`.
    pub config: Vec<(String, String)>,
}

/// One intercepted call. Fields an API has no use for are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Process-wide order in which calls returned to the interposer (starts at 0).
    pub seq: u64,
    /// `CLOCK_MONOTONIC` when the real call returned, ns.
    pub ts_ns: u64,
    /// Linux thread id.
    pub tid: u32,
    /// Device ordinal of the current context, -1 when unknown.
    pub device: i32,
    pub api: Api,
    /// The raw `CUresult` / `cudaError_t` handed back to the caller.
    pub result: i32,
    /// How long the real call took, ns.
    pub duration_ns: u64,
    /// The address handed out or given back (host address for host memory).
    pub ptr: u64,
    /// Bytes requested (for pitched and 3D memory: pitch × rows × depth).
    pub size: u64,
    /// Row pitch of pitched and 3D allocations.
    pub pitch: u64,
    /// Stream of stream-ordered calls; 0 for the legacy default stream.
    pub stream: u64,
    /// Memory pool, virtual-memory handle or graph, by API.
    pub handle: u64,
    /// Offset into the handle for `cuMemMap`; alignment for `cuMemAddressReserve`.
    pub offset: u64,
    /// The call's flags argument.
    pub flags: u64,
    /// The call stack the call was made from: a [`Stack`]'s id, 0 when none was captured
    /// (version-1 traces, `ISOLATE_STACKS=none`, or calls the library makes itself).
    pub stack: u32,
}

impl Event {
    /// True when the call returned success.
    pub fn ok(&self) -> bool {
        self.result == 0
    }
}

/// A freed allocation whose poison changed while it was in quarantine: a stale write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct Violation {
    pub seq: u64,
    pub ts_ns: u64,
    pub device: i32,
    /// Base address of the freed allocation.
    pub ptr: u64,
    pub size: u64,
    /// Offset of the first byte that no longer holds the poison.
    pub first_offset: u64,
    /// How many bytes no longer hold the poison.
    pub changed_bytes: u64,
    /// Sequence numbers of the allocation and its free.
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub free_ts_ns: u64,
    /// The API that freed it.
    pub free_api: Api,
    /// Format version 3: the call stacks of the allocation and of its free (a [`Stack`]'s
    /// id; 0 when none was captured, and in older traces).
    pub alloc_stack: u32,
    pub free_stack: u32,
}

/// A kernel launched with a parameter that points into freed memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct StaleLaunch {
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: Api,
    pub kernel: String,
    pub param_index: u32,
    /// Byte offset of the pointer inside the parameter buffer.
    pub param_offset: u32,
    pub ptr: u64,
    /// The freed allocation it points into.
    pub alloc_ptr: u64,
    pub alloc_size: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub free_ts_ns: u64,
    /// Format version 3: the call stacks of the allocation and of its free, as in
    /// [`Violation`].
    pub alloc_stack: u32,
    pub free_stack: u32,
}

/// Format version 4: an allocation freed on one stream while a use of it on another stream
/// (a kernel launched with it as a pointer parameter, a copy or a set of it) was not ordered
/// before the free by anything the library saw: no event recorded after the use and waited on
/// by the freeing stream, no synchronisation of the using stream, the device or the context
/// (a missing `record_stream`). Decided by happens-before at the free (the library's
/// `policy/order/`), whether or not the timing let the use see other data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct FreedInUse {
    pub seq: u64,
    pub ts_ns: u64,
    /// The freeing thread.
    pub tid: u32,
    pub device: i32,
    /// The allocation: its start, size, event and stack.
    pub alloc_ptr: u64,
    pub alloc_size: u64,
    pub alloc_seq: u64,
    pub alloc_stack: u32,
    /// The free: its event, the API (`cudaFreeAsync`, `cuMemFreeAsync`, …), its stream (0 the
    /// legacy default stream, 2 the per-thread one) and its stack.
    pub free_seq: u64,
    pub free_api: Api,
    pub free_stream: u64,
    pub free_stack: u32,
    /// The use: a kernel's name (`use_kernel`), else the export of the copy or set
    /// (`cuMemcpyDtoDAsync_v2`, …).
    pub use_name: String,
    pub use_kernel: bool,
    /// The stream the use was queued on (as `free_stream`).
    pub use_stream: u64,
    /// The last sequence number taken before the use (uses are not events of their own).
    pub use_after_seq: u64,
    pub use_ts_ns: u64,
    /// The use's stack (0 when none was captured: uses on the allocation's own stream are not
    /// captured, to keep single-stream programs cheap).
    pub use_stack: u32,
    /// The missing edge: the use was operation `use_tick` of its stream, and at the free the
    /// freeing stream was ordered after that stream's operations up to `seen_tick` only
    /// (`seen_tick < use_tick`).
    pub use_tick: u64,
    pub seen_tick: u64,
}

/// What a [`Note`] tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub enum NoteKind {
    /// Free text from the library.
    Info,
    /// A quarantined allocation was really freed (budget reached or exit).
    QuarantineRelease,
    /// A quarantined allocation was freed early because an allocation ran out of memory.
    QuarantineEarlyRelease,
    /// An allocation that failed for lack of memory was retried after releasing quarantine.
    OomRetry,
    /// Guard mode handed an old address reservation back to the driver.
    GuardRecycle,
    /// The writer could not write; the trace ends early.
    WriterError,
    /// A fatal signal reached the process (the signal number is in `value`).
    Signal,
    /// The process called `fork` (child pid in `value`).
    Fork,
    /// The process is about to `exec` (events after this are in a new trace).
    Exec,
    /// A call the library saw returned a device fault, the first of the process (`value` = the
    /// error code, e.g. 700 for an illegal address); `size` = the number of suspect launches
    /// (launched since the last clean synchronisation with a pointer into freed, unmapped
    /// memory), named by that many [`Record::StaleLaunch`] records right after the note.
    DeviceFault,
    /// The library was loaded after CUDA was already in use (`dlopen` late, not `LD_PRELOAD`):
    /// allocations made before it are not in the trace, so frees of them are not invalid.
    /// Written when the trace starts, normally as its first record.
    LateLoad,
    /// A point in the run named by the program (`isolate_mark`): `text` = the mark's text,
    /// `ptr` = the Linux thread id, `value` = the thread's region depth.
    Mark,
    /// The program opened a region (`isolate_region_push`; regions nest per thread): `text` =
    /// its name, `ptr` = the Linux thread id, `value` = the thread's depth after the push.
    RegionPush,
    /// The program closed the region it opened last on that thread (`isolate_region_pop`):
    /// `text` = its name, `ptr` = the thread id, `value` = the depth before the pop (the same
    /// as its push's).
    RegionPop,
    /// The library's own cost or counters, written at exit (format version 3; before, `Info`
    /// notes told by their text): `ptr` = the [`CostTopic`] (its number), `size` and `value`
    /// = its two main numbers (each topic says which), `text` = all of it, for people.
    Cost,
}

/// What a [`NoteKind::Cost`] note is about: its `ptr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CostTopic {
    /// Isolation's time: `size` = frees poisoned, `value` = batches released on the release
    /// stream.
    Isolation = 1,
    /// Call stacks: `size` = stacks captured, `value` = ns the calling threads spent on them.
    Stacks = 2,
    /// `ISOLATE_REUSE`: `size` = allocations served from kept memory, `value` = kept.
    Reuse = 3,
    /// `ISOLATE_PROFILE`: the hooks' time by kind of call.
    Hooks = 4,
    /// `ISOLATE_PROFILE`: the hooks' own time by part.
    HookParts = 5,
    /// The launch check's counters: `size` = stale pointers, `value` = launches checked.
    LaunchCheck = 6,
    /// Poison verified: `size` = allocations on the device, `value` = on the host.
    PoisonVerified = 7,
    /// Stream-ordered frees during graph capture that went unquarantined: `size` = how many.
    CaptureFrees = 8,
    /// Events recorded without a call stack because their thread's stack had too little room
    /// left for a capture: `size` = how many.
    SmallStacks = 9,
    /// The device's work for isolation (tenth session; appended, so older readers skip it as
    /// an unknown topic): `size` = bytes the poisons wrote, `value` = bytes the checks read
    /// (every freed byte each in the full tier, each large block's canaries in the fast one).
    DeviceBytes = 10,
    /// What was freed into quarantine (tenth session): `size` = bytes, `value` = frees.
    Freed = 11,
    /// The stream-order check (format version 4): `size` = allocations freed while in use on
    /// another stream, `value` = streams seen.
    StreamOrder = 12,
    /// The device short of free memory (sixteenth session; appended, so older readers skip
    /// it): `size` = times the quarantine was cut because the device's free memory was below
    /// the library's reserve, `value` = bytes released early because of it.
    MemoryPressure = 13,
    /// The quarantine's budget (eighteenth session; appended, so older readers skip it):
    /// `size` = bytes, `value` = the isolate-mode processes sharing the device's share
    /// (`ISOLATE_TENANTS=share`), itself included.
    QuarantineBudget = 14,
}

impl CostTopic {
    pub const ALL: [CostTopic; 14] = [
        CostTopic::Isolation,
        CostTopic::Stacks,
        CostTopic::Reuse,
        CostTopic::Hooks,
        CostTopic::HookParts,
        CostTopic::LaunchCheck,
        CostTopic::PoisonVerified,
        CostTopic::CaptureFrees,
        CostTopic::SmallStacks,
        CostTopic::DeviceBytes,
        CostTopic::Freed,
        CostTopic::StreamOrder,
        CostTopic::MemoryPressure,
        CostTopic::QuarantineBudget,
    ];

    /// The topic of a note: `None` unless it is a [`NoteKind::Cost`] note of a known topic.
    pub fn of(n: &Note) -> Option<CostTopic> {
        if n.kind != NoteKind::Cost {
            return None;
        }
        CostTopic::ALL.into_iter().find(|t| *t as u64 == n.ptr)
    }

    /// True for the library's own time (what `isolate summary` lists as its cost); false for
    /// counters of what it did.
    pub fn is_time(self) -> bool {
        matches!(
            self,
            CostTopic::Isolation
                | CostTopic::Stacks
                | CostTopic::Reuse
                | CostTopic::Hooks
                | CostTopic::HookParts
        )
    }
}

/// Something that happened that is not an API call.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Note {
    pub seq: u64,
    pub ts_ns: u64,
    pub kind: NoteKind,
    pub ptr: u64,
    pub size: u64,
    pub value: u64,
    pub text: String,
}

/// Counters the writer keeps; written every few seconds and at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct Stats {
    pub ts_ns: u64,
    /// Events accepted by the hooks so far.
    pub events: u64,
    /// How often a hook found the queue full and waited, and for how long in all.
    pub queue_waits: u64,
    pub queue_wait_ns: u64,
    /// Peak bytes held in quarantine.
    pub quarantine_peak_bytes: u64,
    pub quarantine_releases: u64,
    pub quarantine_early_releases: u64,
}

/// Why a trace ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum EndReason {
    /// The process exited (`exit`, return from `main`, `_exit`).
    Exit,
    /// A fatal signal; the process dies of it right after.
    Signal(i32),
    /// The process replaced itself with `exec`.
    Exec,
}

/// The last record of a trace that was closed properly.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct End {
    pub ts_ns: u64,
    pub reason: EndReason,
    pub stats: Stats,
}

/// A loaded object (the executable or a shared library) that native frames point into: enough
/// for the analyzer to find the file and symbolise offline. Written (format version 2) before
/// the first [`Stack`] that has a frame in it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct Module {
    /// Number the stacks' frames do not repeat (frames hold addresses; the analyzer finds the
    /// module by range). Starts at 1.
    pub id: u32,
    /// Path as the dynamic loader has it (`/proc/self/exe`'s target for the executable).
    pub path: String,
    /// Load bias: a file virtual address `v` of the object is at `base + v` in the process.
    pub base: u64,
    /// Lowest and one-past-highest address of its loaded segments.
    pub start: u64,
    pub end: u64,
    /// The GNU build id (`NT_GNU_BUILD_ID`), empty when the object has none.
    pub build_id: Vec<u8>,
}

/// One frame of a [`Stack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub enum Frame {
    /// A native return address (the instruction after the call; symbolise `addr - 1`).
    Native(u64),
    /// A Python frame: the [`PyCode`] it runs and the line it is at.
    Python { code: u32, line: u32 },
}

/// A distinct call stack, written once (format version 2) before the first record that
/// names it. Frames run from the innermost (the call into CUDA) outwards; where the program
/// was running Python, the interpreter's own frames are replaced by the Python frames they
/// were running, as PyTorch's `stacks="all"` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct Stack {
    /// Starts at 1; 0 means "no stack" wherever a stack id is named.
    pub id: u32,
    pub frames: Vec<Frame>,
    /// True when the depth limit cut the stack short (outermost frames missing).
    pub truncated: bool,
}

/// A Python code object (a function, a module body, a lambda), written once (format version
/// 2) before the first [`Stack`] with a frame running it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct PyCode {
    pub id: u32,
    /// `co_filename`.
    pub file: String,
    /// `co_qualname` where the interpreter has one (3.11+), else `co_name`.
    pub name: String,
    /// `co_firstlineno`.
    pub first_line: u32,
}

/// The stack of a record that is not an [`Event`] (a stale launch, a stale value, a note):
/// the record with sequence number `seq` was made from stack `stack`. Format version 2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct StackOf {
    pub seq: u64,
    pub stack: u32,
}

/// One entry of the trace after the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Event(Event),
    Violation(Violation),
    StaleLaunch(StaleLaunch),
    Note(Note),
    Stats(Stats),
    End(End),
    /// The launch check's *suspect*: a word of a kernel's parameters points into a freed
    /// allocation without evidence that the kernel was handed it (never a finding). Either the
    /// word lies inside a parameter passed by value wider than a pointer (a struct) and is not
    /// the allocation's start, or the launch's packed buffer has no parameter layout and the word
    /// is not the start (two 32-bit integers side by side read as such words), or (guard mode)
    /// the allocation's memory is unmapped: any access through it faults, so without a fault
    /// after it the value was not used; followed by a fault ([`NoteKind::DeviceFault`]) it names
    /// the kernel that is the likely culprit.
    StaleValue(StaleLaunch),
    /// Format version 2: a loaded object, a stack, a Python code object, a record's stack.
    Module(Module),
    Stack(Stack),
    PyCode(PyCode),
    StackOf(StackOf),
    /// Format version 4: freed while still in use on another stream (boxed: the largest record,
    /// and rare; every record in the writer's queue is as big as the largest variant).
    FreedInUse(Box<FreedInUse>),
}

impl Record {
    /// The record's sequence number: every record but [`Record::Stats`] and [`Record::End`]
    /// takes one from the same process-wide counter as the events, so sorting by it gives the
    /// order in which things happened. The file's order is only roughly that (threads hand
    /// their records to the writer in whatever order they get there).
    pub fn seq(&self) -> Option<u64> {
        match self {
            Record::Event(e) => Some(e.seq),
            Record::Violation(v) => Some(v.seq),
            Record::StaleLaunch(s) | Record::StaleValue(s) => Some(s.seq),
            Record::Note(n) => Some(n.seq),
            Record::FreedInUse(f) => Some(f.seq),
            Record::Stats(_)
            | Record::End(_)
            | Record::Module(_)
            | Record::Stack(_)
            | Record::PyCode(_)
            | Record::StackOf(_) => None,
        }
    }
}
