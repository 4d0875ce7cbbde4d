//! vmm (in progress).
