//! The CUDA entry points a trace can name, and what each one is: what it does to memory
//! ([`Kind`], [`Memory`]), whether it is stream-ordered and on which stream ([`Order`]), which
//! pool an allocation comes from ([`Source`]), how it is laid out ([`Layout`]). One row an entry
//! point, every column required: the library's policies decide by these (never by name), so a
//! new entry point cannot get another's behaviour by being left out of a list.

use bincode::{Decode, Encode};

/// What an API call does to memory; the analyzer decides everything from this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Hands out a range of memory (`ptr`, `size`).
    Alloc,
    /// Gives back the range that starts at `ptr`.
    Free,
    /// Reserves a virtual address range (`ptr`, `size`), no memory behind it.
    Reserve,
    /// Gives back a reserved virtual address range.
    AddressFree,
    /// Creates physical memory (`handle`, `size`), not yet addressable.
    Create,
    /// Releases a physical memory handle.
    Release,
    /// Takes one more reference to the physical memory handle mapped at `ptr` (its value in
    /// `handle`): one more `Release` of it is then a release, not a double one (NCCL's free).
    Retain,
    /// Maps `size` bytes of `handle` at `offset` to the address `ptr`.
    Map,
    /// Unmaps the range (`ptr`, `size`).
    Unmap,
    /// Changes access to a mapped range (`ptr`, `size`; `handle` holds the location).
    SetAccess,
    /// Registers existing host memory as pinned.
    Register,
    /// Unregisters host memory.
    Unregister,
    /// A kernel launch (only stale launches are recorded).
    Launch,
}

/// References taken to live physical memory handles by [`Kind::Retain`] calls and not given
/// back yet: what a [`Kind::Release`] means depends on it. NCCL frees a buffer with
/// `cuMemRetainAllocationHandle`, `cuMemRelease`, `cuMemUnmap`, `cuMemRelease`: the first
/// release gives the retained reference back and the handle stays live; the second is the
/// handle's own. One model for every reader of events (the analyzer's memory model, the
/// library's counters, isolate mode's handles), each of which keeps its own live handles and
/// calls [`Retained::retain`] only for one of them.
#[derive(Clone, Debug, Default)]
pub struct Retained(std::collections::HashMap<u64, u32>);

impl Retained {
    /// One more reference to the live `handle`.
    pub fn retain(&mut self, handle: u64) {
        *self.0.entry(handle).or_default() += 1;
    }

    /// An accepted release of `handle`: true when it gave a retained reference back (the handle
    /// stays live), false when it is the handle's own release.
    pub fn release(&mut self, handle: u64) -> bool {
        match self.0.get_mut(&handle) {
            None => false,
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.0.remove(&handle);
                }
                true
            }
        }
    }
}

/// Which memory a call deals in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Memory {
    Device,
    Managed,
    Host,
    /// Virtual address space, physical handles and mappings.
    Virtual,
    /// A graph memory node: allocated when the graph runs.
    Graph,
    /// Device memory another process allocated and shares with this one (CUDA IPC): opened
    /// and closed here, never this process's to free or to poison.
    Shared,
    None,
}

/// Whether a call happens in the order of a stream, and which.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Order {
    /// Not stream-ordered: it happens when it is called (a plain free waits for the device).
    Sync,
    /// In the order of the stream it is given (the legacy default stream for a null one).
    Stream,
    /// As `Stream`, in the `_ptsz` variant: a null stream is the calling thread's own default
    /// stream, on which only that thread may queue work.
    PerThread,
}

/// Where an allocation's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// Not from a stream-ordered pool (also every call that is not an allocation).
    Driver,
    /// The device's current memory pool (`cudaMallocAsync`, `cuMemAllocAsync`).
    DefaultPool,
    /// A pool the program names (`cudaMallocFromPoolAsync`, `cuMemAllocFromPoolAsync`).
    NamedPool,
}

/// How an allocation's memory is laid out, for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// One range, its address written to one out-parameter.
    Linear,
    /// Rows of a pitch the call chooses and writes back (`cudaMallocPitch`, `cudaMalloc3D`).
    Pitched,
}

macro_rules! apis {
    ($( $variant:ident = $name:literal, $kind:ident, $mem:ident, $order:ident, $source:ident, $layout:ident; )*) => {
        /// Every API a trace event can name. New variants only ever go at the end: the variant
        /// index is what the trace stores.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Encode, Decode, Default)]
        #[allow(non_camel_case_types)]
        pub enum Api {
            #[default]
            $( $variant, )*
        }

        impl Api {
            /// Every variant, in trace order.
            pub const ALL: &'static [Api] = &[$( Api::$variant, )*];

            /// The exported symbol name (`cudaMalloc`, `cuMemAlloc_v2`, …).
            pub const fn name(self) -> &'static str {
                match self { $( Api::$variant => $name, )* }
            }

            /// What the call does to memory.
            pub const fn kind(self) -> Kind {
                match self { $( Api::$variant => Kind::$kind, )* }
            }

            /// Which memory it deals in.
            pub const fn memory(self) -> Memory {
                match self { $( Api::$variant => Memory::$mem, )* }
            }

            /// Whether it happens in the order of a stream, and which.
            pub const fn order(self) -> Order {
                match self { $( Api::$variant => Order::$order, )* }
            }

            /// Where an allocation's memory comes from.
            pub const fn source(self) -> Source {
                match self { $( Api::$variant => Source::$source, )* }
            }

            /// How an allocation's memory is laid out.
            pub const fn layout(self) -> Layout {
                match self { $( Api::$variant => Layout::$layout, )* }
            }
        }
    };
}

// name = export, kind, memory, order, source, layout;
apis! {
    CudaMalloc = "cudaMalloc", Alloc, Device, Sync, Driver, Linear;
    CudaFree = "cudaFree", Free, Device, Sync, Driver, Linear;
    CudaMallocAsync = "cudaMallocAsync", Alloc, Device, Stream, DefaultPool, Linear;
    CudaMallocAsyncPtsz = "cudaMallocAsync_ptsz", Alloc, Device, PerThread, DefaultPool, Linear;
    CudaFreeAsync = "cudaFreeAsync", Free, Device, Stream, Driver, Linear;
    CudaFreeAsyncPtsz = "cudaFreeAsync_ptsz", Free, Device, PerThread, Driver, Linear;
    CudaMallocFromPoolAsync = "cudaMallocFromPoolAsync", Alloc, Device, Stream, NamedPool, Linear;
    CudaMallocFromPoolAsyncPtsz = "cudaMallocFromPoolAsync_ptsz", Alloc, Device, PerThread, NamedPool, Linear;
    CudaMallocManaged = "cudaMallocManaged", Alloc, Managed, Sync, Driver, Linear;
    CudaMallocPitch = "cudaMallocPitch", Alloc, Device, Sync, Driver, Pitched;
    CudaMalloc3D = "cudaMalloc3D", Alloc, Device, Sync, Driver, Pitched;
    CudaMallocHost = "cudaMallocHost", Alloc, Host, Sync, Driver, Linear;
    CudaHostAlloc = "cudaHostAlloc", Alloc, Host, Sync, Driver, Linear;
    CudaFreeHost = "cudaFreeHost", Free, Host, Sync, Driver, Linear;
    CudaHostRegister = "cudaHostRegister", Register, Host, Sync, Driver, Linear;
    CudaHostUnregister = "cudaHostUnregister", Unregister, Host, Sync, Driver, Linear;
    CuMemAlloc = "cuMemAlloc_v2", Alloc, Device, Sync, Driver, Linear;
    CuMemFree = "cuMemFree_v2", Free, Device, Sync, Driver, Linear;
    CuMemAllocAsync = "cuMemAllocAsync", Alloc, Device, Stream, DefaultPool, Linear;
    CuMemAllocAsyncPtsz = "cuMemAllocAsync_ptsz", Alloc, Device, PerThread, DefaultPool, Linear;
    CuMemFreeAsync = "cuMemFreeAsync", Free, Device, Stream, Driver, Linear;
    CuMemFreeAsyncPtsz = "cuMemFreeAsync_ptsz", Free, Device, PerThread, Driver, Linear;
    CuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync", Alloc, Device, Stream, NamedPool, Linear;
    CuMemAllocFromPoolAsyncPtsz = "cuMemAllocFromPoolAsync_ptsz", Alloc, Device, PerThread, NamedPool, Linear;
    CuMemAllocManaged = "cuMemAllocManaged", Alloc, Managed, Sync, Driver, Linear;
    CuMemAllocPitch = "cuMemAllocPitch_v2", Alloc, Device, Sync, Driver, Pitched;
    CuMemAllocHost = "cuMemAllocHost_v2", Alloc, Host, Sync, Driver, Linear;
    CuMemHostAlloc = "cuMemHostAlloc", Alloc, Host, Sync, Driver, Linear;
    CuMemFreeHost = "cuMemFreeHost", Free, Host, Sync, Driver, Linear;
    CuMemHostRegister = "cuMemHostRegister_v2", Register, Host, Sync, Driver, Linear;
    CuMemHostUnregister = "cuMemHostUnregister", Unregister, Host, Sync, Driver, Linear;
    CuMemAddressReserve = "cuMemAddressReserve", Reserve, Virtual, Sync, Driver, Linear;
    CuMemAddressFree = "cuMemAddressFree", AddressFree, Virtual, Sync, Driver, Linear;
    CuMemCreate = "cuMemCreate", Create, Virtual, Sync, Driver, Linear;
    CuMemRelease = "cuMemRelease", Release, Virtual, Sync, Driver, Linear;
    CuMemMap = "cuMemMap", Map, Virtual, Sync, Driver, Linear;
    CuMemUnmap = "cuMemUnmap", Unmap, Virtual, Sync, Driver, Linear;
    CuMemSetAccess = "cuMemSetAccess", SetAccess, Virtual, Sync, Driver, Linear;
    CuGraphAddMemAllocNode = "cuGraphAddMemAllocNode", Alloc, Graph, Sync, Driver, Linear;
    CuGraphAddMemFreeNode = "cuGraphAddMemFreeNode", Free, Graph, Sync, Driver, Linear;
    CuLaunchKernel = "cuLaunchKernel", Launch, None, Stream, Driver, Linear;
    CuLaunchKernelPtsz = "cuLaunchKernel_ptsz", Launch, None, PerThread, Driver, Linear;
    CuLaunchKernelEx = "cuLaunchKernelEx", Launch, None, Stream, Driver, Linear;
    CuLaunchKernelExPtsz = "cuLaunchKernelEx_ptsz", Launch, None, PerThread, Driver, Linear;
    CuLaunchCooperativeKernel = "cuLaunchCooperativeKernel", Launch, None, Stream, Driver, Linear;
    CuLaunchCooperativeKernelPtsz = "cuLaunchCooperativeKernel_ptsz", Launch, None, PerThread, Driver, Linear;
    CuIpcOpenMemHandle = "cuIpcOpenMemHandle_v2", Alloc, Shared, Sync, Driver, Linear;
    CuIpcCloseMemHandle = "cuIpcCloseMemHandle", Free, Shared, Sync, Driver, Linear;
    CudaIpcOpenMemHandle = "cudaIpcOpenMemHandle", Alloc, Shared, Sync, Driver, Linear;
    CudaIpcCloseMemHandle = "cudaIpcCloseMemHandle", Free, Shared, Sync, Driver, Linear;
    CuMemRetainAllocationHandle = "cuMemRetainAllocationHandle", Retain, Virtual, Sync, Driver, Linear;
}

impl Api {
    /// The API with this exported name, if any.
    pub fn from_name(name: &str) -> Option<Api> {
        Api::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// True for runtime (`cuda*`) entry points, false for driver (`cu*`) ones.
    pub fn is_runtime(self) -> bool {
        self.name().starts_with("cuda")
    }

    /// True when it happens in the order of a stream (`Order::Stream` or `Order::PerThread`).
    pub const fn stream_ordered(self) -> bool {
        !matches!(self.order(), Order::Sync)
    }

    /// True for the `_ptsz` variants: a null stream is the calling thread's own default stream.
    pub const fn per_thread_stream(self) -> bool {
        matches!(self.order(), Order::PerThread)
    }

    /// True for allocations from a stream-ordered pool (the device's current one or a named one).
    pub const fn from_pool(self) -> bool {
        !matches!(self.source(), Source::Driver)
    }

    /// True for allocations guard mode can make itself: one linear range of device memory,
    /// its address the only out-parameter (not managed, host, graph or shared memory, and not
    /// a pitched allocation, whose pitch the caller reads back).
    pub const fn guardable(self) -> bool {
        matches!(self.kind(), Kind::Alloc)
            && matches!(self.memory(), Memory::Device)
            && matches!(self.layout(), Layout::Linear)
    }

    /// True when the event's memory is host memory (pinned or registered).
    pub fn is_host(self) -> bool {
        self.memory() == Memory::Host
    }
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &api in Api::ALL {
            assert!(seen.insert(api.name()), "duplicate name {}", api.name());
            assert_eq!(Api::from_name(api.name()), Some(api));
        }
        assert_eq!(Api::from_name("cudaMemcpy"), None);
    }

    /// The columns agree with CUDA's naming: `_ptsz` is the per-thread stream, `Async` and
    /// launches are stream-ordered, `FromPool` names a pool, `Pitch`/`3D` write a pitch. A row
    /// added with a column copied from the wrong neighbour fails here.
    #[test]
    fn the_columns_agree_with_the_names() {
        for &api in Api::ALL {
            let n = api.name();
            assert_eq!(api.per_thread_stream(), n.ends_with("_ptsz"), "{n}");
            assert_eq!(
                api.stream_ordered(),
                n.contains("Async") || n.contains("Launch"),
                "{n}"
            );
            assert_eq!(
                api.source() == Source::NamedPool,
                n.contains("FromPool"),
                "{n}"
            );
            assert_eq!(
                api.from_pool(),
                api.kind() == Kind::Alloc && n.contains("Async"),
                "{n}"
            );
            assert_eq!(
                api.layout() == Layout::Pitched,
                n.contains("Pitch") || n.contains("3D"),
                "{n}"
            );
        }
        let guardable: Vec<&str> = Api::ALL
            .iter()
            .filter(|a| a.guardable())
            .map(|a| a.name())
            .collect();
        assert_eq!(
            guardable,
            [
                "cudaMalloc",
                "cudaMallocAsync",
                "cudaMallocAsync_ptsz",
                "cudaMallocFromPoolAsync",
                "cudaMallocFromPoolAsync_ptsz",
                "cuMemAlloc_v2",
                "cuMemAllocAsync",
                "cuMemAllocAsync_ptsz",
                "cuMemAllocFromPoolAsync",
                "cuMemAllocFromPoolAsync_ptsz",
            ]
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(Api::CuMemAlloc.kind(), Kind::Alloc);
        assert_eq!(Api::CudaFreeHost.memory(), Memory::Host);
        assert!(Api::CudaHostAlloc.is_host());
        assert!(!Api::CuMemAlloc.is_runtime());
        assert!(Api::CudaMalloc3D.is_runtime());
    }
}
