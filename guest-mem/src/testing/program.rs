//! The guest programs: hand-assembled 32-bit protected-mode code (flat segments, no paging).

/// The touch programs, to be loaded at a VM's code address.
///
/// In: esi = first address, ecx = count, edx = stride, eax = marker. For each address:
/// ebx |= \[esi\]; \[esi\] = eax. Then out 0x10, ebx; hlt.
///
/// * At offset 0: the plain loop.
/// * At `STEPPED`: the same loop with `out 0x11, al` after every store, so that the VMM sees
///   (and can time) each touch.
pub const PROGRAMS: [u8; 32] = [
    // Plain.
    0x0B, 0x1E, // or ebx, [esi]
    0x89, 0x06, // mov [esi], eax
    0x01, 0xD6, // add esi, edx
    0x49, // dec ecx
    0x75, 0xF7, // jnz -9
    0x89, 0xD8, // mov eax, ebx
    0xE7, 0x10, // out 0x10, eax
    0xF4, // hlt
    0xF4, 0xF4, // (padding)
    // Stepped.
    0x0B, 0x1E, // or ebx, [esi]
    0x89, 0x06, // mov [esi], eax
    0xE6, 0x11, // out 0x11, al
    0x01, 0xD6, // add esi, edx
    0x49, // dec ecx
    0x75, 0xF5, // jnz -11
    0x89, 0xD8, // mov eax, ebx
    0xE7, 0x10, // out 0x10, eax
    0xF4, // hlt
];

/// Offset of the stepped program in [`PROGRAMS`].
pub(crate) const STEPPED: u64 = 16;
/// The port the programs write their result to.
pub(crate) const RESULT_PORT: u16 = 0x10;
/// The port the stepped program writes to after each touch.
pub(crate) const STEP_PORT: u16 = 0x11;

/// One pass of a touch program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    /// Guest address of the first dword.
    pub start: u64,
    /// How many dwords.
    pub count: u32,
    /// Bytes between them.
    pub stride: u32,
    /// The value written.
    pub marker: u32,
}

/// Touches `count` dwords `stride` bytes apart, the first at `start + 8`.
pub fn touch(start: u64, stride: u64, count: u32, marker: u32) -> Touch {
    Touch {
        start: start + 8,
        count,
        stride: stride as u32,
        marker,
    }
}
