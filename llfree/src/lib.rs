//! LLFree: a lock- and log-free page-frame allocator.
//!
//! Implements the design of Wrenger et al., "LLFree: Scalable and Optionally-Persistent Page-Frame
//! Allocation" (USENIX ATC'23), extended with 1 GiB giant frames as in Wrenger's thesis.
//!
//! * The **lower level** ([`lower`]) keeps, per 2 MiB child, a 512-bit bitfield (one cache line) and a
//!   16-bit child entry (free counter, huge flags). Every allocation and free is committed by one
//!   atomic change in one cache line, so the lower level alone is the crash-consistent state.
//! * The **upper level** ([`upper`]) groups 32 children into 64 MiB trees, each with a free counter
//!   and a reserved flag, and gives every core a reserved tree so that cores do not share cache lines.
//! * Metadata lives on the heap ([`LLFree::new`]) or inside a caller-provided persistent region
//!   ([`LLFree::persistent`]), e.g. a `MAP_SHARED` file, hugetlbfs or DAX mapping, and can be
//!   recovered after a clean shutdown or after a crash ([`Init`]).
//!
//! Frames are numbered from 0 in units of 4 KiB. Supported orders are 0..=10 and
//! [`GIANT_ORDER`] (18, 1 GiB).

pub mod error;
pub use error::{Error, InitError};
