//! `vmm run`'s flags into the library's [`VmConfig`], checked with its checks.

use vmm::config::{
    check_api_socket, check_backing, check_drives, check_memory, check_network_interfaces,
    check_pmem, check_reclaim, check_smt, check_vcpus, check_zone, ConfigError, GuestConfig,
    HotplugConfig, LinuxConfig, NetConfig, VmConfig, ZoneTarget,
};

use crate::args::{PopulateArg, RunArgs};
use vmm::testguest::image::{guest_for_kernel, ImageError};
use vmm::testguest::WorkloadSpecError;
use vmm_devices::rate_limiter::RateLimiterConfig;

/// Errors of `vmm run`'s flags.
#[derive(Debug, thiserror::Error)]
pub enum RunConfigError {
    /// A setting failed the library's check; its message starts with the setting, which is
    /// the flag's name.
    #[error("--{0}")]
    Config(#[from] ConfigError),
    /// The workload does not fit the VM.
    #[error("--workload: {0}")]
    Workload(#[from] WorkloadSpecError),
    /// The kernel is the test guest's image, which cannot run as asked.
    #[error("--kernel: {0}")]
    TestGuestImage(#[from] ImageError),
}

impl TryFrom<RunArgs> for VmConfig {
    type Error = RunConfigError;

    fn try_from(args: RunArgs) -> Result<Self, Self::Error> {
        check_vcpus(args.vcpus, args.kernel.is_none())?;
        check_smt(args.vcpus, args.smt)?;
        check_memory(args.memory)?;
        let reclaim = vmm::config::ReclaimSettings {
            below_percent: args.reclaim_below,
            weight: args.reclaim_weight,
            floor: args.reclaim_floor,
        };
        check_reclaim(&reclaim, args.memory)?;
        let scrub = check_backing(&args.backing, args.format_pool)?;
        let zone = match (args.zone, args.vm) {
            (Some(path), Some(vm)) => Some(ZoneTarget {
                path,
                vm,
                ephemeral: args.ephemeral,
                accept_damaged: args.accept_damaged,
            }),
            _ => None,
        };
        if let Some(zone) = &zone {
            check_zone(zone)?;
        }
        if let Some(size) = args.pmem {
            check_pmem(size, zone.as_ref())?;
        }

        let hotplug = args
            .hotplug
            .as_deref()
            .map(|text| HotplugConfig::parse(text, args.backing.frame_size()))
            .transpose()
            .map_err(ConfigError::from)?;
        let hotplug_region =
            hotplug.map(|h| vmm::layout::hotplug_region(args.memory, args.pmem, h.total_size));
        let guest = match args.kernel {
            // The test guest's image (`vmm guest-image`) runs as the test guest.
            Some(kernel) => guest_for_kernel(
                LinuxConfig::new(kernel, args.initrd, args.cmdline)?,
                args.memory,
                args.vcpus,
                args.balloon.as_ref(),
                hotplug_region,
                &args.workload,
            )?,
            None => {
                args.workload.check_balloon(args.balloon.as_ref())?;
                args.workload.check_hotplug(hotplug.is_some())?;
                GuestConfig::TestGuest(args.workload.resolve_with_hotplug(
                    args.memory,
                    args.vcpus,
                    hotplug_region,
                )?)
            }
        };
        if let Some(socket) = &args.api_socket {
            check_api_socket(socket)?;
        }
        if let Some(balloon) = &args.balloon {
            balloon.check_fits(args.memory).map_err(ConfigError::from)?;
        }
        let network_interfaces = args
            .net
            .iter()
            .enumerate()
            .map(|(index, text)| NetConfig::parse(text, index))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ConfigError::from)?;
        check_network_interfaces(&network_interfaces).map_err(ConfigError::from)?;
        let mut drives = args.drives;
        check_drives(&drives).map_err(ConfigError::from)?;
        // The root drive comes first: it is /dev/vda.
        drives.sort_by_key(|drive| !drive.root);
        Ok(VmConfig {
            memory_size: args.memory,
            backing: args.backing,
            zone,
            pmem_size: args.pmem,
            hotplug,
            entropy: args.entropy.then(Default::default),
            pmem_rate_limiter: RateLimiterConfig::default(),
            format_pool: args.format_pool,
            wait_for_memory: args.wait_for_memory.is_some(),
            memory_wait_limit: args.wait_for_memory.flatten(),
            reclaim,
            scrub,
            populate: match args.populate {
                PopulateArg::Eager => guest_mem::Populate::Eager,
                PopulateArg::Lazy => guest_mem::Populate::Lazy,
                PopulateArg::Mapped => guest_mem::Populate::Mapped,
            },
            track_dirty_pages: args.track_dirty_pages,
            vcpus: args.vcpus,
            smt: args.smt,
            guest,
            api_socket: args.api_socket,
            balloon: args.balloon,
            drives,
            network_interfaces,
            vsock: args.vsock,
            mmds: None,
            cpu_template: None,
        })
    }
}

#[cfg(test)]
#[path = "run_config_tests.rs"]
mod tests;
