#!/usr/bin/env bash
# The real-Linux end-to-end tests (tests/tests/linux_*.rs), run for real on this host.
#
# Where /proc/cpuinfo shows vmx or svm, the tests boot the L2 kernel built here directly in our
# VMM. Elsewhere (e.g. a PVM /dev/kvm, which cannot run a stock kernel) they run one level
# down: QEMU in TCG mode with `-cpu max` emulates an AMD CPU with SVM; Debian's 6.1 kernel
# there (L1) loads kvm_amd, and the test binaries run inside it against its /dev/kvm.
#
# Stages, all idempotent: packages (apt), the Firecracker Go SDK program (tests/firecracker-sdk,
# static, from the Go module proxy), the L2 kernel (Debian's linux-source-6.1, tinyconfig
# plus l2.config; cached outside the clone, keyed by its configuration), the L1 kernel
# (Debian's linux-image, unpacked), the L2 initramfs (busybox and l2-init), the workspace's test
# binaries, then the run. Ends with the test runners' summary lines; exits non-zero if a test
# failed, printed SKIP, or QEMU did not finish within its time limit.
#
# Usage (as root on Debian 12): tests/linux-nested/run.sh [TEST-NAME-FILTER]
#   or: tests/linux-nested/run.sh --guest-files DIR
#     only builds a Linux guest for a host with hardware virtualisation and leaves it in DIR:
#     bzImage (the L2 kernel) and rootfs.ext4 (busybox; its init, guest-init, says which Linux
#     booted and gives a shell on the console; Ctrl-Alt-Del reboots), as docs/linux-guests.md
#     boots them. The nested tests boot the same files.
# Environment:
#   LLFREE_NESTED_CACHE    cache of kernels (default /var/cache/llfree-vmm-nested)
#   LLFREE_NESTED_TIMEOUT  hard limit of one QEMU run in seconds (default 2400)
#   LLFREE_NESTED_FORCE    1: run through QEMU even where the host has vmx or svm
#   LLFREE_NESTED_ROUNDS   run the tests this many times in one L1 boot (default 1)
#   LLFREE_NESTED_L1_RESTARTS  how many times L1 is booted again after it died (default 3)
#   LLFREE_NESTED_SILENCE  seconds without a line from L1 after which it counts as dead
#                          (default 900)
#   LLFREE_NESTED_BINARIES only these test binaries, e.g. "linux_overcommit linux_exhaustion"
#   LLFREE_NESTED_BENCH_ONLY with LLFREE_NESTED_BENCH=1: only these parts of l1-bench, e.g.
#                          "net vsock" (of boot, reporting, hotplug, balloon, net, vsock)
#   LLFREE_NESTED_PACKAGES_ONLY  1: install the packages (QEMU from backports) and stop; how
#                          check-install.sh proves the install on a fresh Debian
#   LLFREE_NESTED_BENCH    1: instead of the tests, compare our VMM with QEMU's microvm in L1
#                          (boot time to init, free page reporting, virtio-mem; l1-bench)
#   LLFREE_NESTED_FIRECRACKER  with LLFREE_NESTED_BENCH=1: a firecracker binary (built as
#                          tests/firecracker-compare/run.sh says) to measure beside them at boot,
#                          free page reporting and the balloon; it boots the L2 kernel's ELF
#                          vmlinux
#   LLFREE_VMM_DAX_DIR     directly on a host: a directory on a DAX file system for the MAP_SYNC
#                          zone test (nested, L1 mounts one on QEMU's emulated NVDIMM)
#   LLFREE_VMM_DEVDAX      directly on a host: a device DAX (/dev/daxX.Y) for the zone test on
#                          one; its contents are overwritten (nested, L1 makes QEMU's second
#                          emulated NVDIMM one)
set -euo pipefail
# A command substitution (`kernel=$(l2_kernel)`) stops at its first failure too, and so fails
# the assignment: without this, bash runs it without -e, and a failed stage went on. (Nothing
# that must stop at a failure may stand left of `||` or `&&`, or in a condition: bash ignores
# -e there, in every function and subshell it runs.)
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${LLFREE_NESTED_CACHE:-/var/cache/llfree-vmm-nested}
WORK=$ROOT/target/linux-nested
TIMEOUT=${LLFREE_NESTED_TIMEOUT:-2400}
GUEST_FILES=
if [ "${1:-}" = --guest-files ]; then
    GUEST_FILES=${2:?--guest-files needs a directory}
    set --
fi
FILTER=${1:-}
ROUNDS=${LLFREE_NESTED_ROUNDS:-1}
L1_RESTARTS=${LLFREE_NESTED_L1_RESTARTS:-3}
SILENCE=${LLFREE_NESTED_SILENCE:-900}
[[ $SILENCE =~ ^[1-9][0-9]*$ ]] || { echo "error: LLFREE_NESTED_SILENCE must be a number of seconds, not '$SILENCE'" >&2; exit 2; }
# The test binaries with real-Linux tests.
TESTS=(linux_boot linux_balloon linux_overcommit linux_pmem linux_snapshot linux_clones linux_zone_shared
    linux_firecracker linux_exhaustion linux_zone_reclaim linux_net linux_vsock linux_drive
    linux_hotplug)
if [ -n "${LLFREE_NESTED_BINARIES:-}" ]; then read -ra TESTS <<<"$LLFREE_NESTED_BINARIES"; fi
PACKAGES=(busybox-static linux-source-6.1 flex bison bc cpio gcc make libelf-dev libssl-dev
    xz-utils seabios e2fsprogs ndctl)
# QEMU 7.2 (bookworm) froze L1 when an L2 vCPU spun with interrupts off; 10.0 does not.
QEMU_SUITE=bookworm-backports
QEMU_MIN_VERSION=1:10

# shellcheck source=tests/linux-nested/apt.sh
. "$HERE/apt.sh"

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

install_packages() {
    local missing=()
    for package in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$package")
    done
    command -v go >/dev/null 2>&1 || missing+=(golang-go)
    local qemu new_qemu=0
    qemu=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
    if [ -z "$qemu" ] || dpkg --compare-versions "$qemu" lt "$QEMU_MIN_VERSION"; then
        new_qemu=1
        add_suite_source "$QEMU_SUITE"
    fi
    [ ${#missing[@]} -eq 0 ] && [ $new_qemu = 0 ] && return
    apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    if [ $new_qemu = 1 ]; then
        # In its own call, with the suite as the default release: QEMU 10's own dependencies
        # (qemu-system-common, -data, seabios) must come from backports too, which naming
        # only qemu-system-x86/bookworm-backports does not do ("held broken packages").
        log "installing qemu-system-x86 from $QEMU_SUITE"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -t "$QEMU_SUITE" qemu-system-x86 >/dev/null
    fi
    dpkg --compare-versions "$(dpkg-query -W -f='${Version}' qemu-system-x86)" ge \
        "$QEMU_MIN_VERSION" || die "qemu-system-x86 older than $QEMU_MIN_VERSION after the install"
}

# Builds the L2 kernel unless the cache has it: bzImage and, beside it, vmlinux (the stripped
# ELF image the bzImage carries, with its PVH entry note). Prints the bzImage's path. It is
# built in a directory of its own beside the cache's and moved into place once complete: a
# build that fails (or is stopped) stops the harness with its error, leaves the cache as it
# was, and keeps its tree for a look.
l2_kernel() {
    local source=/usr/src/linux-source-6.1.tar.xz version key dir partial
    version=$(dpkg-query -W -f='${Version}' linux-source-6.1)
    key=$( (echo "$version"; cat "$HERE/l2.config") | sha256sum | cut -c1-16)
    dir=$CACHE/l2-$key
    partial=$CACHE/building-l2-$key
    if [ ! -f "$dir/bzImage" ] || [ ! -f "$dir/vmlinux" ]; then
        log "building the L2 kernel (linux-source $version, tinyconfig + l2.config) in $partial"
        rm -rf "$partial" && mkdir -p "$partial/build"
        tar -xJf "$source" -C "$partial/build" --strip-components=1 ||
            die "cannot unpack $source into $partial/build"
        (
            cd "$partial/build"
            make -s tinyconfig
            scripts/kconfig/merge_config.sh -m .config "$HERE/l2.config" >/dev/null
            make -s olddefconfig
            # Every option of the fragment must have survived the dependency resolution.
            grep -E '^CONFIG_[A-Z0-9_]+=' "$HERE/l2.config" | while read -r option; do
                grep -qx "$option" .config || die "the L2 kernel lacks $option"
            done
            nice make -s -j"$(nproc)" bzImage
        ) >&2
        cp "$partial/build/arch/x86/boot/bzImage" "$partial/bzImage"
        cp "$partial/build/arch/x86/boot/compressed/vmlinux.bin" "$partial/vmlinux"
        rm -rf "$partial/build" "$dir"
        mv "$partial" "$dir"
    fi
    echo "$dir/bzImage"
}

# Unpacks Debian's current 6.1 kernel image (vmlinuz and the KVM modules) unless the cache has
# it; prints the directory.
l1_kernel() {
    local package dir
    package=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-6/ { print $2; exit }')
    [ -n "$package" ] || die "apt knows no linux-image-6.* package"
    dir=$CACHE/l1-$package
    if [ ! -d "$dir/boot" ]; then
        log "unpacking $package (the L1 kernel)"
        rm -rf "$dir" "$CACHE/debs" && mkdir -p "$CACHE/debs"
        (cd "$CACHE/debs" && apt-get download -qq -o APT::Sandbox::User=root "$package") >&2
        dpkg -x "$CACHE"/debs/"$package"_*.deb "$dir"
        rm -rf "$CACHE/debs"
    fi
    echo "$dir"
}

# A gzip'd newc initramfs of directory $1 at $2.
pack() {
    (cd "$1" && find . | cpio -o -H newc --quiet | gzip -1) >"$2"
}

# The L2 initramfs: busybox, l2-init, mke2fs and e2fsck for the pmem test, and vsock-tool
# (built by build_tests) for the vsock test.
l2_initramfs() {
    local root=$WORK/l2-root tool
    rm -rf "$root" && mkdir -p "$root"/{bin,dev,proc,sys,tmp,usr/sbin}
    cp /bin/busybox "$root/bin/busybox"
    cp "$HERE/l2-init" "$root/init"
    # Outside /bin, where busybox installs its own (smaller) mke2fs.
    for tool in /sbin/mke2fs /sbin/e2fsck "$ROOT/target/release/vsock-tool"; do
        cp "$tool" "$root/usr/sbin/"
        copy_libraries "$tool" "$root"
    done
    pack "$root" "$WORK/l2-initrd.gz"
}

# The documented Linux guest in directory $2, with the L2 kernel $1: bzImage, and rootfs.ext4
# (busybox, guest-init as /sbin/init).
guest_files() {
    local kernel=$1 dir=$2 tree=$WORK/guest-root applet
    mkdir -p "$dir"
    rm -rf "$tree" && mkdir -p "$tree"/{bin,sbin,proc,sys,dev,tmp,root}
    cp /bin/busybox "$tree/bin/busybox"
    for applet in sh mount sed grep uname setsid cttyhack sleep reboot; do
        ln -s busybox "$tree/bin/$applet"
    done
    cp "$HERE/guest-init" "$tree/sbin/init"
    cp "$kernel" "$dir/bzImage"
    rm -f "$dir/rootfs.ext4"
    truncate -s 64M "$dir/rootfs.ext4"
    mke2fs -q -F -t ext4 -d "$tree" "$dir/rootfs.ext4"
}

# The Firecracker Go SDK program of tests/firecracker-sdk, static (it runs in L1 too).
build_sdk_program() {
    (cd "$ROOT/tests/firecracker-sdk" &&
        CGO_ENABLED=0 go build -mod=readonly -o "$WORK/firecracker-sdk" . >&2)
}

# Builds vmm and the test binaries; prints the binaries' paths.
build_tests() {
    local args=()
    for test in "${TESTS[@]}"; do args+=(--test "$test"); done
    (cd "$ROOT" && cargo build --release -q -p vmm-cli -p vmm-jailer -p e2e-tests -p guest-mem-bench \
        --bins >&2)
    (cd "$ROOT" && cargo test --release -q -p e2e-tests "${args[@]}" --no-run \
        --message-format=json 2>/dev/null) |
        sed -n 's/.*"executable":"\([^"]*\/deps\/[^"]*\)".*/\1/p'
}

hardware_virtualization() {
    grep -qwE 'vmx|svm' /proc/cpuinfo
}

# Copies the shared libraries of binary $1 into root $2.
copy_libraries() {
    local library
    for library in $(ldd "$1" | grep -o '/[^ ]*'); do
        mkdir -p "$2$(dirname "$library")"
        cp -L "$library" "$2$library"
    done
}

# The L1 initramfs: busybox, l1-init, the KVM modules, the test binaries and the vmm and
# vmm-jailer they spawn (/bin/vmm, LLFREE_VMM_BIN; /bin/vmm-jailer, LLFREE_VMM_JAILER_BIN),
# the L2 kernel and initramfs.
l1_initramfs() {
    local l1=$1 kernel=$2 root=$WORK/l1-root binary modules release
    shift 2
    rm -rf "$root" && mkdir -p "$root"/{bin,dev,proc,sys,tmp,tests,l2,modules}
    cp /bin/busybox "$root/bin/busybox"
    cp "$HERE/l1-init" "$root/init"
    release=$(ls "$l1/lib/modules")
    modules=$l1/lib/modules/$release/kernel
    # KVM; the emulated NVDIMMs (ACPI NFIT, libnvdimm, pmem), ext4 for a DAX file system,
    # device DAX, tun for the taps of the virtio-net tests, and vhost-net and vhost-vsock for
    # QEMU's in the benchmarks.
    for module in virt/lib/irqbypass.ko arch/x86/kvm/kvm.ko drivers/crypto/ccp/ccp.ko \
        arch/x86/kvm/kvm-amd.ko drivers/nvdimm/libnvdimm.ko drivers/nvdimm/nd_btt.ko \
        drivers/nvdimm/nd_pmem.ko drivers/acpi/nfit/nfit.ko lib/crc16.ko fs/mbcache.ko \
        fs/jbd2/jbd2.ko crypto/crc32c_generic.ko fs/ext4/ext4.ko drivers/dax/device_dax.ko \
        drivers/dax/dax_pmem.ko drivers/net/tun.ko drivers/net/tap.ko drivers/vhost/vhost_iotlb.ko \
        drivers/vhost/vhost.ko drivers/vhost/vhost_net.ko drivers/vhost/vhost_vsock.ko \
        net/vmw_vsock/vsock.ko net/vmw_vsock/vmw_vsock_virtio_transport_common.ko; do
        cp "$modules/$module" "$root/modules/"
    done
    cp /sbin/mke2fs "$root/bin/mke2fs.real"
    copy_libraries /sbin/mke2fs "$root"
    cp /usr/bin/ndctl "$root/bin/ndctl"
    copy_libraries /usr/bin/ndctl "$root"
    for binary in "$@"; do
        cp "$binary" "$root/tests/"
        copy_libraries "$binary" "$root"
        # A rerun: only the tests of the binary that failed (l1-init runs them by exact name).
        if [ -f "$WORK/rerun-tests" ]; then
            sed -n "s/^$(basename "$binary") //p" "$WORK/rerun-tests" \
                >"$root/tests/$(basename "$binary").only"
            [ -s "$root/tests/$(basename "$binary").only" ] ||
                rm "$root/tests/$(basename "$binary").only"
        fi
    done
    cp "$ROOT/target/release/vmm" "$root/bin/vmm"
    copy_libraries "$ROOT/target/release/vmm" "$root"
    cp "$ROOT/target/release/vmm-jailer" "$root/bin/vmm-jailer"
    copy_libraries "$ROOT/target/release/vmm-jailer" "$root"
    cp "$WORK/firecracker-sdk" "$root/bin/firecracker-sdk"
    cp "$kernel" "$root/l2/bzImage"
    # The same kernel's ELF image: booted through PVH (and by Firecracker, which loads only
    # ELF kernels on x86).
    cp "$(dirname "$kernel")/vmlinux" "$root/l2/vmlinux"
    cp "$WORK/l2-initrd.gz" "$root/l2/initrd.gz"
    cp -r "$WORK/guest" "$root/guest"
    echo "$FILTER" >"$root/tests/filter"
    echo "$ROUNDS" >"$root/tests/rounds"
    if [ "${LLFREE_NESTED_BENCH:-0}" = 1 ]; then
        mkdir -p "$root/bench" "$root/qemu"
        cp "$HERE/l1-bench" "$root/bench/run"
        cp "$ROOT/target/release/linux-guest-bench" "$ROOT/target/release/vsock-tool" \
            "$ROOT/target/release/guest-mem-bench" \
            "$root/bench/"
        echo "${LLFREE_NESTED_BENCH_ONLY:-}" >"$root/bench/only"
        # microvm's firmware, and the pc machine's (QEMU's virtio-mem-pci needs PCI).
        cp /usr/bin/qemu-system-x86_64 /usr/share/seabios/bios-microvm.bin \
            /usr/share/qemu/qboot.rom /usr/share/seabios/bios-256k.bin \
            /usr/share/qemu/linuxboot_dma.bin /usr/share/qemu/kvmvapic.bin "$root/qemu/"
        copy_libraries /usr/bin/qemu-system-x86_64 "$root"
        if [ -n "${LLFREE_NESTED_FIRECRACKER:-}" ]; then
            [ -f "$LLFREE_NESTED_FIRECRACKER" ] && [ -x "$LLFREE_NESTED_FIRECRACKER" ] ||
                die "LLFREE_NESTED_FIRECRACKER=$LLFREE_NESTED_FIRECRACKER is no executable file"
            mkdir -p "$root/firecracker"
            cp "$LLFREE_NESTED_FIRECRACKER" "$root/firecracker/firecracker"
            copy_libraries "$LLFREE_NESTED_FIRECRACKER" "$root"
        fi
    fi
    pack "$root" "$WORK/l1-initrd.gz"
}

# Runs the tests in QEMU; prints L1's console, one line at a time, as it comes.
run_in_qemu() {
    local l1=$1
    log "booting L1 in QEMU/TCG (limit ${TIMEOUT} s)"
    # As many L1 CPUs as the largest L2 has vCPUs: with 2, a 4-vCPU L2 froze L1 once in 25
    # boots (an L1 CPU looping on a page fault at its own kvm_amd code, an emulation fault);
    # with 4, 60 boots in a row passed.
    # Two emulated NVDIMMs: on the first L1 mounts ext4 with -o dax (a zone there is mapped
    # with MAP_SYNC), the second is a device DAX (/dev/dax1.0, a zone right on it): the DAX
    # tests of tests/tests/linux_pmem.rs.
    rm -f "$WORK/nvdimm.img" "$WORK/devdax.img"
    truncate -s 1G "$WORK/nvdimm.img" "$WORK/devdax.img"
    timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
        -machine pc,nvdimm=on -smp 4 -m 6G,slots=2,maxmem=8G -nographic -no-reboot -nic none \
        -object memory-backend-file,id=nvmem,share=on,mem-path="$WORK/nvdimm.img",size=1G \
        -device nvdimm,id=nvdimm0,memdev=nvmem \
        -object memory-backend-file,id=devdax,share=on,mem-path="$WORK/devdax.img",size=1G \
        -device nvdimm,id=nvdimm1,memdev=devdax \
        -kernel "$l1"/boot/vmlinuz-* -initrd "$WORK/l1-initrd.gz" \
        -append "console=ttyS0 panic=-1 softlockup_panic=1 watchdog_thresh=30 loglevel=4 hugepagesz=1G hugepages=1" \
        -monitor unix:"$WORK/monitor.sock",server,nowait </dev/null
}

run_directly() {
    local kernel=$1 binary status=0
    shift
    export LLFREE_VMM_TEST_KERNEL=$kernel LLFREE_VMM_TEST_VMLINUX=$(dirname "$kernel")/vmlinux
    export LLFREE_VMM_TEST_INITRD=$WORK/l2-initrd.gz
    export LLFREE_VMM_FC_SDK=$WORK/firecracker-sdk LLFREE_VMM_GUEST_FILES=$WORK/guest
    # The vmm that build_tests just built (its own build, whose features differ from the tests').
    export LLFREE_VMM_BIN=$ROOT/target/release/vmm
    # A DAX file system for the MAP_SYNC zone test and a device DAX, if the host has them.
    if [ -n "${LLFREE_VMM_DAX_DIR:-}" ]; then export LLFREE_VMM_DAX_DIR; fi
    if [ -n "${LLFREE_VMM_DEVDAX:-}" ]; then export LLFREE_VMM_DEVDAX; fi
    for binary in "$@"; do
        "$binary" --test-threads=1 --nocapture ${FILTER:+"$FILTER"} 2>&1 || status=1
    done
    return $status
}

# The test binaries of $2... that did not finish in the L1 boot whose console is file $1: the
# one that ran when L1 died and those not started (l1-init runs them in the order of their
# names and says "L1: round R: running NAME" before each).
unfinished() {
    local console=$1 binary started last
    shift
    started=$(sed -n 's/\r$//; s/^L1: round [0-9]*: running //p' "$console")
    last=$(tail -n 1 <<<"$started")
    for binary in "$@"; do
        if [ "$(basename "$binary")" = "$last" ] || ! grep -qxF "$(basename "$binary")" <<<"$started"; then
            echo "$binary"
        fi
    done
}

# The binaries of $2... whose names the list $1 ("NAME NAME...", l1-init's failures) gives.
# The tests that failed in L1's console (file $1), a line "BINARY TEST" each: the names listed
# under a test binary's last "failures:" before its result line.
failed_tests() {
    sed 's/\r$//' "$1" | awk '
        /^L1: round [0-9]+: running / { binary = $5; listing = 0 }
        /^failures:$/ { listing = 1; next }
        /^test result:/ { listing = 0 }
        listing && /^    [A-Za-z0-9_:]+$/ { print binary, $1 }'
}

failed_binaries() {
    local failed=" $1 " binary
    shift
    for binary in "$@"; do
        if [[ "$failed" == *" $(basename "$binary") "* ]]; then
            echo "$binary"
        fi
    done
}

# Stops QEMU when L1's console (file $1) has not grown for SILENCE seconds: an L1 wedged with
# a CPU spinning where no watchdog of its own fires (seen once in the Go SDK's test, 23 minutes
# without a line) then counts as an L1 that died, instead of running out QEMU's time limit.
watch_console() {
    local console=$1 size last=-1 since=$SECONDS
    while sleep 10; do
        size=$(stat -c %s "$console" 2>/dev/null || echo 0)
        if [ "$size" != "$last" ]; then
            last=$size since=$SECONDS
        elif [ $((SECONDS - since)) -ge "$SILENCE" ]; then
            log "L1 printed nothing for $SILENCE s: stopping QEMU"
            pkill -TERM -f -- "mem-path=$WORK/nvdimm.img" || true
            return
        fi
    done
}

# Runs test binaries $4... in L1 (kernel directory $1, L2 kernel $2), L1's console appended to
# file $3. QEMU's emulation of SVM fails now and then under L1's own kernel (a CPU looping for
# minutes, or kvm_amd returning to L1 with the L2's GS base: L1 panics; or L1 goes silent, see
# watch_console); then L1 boots again
# for the binary that ran and those after it, at most L1_RESTARTS times, in one round only.
# A CPU of L1 looping for minutes can also stall a guest until its test gives up while L1
# lives on (seen: a VMM whose guest made no progress for 200 s, then L1 panicked in its
# vCPU's KVM_RUN): tests that failed run once more on a freshly booted L1 (only they, of
# their binaries), in one round only, and the log names them. Fails if a test failed twice,
# or L1 died once more than allowed.
run_nested() {
    local l1=$1 kernel=$2 output=$3 console=$WORK/l1-console.log boots=0 status=0 rerun=0
    shift 3
    local all=("$@") remaining=("$@") again binary
    : >"$output"
    rm -f "$WORK/rerun-tests"
    while :; do
        boots=$((boots + 1))
        l1_initramfs "$l1" "$kernel" "${remaining[@]}"
        local qemu_status=0 watcher
        : >"$console"
        watch_console "$console" &
        watcher=$!
        run_in_qemu "$l1" | tee "$console" || qemu_status=$?
        kill "$watcher" 2>/dev/null || true
        wait "$watcher" 2>/dev/null || true
        cat "$console" >>"$output"
        if grep -aq '^LLFREE-NESTED-END ok' "$console"; then
            return $status
        elif grep -aq '^LLFREE-NESTED-END' "$console"; then
            local failed
            failed=$(sed -n 's/\r$//; s/^LLFREE-NESTED-END failed://p' "$console")
            mapfile -t remaining < <(failed_binaries "$failed" "${remaining[@]}")
            if [ "$rerun" = 1 ] || [ "$ROUNDS" != 1 ] || [ "${LLFREE_NESTED_BENCH:-0}" = 1 ] ||
                [ ${#remaining[@]} -eq 0 ]; then
                return 1
            fi
            rerun=1
            failed_tests "$console" >"$WORK/rerun-tests"
            log "failed in L1: $(cut -d' ' -f2 "$WORK/rerun-tests" | tr '\n' ' ')(of$failed);" \
                "running them once more on a freshly booted L1 (QEMU's emulation of SVM" \
                "stalls L1 now and then; a second failure fails)"
            continue
        fi
        # What finished before L1 died counts as it ran; a test that failed there runs once
        # more with the rest, as after an L1 that lived (this is that one rerun).
        mapfile -t remaining < <(unfinished "$console" "${remaining[@]}")
        if grep -aq '^test result: FAILED' "$console"; then
            if [ "$rerun" = 1 ] || [ "$ROUNDS" != 1 ] || [ "${LLFREE_NESTED_BENCH:-0}" = 1 ]; then
                status=1
            else
                rerun=1
                failed_tests "$console" >>"$WORK/rerun-tests"
                mapfile -t again < <(failed_binaries \
                    "$(cut -d' ' -f1 "$WORK/rerun-tests" | tr '\n' ' ')" "${all[@]}")
                for binary in "${again[@]}"; do
                    [[ " ${remaining[*]} " == *" $binary "* ]] || remaining+=("$binary")
                done
                log "failed in L1 before it died: $(cut -d' ' -f2 "$WORK/rerun-tests" |
                    tr '\n' ' ')- running them once more on the next L1 (a second failure fails)"
            fi
        fi
        # Not after QEMU's time limit: that time is spent.
        if [ "$boots" -gt "$L1_RESTARTS" ] || [ "$ROUNDS" != 1 ] || [ ${#remaining[@]} -eq 0 ] ||
            [ "$qemu_status" -eq 124 ] || [ "$qemu_status" -eq 137 ]; then
            log "QEMU did not finish: failed"
            return 1
        fi
        log "L1 died (QEMU did not finish; its console above); booting it again for" \
            "$(for binary in "${remaining[@]}"; do basename "$binary"; done | tr '\n' ' ')"
    done
}

main() {
    [ "$(id -u)" -eq 0 ] || die "run as root (packages, KVM, huge pages)"
    install_packages
    if [ "${LLFREE_NESTED_PACKAGES_ONLY:-0}" = 1 ]; then
        log "qemu-system-x86 $(dpkg-query -W -f='${Version}' qemu-system-x86) installed"
        return
    fi
    mkdir -p "$CACHE" "$WORK"
    local kernel l1 binaries output status=0
    kernel=$(l2_kernel)
    if [ -n "$GUEST_FILES" ]; then
        guest_files "$kernel" "$GUEST_FILES"
        log "a Linux guest in $GUEST_FILES: bzImage and rootfs.ext4"
        return
    fi
    guest_files "$kernel" "$WORK/guest"
    build_sdk_program
    mapfile -t binaries < <(build_tests)
    l2_initramfs
    [ ${#binaries[@]} -eq ${#TESTS[@]} ] || die "expected ${#TESTS[@]} test binaries: ${binaries[*]}"
    output=$WORK/output.log
    local mode=nested
    if hardware_virtualization && [ "${LLFREE_NESTED_FORCE:-0}" != 1 ]; then
        mode=direct
        log "this host has hardware virtualization: running the tests directly"
        run_directly "$kernel" "${binaries[@]}" | tee "$output" || status=1
    else
        l1=$(l1_kernel)
        run_nested "$l1" "$kernel" "$output" "${binaries[@]}" || status=1
    fi
    log "summary"
    if [ "${LLFREE_NESTED_BENCH:-0}" = 1 ]; then
        grep -aE '^(L1-BENCH|boot|reporting|hotplug|balloon)' "$output" || status=1
        return $status
    fi
    # Every test must run for real; directly on a host, the DAX tests may lack a DAX file
    # system (LLFREE_VMM_DAX_DIR) or device (LLFREE_VMM_DEVDAX), which only the nested run
    # brings along.
    local skips
    skips=$(grep -a 'SKIP' "$output" || true)
    if [ "$mode" = direct ]; then
        skips=$(grep -v -e 'no DAX file system' -e 'no device DAX' <<<"$skips" || true)
    fi
    if [ -n "$skips" ]; then
        log "a real-Linux test printed SKIP: failed"
        status=1
    fi
    grep -aE '^test result:' "$output" || { log "no test ran"; status=1; }
    # Where a test failed, where and why, first lines only: its message may carry a guest's
    # whole console, which would push the reason out of a log's tail.
    if grep -aq 'panicked at' "$output"; then
        log "failures (where each test panicked, and the first line of its message)"
        grep -a -A1 'panicked at' "$output" | grep -av '^--$' | cut -c1-300 || true
    fi
    return $status
}

# Sourced (a test of the harness's stages), it only defines them.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main
fi
