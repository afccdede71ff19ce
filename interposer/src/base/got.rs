//! Another loaded object's imports, read from its dynamic section, and its GOT slots rewritten:
//! the objects loaded now ([`loaded`]), each import's slot with the symbol's name and version
//! ([`Object::imports`]: the `R_X86_64_JUMP_SLOT` and `R_X86_64_GLOB_DAT` relocations of
//! `DT_JMPREL` and `DT_RELA`, names from `DT_SYMTAB`/`DT_STRTAB`, versions from
//! `DT_VERSYM`/`DT_VERNEED`), and one slot written ([`Object::write`]), also where `PT_GNU_RELRO`
//! made its page read-only. Every table is bounds-checked against the object's own segments
//! before anything is read from it; a malformed object is an error, never a crash.
//!
//! Layer: base. Uses nothing of this crate.

use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const PF_W: u32 = 2;
const PF_R: u32 = 4;

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_RELAENT: i64 = 9;
const DT_STRSZ: i64 = 10;
const DT_SYMENT: i64 = 11;
const DT_PLTREL: i64 = 20;
const DT_JMPREL: i64 = 23;
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_VERNEED: i64 = 0x6fff_fffe;
const DT_VERNEEDNUM: i64 = 0x6fff_ffff;

const R_X86_64_GLOB_DAT: u64 = 6;
const R_X86_64_JUMP_SLOT: u64 = 7;

/// `Elf64_Dyn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `Elf64_Rela`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

/// `Elf64_Sym`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code)] // every field, for the layout
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// `Elf64_Verneed`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code)] // every field, for the layout
struct Verneed {
    version: u16,
    cnt: u16,
    file: u32,
    aux: u32,
    next: u32,
}

/// `Elf64_Vernaux`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code)] // every field, for the layout
struct Vernaux {
    hash: u32,
    flags: u16,
    other: u16,
    name: u32,
    next: u32,
}

/// One loaded object, as `dl_iterate_phdr` shows it.
pub struct Object {
    /// The load bias (`l_addr`): what is added to the object's virtual addresses.
    pub bias: usize,
    phdr: *const libc::Elf64_Phdr,
    phnum: usize,
    /// Its file name as the loader knows it (empty for the executable).
    pub name: CString,
}

/// One import of an object: a GOT slot the loader fills with another object's function.
pub struct Import<'a> {
    pub name: &'a CStr,
    /// The version the reference asks for (`cudaMalloc@libcudart.so.13`), if any.
    pub version: Option<&'a CStr>,
    /// The slot's address.
    pub slot: usize,
    /// What the slot holds now.
    pub value: usize,
    /// True when the slot still points into the object itself: a lazy `JUMP_SLOT` not bound
    /// yet (its PLT entry), so `value` is not the function it will call.
    pub unbound: bool,
}

/// The objects loaded now, in the loader's order.
pub fn loaded() -> Vec<Object> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `&mut out` that `loaded` passed to dl_iterate_phdr below, which
        // calls this callback synchronously, one object at a time, while `out` is alive and not
        // otherwise borrowed.
        let out = unsafe { &mut *(data as *mut Vec<Object>) };
        // SAFETY: glibc passes a pointer to a `dl_phdr_info` valid for the duration of the
        // callback; the reference does not outlive it (only copied fields and an owned name are
        // kept).
        let info = unsafe { &*info };
        let name = if info.dlpi_name.is_null() {
            CString::default()
        } else {
            // SAFETY: a non-null `dlpi_name` is the loader's NUL-terminated name of the object,
            // alive while the callback runs; it is copied (`to_owned`) before returning.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned()
        };
        out.push(Object {
            bias: info.dlpi_addr as usize,
            phdr: info.dlpi_phdr,
            phnum: info.dlpi_phnum as usize,
            name,
        });
        0
    }
    let mut out: Vec<Object> = Vec::new();
    // SAFETY: `each` has the callback's C signature and only reads what glibc passes it; `data` is
    // `&mut out`, a live Vec<Object>, which is what `each` casts it back to.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut out as *mut _ as *mut c_void) };
    out
}

fn page_size() -> usize {
    // SAFETY: sysconf takes an integer and reads no memory of ours; a failure (-1) is handled.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// The dynamic section's entries we read.
#[derive(Default)]
struct Tables {
    strtab: Option<u64>,
    strsz: u64,
    symtab: Option<u64>,
    syment: Option<u64>,
    rela: Option<u64>,
    relasz: u64,
    relaent: Option<u64>,
    jmprel: Option<u64>,
    pltrelsz: u64,
    pltrel: Option<u64>,
    versym: Option<u64>,
    verneed: Option<u64>,
    verneednum: u64,
}

impl Object {
    /// True for the same loaded object (the same bias and program headers).
    pub fn same(&self, other: &Object) -> bool {
        self.bias == other.bias && std::ptr::eq(self.phdr, other.phdr)
    }

    /// The file name without its directories.
    pub fn file_name(&self) -> &[u8] {
        let b = self.name.to_bytes();
        b.rsplit(|&c| c == b'/').next().unwrap_or(b)
    }

    fn headers(&self) -> &[libc::Elf64_Phdr] {
        if self.phdr.is_null() {
            return &[];
        }
        // SAFETY: the loader keeps an object's program headers mapped while it is loaded.
        unsafe { std::slice::from_raw_parts(self.phdr, self.phnum) }
    }

    fn header(&self, kind: u32) -> Option<&libc::Elf64_Phdr> {
        self.headers().iter().find(|h| h.p_type == kind)
    }

    /// True when `[addr, addr + len)` lies inside one `PT_LOAD` segment with all of `flags`.
    fn inside(&self, addr: usize, len: usize, flags: u32) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.headers().iter().any(|h| {
            let start = self.bias.wrapping_add(h.p_vaddr as usize);
            h.p_type == PT_LOAD
                && h.p_flags & flags == flags
                && addr >= start
                && end <= start.saturating_add(h.p_memsz as usize)
        })
    }

    /// True when `addr` lies inside one of the object's segments.
    pub fn contains(&self, addr: usize) -> bool {
        self.inside(addr, 1, 0)
    }

    /// The address a dynamic-section pointer names, checked to hold `len` readable bytes. glibc
    /// adds the bias in place to most such pointers of a writable dynamic section, and to none
    /// of a read-only one (nor ever to `DT_VERNEED`): whichever reading lands in the object.
    fn at(&self, v: u64, len: usize) -> Result<usize, String> {
        let v = v as usize;
        [v, self.bias.wrapping_add(v)]
            .into_iter()
            .find(|&a| self.inside(a, len, PF_R))
            .ok_or_else(|| format!("a table at {v:#x} ({len} bytes) is outside the object"))
    }

    /// The `n`-th `T` of a table at `base`, checked to be readable.
    fn read<T: Copy>(&self, base: usize, n: usize) -> Result<T, String> {
        let size = std::mem::size_of::<T>();
        let addr = n
            .checked_mul(size)
            .and_then(|o| base.checked_add(o))
            .ok_or("an index overflows")?;
        if !self.inside(addr, size, PF_R) {
            return Err(format!(
                "entry {n} of a table at {base:#x} is outside the object"
            ));
        }
        // SAFETY: inside a readable segment of a loaded object.
        Ok(unsafe { std::ptr::read_unaligned(addr as *const T) })
    }

    /// The string at offset `off` of the string table.
    fn string(&self, strtab: usize, strsz: u64, off: u32) -> Result<&CStr, String> {
        if off as u64 >= strsz {
            return Err(format!("a name at offset {off} past the string table"));
        }
        let start = strtab + off as usize;
        let max = (strsz - off as u64) as usize;
        if !self.inside(start, max, PF_R) {
            return Err("the string table is outside the object".into());
        }
        // SAFETY: `max` readable bytes at `start`, checked above.
        let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, max) };
        CStr::from_bytes_until_nul(bytes).map_err(|_| format!("a name at offset {off} has no end"))
    }

    fn tables(&self) -> Result<Tables, String> {
        let dynamic = self.header(PT_DYNAMIC).ok_or("no PT_DYNAMIC")?;
        let base = self.bias.wrapping_add(dynamic.p_vaddr as usize);
        let count = dynamic.p_memsz as usize / std::mem::size_of::<Dyn>();
        let mut t = Tables::default();
        for i in 0..count {
            let d: Dyn = self.read(base, i)?;
            match d.tag {
                DT_NULL => return Ok(t),
                DT_STRTAB => t.strtab = Some(d.val),
                DT_STRSZ => t.strsz = d.val,
                DT_SYMTAB => t.symtab = Some(d.val),
                DT_SYMENT => t.syment = Some(d.val),
                DT_RELA => t.rela = Some(d.val),
                DT_RELASZ => t.relasz = d.val,
                DT_RELAENT => t.relaent = Some(d.val),
                DT_JMPREL => t.jmprel = Some(d.val),
                DT_PLTRELSZ => t.pltrelsz = d.val,
                DT_PLTREL => t.pltrel = Some(d.val),
                DT_VERSYM => t.versym = Some(d.val),
                DT_VERNEED => t.verneed = Some(d.val),
                DT_VERNEEDNUM => t.verneednum = d.val,
                _ => {}
            }
        }
        Err("the dynamic section has no DT_NULL".into())
    }

    /// The version named by version index `index` in `DT_VERNEED`.
    fn needed_version(&self, t: &Tables, strtab: usize, index: u16) -> Result<&CStr, String> {
        let mut at = self.at(
            t.verneed.ok_or("DT_VERSYM without DT_VERNEED")?,
            std::mem::size_of::<Verneed>(),
        )?;
        for _ in 0..t.verneednum.min(4096) {
            let need: Verneed = self.read(at, 0)?;
            let mut aux_at = at
                .checked_add(need.aux as usize)
                .ok_or("DT_VERNEED overflows")?;
            for _ in 0..need.cnt {
                let aux: Vernaux = self.read(aux_at, 0)?;
                if aux.other & 0x7fff == index {
                    return self.string(strtab, t.strsz, aux.name);
                }
                if aux.next == 0 {
                    break;
                }
                aux_at = aux_at
                    .checked_add(aux.next as usize)
                    .ok_or("DT_VERNEED overflows")?;
            }
            if need.next == 0 {
                break;
            }
            at = at
                .checked_add(need.next as usize)
                .ok_or("DT_VERNEED overflows")?;
        }
        Err(format!("version index {index} is not in DT_VERNEED"))
    }

    /// Every function the object imports through a GOT slot: its undefined symbols bound by
    /// `R_X86_64_JUMP_SLOT` or `R_X86_64_GLOB_DAT` (with no addend), one per slot. Symbols the
    /// object defines itself are left out, and so is a symbol whose version cannot be read. An
    /// error when any table is malformed: then nothing of the object should be touched.
    pub fn imports(&self) -> Result<Vec<Import<'_>>, String> {
        let t = self.tables()?;
        let mut out: Vec<Import<'_>> = Vec::new();
        let groups = [
            (t.jmprel, t.pltrelsz, "DT_JMPREL"),
            (t.rela, t.relasz, "DT_RELA"),
        ];
        if t.jmprel.is_some() && t.pltrel != Some(DT_RELA as u64) {
            return Err("DT_PLTREL is not DT_RELA".into());
        }
        if t.relaent
            .is_some_and(|e| e != std::mem::size_of::<Rela>() as u64)
        {
            return Err("DT_RELAENT is not 24".into());
        }
        if t.syment
            .is_some_and(|e| e != std::mem::size_of::<Sym>() as u64)
        {
            return Err("DT_SYMENT is not 24".into());
        }
        let rela_size = std::mem::size_of::<Rela>() as u64;
        for (table, size, what) in groups {
            let Some(table) = table else { continue };
            if size == 0 {
                continue;
            }
            if size % rela_size != 0 {
                return Err(format!("{what}'s size {size} is not a multiple of 24"));
            }
            let table = self.at(table, size as usize)?;
            let symtab = self.at(t.symtab.ok_or("no DT_SYMTAB")?, std::mem::size_of::<Sym>())?;
            let strtab = self.at(t.strtab.ok_or("no DT_STRTAB")?, 1)?;
            let versym = match t.versym {
                Some(v) => Some(self.at(v, 2)?),
                None => None,
            };
            for i in 0..(size / rela_size) as usize {
                let r: Rela = self.read(table, i)?;
                let kind = r.info & 0xffff_ffff;
                let index = (r.info >> 32) as usize;
                if (kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT) || index == 0 {
                    continue;
                }
                let sym: Sym = self.read(symtab, index)?;
                if sym.shndx != 0 || r.addend != 0 {
                    continue; // defined here (SHN_UNDEF is 0), or not a plain function pointer
                }
                let name = self.string(strtab, t.strsz, sym.name)?;
                if name.is_empty() {
                    continue;
                }
                let version = match versym {
                    Some(vs) => match self.read::<u16>(vs, index)? & 0x7fff {
                        0 | 1 => None, // local, or the unversioned base
                        v => match self.needed_version(&t, strtab, v) {
                            Ok(name) => Some(name),
                            // Not knowing which version it binds to, it is not ours to touch.
                            Err(_) => continue,
                        },
                    },
                    None => None,
                };
                let slot = self.bias.wrapping_add(r.offset as usize);
                if slot & 7 != 0 || !self.inside(slot, 8, PF_R) {
                    return Err(format!("the slot of {name:?} is outside the object"));
                }
                // SAFETY: eight readable bytes, checked above.
                let value =
                    unsafe { AtomicUsize::from_ptr(slot as *mut usize) }.load(Ordering::Acquire);
                if out.iter().any(|o| o.slot == slot) {
                    continue; // DT_RELASZ may cover DT_JMPREL too
                }
                out.push(Import {
                    name,
                    version,
                    slot,
                    value,
                    unbound: self.contains(value),
                });
            }
        }
        Ok(out)
    }

    /// The pages glibc made read-only after relocating the object (`_dl_protect_relro`: from the
    /// `PT_GNU_RELRO` segment's start rounded down to its end rounded down).
    fn relro(&self, page: usize) -> Option<(usize, usize)> {
        let h = self.header(PT_GNU_RELRO)?;
        let start = self.bias.wrapping_add(h.p_vaddr as usize);
        let end = start.checked_add(h.p_memsz as usize)?;
        Some((start & !(page - 1), end & !(page - 1)))
    }

    /// Writes `value` into the GOT slot `slot` (one of [`Object::imports`]'s), making a
    /// read-only relocation page writable for the write and read-only again after it.
    pub fn write(&self, slot: usize, value: usize) -> Result<(), String> {
        if slot & 7 != 0 || !self.inside(slot, 8, PF_R) {
            return Err(format!("slot {slot:#x} is outside the object"));
        }
        let page = page_size();
        let in_relro = self
            .relro(page)
            .is_some_and(|(start, end)| slot >= start && slot < end);
        if !in_relro && !self.inside(slot, 8, PF_R | PF_W) {
            return Err(format!("slot {slot:#x} is in a read-only segment"));
        }
        let first = (slot & !(page - 1)) as *mut c_void;
        if in_relro
            // SAFETY: `first` is the page-aligned start of the page holding `slot`, which the
            // checks above put inside this object's PT_GNU_RELRO segment, mapped since the object
            // was loaded; making a page of it writable changes no value, and only the thread
            // calling this writes it.
            && unsafe { libc::mprotect(first, page, libc::PROT_READ | libc::PROT_WRITE) } != 0
        {
            return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: an aligned, writable word of a loaded object: one store, atomic to any thread
        // that calls through the slot meanwhile.
        unsafe { AtomicUsize::from_ptr(slot as *mut usize) }.store(value, Ordering::Release);
        // SAFETY: the same page made writable above, back to read-only as glibc left it.
        if in_relro && unsafe { libc::mprotect(first, page, libc::PROT_READ) } != 0 {
            return Err(format!(
                "mprotect back to read-only: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::loaded;

    /// Every object of this test process parses; the executable's import of `dl_iterate_phdr`
    /// (which [`loaded`] calls) is found, bound to libc's, with its version; writing the slot
    /// back (through the RELRO page when it is there) leaves it working.
    #[test]
    fn this_process_reads_and_writes_back() {
        let objects = loaded();
        assert!(objects.len() > 2);
        let libc_fn = libc::dl_iterate_phdr as *const () as usize;
        let mut found = 0;
        for obj in &objects {
            let imports = obj
                .imports()
                .unwrap_or_else(|e| panic!("{:?}: {e}", obj.name));
            for imp in imports
                .iter()
                .filter(|i| i.name.to_bytes() == b"dl_iterate_phdr" && !i.unbound)
            {
                assert_eq!(imp.value, libc_fn, "{:?}", obj.name);
                assert!(
                    imp.version
                        .is_some_and(|v| v.to_bytes().starts_with(b"GLIBC_"))
                );
                obj.write(imp.slot, imp.value).unwrap();
                found += 1;
            }
        }
        assert!(found > 0, "no bound import of dl_iterate_phdr");
        assert_eq!(loaded().len(), objects.len());
    }
}
