//! Checks that this host can run a configured VM before anything is set up: a usable
//! /dev/kvm, and enough free huge pages for a hugetlb backing.

use std::path::Path;

use guest_mem::pool::{available_huge_pages, sysfs_visible};
use kvm_ioctls::Kvm;

use vmm::config::{format_size, BackingKind, VmConfig};

/// The KVM API version every current kernel has.
const KVM_API_VERSION: i32 = 12;

/// Why this host cannot run the VM.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// /dev/kvm cannot be opened.
    #[error("cannot open /dev/kvm: {0} (KVM is required: load kvm_intel or kvm_amd and check its permissions)")]
    NoKvm(kvm_ioctls::Error),
    /// /dev/kvm speaks another API version.
    #[error("/dev/kvm has KVM API version {0}, but {KVM_API_VERSION} is required")]
    KvmVersion(i32),
    /// The kernel has no huge pages of this size.
    #[error("--backing {backing}: this kernel has no {size} huge pages ({dir} is missing)")]
    NoHugePages {
        /// The backing.
        backing: BackingKind,
        /// "2 MiB" or "1 GiB".
        size: &'static str,
        /// The sysfs directory of this page size.
        dir: String,
    },
    /// Too few free huge pages.
    #[error(
        "--backing {backing}: {memory} of guest RAM needs {need} free {size} huge pages, but \
         {free} are free (raise {dir}/nr_hugepages)"
    )]
    NotEnoughHugePages {
        /// The backing.
        backing: BackingKind,
        /// Guest RAM, formatted.
        memory: String,
        /// "2 MiB" or "1 GiB".
        size: &'static str,
        /// Pages needed.
        need: u64,
        /// Pages free and not reserved.
        free: u64,
        /// The sysfs directory of this page size.
        dir: String,
    },
}

/// Checks KVM and, for hugetlb backings, the free huge pages guest RAM needs.
pub fn check_host(config: &VmConfig) -> Result<(), HostError> {
    let kvm = Kvm::new().map_err(HostError::NoKvm)?;
    let version = kvm.get_api_version();
    if version != KVM_API_VERSION {
        return Err(HostError::KvmVersion(version));
    }
    check_huge_pages(config)
}

fn check_huge_pages(config: &VmConfig) -> Result<(), HostError> {
    let kib = match config.backing {
        BackingKind::Hugetlb2M => 2048,
        BackingKind::Hugetlb1G => 1_048_576,
        _ => return Ok(()),
    };
    if !sysfs_visible() {
        // No sysfs to count them in (a jail): creating the memory says whether they are there.
        return Ok(());
    }
    let frame = config.backing.frame_size();
    let dir = format!("/sys/kernel/mm/hugepages/hugepages-{kib}kB");
    if !Path::new(&dir).is_dir() {
        return Err(HostError::NoHugePages {
            backing: config.backing.clone(),
            size: frame.name(),
            dir,
        });
    }
    let need = config.memory_size / frame.bytes();
    let free = available_huge_pages(kib).unwrap_or(0);
    if free < need {
        return Err(HostError::NotEnoughHugePages {
            backing: config.backing.clone(),
            memory: format_size(config.memory_size),
            size: frame.name(),
            need,
            free,
            dir,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn config(flags: &[&str]) -> VmConfig {
        let cli = Cli::try_parse_from(["vmm", "run"].iter().chain(flags)).unwrap();
        let Some(Command::Run(args)) = cli.command else {
            panic!("not run")
        };
        VmConfig::try_from(*args).unwrap()
    }

    #[test]
    fn plain_memory_needs_no_huge_pages() {
        assert!(check_huge_pages(&config(&["--memory=1T"])).is_ok());
    }

    #[test]
    fn a_terabyte_of_giant_pages_is_more_than_this_host_has() {
        let err = check_huge_pages(&config(&["--backing=hugetlb-1g", "--memory=1T"])).unwrap_err();
        match err {
            HostError::NotEnoughHugePages { need, free, .. } => {
                assert_eq!(need, 1024);
                assert!(free < need);
                assert!(
                    err.to_string().contains("raise /sys/kernel/mm/hugepages/"),
                    "{err}"
                );
            }
            HostError::NoHugePages { .. } => {}
            other => panic!("{other}"),
        }
    }
}
