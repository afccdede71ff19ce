//! The CUDA entry points a trace can name, and what each one does to memory.

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

macro_rules! apis {
    ($( $variant:ident = $name:literal, $kind:ident, $mem:ident; )*) => {
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
        }
    };
}

apis! {
    CudaMalloc = "cudaMalloc", Alloc, Device;
    CudaFree = "cudaFree", Free, Device;
    CudaMallocAsync = "cudaMallocAsync", Alloc, Device;
    CudaMallocAsyncPtsz = "cudaMallocAsync_ptsz", Alloc, Device;
    CudaFreeAsync = "cudaFreeAsync", Free, Device;
    CudaFreeAsyncPtsz = "cudaFreeAsync_ptsz", Free, Device;
    CudaMallocFromPoolAsync = "cudaMallocFromPoolAsync", Alloc, Device;
    CudaMallocFromPoolAsyncPtsz = "cudaMallocFromPoolAsync_ptsz", Alloc, Device;
    CudaMallocManaged = "cudaMallocManaged", Alloc, Managed;
    CudaMallocPitch = "cudaMallocPitch", Alloc, Device;
    CudaMalloc3D = "cudaMalloc3D", Alloc, Device;
    CudaMallocHost = "cudaMallocHost", Alloc, Host;
    CudaHostAlloc = "cudaHostAlloc", Alloc, Host;
    CudaFreeHost = "cudaFreeHost", Free, Host;
    CudaHostRegister = "cudaHostRegister", Register, Host;
    CudaHostUnregister = "cudaHostUnregister", Unregister, Host;
    CuMemAlloc = "cuMemAlloc_v2", Alloc, Device;
    CuMemFree = "cuMemFree_v2", Free, Device;
    CuMemAllocAsync = "cuMemAllocAsync", Alloc, Device;
    CuMemAllocAsyncPtsz = "cuMemAllocAsync_ptsz", Alloc, Device;
    CuMemFreeAsync = "cuMemFreeAsync", Free, Device;
    CuMemFreeAsyncPtsz = "cuMemFreeAsync_ptsz", Free, Device;
    CuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync", Alloc, Device;
    CuMemAllocFromPoolAsyncPtsz = "cuMemAllocFromPoolAsync_ptsz", Alloc, Device;
    CuMemAllocManaged = "cuMemAllocManaged", Alloc, Managed;
    CuMemAllocPitch = "cuMemAllocPitch_v2", Alloc, Device;
    CuMemAllocHost = "cuMemAllocHost_v2", Alloc, Host;
    CuMemHostAlloc = "cuMemHostAlloc", Alloc, Host;
    CuMemFreeHost = "cuMemFreeHost", Free, Host;
    CuMemHostRegister = "cuMemHostRegister_v2", Register, Host;
    CuMemHostUnregister = "cuMemHostUnregister", Unregister, Host;
    CuMemAddressReserve = "cuMemAddressReserve", Reserve, Virtual;
    CuMemAddressFree = "cuMemAddressFree", AddressFree, Virtual;
    CuMemCreate = "cuMemCreate", Create, Virtual;
    CuMemRelease = "cuMemRelease", Release, Virtual;
    CuMemMap = "cuMemMap", Map, Virtual;
    CuMemUnmap = "cuMemUnmap", Unmap, Virtual;
    CuMemSetAccess = "cuMemSetAccess", SetAccess, Virtual;
    CuGraphAddMemAllocNode = "cuGraphAddMemAllocNode", Alloc, Graph;
    CuGraphAddMemFreeNode = "cuGraphAddMemFreeNode", Free, Graph;
    CuLaunchKernel = "cuLaunchKernel", Launch, None;
    CuLaunchKernelPtsz = "cuLaunchKernel_ptsz", Launch, None;
    CuLaunchKernelEx = "cuLaunchKernelEx", Launch, None;
    CuLaunchKernelExPtsz = "cuLaunchKernelEx_ptsz", Launch, None;
    CuLaunchCooperativeKernel = "cuLaunchCooperativeKernel", Launch, None;
    CuLaunchCooperativeKernelPtsz = "cuLaunchCooperativeKernel_ptsz", Launch, None;
    CuIpcOpenMemHandle = "cuIpcOpenMemHandle_v2", Alloc, Shared;
    CuIpcCloseMemHandle = "cuIpcCloseMemHandle", Free, Shared;
    CudaIpcOpenMemHandle = "cudaIpcOpenMemHandle", Alloc, Shared;
    CudaIpcCloseMemHandle = "cudaIpcCloseMemHandle", Free, Shared;
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

    #[test]
    fn kinds() {
        assert_eq!(Api::CuMemAlloc.kind(), Kind::Alloc);
        assert_eq!(Api::CudaFreeHost.memory(), Memory::Host);
        assert!(Api::CudaHostAlloc.is_host());
        assert!(!Api::CuMemAlloc.is_runtime());
        assert!(Api::CudaMalloc3D.is_runtime());
    }
}
