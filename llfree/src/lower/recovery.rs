//! Recovery of the lower level after a restart, and its consistency check.
//!
//! After a clean shutdown the child entries are only validated. After a crash the counters of
//! base-frame children are rebuilt from their bitfields (the authoritative state); huge, order-10
//! and giant children are authoritative in their entries, and their bitfields are not read. Giant frames whose first child was not
//! committed are freed.

use super::child::{Child, GIANT, HUGE, PAIR};
use super::{Lower, GIANT_CHILD, GIANT_CHILDREN, PAIR_CHILD};
use crate::{InitError, CHILD_FRAMES};

impl Lower {
    /// Recovers the child entries after a restart. With `deep` (after a crash) the counters of
    /// base-frame children are rebuilt from the bitfields; otherwise they are validated only.
    pub fn recover(&self, deep: bool) -> Result<(), InitError> {
        for (index, pair) in self.pairs.iter().enumerate() {
            let old = pair.load();
            let mut new = old;
            for half in 0..2 {
                let child = index * 2 + half;
                if child < self.children() {
                    new[half] = self.recover_child(child, old[half], old[half ^ 1], deep)?;
                }
            }
            if new != old {
                pair.store(new);
            }
        }
        self.recover_giants()?;
        self.persist_range(0..self.pairs.len());
        Ok(())
    }

    /// Validates one child entry (given its partner in the pair) and, with `deep`, rebuilds the
    /// counter of a base-frame child from its bitfield.
    fn recover_child(
        &self,
        index: usize,
        child: Child,
        partner: Child,
        deep: bool,
    ) -> Result<Child, InitError> {
        let corrupted = |what| Err(InitError::Corrupted { what, index });
        if child.is_malformed() {
            return corrupted("malformed child entry");
        }
        let flags = child.flags();
        if flags & GIANT != 0 && (flags != GIANT || child.free() != 0) {
            return corrupted("malformed giant child");
        }
        if flags & HUGE != 0 && (child.free() != 0 || (flags & PAIR != 0 && partner != PAIR_CHILD))
        {
            return corrupted("malformed huge child");
        }
        if flags == PAIR {
            return corrupted("pair flag without huge flag");
        }
        // The bitfield of a huge, order-10 or giant child is unused (all zero): it is not read,
        // so that recovering a zone of huge frames touches no bitfield at all.
        if !deep || flags != 0 {
            return Ok(child);
        }
        let used = self.fields[index].count_ones();
        Ok(Child::new(CHILD_FRAMES - used, 0))
    }

    /// Keeps committed giant frames and frees the children of unfinished ones.
    fn recover_giants(&self) -> Result<(), InitError> {
        for first in (0..self.children()).step_by(GIANT_CHILDREN) {
            let children = first..(first + GIANT_CHILDREN).min(self.children());
            let committed = self.child(first) == GIANT_CHILD;
            if committed && children.len() < GIANT_CHILDREN {
                return Err(InitError::Corrupted {
                    what: "giant frame beyond the end of the zone",
                    index: first,
                });
            }
            for index in children {
                let giant = self.child(index) == GIANT_CHILD;
                if committed && !giant {
                    return Err(InitError::Corrupted {
                        what: "incomplete committed giant frame",
                        index,
                    });
                }
                if !committed && giant {
                    self.pair(index)
                        .update(index % 2, |_| Some(Child::FREE))
                        .ok();
                }
            }
        }
        Ok(())
    }

    /// Checks that every base-frame child counts exactly its zero bits.
    pub fn validate_counters(&self) -> Result<(), InitError> {
        for (index, field) in self.fields.iter().enumerate() {
            let child = self.child(index);
            let expected = if child.flags() == 0 {
                CHILD_FRAMES - field.count_ones()
            } else {
                0
            };
            if child.free() != expected {
                return Err(InitError::Corrupted {
                    what: "child counter differs from its bitfield",
                    index,
                });
            }
        }
        Ok(())
    }
}
