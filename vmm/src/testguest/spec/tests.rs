use super::*;
use crate::testguest::protocol::{step_kind, ALL_VCPUS};

const MIB: u64 = 1 << 20;

fn resolve(text: &str, memory: u64, vcpus: usize) -> Result<Workload, WorkloadSpecError> {
    text.parse::<WorkloadSpec>()?.resolve(memory, vcpus)
}

#[test]
fn default_workload_writes_and_verifies_the_whole_area() {
    let workload = WorkloadSpec::default().resolve(64 * MIB, 2).unwrap();
    let steps = workload.steps();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (steps[0].kind, steps[1].kind),
        (step_kind::WRITE, step_kind::VERIFY)
    );
    for step in steps {
        assert_eq!((step.addr, step.size), (2 * MIB, 62 * MIB));
        assert_eq!((step.pattern, step.vcpu), (DEFAULT_PATTERN, ALL_VCPUS));
    }
}

#[test]
fn all_stops_at_the_mmio_gap() {
    let workload = resolve("read:all", 8 << 30, 1).unwrap();
    assert_eq!(workload.steps()[0].addr + workload.steps()[0].size, 3 << 30);
}

#[test]
fn parses_every_step_kind_with_vcpus_and_patterns() {
    let text = "write@1:2M+4M:0xabc,verify:2M+4M:2748,verify-zero:8M+1M,read@0:4G+4K,checkpoint:7";
    let workload = resolve(text, 6 << 30, 2).unwrap();
    let steps = workload.steps();
    assert_eq!(steps.len(), 5);
    assert_eq!(
        (steps[0].kind, steps[0].vcpu, steps[0].pattern),
        (step_kind::WRITE, 1, 0xabc)
    );
    assert_eq!(
        (steps[1].kind, steps[1].pattern),
        (step_kind::VERIFY, 0xabc)
    );
    assert_eq!(
        (steps[2].kind, steps[2].addr, steps[2].size),
        (step_kind::VERIFY_ZERO, 8 * MIB, MIB)
    );
    assert_eq!(
        (steps[3].kind, steps[3].addr, steps[3].vcpu),
        (step_kind::READ, 4 << 30, 0)
    );
    assert_eq!(
        (steps[4].kind, steps[4].pattern),
        (step_kind::CHECKPOINT, 7)
    );
}

#[test]
fn every_syntax_error_has_its_own_message() {
    let malformed = |step: &str, why| WorkloadSpecError::Malformed {
        step: step.into(),
        why,
    };
    let cases = [
        ("", WorkloadSpecError::EmptyStep),
        ("write:all,", WorkloadSpecError::EmptyStep),
        (
            "touch:all",
            WorkloadSpecError::UnknownKind("touch:all".into()),
        ),
        (
            "Write:all",
            WorkloadSpecError::UnknownKind("Write:all".into()),
        ),
        ("foo", WorkloadSpecError::UnknownKind("foo".into())),
        (
            "write",
            malformed(
                "write",
                "the step needs a range (KIND:all or KIND:START+SIZE)",
            ),
        ),
        (
            "checkpoint",
            malformed("checkpoint", "a checkpoint needs an id (checkpoint:ID)"),
        ),
        (
            "write:all:1:2",
            malformed("write:all:1:2", "too many ':'-separated fields"),
        ),
        (
            "read:all:5",
            malformed("read:all:5", "only write and verify steps take a pattern"),
        ),
        (
            "checkpoint:1:2",
            malformed(
                "checkpoint:1:2",
                "only write and verify steps take a pattern",
            ),
        ),
        (
            "write:2M",
            malformed(
                "write:2M",
                "the range must be 'all' or START+SIZE (e.g. 2M+64M)",
            ),
        ),
        (
            "write@99999999999:all",
            malformed("write@99999999999:all", "the vCPU index is too large"),
        ),
        (
            "write:all:zz",
            WorkloadSpecError::BadNumber {
                step: "write:all:zz".into(),
                text: "zz".into(),
            },
        ),
        (
            "write@x:all",
            WorkloadSpecError::BadNumber {
                step: "write@x:all".into(),
                text: "x".into(),
            },
        ),
        (
            "checkpoint:0x",
            WorkloadSpecError::BadNumber {
                step: "checkpoint:0x".into(),
                text: "0x".into(),
            },
        ),
        (
            "write:all:0x10000000000000000",
            WorkloadSpecError::BadNumber {
                step: "write:all:0x10000000000000000".into(),
                text: "0x10000000000000000".into(),
            },
        ),
        (
            "write:2X+1M",
            WorkloadSpecError::BadSize {
                step: "write:2X+1M".into(),
                source: SizeError::Malformed("2X".into()),
            },
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(text.parse::<WorkloadSpec>(), Err(expected), "{text:?}");
    }
    let too_many = vec!["checkpoint:1"; MAX_STEPS + 1].join(",");
    assert_eq!(
        too_many.parse::<WorkloadSpec>(),
        Err(WorkloadSpecError::TooManySteps(MAX_STEPS + 1))
    );
}

#[test]
fn ranges_are_checked_against_memory_and_vcpus() {
    let bad_range = |text: &str| match resolve(text, 64 * MIB, 2) {
        Err(WorkloadSpecError::BadRange { why, .. }) => why,
        other => panic!("{text}: {other:?}"),
    };
    assert_eq!(bad_range("write:2M+0"), "the range is empty");
    assert_eq!(
        bad_range("write:2M+100"),
        "start and size must be multiples of 4 KiB"
    );
    assert_eq!(
        bad_range("write:2050K+4K"),
        "start and size must be multiples of 4 KiB"
    );
    assert!(bad_range("write:1M+1M").contains("at or above 2M"));
    assert!(bad_range("write:32M+64M").contains("not inside guest RAM (64 MiB of RAM"));
    assert!(bad_range("write:16T+16T").contains("not inside guest RAM"));
    assert!(matches!(
        resolve("read:all", 2 * MIB, 1),
        Err(WorkloadSpecError::BadRange { why, .. }) if why.contains("'all' is empty")
    ));
    // Across the MMIO gap is not one region.
    assert!(matches!(
        resolve("read:3G-4K+8K", 6 << 30, 1),
        Err(WorkloadSpecError::BadSize { .. })
    ));
    assert!(matches!(
        resolve("read:3071M+2M", 6 << 30, 1),
        Err(WorkloadSpecError::BadRange { .. })
    ));
    assert_eq!(
        resolve("read@2:all", 64 * MIB, 2),
        Err(WorkloadSpecError::NoSuchVcpu {
            step: "read@2:all".into(),
            vcpu: 2,
            vcpus: 2
        })
    );
}

#[test]
fn balloon_steps_are_preceded_by_one_probe_of_the_balloon_slot() {
    let text = "write:all,inflate:64M,checkpoint:1,balloon-target@1,deflate:4K,report:8M+16M,\
                answer-stats,answer-stats@1:3,hint@1:4M+8M";
    let workload = resolve(text, 128 * MIB, 2).unwrap();
    let kinds: Vec<u32> = workload.steps().iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            step_kind::WRITE,
            step_kind::BALLOON_PROBE,
            step_kind::BALLOON_INFLATE,
            step_kind::CHECKPOINT,
            step_kind::BALLOON_TO_TARGET,
            step_kind::BALLOON_DEFLATE,
            step_kind::BALLOON_REPORT,
            step_kind::BALLOON_STATS,
            step_kind::BALLOON_STATS,
            step_kind::BALLOON_HINT,
        ]
    );
    let steps = workload.steps();
    let probe = steps[1];
    assert_eq!(probe.addr, crate::layout::virtio_mmio_base(0).unwrap());
    assert_eq!(probe.size, 128 * MIB, "pages from the top of low RAM down");
    assert_eq!(
        probe.pattern,
        crate::testguest::protocol::BALLOON_DRIVER_FEATURES
    );
    assert_eq!((steps[2].size, steps[2].vcpu), (64 * MIB, ALL_VCPUS));
    assert_eq!(steps[4].vcpu, 1);
    assert_eq!(steps[5].size, 4096);
    assert_eq!((steps[6].addr, steps[6].size), (8 * MIB, 16 * MIB));
    assert_eq!((steps[7].pattern, steps[8].pattern), (1, 3));
    assert_eq!(steps[8].vcpu, 1);
    assert_eq!(
        (steps[9].addr, steps[9].size, steps[9].vcpu),
        (4 * MIB, 8 * MIB, 1)
    );
    // Above 3 GiB of RAM the balloon's area ends at the MMIO gap.
    let big = resolve("inflate:4K", 6 << 30, 1).unwrap();
    assert_eq!(big.steps()[0].size, 3 << 30);
    // The probe counts against the descriptor's steps.
    let full = vec!["checkpoint:1"; MAX_STEPS - 1].join(",") + ",inflate:4K";
    assert_eq!(
        resolve(&full, 64 * MIB, 1),
        Err(WorkloadSpecError::TooManySteps(MAX_STEPS + 1))
    );
}

#[test]
fn balloon_step_errors_name_the_step() {
    let malformed = |step: &str, why| WorkloadSpecError::Malformed {
        step: step.into(),
        why,
    };
    let cases = [
        (
            "inflate",
            malformed("inflate", "the step needs a size (e.g. inflate:64M)"),
        ),
        (
            "inflate:0",
            malformed("inflate:0", "the size must be a positive multiple of 4 KiB"),
        ),
        (
            "deflate:4097",
            malformed(
                "deflate:4097",
                "the size must be a positive multiple of 4 KiB",
            ),
        ),
        (
            "inflate:4K:1",
            malformed("inflate:4K:1", "only write and verify steps take a pattern"),
        ),
        (
            "balloon-target:1",
            malformed("balloon-target:1", "too many ':'-separated fields"),
        ),
        (
            "answer-stats:1:2",
            malformed("answer-stats:1:2", "too many ':'-separated fields"),
        ),
        (
            "answer-stats:x",
            WorkloadSpecError::BadNumber {
                step: "answer-stats:x".into(),
                text: "x".into(),
            },
        ),
        (
            "deflate:-4K",
            WorkloadSpecError::BadSize {
                step: "deflate:-4K".into(),
                source: SizeError::Malformed("-4K".into()),
            },
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(text.parse::<WorkloadSpec>(), Err(expected), "{text:?}");
    }
    assert!(matches!(
        resolve("report:1M+1M", 64 * MIB, 1),
        Err(WorkloadSpecError::BadRange { .. })
    ));
    assert!(matches!(
        resolve("inflate@3:4K", 64 * MIB, 2),
        Err(WorkloadSpecError::NoSuchVcpu { vcpu: 3, .. })
    ));
}

#[test]
fn balloon_steps_need_the_device_and_its_features() {
    let check = |text: &str, balloon: Option<&str>| {
        let spec: WorkloadSpec = text.parse().unwrap();
        let balloon: Option<BalloonDeviceConfig> = balloon.map(|b| b.parse().unwrap());
        spec.check_balloon(balloon.as_ref())
    };
    assert_eq!(check("write:all,checkpoint:1", None), Ok(()));
    assert_eq!(
        check("write:all,inflate:4K", None),
        Err(WorkloadSpecError::NoBalloon("inflate:4K".into()))
    );
    assert_eq!(check("balloon-target,deflate:4K", Some("size=0")), Ok(()));
    assert_eq!(
        check("report:all", Some("size=0")),
        Err(WorkloadSpecError::BalloonFeatureOff {
            step: "report:all".into(),
            option: "free_page_reporting=on",
        })
    );
    assert_eq!(check("report:all", Some("free_page_reporting=on")), Ok(()));
    let err = check("answer-stats", Some("stats_polling_interval_s=0")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "workload step 'answer-stats' needs --balloon stats_polling_interval_s=N (N > 0)"
    );
    assert_eq!(
        check("answer-stats:2", Some("stats_polling_interval_s=1")),
        Ok(())
    );
}

#[test]
fn repeated_and_joined_steps() {
    use crate::testguest::protocol::step_flags::JOINED_WITH_NEXT;
    let workload = resolve(
        "write@1:2M+2M*1000&report@0:2M+2M*50,verify:all",
        64 * MIB,
        2,
    )
    .unwrap();
    let steps = workload.steps();
    let summary: Vec<_> = steps
        .iter()
        .map(|s| (s.kind, s.vcpu, s.repeat, s.flags))
        .collect();
    assert_eq!(
        summary,
        [
            // The probe goes before the group, not between its steps.
            (step_kind::BALLOON_PROBE, ALL_VCPUS, 1, 0),
            (step_kind::WRITE, 1, 1000, JOINED_WITH_NEXT),
            (step_kind::BALLOON_REPORT, 0, 50, 0),
            (step_kind::VERIFY, ALL_VCPUS, 1, 0),
        ]
    );
    assert_eq!(workload.user_step_number(2), Some(2));
}

#[test]
fn bad_repeats_and_groups_are_refused() {
    let malformed = |step: &str, why| WorkloadSpecError::Malformed {
        step: step.into(),
        why,
    };
    let cases = [
        (
            "write:all*0",
            malformed(
                "write:all*0",
                "the repeat count (*N) must be 1 to 4294967295",
            ),
        ),
        (
            "write:all*x",
            WorkloadSpecError::BadNumber {
                step: "write:all*x".into(),
                text: "x".into(),
            },
        ),
        (
            "checkpoint:1*2",
            malformed("checkpoint:1*2", "a checkpoint cannot be repeated"),
        ),
        ("write:all&", WorkloadSpecError::EmptyStep),
        (
            "write:all&checkpoint:1",
            WorkloadSpecError::BadGroup(
                "write:all&checkpoint:1".into(),
                "a checkpoint cannot run at the same time as other steps",
            ),
        ),
        (
            "inflate@1:4K&report@0:2M+2M",
            WorkloadSpecError::BadGroup(
                "inflate@1:4K&report@0:2M+2M".into(),
                "at most one balloon step runs at a time (the guest has one driver)",
            ),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(text.parse::<WorkloadSpec>(), Err(expected), "{text:?}");
    }
}

#[test]
fn hotplug_steps_need_the_device_and_ranges_may_lie_in_its_memory() {
    let hotplug = Some(RamRegion {
        start: 4 << 30,
        size: 256 * MIB,
    });
    let text = "hotplug-target@1,write:4G+64M,hotplug-request:plug:4G:3:nack,\
                hotplug-request:77:4100M:65535:error";
    let spec: WorkloadSpec = text.parse().unwrap();
    assert!(matches!(
        spec.check_hotplug(false),
        Err(WorkloadSpecError::NoHotplug(step)) if step == "hotplug-target@1"
    ));
    spec.check_hotplug(true).unwrap();
    let workload = spec.resolve_with_hotplug(64 * MIB, 2, hotplug).unwrap();
    let steps = workload.steps();
    assert_eq!(
        (steps[0].kind, steps[0].vcpu),
        (step_kind::HOTPLUG_TO_REQUESTED, 1)
    );
    assert_eq!((steps[1].addr, steps[1].size), (4 << 30, 64 * MIB));
    assert_eq!(
        (steps[2].kind, steps[2].addr, steps[2].pattern),
        (step_kind::HOTPLUG_RAW, 4 << 30, 1 << 32 | 3 << 16)
    );
    assert_eq!(steps[3].pattern, 3 << 32 | 0xffff << 16 | 77);
    // Without the region, its memory is no range; past it neither.
    assert!(spec.resolve(64 * MIB, 2).is_err());
    let past = "write:4352M+4M".parse::<WorkloadSpec>().unwrap();
    assert!(past.resolve_with_hotplug(64 * MIB, 1, hotplug).is_err());
    for bad in [
        "hotplug-target:1",
        "hotplug-request:plug:4G:1",
        "hotplug-request:plug:4G:1:maybe",
        "hotplug-request:plug:4G:65536:ack",
        "hotplug-request:grow:4G:1:ack",
        "hotplug-request:plug:4G:1:ack:extra",
        "hotplug-target&hotplug-request:state:4G:1:ack",
    ] {
        assert!(bad.parse::<WorkloadSpec>().is_err(), "{bad}");
    }
}
