//! Cache-line write-back for persistent memory on ADR platforms.
//!
//! On eADR platforms (the default assumption) the caches are part of the persistence domain and
//! nothing needs to be flushed. On ADR platforms every committed change must be written back:
//! `clwb` where the CPU has it, otherwise `clflushopt` or `clflush`, followed by `sfence`.

use std::sync::OnceLock;

/// The write-back instruction this CPU offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteBack {
    Clwb,
    ClflushOpt,
    Clflush,
}

fn write_back() -> WriteBack {
    static KIND: OnceLock<WriteBack> = OnceLock::new();
    *KIND.get_or_init(|| {
        let ebx = std::arch::x86_64::__cpuid_count(7, 0).ebx;
        if ebx & (1 << 24) != 0 {
            WriteBack::Clwb
        } else if ebx & (1 << 23) != 0 {
            WriteBack::ClflushOpt
        } else {
            WriteBack::Clflush
        }
    })
}

/// Writes the cache line containing `ptr` back to memory and orders it before later stores.
pub(crate) fn persist(ptr: *const u8) {
    // SAFETY: the write-back instructions only need a mapped address, which the allocator's
    // metadata pointers always are; they do not change memory contents. The CPU supports the
    // chosen instruction (checked with cpuid).
    unsafe {
        match write_back() {
            WriteBack::Clwb => std::arch::asm!("clwb [{0}]", in(reg) ptr, options(nostack)),
            WriteBack::ClflushOpt => {
                std::arch::asm!("clflushopt [{0}]", in(reg) ptr, options(nostack))
            }
            WriteBack::Clflush => std::arch::asm!("clflush [{0}]", in(reg) ptr, options(nostack)),
        }
        std::arch::asm!("sfence", options(nostack, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn persist_runs_on_this_cpu() {
        let line = [0u8; 64];
        super::persist(line.as_ptr());
    }
}
