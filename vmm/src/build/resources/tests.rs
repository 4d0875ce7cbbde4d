use std::path::PathBuf;

use super::*;
use vmm_api::model::{IoEngine, PopulateMode};

/// A scratch directory with a kernel file and two disk images.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("llfree-res-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["vmlinux", "a.img", "b.img"] {
            std::fs::write(dir.join(file), [1u8; 4096]).unwrap();
        }
        Files { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn drive(&self, id: &str, image: &str, root: bool) -> Drive {
        Drive {
            drive_id: id.into(),
            is_root_device: root,
            partuuid: None,
            cache_type: None,
            is_read_only: Some(false),
            path_on_host: Some(self.path(image)),
            rate_limiter: None,
            io_engine: None,
            socket: None,
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn machine(vcpus: u64, mib: u64) -> MachineConfiguration {
    MachineConfiguration {
        vcpu_count: vcpus,
        mem_size_mib: mib,
        ..MachineConfiguration::default()
    }
}

fn message(error: ControlError) -> String {
    assert_eq!(error.status(), 400, "{error:?}");
    error.to_string()
}

#[test]
fn machine_settings_are_checked_as_firecracker_and_vmm_run_check_them() {
    let mut resources = VmResources::default();
    assert_eq!(resources.machine(), &machine(1, 128));
    resources.put_machine(machine(2, 256)).unwrap();
    assert_eq!(resources.machine(), &machine(2, 256));
    // SMT as Firecracker has it: pairs of threads, or a single vCPU.
    for vcpus in [1, 2, 4] {
        let smt = MachineConfiguration {
            smt: true,
            ..machine(vcpus, 256)
        };
        resources.put_machine(smt.clone()).unwrap();
        assert_eq!(resources.machine(), &smt);
    }
    // Any number of MiB, as in Firecracker without huge pages.
    resources.put_machine(machine(1, 129)).unwrap();
    assert_eq!(resources.machine(), &machine(1, 129));
    resources.put_machine(machine(2, 256)).unwrap();
    for (bad, expected) in [
        (machine(0, 128), "vcpus 0"),
        (machine(255, 128), "vcpus 255"),
        (machine(1, 0), "memory 0 bytes"),
        (
            MachineConfiguration {
                huge_pages: HugePages::Huge2M,
                ..machine(1, 129)
            },
            "not a multiple of the configured page size",
        ),
        (
            MachineConfiguration {
                smt: true,
                ..machine(3, 128)
            },
            "can only be 1 or an even number when hyperthreading is enabled",
        ),
        (
            MachineConfiguration {
                cpu_template: Some("T2".into()),
                ..machine(2, 128)
            },
            "cpu_template T2",
        ),
        (
            MachineConfiguration {
                huge_pages: HugePages::Transparent,
                ..machine(2, 128)
            },
            "Transparent",
        ),
        (
            MachineConfiguration {
                huge_pages: HugePages::Giant1G,
                ..machine(2, 1536)
            },
            "not a multiple of the configured page size",
        ),
    ] {
        let text = message(resources.put_machine(bad).unwrap_err());
        assert!(text.contains(expected), "{text}");
        assert_eq!(resources.machine(), &machine(2, 256), "nothing changed");
    }
    // PATCH changes only what it names; an empty one is refused.
    resources
        .patch_machine(MachineConfigurationUpdate {
            mem_size_mib: Some(64),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(resources.machine(), &machine(2, 64));
    let empty = message(resources.patch_machine(Default::default()).unwrap_err());
    assert_eq!(empty, "Empty PATCH request.");
    // The balloon must fit, and keeps fitting.
    let balloon = Balloon {
        amount_mib: 65,
        deflate_on_oom: true,
        stats_polling_interval_s: 1,
        free_page_hinting: false,
        free_page_reporting: true,
    };
    assert!(message(resources.put_balloon(balloon).unwrap_err()).contains("too large"));
    resources
        .put_balloon(Balloon {
            amount_mib: 32,
            ..balloon
        })
        .unwrap();
    let shrink = message(resources.put_machine(machine(2, 16)).unwrap_err());
    assert!(
        shrink.contains("smaller than the previously set balloon"),
        "{shrink}"
    );
    assert_eq!(resources.balloon().map(|b| b.amount_mib), Some(32));
    let hinting = Balloon {
        amount_mib: 32,
        free_page_hinting: true,
        ..balloon
    };
    resources.put_balloon(hinting).unwrap();
    assert_eq!(resources.balloon().map(|b| b.free_page_hinting), Some(true));
}

#[test]
fn drives_are_checked_and_the_root_drive_comes_first() {
    let files = Files::new("drives");
    let mut resources = VmResources::default();
    assert!(!resources.boot_specific());
    let start = message(resources.vm_config(None).unwrap_err());
    assert_eq!(start, "Start microvm error: Missing kernel configuration.");
    resources
        .put_boot_source(BootSource {
            kernel_image_path: files.path("vmlinux"),
            initrd_path: None,
            boot_args: Some("console=ttyS0 -- init".into()),
        })
        .unwrap();
    let missing = BootSource {
        kernel_image_path: files.path("none"),
        initrd_path: None,
        boot_args: None,
    };
    assert!(message(resources.put_boot_source(missing).unwrap_err()).starts_with("kernel "));
    resources
        .put_drive("data", files.drive("data", "b.img", false))
        .unwrap();
    resources
        .put_drive("rootfs", files.drive("rootfs", "a.img", true))
        .unwrap();
    let mismatch = message(
        resources
            .put_drive("other", files.drive("rootfs", "a.img", true))
            .unwrap_err(),
    );
    assert_eq!(
        mismatch,
        "The id from the path does not match the id from the body!"
    );
    let second_root = message(
        resources
            .put_drive("data", files.drive("data", "b.img", true))
            .unwrap_err(),
    );
    assert_eq!(second_root, "A root block device already exists!");
    for (change, expected) in [
        (
            Drive {
                path_on_host: None,
                ..files.drive("x", "a.img", false)
            },
            "path_on_host is required",
        ),
        (
            Drive {
                is_read_only: None,
                ..files.drive("x", "a.img", false)
            },
            "is_read_only is required",
        ),
        (
            Drive {
                socket: Some("/s".into()),
                ..files.drive("x", "a.img", false)
            },
            "vhost-user",
        ),
        (files.drive("x", "missing.img", false), "missing.img"),
    ] {
        let text = message(resources.put_drive("x", change).unwrap_err());
        assert!(text.contains(expected), "{text}");
    }
    // A drive given again is replaced, not added; its engine is kept and shown.
    let io_engine = Some(IoEngine::Async);
    resources
        .put_drive(
            "data",
            Drive {
                io_engine,
                ..files.drive("data", "b.img", false)
            },
        )
        .unwrap();
    let config = resources.vm_config(None).unwrap();
    let ids: Vec<&str> = config.drives.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["rootfs", "data"]);
    let engines: Vec<_> = full_configuration(&config)
        .drives
        .iter()
        .map(|d| d.io_engine)
        .collect();
    assert_eq!(engines, [Some(IoEngine::Sync), io_engine]);
    assert!(matches!(config.guest, GuestConfig::Linux(_)));
    assert_eq!((config.vcpus, config.memory_size), (1, 128 << 20));
    assert!(resources.boot_specific());
    let full = resources.full_config();
    assert_eq!(full.drives.len(), 2);
    assert_eq!(full.machine_config.as_ref(), Some(&machine(1, 128)));
    let json = serde_json::to_value(&full).unwrap();
    assert_eq!(json["boot-source"]["boot_args"], "console=ttyS0 -- init");
    assert_eq!(json["machine-config"]["huge_pages"], "None");
    assert_eq!(json["network-interfaces"], serde_json::json!([]));
}

#[test]
fn each_population_mode_reaches_the_vm_config() {
    let files = Files::new("populate");
    for (mode, populate) in [
        (None, Populate::Lazy),
        (Some(PopulateMode::Lazy), Populate::Lazy),
        (Some(PopulateMode::Eager), Populate::Eager),
        (Some(PopulateMode::Mapped), Populate::Mapped),
    ] {
        let mut resources = VmResources::default();
        resources
            .put_boot_source(BootSource {
                kernel_image_path: files.path("vmlinux"),
                initrd_path: None,
                boot_args: None,
            })
            .unwrap();
        let machine = MachineConfiguration {
            populate: mode,
            ..machine(1, 128)
        };
        resources.put_machine(machine).unwrap();
        assert_eq!(resources.vm_config(None).unwrap().populate, populate);
    }
}

#[test]
fn pmem_lives_in_the_vms_zone() {
    let files = Files::new("pmem");
    let mut resources = VmResources::default();
    let pmem = Pmem {
        id: "pmem0".into(),
        path_on_host: files.path("a.img"),
        size_mib: Some(4),
        root_device: false,
        read_only: false,
        rate_limiter: None,
    };
    let without_zone = message(resources.put_pmem("pmem0", pmem.clone()).unwrap_err());
    assert!(without_zone.contains("zone"), "{without_zone}");
    resources
        .put_machine(MachineConfiguration {
            zone: Some(ZoneAttachment {
                path: files.path("b.img"),
                vm: "vm1".into(),
                ephemeral: false,
                accept_damaged: false,
            }),
            ..machine(1, 64)
        })
        .unwrap();
    let elsewhere = message(resources.put_pmem("pmem0", pmem.clone()).unwrap_err());
    assert!(elsewhere.contains("lives in the VM's zone"), "{elsewhere}");
    let in_zone = Pmem {
        path_on_host: files.path("b.img"),
        ..pmem
    };
    let odd = Pmem {
        size_mib: Some(3),
        ..in_zone.clone()
    };
    assert!(message(resources.put_pmem("pmem0", odd).unwrap_err()).contains("pmem"));
    resources.put_pmem("pmem0", in_zone.clone()).unwrap();
    let second = Pmem {
        id: "pmem1".into(),
        ..in_zone
    };
    assert!(message(resources.put_pmem("pmem1", second).unwrap_err()).contains("only one"));
}
