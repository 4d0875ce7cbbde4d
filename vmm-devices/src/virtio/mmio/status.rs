//! Legal driver-initiated device status transitions (virtio 1.2 §3.1.1).

use crate::virtio::status::{
    ACKNOWLEDGE, DEVICE_NEEDS_RESET, DRIVER, DRIVER_OK, FAILED, FEATURES_OK,
};

/// The initialization steps, in the order the driver must set them.
const ORDER: [u32; 4] = [ACKNOWLEDGE, DRIVER, FEATURES_OK, DRIVER_OK];

/// Returns the new status when the driver writes `requested` (non-zero) over `current`, or
/// `None` if the write is illegal. The driver may only add bits: the next initialization
/// step, FAILED at any time, or nothing. It may not clear bits (only a write of 0 resets),
/// skip a step, or set DEVICE_NEEDS_RESET, which only the device sets (and which the driver
/// echoes back unchanged).
pub fn transition(current: u32, requested: u32) -> Option<u32> {
    let driver_bits = ORDER.iter().fold(FAILED, |acc, bit| acc | bit);
    let requested_steps = requested & !(FAILED | DEVICE_NEEDS_RESET);
    if requested & !(driver_bits | DEVICE_NEEDS_RESET) != 0 {
        return None;
    }
    if current & !requested & !DEVICE_NEEDS_RESET != 0 {
        return None; // clears a bit
    }
    if requested & DEVICE_NEEDS_RESET & !current != 0 {
        return None; // only the device sets it
    }
    if current & FAILED != 0 && requested_steps & !current != 0 {
        return None; // no progress after FAILED
    }
    let added = requested_steps & !current;
    if added != 0 {
        // Exactly one step, the first one missing.
        let next = ORDER.iter().find(|bit| current & **bit == 0)?;
        if added != *next {
            return None;
        }
    }
    Some(requested | (current & DEVICE_NEEDS_RESET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_sequence_is_accepted() {
        let mut status = 0;
        for step in ORDER {
            status = transition(status, status | step).unwrap();
        }
        assert_eq!(status, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        // Rewriting the same value is harmless.
        assert_eq!(transition(status, status), Some(status));
    }

    #[test]
    fn skipping_clearing_and_unknown_bits_are_rejected() {
        assert_eq!(transition(0, DRIVER), None);
        assert_eq!(transition(0, ACKNOWLEDGE | DRIVER), None);
        assert_eq!(transition(ACKNOWLEDGE, ACKNOWLEDGE | DRIVER_OK), None);
        assert_eq!(transition(ACKNOWLEDGE | DRIVER, ACKNOWLEDGE), None);
        assert_eq!(transition(ACKNOWLEDGE, ACKNOWLEDGE | 0x10), None);
        assert_eq!(transition(ACKNOWLEDGE, ACKNOWLEDGE | 0x100), None);
        assert_eq!(
            transition(ACKNOWLEDGE, ACKNOWLEDGE | DEVICE_NEEDS_RESET),
            None
        );
    }

    #[test]
    fn failed_is_accepted_any_time_and_ends_progress() {
        let failed = transition(ACKNOWLEDGE, ACKNOWLEDGE | FAILED).unwrap();
        assert_eq!(failed, ACKNOWLEDGE | FAILED);
        assert_eq!(transition(failed, failed | DRIVER), None);
        assert_eq!(transition(0, FAILED), Some(FAILED));
    }

    #[test]
    fn device_needs_reset_is_kept() {
        let current = ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK | DEVICE_NEEDS_RESET;
        assert_eq!(
            transition(current, current & !DEVICE_NEEDS_RESET | FAILED),
            Some(current | FAILED)
        );
    }
}
