//! The device's state for a snapshot, and its restoration in another process: the
//! configuration space, what the device counted, the guest's latest statistics and, while a
//! driver drives it, the negotiated features, the statistics buffer it holds and whether it
//! waits for a reset. The queues' positions are the transport's to save ([`VirtioBalloon::queue_states`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestAddressSpace;

use super::{BalloonCounters, BalloonError, VirtioBalloon};
use crate::backend::{BalloonBackend, GuestNotifier};
use crate::queues::QueueRole;
use crate::spec::FREE_PAGE_HINT_DONE;
use crate::stats::GuestStats;
use crate::violations::Violations;

/// A balloon's state, apart from its options (which the VMM configures again) and its queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    /// Target in 4 KiB pages.
    pub target_pages: u32,
    /// The size the driver reported, in 4 KiB pages.
    pub actual_pages: u32,
    /// What the device did.
    pub counters: BalloonCounters,
    /// The guest's latest statistics as (tag, value) pairs.
    pub stats: Vec<(u16, u64)>,
    /// Invalid driver input seen.
    pub violations: Violations,
    /// Present while a driver drives the device.
    pub active: Option<ActiveState>,
    /// The host's free page hinting command.
    #[serde(default)]
    pub free_page_hint_cmd_id: u32,
    /// The guest's last free page hinting command.
    #[serde(default)]
    pub guest_hint_cmd: Option<u32>,
    /// The id of the last hinting run started.
    #[serde(default)]
    pub last_hint_run: u32,
}

/// The part of [`BalloonState`] that exists while a driver drives the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveState {
    /// Features the driver acknowledged.
    pub acked_features: u64,
    /// Head of the statistics buffer the device holds until it wants new statistics.
    pub held_stats: Option<u16>,
    /// The device stopped on broken queues and waits for a reset.
    pub needs_reset: bool,
}

/// What an active device needs on restoration: as for [`VirtioBalloon::activate`].
pub struct Reactivation<M, Q> {
    /// Guest memory of the queues.
    pub memory: M,
    /// The queues as the transport saved them, as (index, queue) pairs.
    pub queues: Q,
    /// Where interrupts go.
    pub notifier: Arc<dyn GuestNotifier>,
}

impl<M, Q> std::fmt::Debug for Reactivation<M, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactivation").finish_non_exhaustive()
    }
}

impl<M: GuestAddressSpace, B: BalloonBackend> VirtioBalloon<M, B> {
    /// The state to save; the queues' positions come from [`Self::queue_states`].
    pub fn save_state(&self) -> BalloonState {
        BalloonState {
            target_pages: self.space.num_pages,
            actual_pages: self.space.actual,
            counters: self.record.counters,
            stats: self.record.stats.entries(),
            violations: self.record.violations,
            active: self.active.as_ref().map(|active| ActiveState {
                acked_features: active.acked_features,
                held_stats: active.held_stats,
                needs_reset: active.needs_reset,
            }),
            free_page_hint_cmd_id: self.space.free_page_hint_cmd_id,
            guest_hint_cmd: self.record.guest_hint_cmd,
            last_hint_run: self.hint_runs.last_id,
        }
    }

    /// The positions of the queues an active device works on, by queue index (the transport's
    /// copies stop at the activation).
    pub fn queue_states(&self) -> Vec<(u16, QueueState)> {
        let Some(active) = &self.active else {
            return Vec::new();
        };
        active
            .layout
            .roles()
            .filter_map(|role| {
                let index = active.layout.index(role)?;
                let queue = active.queues[role.slot()].as_ref()?;
                Some((index, queue.state()))
            })
            .collect()
    }

    /// Restores a saved state into a device fresh from [`VirtioBalloon::new`] with the same options;
    /// a device that was active gets its queues back through `reactivation`. Unlike
    /// [`Self::activate`] it processes nothing: buffers the driver made available wait for its
    /// next notification. Everything is checked as an activation is (the state may come from a
    /// damaged file); on error the device is left inactive.
    pub fn restore<Q>(
        &mut self,
        state: &BalloonState,
        reactivation: Option<Reactivation<M, Q>>,
    ) -> Result<(), BalloonError>
    where
        Q: IntoIterator<Item = (u16, Queue)>,
    {
        if self.active.is_some() {
            return Err(BalloonError::AlreadyActive);
        }
        let active = match (state.active, reactivation) {
            (None, None) => None,
            (Some(saved), Some(reactivation)) => {
                let mut active = self.check_activation(
                    reactivation.memory,
                    saved.acked_features,
                    reactivation.queues,
                    reactivation.notifier,
                )?;
                if let Some(head) = saved.held_stats {
                    let stats_queue = active.queues[QueueRole::Stats.slot()].as_ref();
                    if stats_queue.is_none_or(|queue| head >= queue.size()) {
                        return Err(BalloonError::BadState(format!(
                            "held statistics buffer {head} is not in the statistics queue"
                        )));
                    }
                }
                active.held_stats = saved.held_stats;
                active.needs_reset = saved.needs_reset;
                Some(active)
            }
            (Some(_), None) => {
                return Err(BalloonError::BadState(
                    "the balloon was active but its queues are missing".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(BalloonError::BadState(
                    "the balloon was inactive but queues were handed over".into(),
                ))
            }
        };
        self.space.num_pages = state.target_pages;
        self.space.actual = state.actual_pages;
        self.record.counters = state.counters;
        self.record.stats = GuestStats::from_entries(&state.stats);
        self.record.violations = state.violations;
        self.record.guest_hint_cmd = state.guest_hint_cmd;
        self.hint_runs.last_id = state.last_hint_run;
        self.space.free_page_hint_cmd_id = state.free_page_hint_cmd_id;
        self.active = active;
        // A run that was going on ends: the guest uses the pages it hinted again (the VMM
        // that started it is gone, and so is whoever would have stopped it).
        if state.free_page_hint_cmd_id > FREE_PAGE_HINT_DONE && self.check_hinting().is_ok() {
            self.set_hint_cmd(FREE_PAGE_HINT_DONE)?;
        }
        Ok(())
    }
}
