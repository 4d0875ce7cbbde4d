//! Which queue index plays which role.
//!
//! virtio 1.2 §5.5.2 lists inflateq 0, deflateq 1, statsq 2, free_page_vq 3 and reporting_vq 4,
//! each of the last three existing only with its feature. Drivers and devices (Linux, QEMU) number
//! the queues that exist consecutively, which later spec versions made explicit: with STATS_VQ and
//! PAGE_REPORTING but no FREE_PAGE_HINT the reporting queue is index 3; without STATS_VQ it is
//! index 2.

use crate::spec::{
    VIRTIO_BALLOON_F_FREE_PAGE_HINT, VIRTIO_BALLOON_F_PAGE_REPORTING, VIRTIO_BALLOON_F_STATS_VQ,
};

/// What a queue is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRole {
    /// Page frame numbers the guest gives away.
    Inflate,
    /// Page frame numbers the guest takes back.
    Deflate,
    /// The guest's memory statistics.
    Stats,
    /// Free page hints, in the runs the host starts.
    FreePageHint,
    /// Free page reports.
    Reporting,
}

impl QueueRole {
    /// Number of roles.
    pub const COUNT: usize = 5;

    /// A dense index for per-role arrays.
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// The queues that exist for a set of features, in index order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    roles: [Option<QueueRole>; QueueRole::COUNT],
}

impl QueueLayout {
    /// The layout for `features` (offered ones for the queue count, acked ones when active).
    pub fn new(features: u64) -> Self {
        let has = |bit: u32| features & (1 << bit) != 0;
        let mut roles = [None; QueueRole::COUNT];
        let present = [
            Some(QueueRole::Inflate),
            Some(QueueRole::Deflate),
            has(VIRTIO_BALLOON_F_STATS_VQ).then_some(QueueRole::Stats),
            has(VIRTIO_BALLOON_F_FREE_PAGE_HINT).then_some(QueueRole::FreePageHint),
            has(VIRTIO_BALLOON_F_PAGE_REPORTING).then_some(QueueRole::Reporting),
        ];
        for (slot, role) in roles.iter_mut().zip(present.into_iter().flatten()) {
            *slot = Some(role);
        }
        Self { roles }
    }

    /// The number of queues.
    pub fn len(&self) -> usize {
        self.roles.iter().flatten().count()
    }

    /// Whether there are no queues (never: inflate and deflate always exist).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The role of queue `index`, if it exists.
    pub fn role(&self, index: u16) -> Option<QueueRole> {
        self.roles.get(usize::from(index)).copied().flatten()
    }

    /// The index of the queue playing `role`, if it exists.
    pub fn index(&self, role: QueueRole) -> Option<u16> {
        self.roles
            .iter()
            .position(|r| *r == Some(role))
            .and_then(|i| u16::try_from(i).ok())
    }

    /// The roles in index order.
    pub fn roles(&self) -> impl Iterator<Item = QueueRole> + '_ {
        self.roles.iter().flatten().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QueueRole::*;

    fn layout(stats: bool, reporting: bool) -> QueueLayout {
        let features = u64::from(stats) << VIRTIO_BALLOON_F_STATS_VQ
            | u64::from(reporting) << VIRTIO_BALLOON_F_PAGE_REPORTING;
        QueueLayout::new(features)
    }

    #[test]
    fn absent_queues_shift_the_later_ones_down() {
        let all = layout(true, true);
        assert_eq!(
            all.roles().collect::<Vec<_>>(),
            [Inflate, Deflate, Stats, Reporting]
        );
        assert_eq!(all.index(Reporting), Some(3));
        assert_eq!(all.role(4), None);

        let reporting_only = layout(false, true);
        assert_eq!(reporting_only.len(), 3);
        assert_eq!(reporting_only.role(2), Some(Reporting));
        assert_eq!(reporting_only.index(Stats), None);

        let basic = layout(false, false);
        assert_eq!(basic.len(), 2);
        assert!(!basic.is_empty());
        assert_eq!(basic.role(2), None);
        assert_eq!(basic.role(u16::MAX), None);
        assert_eq!(layout(true, false).role(2), Some(Stats));

        // Free page hinting comes between statistics and reporting.
        let hinting = QueueLayout::new(
            1 << VIRTIO_BALLOON_F_FREE_PAGE_HINT | 1 << VIRTIO_BALLOON_F_PAGE_REPORTING,
        );
        assert_eq!(
            hinting.roles().collect::<Vec<_>>(),
            [Inflate, Deflate, FreePageHint, Reporting]
        );
        let every = QueueLayout::new(
            1 << VIRTIO_BALLOON_F_STATS_VQ
                | 1 << VIRTIO_BALLOON_F_FREE_PAGE_HINT
                | 1 << VIRTIO_BALLOON_F_PAGE_REPORTING,
        );
        assert_eq!(
            (every.index(FreePageHint), every.index(Reporting)),
            (Some(3), Some(4))
        );
    }
}
