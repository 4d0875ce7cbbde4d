//! A VM with one vCPU running the touch programs over guest RAM at guest address 0; the
//! programs live in a small slot of their own, so that loading them populates no RAM.

use std::time::{Duration, Instant};

use guest_mem::testing::{touch, KvmError, TouchVcpu, TouchVm, PROGRAMS};

use crate::host::Mapping;
use crate::subject::Ram;
use crate::MIB;

/// Guest address of the program slot: the last 2 MiB below 4 GiB (the programs run in 32-bit
/// mode).
pub const CODE_GPA: u64 = (4 << 30) - 2 * MIB;
/// The most RAM: it ends below the local APIC page at 0xfee0_0000, which KVM keeps for MMIO.
pub const MAX_RAM: u64 = (4 << 30) - 32 * MIB;

/// Strides of the touch programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stride {
    /// One dword per 4 KiB page.
    Page,
    /// One dword per 2 MiB.
    Huge,
    /// One dword per 1 GiB.
    Giant,
}

impl Stride {
    /// Parses "4k", "2m" or "1g".
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "4k" => Ok(Stride::Page),
            "2m" => Ok(Stride::Huge),
            "1g" => Ok(Stride::Giant),
            _ => Err(format!("unknown stride {text:?} (4k, 2m, 1g)")),
        }
    }

    /// The name used in the results.
    pub fn name(self) -> &'static str {
        match self {
            Stride::Page => "4k",
            Stride::Huge => "2m",
            Stride::Giant => "1g",
        }
    }

    /// Bytes between touches.
    pub fn bytes(self) -> u64 {
        match self {
            Stride::Page => 4096,
            Stride::Huge => 2 * MIB,
            Stride::Giant => 1 << 30,
        }
    }
}

/// A VM over some guest RAM with one vCPU, run on the calling thread.
pub struct BenchGuest<'a> {
    vcpu: TouchVcpu,
    ram: &'a Ram,
    _vm: TouchVm,
    _code: Mapping,
}

fn kvm(e: KvmError) -> String {
    e.to_string()
}

impl<'a> BenchGuest<'a> {
    /// A VM over `ram`; the calling thread becomes vCPU 0 of its guest memory.
    pub fn new(ram: &'a Ram) -> Result<Self, String> {
        let code = Mapping::anonymous(2 * MIB as usize, 2 * MIB as usize)
            .map_err(|e| format!("program slot: {e}"))?;
        // SAFETY: the slot is a fresh read/write mapping of 2 MiB that only this VM uses.
        unsafe {
            std::ptr::copy_nonoverlapping(PROGRAMS.as_ptr(), code.addr() as *mut u8, PROGRAMS.len())
        };
        let vm = TouchVm::empty(CODE_GPA).map_err(kvm)?;
        // SAFETY: `ram` outlives the VM (the borrow in `BenchGuest`), and so does `code` (a field
        // dropped after the VM).
        unsafe {
            vm.add_memory(0, 0, ram.host_addr(), ram.size())
                .map_err(kvm)?;
            vm.add_memory(1, CODE_GPA, code.addr(), 2 * MIB)
                .map_err(kvm)?;
        }
        if let Some(memory) = ram.memory() {
            memory.register_vcpu(0).map_err(|e| e.to_string())?;
        }
        crate::pinning::pin_threads()?;
        let vcpu = vm.create_vcpu(0).map_err(kvm)?;
        Ok(Self {
            vcpu,
            ram,
            _vm: vm,
            _code: code,
        })
    }

    fn touches(&self, stride: Stride) -> Result<u32, String> {
        u32::try_from(self.ram.size() / stride.bytes())
            .map_err(|_| "too many touches for the guest's 32-bit counter".to_string())
    }

    /// Touches one dword per `stride` over all of the RAM, writing `marker`; returns how long
    /// the guest ran and the OR of the old values.
    pub fn touch_all(&mut self, stride: Stride, marker: u32) -> Result<(Duration, u32), String> {
        let job = touch(0, stride.bytes(), self.touches(stride)?, marker);
        let started = Instant::now();
        let old = self
            .vcpu
            .run(job, self.ram.memory())
            .map_err(|e| format!("{e:?}"))?;
        Ok((started.elapsed(), old))
    }

    /// As [`BenchGuest::touch_all`] with the stepped program; returns the time of every touch, as
    /// the VMM sees it (from one exit to the next), and the OR of the old values.
    pub fn touch_each(
        &mut self,
        stride: Stride,
        marker: u32,
    ) -> Result<(Vec<Duration>, u32), String> {
        let count = self.touches(stride)?;
        let job = touch(0, stride.bytes(), count, marker);
        let mut times = Vec::with_capacity(count as usize);
        let mut last = Instant::now();
        let old = self
            .vcpu
            .run_stepped(job, self.ram.memory(), &mut || {
                let now = Instant::now();
                times.push(now - last);
                last = now;
            })
            .map_err(|e| format!("{e:?}"))?;
        Ok((times, old))
    }
}
