//! The kernel command line, including the `virtio_mmio.device=` entries through which a guest
//! finds its virtio-mmio devices.
//!
//! Those entries need a kernel built with `CONFIG_VIRTIO_MMIO=y` and
//! `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y`. Debian's stock kernels lack the latter and will not
//! see the devices; Firecracker's CI guest kernels and custom builds with both options do.

use linux_loader::cmdline::Cmdline;

use super::BootError;
use crate::layout::CMDLINE_MAX_SIZE;

/// Command line used when the user gives none (as in Firecracker): serial console, reboot
/// through the keyboard controller, panic reboots after 1 s, no PCI probing, and Linux's i8042
/// driver told that there is a keyboard and nothing else (without `i8042.noaux` and
/// `i8042.nomux` it waits out two 500 ms timeouts probing for a mouse port: a real Linux
/// booted a second slower).
pub const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd";

/// A virtio-mmio device as announced on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioMmioEntry {
    /// Base address of the device's register window.
    pub base: u64,
    /// Size of the register window.
    pub size: u64,
    /// Interrupt line (GSI).
    pub irq: u32,
}

/// Builds the command line: `user` (or [`DEFAULT_CMDLINE`]) followed by one
/// `virtio_mmio.device=<size>@<base>:<irq>` per device. Init arguments after `--` in `user`
/// stay at the end. `max_size` includes the terminating NUL and is capped at
/// [`CMDLINE_MAX_SIZE`].
pub fn build_cmdline(
    user: Option<&str>,
    devices: &[VirtioMmioEntry],
    max_size: usize,
) -> Result<Cmdline, BootError> {
    let capacity = max_size.min(CMDLINE_MAX_SIZE);
    let text = user.unwrap_or(DEFAULT_CMDLINE);
    if !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(BootError::Cmdline(
            linux_loader::cmdline::Error::InvalidAscii,
        ));
    }
    let mut cmdline = if text.trim().is_empty() {
        Cmdline::new(capacity)
    } else {
        Cmdline::try_from(text, capacity)
    }
    .map_err(BootError::Cmdline)?;
    for device in devices {
        cmdline
            .add_virtio_mmio_device(
                device.size,
                vm_memory::GuestAddress(device.base),
                device.irq,
                None,
            )
            .map_err(BootError::Cmdline)?;
    }
    // Validate the final string (NUL bytes, length) now rather than when writing it.
    cmdline.as_cstring().map_err(BootError::Cmdline)?;
    Ok(cmdline)
}

/// `user` (or [`DEFAULT_CMDLINE`]) with the kernel parameter `arg` added to the kernel's part,
/// before any init arguments after `--` (how a root drive's `root=` joins the command line).
pub fn add_kernel_arg(user: Option<&str>, arg: &str) -> String {
    let text = user.unwrap_or(DEFAULT_CMDLINE).trim();
    if let Some(init) = text.strip_prefix("--") {
        return format!("{arg} --{init}");
    }
    match text.split_once(" -- ") {
        Some((kernel, init)) => format!("{kernel} {arg} -- {init}"),
        None if text.is_empty() => arg.to_owned(),
        None => format!("{text} {arg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_go_before_the_init_args() {
        assert_eq!(
            add_kernel_arg(Some("console=ttyS0 -- single"), "root=/dev/vda rw"),
            "console=ttyS0 root=/dev/vda rw -- single"
        );
        assert_eq!(add_kernel_arg(Some("quiet"), "ro"), "quiet ro");
        assert_eq!(add_kernel_arg(Some(""), "ro"), "ro");
        assert_eq!(add_kernel_arg(Some("-- init"), "ro"), "ro -- init");
        assert_eq!(add_kernel_arg(None, "ro"), format!("{DEFAULT_CMDLINE} ro"));
    }

    fn text(cmdline: &Cmdline) -> String {
        cmdline.as_cstring().unwrap().into_string().unwrap()
    }

    const BALLOON: VirtioMmioEntry = VirtioMmioEntry {
        base: 0xc000_0000,
        size: 0x1000,
        irq: 5,
    };

    #[test]
    fn default_cmdline_with_devices() {
        let second = VirtioMmioEntry {
            base: 0xc000_1000,
            irq: 6,
            ..BALLOON
        };
        let cmdline = build_cmdline(None, &[BALLOON, second], CMDLINE_MAX_SIZE).unwrap();
        assert_eq!(
            text(&cmdline),
            format!(
                "{DEFAULT_CMDLINE} virtio_mmio.device=4K@0xc0000000:5 \
                 virtio_mmio.device=4K@0xc0001000:6"
            )
        );
    }

    #[test]
    fn devices_go_before_init_arguments() {
        let cmdline = build_cmdline(
            Some("console=ttyS0 root=/dev/vda -- --init-flag"),
            &[BALLOON],
            CMDLINE_MAX_SIZE,
        )
        .unwrap();
        assert_eq!(
            text(&cmdline),
            "console=ttyS0 root=/dev/vda virtio_mmio.device=4K@0xc0000000:5 -- --init-flag"
        );
    }

    #[test]
    fn empty_user_cmdline_means_only_devices() {
        let cmdline = build_cmdline(Some(""), &[BALLOON], CMDLINE_MAX_SIZE).unwrap();
        assert_eq!(text(&cmdline), "virtio_mmio.device=4K@0xc0000000:5");
    }

    #[test]
    fn too_long_or_invalid_cmdlines_are_errors() {
        let long = "a".repeat(CMDLINE_MAX_SIZE);
        assert!(build_cmdline(Some(&long), &[], CMDLINE_MAX_SIZE).is_err());
        // The kernel's own limit is honoured.
        assert!(build_cmdline(None, &[BALLOON], 40).is_err());
        assert!(build_cmdline(Some("bad\u{7}char"), &[], CMDLINE_MAX_SIZE).is_err());
        assert!(build_cmdline(Some("console=\u{e9}"), &[], CMDLINE_MAX_SIZE).is_err());
        assert!(build_cmdline(Some("a\0b"), &[], CMDLINE_MAX_SIZE).is_err());
    }
}
