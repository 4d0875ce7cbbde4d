//! The zone's reclaim policy: a VMM whose VM lives in a zone takes memory back from its guest,
//! through the balloon, when the zone runs low, before any VM has to wait for a frame; and
//! gives it back once the pressure is gone. No daemon: every VMM on the zone runs its own
//! policy, and they share the deficit through the zone itself.
//!
//! Every [`TICK`], a VM with a balloon whose guest reports statistics:
//! * records its *claim* in its zone slot: its *spare* (the guest's available, else free,
//!   memory as its latest statistics tell, less a margin of a sixteenth of its RAM that it
//!   keeps) times its weight (`--reclaim-weight`, 100 by default);
//! * when the zone's free memory is below the threshold (`low`, a percentage of the zone),
//!   inflates its balloon by its share of the deficit up to twice the threshold, in proportion
//!   to its claim against the claims of every VM on the zone (so VMs of one weight give the
//!   same fraction of what they can spare), never by more than its spare, and never so far
//!   that the guest keeps less than its floor (`--reclaim-floor`);
//! * when the zone's free memory is above twice the threshold, deflates what the policy
//!   inflated by a quarter of the surplus at a time (every VMM sees the same surplus, and each
//!   deflated page the guest touches again may cost a whole frame).
//!
//! After each change it waits until the guest has reached the target and reported statistics
//! again, so that it never acts twice on one report. A target a person sets (API, `vmm
//! balloon set`) replaces the policy's. A VM opts out with `--reclaim-below 0`.
//!
//! A guest that took free page hinting (`--balloon free_page_hinting=on`) is asked to hint
//! instead, when the zone runs low, at most every [`HINT_AGAIN_AFTER`]: the run gives back the
//! frames of every free page it names and takes nothing from the guest, where a balloon takes
//! free pages in no order, untouched ones and ones hinted before (that hold no frame) among
//! them, and leaves the guest less memory for nothing. Its balloon is not inflated (what the
//! policy inflated before the guest took hinting is still deflated). A run a person started is
//! left alone.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use guest_mem::GuestMemory;
use virtio_balloon::spec::{FREE_PAGE_HINT_DONE, VIRTIO_BALLOON_F_FREE_PAGE_HINT};
use virtio_balloon::BalloonReading;

use crate::config::ReclaimSettings;
use crate::vm::run_control::{RunState, VmControl};
use vmm_devices::balloon::BalloonHandle;

/// How often the policy looks at the zone.
pub const TICK: Duration = Duration::from_millis(250);
const MIB: u64 = 1 << 20;
/// Balloon pages (4 KiB) per MiB.
const PAGES_PER_MIB: u64 = 256;
/// The shortest time from the end of one hinting run the policy started to its next.
pub const HINT_AGAIN_AFTER: Duration = Duration::from_secs(5);
/// How long the policy lets a guest hint before it ends the run (the guest holds the pages
/// it hinted until then).
const HINT_RUN_LIMIT: Duration = Duration::from_secs(30);

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
    /// The VM's weight in sharing a deficit, in hundredths.
    weight: u16,
    /// MiB of RAM the policy always leaves the guest.
    floor_mib: u64,
    ram_bytes: u64,
    /// MiB the policy inflated on top of `base_mib`, the target a person set.
    policy_mib: u64,
    base_mib: u64,
    /// The target the policy set last; another one was set by a person.
    last_set_mib: Option<u64>,
    /// After a change: the guest's statistics count once it had reached the target, `None`
    /// until it has; the policy acts again after a newer report.
    settled_at: Option<Option<u64>>,
    /// The hinting run the policy started and has not seen end.
    hint_run: Option<HintRun>,
    /// When the policy's last hinting run ended.
    hint_ended: Option<Instant>,
}

/// A free page hinting run the policy started.
#[derive(Debug, Clone, Copy)]
struct HintRun {
    id: u32,
    started: Instant,
    /// The device's freed frames counter when it started.
    freed_before: u64,
}

impl Reclaim {
    /// The policy of the VM whose guest memory is `memory` (in a zone) and whose balloon is
    /// `balloon`, with its `settings`.
    pub fn new(
        balloon: BalloonHandle,
        memory: &Arc<GuestMemory>,
        control: &Arc<VmControl>,
        settings: ReclaimSettings,
        ram_bytes: u64,
    ) -> Self {
        let base_mib = u64::from(balloon.info().target_pages) / PAGES_PER_MIB;
        Self {
            balloon,
            memory: Arc::downgrade(memory),
            control: Arc::downgrade(control),
            below_percent: settings.below_percent,
            weight: settings.weight,
            floor_mib: settings.floor.div_ceil(MIB),
            ram_bytes,
            policy_mib: 0,
            base_mib,
            last_set_mib: None,
            settled_at: None,
            hint_run: None,
            hint_ended: None,
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
        let claim = claim_of(spare, self.weight);
        vm.set_spare(claim);
        let pool = memory.pool().stats();
        let zone = ZoneMemory {
            free: pool.free_bytes,
            total: pool.total_bytes,
            claim_total: vm.zone().spare_total().max(claim),
        };
        let took_hinting = took_hinting(&info);
        if self.hint(&info, zone, took_hinting) {
            return;
        }
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
        let room_mib = (self.ram_bytes / MIB)
            .saturating_sub(self.floor_mib)
            .saturating_sub(self.base_mib + self.policy_mib);
        let vm_share = VmShare {
            spare,
            claim,
            inflated_mib: self.policy_mib,
            room_mib,
        };
        let change = match decide(zone, self.below_percent, vm_share) {
            PolicyStep::Inflate(_) if took_hinting => return,
            PolicyStep::Inflate(mib) => {
                self.policy_mib += mib;
                format!("inflates the balloon by {mib} MiB")
            }
            PolicyStep::Deflate(mib) => {
                self.policy_mib -= mib;
                format!("deflates the balloon by {mib} MiB")
            }
            PolicyStep::Nothing => return,
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

    /// Free page hinting's part of one look: follows the run the policy started, or starts
    /// one when the zone is low and the guest `took_hinting`. Returns whether a run is under
    /// way (the balloon waits for its end: until then the guest holds what it hinted).
    fn hint(&mut self, info: &BalloonReading, zone: ZoneMemory, took_hinting: bool) -> bool {
        if let Some(run) = self.hint_run {
            let host_cmd = self.balloon.hinting_status().map(|status| status.host_cmd);
            if host_cmd.as_ref().is_ok_and(|&cmd| cmd == run.id) {
                if run.started.elapsed() < HINT_RUN_LIMIT {
                    return true;
                }
                log::warn!(
                    "zone reclaim: the guest did not finish hinting run {} in {HINT_RUN_LIMIT:?}: \
                     ended",
                    run.id
                );
                if let Err(e) = self.balloon.stop_hinting() {
                    log::warn!("zone reclaim: cannot end hinting run {}: {e}", run.id);
                }
            }
            log::info!(
                "zone reclaim: free page hinting run {} gave {} frames back in {:.1?}",
                run.id,
                info.counters.hint_freed_frames - run.freed_before,
                run.started.elapsed()
            );
            self.hint_run = None;
            self.hint_ended = Some(Instant::now());
            return false;
        }
        let rested = self
            .hint_ended
            .is_none_or(|ended| ended.elapsed() >= HINT_AGAIN_AFTER);
        if !took_hinting || !rested || zone.free >= zone.low(self.below_percent) {
            return false;
        }
        // A run a person started (and did not end) is theirs.
        match self.balloon.hinting_status() {
            Ok(status) if status.host_cmd <= FREE_PAGE_HINT_DONE => {}
            _ => return false,
        }
        match self.balloon.start_hinting(true) {
            Ok(id) => {
                log::info!(
                    "zone reclaim: {} MiB of {} MiB free (threshold {} %): free page hinting \
                     run {id}",
                    zone.free / MIB,
                    zone.total / MIB,
                    self.below_percent
                );
                self.hint_run = Some(HintRun {
                    id,
                    started: Instant::now(),
                    freed_before: info.counters.hint_freed_frames,
                });
                true
            }
            Err(e) => {
                log::warn!("zone reclaim: cannot start free page hinting: {e}");
                self.hint_ended = Some(Instant::now());
                false
            }
        }
    }
}

/// Whether the guest's balloon driver took free page hinting.
fn took_hinting(info: &BalloonReading) -> bool {
    info.acked_features & (1 << VIRTIO_BALLOON_F_FREE_PAGE_HINT) != 0
}

/// The zone's memory as one VM's policy sees it.
#[derive(Debug, Clone, Copy)]
struct ZoneMemory {
    /// Free bytes.
    free: u64,
    /// Bytes.
    total: u64,
    /// The claims of all VMs on the zone (what their guests can spare times their weights),
    /// this one's included.
    claim_total: u64,
}

/// One VM as its policy weighs it.
#[derive(Debug, Clone, Copy)]
struct VmShare {
    /// Bytes its guest can spare.
    spare: u64,
    /// Its spare times its weight (see [`claim_of`]).
    claim: u64,
    /// MiB the policy inflated its balloon by.
    inflated_mib: u64,
    /// MiB the policy may inflate its balloon by more (its RAM less its floor and balloon).
    room_mib: u64,
}

/// The claim of a VM whose guest can spare `spare` bytes, of weight `weight` (100: its spare).
fn claim_of(spare: u64, weight: u16) -> u64 {
    u64::try_from(u128::from(spare) * u128::from(weight) / 100).unwrap_or(u64::MAX)
}

impl ZoneMemory {
    /// The threshold: `below_percent` of the zone.
    fn low(&self, below_percent: u8) -> u64 {
        self.total * u64::from(below_percent) / 100
    }
}

/// What one look at the zone decides.
#[derive(Debug, PartialEq, Eq)]
enum PolicyStep {
    /// Inflate the balloon by this many MiB.
    Inflate(u64),
    /// Deflate what the policy inflated by this many MiB.
    Deflate(u64),
    /// Leave the balloon as it is.
    Nothing,
}

/// The policy (see the module docs) for VM `vm`.
fn decide(zone: ZoneMemory, below_percent: u8, vm: VmShare) -> PolicyStep {
    let VmShare {
        spare,
        claim,
        inflated_mib,
        room_mib,
    } = vm;
    let low = zone.low(below_percent);
    let high = 2 * low;
    if zone.free < low {
        if zone.claim_total == 0 {
            return PolicyStep::Nothing;
        }
        let deficit = high - zone.free;
        let share = u128::from(deficit) * u128::from(claim) / u128::from(zone.claim_total);
        let mib = u64::try_from(share)
            .unwrap_or(u64::MAX)
            .div_ceil(MIB)
            .min(spare / MIB)
            .min(room_mib);
        return match mib {
            0 => PolicyStep::Nothing,
            mib => PolicyStep::Inflate(mib),
        };
    }
    if zone.free > high && inflated_mib > 0 {
        // A quarter of the surplus at a time: every VMM on the zone sees the same surplus, and
        // a deflated page the guest touches again costs a whole frame (a balloon gives back
        // scattered 4 KiB pages of frames that were freed whole), so giving all of it back at
        // once could run the zone dry again.
        return match ((zone.free - high) / 4 / MIB).min(inflated_mib) {
            0 => PolicyStep::Nothing,
            mib => PolicyStep::Deflate(mib),
        };
    }
    PolicyStep::Nothing
}

#[cfg(test)]
mod tests {
    use guest_mem::{Backing, MemoryConfig, Pool, PoolConfig, Populate};
    use virtio_balloon::spec::{FREE_PAGE_HINT_STOP, VIRTIO_F_VERSION_1};
    use virtio_balloon::BalloonConfig;
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use super::*;
    use crate::layout::MMIO_GAP_START;
    use vmm_devices::balloon::testing::MmioDriver;
    use vmm_devices::balloon::{create, BalloonTransport};
    use vmm_devices::virtio::mmio::{registers as reg, MmioTransport};
    use vmm_devices::virtio::VirtioDevice;

    fn zone(free_mib: u64, spare_total_mib: u64) -> ZoneMemory {
        ZoneMemory {
            free: free_mib * MIB,
            total: 1000 * MIB,
            claim_total: spare_total_mib * MIB,
        }
    }

    /// A VM of weight 100 that can spare `spare` bytes, inflated by `inflated_mib` with room
    /// for `room_mib` more.
    fn vm(spare: u64, inflated_mib: u64, room_mib: u64) -> VmShare {
        VmShare {
            spare,
            claim: spare,
            inflated_mib,
            room_mib,
        }
    }

    #[test]
    fn a_heavier_vm_gives_more_of_the_deficit_and_none_gives_more_than_it_can_spare() {
        // Two VMs that can spare 200 MiB each, of weights 300 and 100: claims 600 and 200.
        let heavy = VmShare {
            claim: claim_of(200 * MIB, 300),
            ..vm(200 * MIB, 0, 1000)
        };
        let light = VmShare {
            claim: claim_of(200 * MIB, 100),
            ..vm(200 * MIB, 0, 1000)
        };
        assert_eq!(decide(zone(40, 800), 10, heavy), PolicyStep::Inflate(120));
        assert_eq!(decide(zone(40, 800), 10, light), PolicyStep::Inflate(40));
        // A heavy weight never takes more than the guest can spare.
        let spare_little = VmShare {
            claim: claim_of(10 * MIB, 1000),
            ..vm(10 * MIB, 0, 1000)
        };
        assert_eq!(
            decide(zone(0, 100), 10, spare_little),
            PolicyStep::Inflate(10)
        );
        assert_eq!(claim_of(u64::MAX, 1000), u64::MAX);
    }

    #[test]
    fn below_the_threshold_each_vm_gives_its_share_of_the_deficit_up_to_twice_the_threshold() {
        // 10 % of 1000 MiB: below 100 MiB free, inflate up to 200 MiB free.
        assert_eq!(
            decide(zone(40, 400), 10, vm(100 * MIB, 0, 1000)),
            PolicyStep::Inflate(40)
        );
        assert_eq!(
            decide(zone(40, 400), 10, vm(300 * MIB, 0, 1000)),
            PolicyStep::Inflate(120)
        );
        // Never more than the guest can spare, nor than its RAM allows.
        assert_eq!(
            decide(zone(0, 50), 10, vm(50 * MIB, 0, 1000)),
            PolicyStep::Inflate(50)
        );
        assert_eq!(
            decide(zone(0, 400), 10, vm(400 * MIB, 0, 30)),
            PolicyStep::Inflate(30)
        );
        // Nobody can spare anything: nothing to do.
        assert_eq!(decide(zone(0, 0), 10, vm(0, 0, 1000)), PolicyStep::Nothing);
    }

    #[test]
    fn above_twice_the_threshold_the_policy_deflates_what_it_inflated() {
        // A quarter of the surplus over twice the threshold (200 MiB) at a time.
        assert_eq!(
            decide(zone(260, 400), 10, vm(0, 100, 0)),
            PolicyStep::Deflate(15)
        );
        assert_eq!(
            decide(zone(900, 400), 10, vm(0, 100, 0)),
            PolicyStep::Deflate(100)
        );
        assert_eq!(
            decide(zone(500, 400), 10, vm(0, 100, 0)),
            PolicyStep::Deflate(75)
        );
        assert_eq!(
            decide(zone(900, 400), 10, vm(0, 0, 1000)),
            PolicyStep::Nothing
        );
        // Between the two: the balloon stays.
        assert_eq!(
            decide(zone(150, 400), 10, vm(100 * MIB, 100, 0)),
            PolicyStep::Nothing
        );
    }

    const RAM: u64 = 16 * MIB;
    /// The hinting queue of a driver that took no statistics: after inflate and deflate.
    const HINT_QUEUE: u16 = 2;
    const RINGS: u64 = 0x10_0000;
    const COMMAND: u64 = 0x18_0000;

    /// A guest with 16 MiB of touched RAM and a balloon offering free page hinting, a driver
    /// that took it, and the policy of its VM.
    fn hinting_guest() -> (Arc<GuestMemory>, BalloonTransport, Reclaim) {
        let pool = Pool::new(PoolConfig::new(Backing::Anonymous, 2 * RAM)).unwrap();
        let config = MemoryConfig {
            populate: Populate::Eager,
            ..MemoryConfig::new(vec![(GuestAddress(0), RAM)], 1)
        };
        let memory = Arc::new(GuestMemory::new(pool, config).unwrap());
        let config = BalloonConfig {
            free_page_hinting: true,
            ..BalloonConfig::default()
        };
        let balloon = create(memory.clone(), config).unwrap();
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let transport = MmioTransport::new(memory.clone(), balloon.device, irq).unwrap();
        let control = Arc::new(VmControl::new(1));
        let policy = Reclaim::new(
            balloon.handle,
            &memory,
            &control,
            ReclaimSettings {
                below_percent: 10,
                ..ReclaimSettings::default()
            },
            RAM,
        );
        (memory, transport, policy)
    }

    /// One look of the policy's hinting part at `zone`, as a tick takes it.
    fn look(policy: &mut Reclaim, zone: ZoneMemory) -> bool {
        let info = policy.balloon.info();
        policy.hint(&info, zone, took_hinting(&info))
    }

    /// The guest's side of a run: the command it hints for, `ranges` (address, MiB), STOP.
    fn guest_hints(
        memory: &GuestMemory,
        driver: &mut MmioDriver<'_, GuestMemory>,
        run: u32,
        ranges: &[(u64, u32)],
    ) {
        use vm_memory::Bytes;
        for (slot, cmd) in [(0, run), (1, FREE_PAGE_HINT_STOP)] {
            memory
                .write_obj(cmd.to_le(), GuestAddress(COMMAND + slot * 4))
                .unwrap();
        }
        driver.add_chain(HINT_QUEUE, &[(COMMAND, 4, false)]);
        for &(addr, mib) in ranges {
            driver.add_chain(HINT_QUEUE, &[(addr, mib * MIB as u32, true)]);
        }
        driver.add_chain(HINT_QUEUE, &[(COMMAND + 4, 4, false)]);
    }

    #[test]
    fn a_low_zone_starts_one_hinting_run_whose_pages_go_back_and_a_persons_run_is_left_alone() {
        let (memory, transport, mut policy) = hinting_guest();
        let features = 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_BALLOON_F_FREE_PAGE_HINT;
        let mut driver =
            MmioDriver::start(&transport, MMIO_GAP_START, &*memory, RINGS, features, 3, 64);
        let pool = memory.pool().clone();
        let free_before = pool.stats().free_bytes;
        let low = zone(50, 400);
        let plenty = zone(500, 400);

        // Above the threshold: no run.
        assert!(!look(&mut policy, plenty));
        assert_eq!(
            policy.balloon.hinting_status().unwrap().host_cmd,
            FREE_PAGE_HINT_STOP
        );
        // Below it: a run, which the balloon waits for.
        assert!(look(&mut policy, low));
        let run = policy.balloon.hinting_status().unwrap().host_cmd;
        assert!(run > FREE_PAGE_HINT_DONE);
        assert_eq!(driver.read(reg::CONFIG + 8), run);
        assert!(look(&mut policy, low), "the guest has not hinted yet");

        // The guest hints 4 MiB at 8 MiB and is through: the frames go back, and the run ends
        // (acknowledged) at the guest's STOP.
        guest_hints(&memory, &mut driver, run, &[(8 * MIB, 4)]);
        transport.device().lock().unwrap().process_queue(HINT_QUEUE);
        assert_eq!(pool.stats().free_bytes, free_before + 4 * MIB);
        assert_eq!(driver.read(reg::CONFIG + 8), FREE_PAGE_HINT_DONE);
        let info = policy.balloon.info();
        assert_eq!(info.counters.hint_freed_frames, 2);
        assert!(!policy.hint(&info, low, true), "the run is over");
        // Not again before HINT_AGAIN_AFTER.
        assert!(!policy.hint(&info, low, true));
        assert_eq!(
            policy.balloon.hinting_status().unwrap().host_cmd,
            FREE_PAGE_HINT_DONE
        );

        // A run a person started is theirs, even when the policy may hint again.
        policy.hint_ended = Some(Instant::now() - HINT_AGAIN_AFTER);
        let theirs = policy.balloon.start_hinting(false).unwrap();
        assert!(!look(&mut policy, low));
        assert_eq!(policy.balloon.hinting_status().unwrap().host_cmd, theirs);
        policy.balloon.stop_hinting().unwrap();
        assert!(look(&mut policy, low));
        assert!(policy.balloon.hinting_status().unwrap().host_cmd > theirs);
    }

    #[test]
    fn a_guest_without_hinting_gets_no_run() {
        let (memory, transport, mut policy) = hinting_guest();
        let features = 1 << VIRTIO_F_VERSION_1;
        let _driver =
            MmioDriver::start(&transport, MMIO_GAP_START, &*memory, RINGS, features, 2, 64);
        assert!(!look(&mut policy, zone(0, 400)));
        assert!(policy.hint_ended.is_none());
    }
}
