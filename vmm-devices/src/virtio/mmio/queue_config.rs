//! Driver writes to the per-queue registers (size, ring addresses, ready), validated.

use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace};

use super::registers as reg;
use super::{MmioTransport, TransportState};
use crate::virtio::status::{DRIVER_OK, FAILED, FEATURES_OK};
use crate::virtio::VirtioDevice;

impl<M: GuestAddressSpace, D: VirtioDevice<M>> MmioTransport<M, D> {
    /// Handles a write to a queue register of the selected queue. Legal only between
    /// FEATURES_OK and DRIVER_OK on a queue that is not ready (disabling is always allowed
    /// before DRIVER_OK).
    pub(super) fn write_queue_register(
        &self,
        state: &mut TransportState<M>,
        base: u64,
        offset: u64,
        value: u32,
    ) {
        let s = state.device_status;
        let disabling = offset == reg::QUEUE_READY && value == 0 && s & DRIVER_OK == 0;
        if !disabling && (s & FEATURES_OK == 0 || s & (DRIVER_OK | FAILED) != 0) {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: queue register {offset:#x} written in status {s:#x}"
            ));
            return;
        }
        let sel = state.queue_sel;
        let memory = state.memory.memory();
        let Some(queue) = state.queues.get_mut(sel as usize) else {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: queue register {offset:#x} for missing queue {sel}"
            ));
            return;
        };
        if queue.ready() && !disabling {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: queue {sel} is ready; disable it before changing it"
            ));
            return;
        }
        let result = match offset {
            reg::QUEUE_NUM => u16::try_from(value)
                .map_err(|_| virtio_queue::Error::InvalidSize)
                .and_then(|size| queue.try_set_size(size)),
            reg::QUEUE_DESC_LOW => queue.try_set_desc_table_address(low(queue.desc_table(), value)),
            reg::QUEUE_DESC_HIGH => {
                queue.try_set_desc_table_address(high(queue.desc_table(), value))
            }
            reg::QUEUE_AVAIL_LOW => {
                queue.try_set_avail_ring_address(low(queue.avail_ring(), value))
            }
            reg::QUEUE_AVAIL_HIGH => {
                queue.try_set_avail_ring_address(high(queue.avail_ring(), value))
            }
            reg::QUEUE_USED_LOW => queue.try_set_used_ring_address(low(queue.used_ring(), value)),
            reg::QUEUE_USED_HIGH => queue.try_set_used_ring_address(high(queue.used_ring(), value)),
            _ => {
                // QUEUE_READY
                queue.set_ready(value != 0);
                if value != 0 && !queue.is_valid(&*memory) {
                    queue.set_ready(false);
                    self.warnings.warn(format_args!(
                        "virtio-mmio@{base:#x}: queue {sel} rings are not in guest memory"
                    ));
                }
                Ok(())
            }
        };
        if let Err(e) = result {
            self.warnings.warn(format_args!(
                "virtio-mmio@{base:#x}: queue {sel}: register {offset:#x} = {value:#x}: {e}"
            ));
        }
    }
}

/// Replaces the low 32 bits of an address.
fn low(addr: u64, value: u32) -> GuestAddress {
    GuestAddress((addr & !0xffff_ffff) | u64::from(value))
}

/// Replaces the high 32 bits of an address.
fn high(addr: u64, value: u32) -> GuestAddress {
    GuestAddress((addr & 0xffff_ffff) | (u64::from(value) << 32))
}
