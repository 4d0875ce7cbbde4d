//! The zone's reclaim policy: a VMM whose VM lives in a zone takes memory back from its guest,
//! through the balloon, when the zone runs low, before any VM has to wait for a frame; and
//! gives it back once the pressure is gone. No daemon: every VMM on the zone runs its own
//! policy, and they share the deficit through the zone itself.
//!
//! Every [`TICK`], a VM with a balloon whose guest reports statistics:
//! * records its *spare* in its zone slot: the guest's available (else free) memory as its
//!   latest statistics tell, less a margin of a sixteenth of its RAM that it keeps;
//! * when the zone's free memory is below the threshold (`low`, a percentage of the zone),
//!   inflates its balloon by its share of the deficit up to twice the threshold, in proportion
//!   to its spare against the spare of every VM on the zone (so every VM gives the same
//!   fraction of what it can spare), and never by more than its spare;
//! * when the zone's free memory is above twice the threshold, deflates what the policy
//!   inflated by a quarter of the surplus at a time (every VMM sees the same surplus, and each
//!   deflated page the guest touches again may cost a whole frame).
//!
//! After each change it waits until the guest has reached the target and reported statistics
//! again, so that it never acts twice on one report. A target a person sets (API, `vmm
//! balloon set`) replaces the policy's. A VM opts out with `--reclaim-below 0`.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use guest_mem::GuestMemory;

use crate::devices::balloon::BalloonHandle;
use crate::vm::control::{RunState, VmControl};

/// How often the policy looks at the zone.
pub const TICK: Duration = Duration::from_millis(250);
const MIB: u64 = 1 << 20;
/// Balloon pages (4 KiB) per MiB.
const PAGES_PER_MIB: u64 = 256;

/// The thread running a VM's policy; stopped and joined when dropped.
pub(super) struct ReclaimThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ReclaimThread {
    fn drop(&mut self) {
        let (flag, changed) = &*self.stop;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One VM's policy.
pub(super) struct Reclaim {
    balloon: BalloonHandle,
    memory: Weak<GuestMemory>,
    control: Weak<VmControl>,
    /// The threshold, in percent of the zone.
    below_percent: u8,
    ram_bytes: u64,
    /// MiB the policy inflated on top of `base_mib`, the target a person set.
    policy_mib: u64,
    base_mib: u64,
    /// The target the policy set last; another one was set by a person.
    last_set_mib: Option<u64>,
    /// After a change: the guest's statistics count once it had reached the target, `None`
    /// until it has; the policy acts again after a newer report.
    settled_at: Option<Option<u64>>,
}

impl Reclaim {
    /// The policy of the VM whose guest memory is `memory` (in a zone) and whose balloon is
    /// `balloon`, with the threshold `below_percent` of the zone.
    pub fn new(
        balloon: BalloonHandle,
        memory: &Arc<GuestMemory>,
        control: &Arc<VmControl>,
        below_percent: u8,
        ram_bytes: u64,
    ) -> Self {
        let base_mib = u64::from(balloon.info().target_pages) / PAGES_PER_MIB;
        Self {
            balloon,
            memory: Arc::downgrade(memory),
            control: Arc::downgrade(control),
            below_percent,
            ram_bytes,
            policy_mib: 0,
            base_mib,
            last_set_mib: None,
            settled_at: None,
        }
    }

    /// Runs the policy on its own thread until the VM stops or the returned thread is dropped
    /// (which waits for it: the policy holds the balloon, and through it guest memory, which
    /// must go before the VMM leaves its zone).
    pub fn spawn(mut self) -> std::io::Result<ReclaimThread> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("zone-reclaim".into())
            .spawn(move || loop {
                let (flag, changed) = &*stopped;
                let flag = flag.lock().unwrap_or_else(|e| e.into_inner());
                let (flag, _) = changed
                    .wait_timeout_while(flag, TICK, |stop| !*stop)
                    .unwrap_or_else(|e| e.into_inner());
                if *flag {
                    return;
                }
                drop(flag);
                let Some(control) = self.control.upgrade() else {
                    return;
                };
                match control.state() {
                    RunState::Stopped => return,
                    RunState::Paused => continue,
                    RunState::Running => {}
                }
                let Some(memory) = self.memory.upgrade() else {
                    return;
                };
                self.tick(&memory);
            })?;
        Ok(ReclaimThread {
            stop,
            thread: Some(thread),
        })
    }

    /// One look at the zone and the guest.
    fn tick(&mut self, memory: &GuestMemory) {
        let Some(vm) = memory.zone_vm() else {
            return;
        };
        let info = self.balloon.info();
        let target_mib = u64::from(info.target_pages) / PAGES_PER_MIB;
        if self.last_set_mib.is_some_and(|set| set != target_mib) {
            // A person set a target: it replaces the policy's.
            self.base_mib = target_mib;
            self.policy_mib = 0;
            self.last_set_mib = None;
            self.settled_at = None;
        }
        let stats = info.stats;
        let free = stats.available_memory.or(stats.free_memory).unwrap_or(0);
        // A guest's figures are its own word: never more than its RAM, so that one claiming
        // more cannot shrink the other VMs' shares.
        let spare = free.min(self.ram_bytes).saturating_sub(self.ram_bytes / 16);
        vm.set_spare(spare);
        // Wait for the guest to reach the last target and to report after that.
        if let Some(settled) = self.settled_at {
            let updates = info.counters.stats_updates;
            match settled {
                None if info.actual_pages == info.target_pages => {
                    self.settled_at = Some(Some(updates));
                    return;
                }
                Some(at) if updates > at => self.settled_at = None,
                _ => return,
            }
        }
        let pool = memory.pool().stats();
        let zone = ZoneMemory {
            free: pool.free_bytes,
            total: pool.total_bytes,
            spare_total: vm.zone().spare_total().max(spare),
        };
        let room_mib = (self.ram_bytes / MIB).saturating_sub(self.base_mib + self.policy_mib);
        let change = match decide(zone, self.below_percent, spare, self.policy_mib, room_mib) {
            Step::Inflate(mib) => {
                self.policy_mib += mib;
                format!("inflates the balloon by {mib} MiB")
            }
            Step::Deflate(mib) => {
                self.policy_mib -= mib;
                format!("deflates the balloon by {mib} MiB")
            }
            Step::Nothing => return,
        };
        let target = self.base_mib + self.policy_mib;
        match self.balloon.set_target_mib(target) {
            Ok(()) => {
                log::info!(
                    "zone reclaim: {} MiB of {} MiB free (threshold {} %): {change}, to {target} \
                     MiB",
                    zone.free / MIB,
                    zone.total / MIB,
                    self.below_percent
                );
                self.last_set_mib = Some(target);
                self.settled_at = Some(None);
            }
            Err(e) => log::warn!("zone reclaim: cannot set the balloon's target: {e}"),
        }
    }
}

/// The zone's memory as one VM's policy sees it.
#[derive(Debug, Clone, Copy)]
struct ZoneMemory {
    /// Free bytes.
    free: u64,
    /// Bytes.
    total: u64,
    /// What the guests of all VMs on the zone can spare, this one's included.
    spare_total: u64,
}

/// What one look at the zone decides.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Inflate the balloon by this many MiB.
    Inflate(u64),
    /// Deflate what the policy inflated by this many MiB.
    Deflate(u64),
    /// Leave the balloon as it is.
    Nothing,
}

/// The policy (see the module docs) for a VM whose guest can spare `spare` bytes, whose
/// balloon the policy inflated by `inflated_mib` and can inflate by `room_mib` more.
fn decide(
    zone: ZoneMemory,
    below_percent: u8,
    spare: u64,
    inflated_mib: u64,
    room_mib: u64,
) -> Step {
    let low = zone.total * u64::from(below_percent) / 100;
    let high = 2 * low;
    if zone.free < low {
        if zone.spare_total == 0 {
            return Step::Nothing;
        }
        let deficit = high - zone.free;
        let share = u128::from(deficit) * u128::from(spare) / u128::from(zone.spare_total);
        let mib = u64::try_from(share)
            .unwrap_or(u64::MAX)
            .div_ceil(MIB)
            .min(spare / MIB)
            .min(room_mib);
        return match mib {
            0 => Step::Nothing,
            mib => Step::Inflate(mib),
        };
    }
    if zone.free > high && inflated_mib > 0 {
        // A quarter of the surplus at a time: every VMM on the zone sees the same surplus, and
        // a deflated page the guest touches again costs a whole frame (a balloon gives back
        // scattered 4 KiB pages of frames that were freed whole), so giving all of it back at
        // once could run the zone dry again.
        return match ((zone.free - high) / 4 / MIB).min(inflated_mib) {
            0 => Step::Nothing,
            mib => Step::Deflate(mib),
        };
    }
    Step::Nothing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(free_mib: u64, spare_total_mib: u64) -> ZoneMemory {
        ZoneMemory {
            free: free_mib * MIB,
            total: 1000 * MIB,
            spare_total: spare_total_mib * MIB,
        }
    }

    #[test]
    fn below_the_threshold_each_vm_gives_its_share_of_the_deficit_up_to_twice_the_threshold() {
        // 10 % of 1000 MiB: below 100 MiB free, inflate up to 200 MiB free.
        assert_eq!(
            decide(zone(40, 400), 10, 100 * MIB, 0, 1000),
            Step::Inflate(40)
        );
        assert_eq!(
            decide(zone(40, 400), 10, 300 * MIB, 0, 1000),
            Step::Inflate(120)
        );
        // Never more than the guest can spare, nor than its RAM allows.
        assert_eq!(
            decide(zone(0, 50), 10, 50 * MIB, 0, 1000),
            Step::Inflate(50)
        );
        assert_eq!(
            decide(zone(0, 400), 10, 400 * MIB, 0, 30),
            Step::Inflate(30)
        );
        // Nobody can spare anything: nothing to do.
        assert_eq!(decide(zone(0, 0), 10, 0, 0, 1000), Step::Nothing);
    }

    #[test]
    fn above_twice_the_threshold_the_policy_deflates_what_it_inflated() {
        // A quarter of the surplus over twice the threshold (200 MiB) at a time.
        assert_eq!(decide(zone(260, 400), 10, 0, 100, 0), Step::Deflate(15));
        assert_eq!(decide(zone(900, 400), 10, 0, 100, 0), Step::Deflate(100));
        assert_eq!(decide(zone(500, 400), 10, 0, 100, 0), Step::Deflate(75));
        assert_eq!(decide(zone(900, 400), 10, 0, 0, 1000), Step::Nothing);
        // Between the two: the balloon stays.
        assert_eq!(decide(zone(150, 400), 10, 100 * MIB, 100, 0), Step::Nothing);
    }
}
