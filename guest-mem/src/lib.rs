//! guest-mem (in progress).
