//! Frame runs: consecutive chunks of a region backed by consecutive frames of the pool, which
//! one system call maps, makes inaccessible or scrubs.

use std::ops::Range;

use crate::pool::Frame;

/// Chunks `[chunk, chunk + len)` backed by the frames that follow `first` in the pool, one per
/// chunk.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameRun {
    /// The first chunk.
    pub chunk: usize,
    /// The frame of the first chunk.
    pub first: Frame,
    /// How many chunks (and frames).
    pub len: usize,
}

impl FrameRun {
    /// `chunk` alone, backed by `frame`.
    pub fn single(chunk: usize, frame: Frame) -> Self {
        Self {
            chunk,
            first: frame,
            len: 1,
        }
    }

    /// Takes `chunk` backed by `frame` into the run if both come right after its last ones;
    /// returns whether it did.
    pub fn extend(&mut self, chunk: usize, frame: Frame) -> bool {
        let next_frame = self.first.index + self.len as u64 * self.first.size.base_frames();
        let follows = chunk == self.chunk + self.len
            && frame.size == self.first.size
            && frame.index == next_frame;
        self.len += usize::from(follows);
        follows
    }

    /// The chunks.
    pub fn chunks(&self) -> Range<usize> {
        self.chunk..self.chunk + self.len
    }

    /// Each chunk with its frame.
    pub fn frames(&self) -> impl Iterator<Item = (usize, Frame)> + '_ {
        self.chunks().zip(0u64..).map(|(chunk, i)| {
            let frame = Frame {
                index: self.first.index + i * self.first.size.base_frames(),
                size: self.first.size,
            };
            (chunk, frame)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::FrameSize;

    fn frame(index: u64) -> Frame {
        Frame {
            index,
            size: FrameSize::Huge,
        }
    }

    #[test]
    fn a_run_takes_only_the_next_chunk_with_the_next_frame() {
        let mut run = FrameRun::single(3, frame(1024));
        assert!(run.extend(4, frame(1536)));
        assert!(!run.extend(6, frame(2048)), "a chunk left out");
        assert!(!run.extend(5, frame(4096)), "a frame left out");
        assert!(!run.extend(5, frame(512)), "a frame before");
        assert!(run.extend(5, frame(2048)));
        assert_eq!(run.chunks(), 3..6);
        let frames: Vec<_> = run.frames().map(|(c, f)| (c, f.index)).collect();
        assert_eq!(frames, [(3, 1024), (4, 1536), (5, 2048)]);
    }
}
