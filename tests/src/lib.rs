//! tests (in progress).
