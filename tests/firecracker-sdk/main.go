// Command firecracker-sdk drives llfree-vmm through the official Firecracker Go SDK
// (github.com/firecracker-microvm/firecracker-go-sdk), exactly as the SDK starts and drives
// Firecracker: it boots a kernel with an initrd and a root drive, sets and reads the balloon and
// its statistics, pauses the VM, snapshots it, restores the snapshot into a new VMM process,
// resumes it and shuts it down with SendCtrlAltDel. It prints one "ok:" line per step and exits
// with status 1 on the first failure.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	models "github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"
)

// console collects what the VMM writes on stdout: the guest's serial console.
type console struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// waitFor waits until the console shows text; it gives up at once when m's VMM ends first
// (a guest that reset or crashed), not after the timeout.
func (c *console) waitFor(text string, timeout time.Duration, m *firecracker.Machine) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() { ended <- m.Wait(ctx) }()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(c.String(), text) {
		select {
		case err := <-ended:
			if strings.Contains(c.String(), text) {
				return nil
			}
			return fmt.Errorf("the VMM ended (%v) before %q came on the console; it shows %q", err, text, c.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q on the console after %v; it shows %q", text, timeout, c.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

type options struct {
	vmm, kernel, initrd, rootfs, dir, ready, bootArgs, tap string
	jailer, cgroupVersion                                  string
	uid, gid                                               int
	memMib                                                 int64
	guestStats                                             bool
}

// started are the machines whose VMM process may still run: a failure stops them.
var started []*firecracker.Machine

func check(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAILED: %s: %v\n", what, err)
		for _, m := range started {
			_ = m.StopVMM()
		}
		os.Exit(1)
	}
	fmt.Printf("ok: %s\n", what)
}

func expect(condition bool, what string, format string, args ...interface{}) {
	if !condition {
		check(fmt.Errorf(format, args...), what)
	}
	fmt.Printf("ok: %s\n", what)
}

// machine makes a Machine whose VMM is llfree-vmm, started as the SDK starts Firecracker.
func machine(ctx context.Context, o options, cfg firecracker.Config, out *console, opts ...firecracker.Opt) (*firecracker.Machine, error) {
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	command := firecracker.VMCommandBuilder{}.
		WithBin(o.vmm).
		WithSocketPath(cfg.SocketPath).
		AddArgs("--id", cfg.VMID).
		WithStdout(out).
		WithStderr(os.Stderr).
		Build(ctx)
	opts = append(opts, firecracker.WithProcessRunner(command), firecracker.WithLogger(logrus.NewEntry(logger)))
	m, err := firecracker.NewMachine(ctx, cfg, opts...)
	if err == nil {
		started = append(started, m)
	}
	return m, err
}

func main() {
	var o options
	flag.StringVar(&o.vmm, "vmm", "", "the vmm binary")
	flag.StringVar(&o.kernel, "kernel", "", "the kernel")
	flag.StringVar(&o.initrd, "initrd", "", "the initrd, if any")
	flag.StringVar(&o.ready, "ready", "", "what the guest prints once it runs")
	flag.StringVar(&o.bootArgs, "boot-args", "console=ttyS0 reboot=k panic=1 pci=off", "the kernel command line")
	flag.StringVar(&o.rootfs, "rootfs", "", "the root drive's image")
	flag.StringVar(&o.dir, "dir", "", "a scratch directory")
	flag.Int64Var(&o.memMib, "mem-mib", 64, "guest memory in MiB")
	flag.BoolVar(&o.guestStats, "guest-stats", false, "wait for the guest's balloon driver to report its memory statistics")
	flag.StringVar(&o.tap, "tap", "", "instead: boot with a network interface on this tap (its host side 10.0.2.1/24), vsock and MMDS V2, and reach the guest through each")
	flag.StringVar(&o.jailer, "jailer", "", "instead: start the VMM through this jailer with the SDK's JailerCfg, boot, check and shut down")
	flag.IntVar(&o.uid, "uid", 0, "with -jailer: the VMM's uid")
	flag.IntVar(&o.gid, "gid", 0, "with -jailer: the VMM's gid")
	flag.StringVar(&o.cgroupVersion, "cgroup-version", "", "with -jailer: the jailer's --cgroup-version")
	flag.Parse()
	if o.tap != "" {
		devices(o)
		return
	}
	if o.jailer != "" {
		jailed(o)
		return
	}
	// A real Linux boots for minutes where it runs nested under emulation.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bootTimeout := 10 * time.Minute

	// Boot: kernel, initrd, root drive, machine, balloon with statistics, logger, metrics.
	cfg := firecracker.Config{
		SocketPath:      filepath.Join(o.dir, "first.sock"),
		VMID:            "sdk_vm",
		LogPath:         filepath.Join(o.dir, "first.log"),
		LogLevel:        "Debug",
		MetricsPath:     filepath.Join(o.dir, "metrics.json"),
		KernelImagePath: o.kernel,
		InitrdPath:      o.initrd,
		KernelArgs:      o.bootArgs,
		Drives:          firecracker.NewDrivesBuilder(o.rootfs).Build(),
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(2),
			MemSizeMib: firecracker.Int64(o.memMib),
		},
	}
	out := &console{}
	m, err := machine(ctx, o, cfg, out)
	check(err, "NewMachine")
	m.Handlers.FcInit = m.Handlers.FcInit.Append(firecracker.NewCreateBalloonHandler(16, true, 1))
	began := time.Now()
	check(m.Start(ctx), "Start (logger, metrics, machine-config, boot-source, drives, balloon, InstanceStart)")
	startTime := time.Since(began)
	check(out.waitFor(o.ready, bootTimeout, m), "the guest runs")
	readyTime := time.Since(began)
	expect(strings.Contains(out.String(), "root=/dev/vda rw"), "the root drive is on the command line", "console: %q", out.String())

	info, err := m.DescribeInstanceInfo(ctx)
	check(err, "DescribeInstanceInfo")
	expect(*info.State == "Running" && *info.ID == "sdk_vm" && *info.AppName == "llfree-vmm",
		"instance info", "state %q, id %q, app %q", *info.State, *info.ID, *info.AppName)
	version, err := m.GetFirecrackerVersion(ctx)
	check(err, "GetFirecrackerVersion")
	expect(version != "", "a version", "empty version")

	// The balloon: read, set, statistics.
	balloon, err := m.GetBalloonConfig(ctx)
	check(err, "GetBalloonConfig")
	expect(*balloon.AmountMib == 16 && *balloon.DeflateOnOom && balloon.StatsPollingIntervals == 1,
		"the balloon as created", "%+v", balloon)
	check(m.UpdateBalloon(ctx, 8), "UpdateBalloon 8 MiB")
	balloon, err = m.GetBalloonConfig(ctx)
	check(err, "GetBalloonConfig after the update")
	expect(*balloon.AmountMib == 8, "the new balloon target", "amount %d", *balloon.AmountMib)
	stats, err := m.GetBalloonStats(ctx)
	check(err, "GetBalloonStats")
	expect(*stats.TargetMib == 8 && *stats.TargetPages == 8*256, "the statistics' target", "%+v", stats)
	if o.guestStats {
		// The guest's driver answers the device's statistics requests (every second).
		deadline := time.Now().Add(bootTimeout)
		for stats.FreeMemory == 0 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			stats, err = m.GetBalloonStats(ctx)
			check(err, "GetBalloonStats while waiting for the guest's")
		}
		expect(stats.FreeMemory > 0 && stats.TotalMemory > 0 && stats.TotalMemory <= o.memMib<<20,
			"the guest's memory statistics", "%+v", stats)
	}
	check(m.UpdateBalloonStats(ctx, 2), "UpdateBalloonStats 2 s")
	balloon, err = m.GetBalloonConfig(ctx)
	check(err, "GetBalloonConfig after the interval change")
	expect(balloon.StatsPollingIntervals == 2, "the new statistics interval", "%d", balloon.StatsPollingIntervals)

	// Pause, snapshot, and end this VMM.
	check(m.PauseVM(ctx), "PauseVM")
	info, err = m.DescribeInstanceInfo(ctx)
	check(err, "DescribeInstanceInfo when paused")
	expect(*info.State == "Paused", "paused", "state %q", *info.State)
	memFile := filepath.Join(o.dir, "vm.mem")
	snapshot := filepath.Join(o.dir, "vm.snap")
	began = time.Now()
	check(m.CreateSnapshot(ctx, memFile, snapshot), "CreateSnapshot")
	snapshotTime := time.Since(began)
	check(m.StopVMM(), "StopVMM")
	_ = m.Wait(ctx)

	// Restore into a new VMM process and resume.
	restoredCfg := firecracker.Config{
		SocketPath: filepath.Join(o.dir, "second.sock"),
		VMID:       "sdk_vm_restored",
		Drives:     firecracker.NewDrivesBuilder(o.rootfs).Build(),
		MachineCfg: cfg.MachineCfg,
	}
	restoredOut := &console{}
	r, err := machine(ctx, o, restoredCfg, restoredOut,
		firecracker.WithSnapshot(memFile, snapshot, func(s *firecracker.SnapshotConfig) { s.ResumeVM = true }))
	check(err, "NewMachine WithSnapshot")
	began = time.Now()
	check(r.Start(ctx), "Start from the snapshot (LoadSnapshot, resume_vm)")
	restoreTime := time.Since(began)
	info, err = r.DescribeInstanceInfo(ctx)
	check(err, "DescribeInstanceInfo after the restore")
	expect(*info.State == "Running", "running again", "state %q", *info.State)
	balloon, err = r.GetBalloonConfig(ctx)
	check(err, "GetBalloonConfig after the restore")
	expect(*balloon.AmountMib == 8 && balloon.StatsPollingIntervals == 2, "the balloon came along", "%+v", balloon)
	check(r.PauseVM(ctx), "PauseVM after the restore")
	check(r.ResumeVM(ctx), "ResumeVM")

	// Shut down as the SDK does: Ctrl-Alt-Del; the guest reboots and the VMM ends.
	began = time.Now()
	check(r.Shutdown(ctx), "Shutdown (SendCtrlAltDel)")
	waitCtx, waitCancel := context.WithTimeout(ctx, bootTimeout)
	defer waitCancel()
	check(r.Wait(waitCtx), "the VMM ended with status 0")
	shutdownTime := time.Since(began)
	fmt.Printf("time: Start %v, guest running %v after it began, CreateSnapshot (%d MiB copied) %v, "+
		"Start from the snapshot %v, Shutdown to the VMM's exit %v\n",
		startTime.Round(time.Microsecond*100), readyTime.Round(time.Microsecond*100), o.memMib,
		snapshotTime.Round(time.Microsecond*100), restoreTime.Round(time.Microsecond*100),
		shutdownTime.Round(time.Microsecond*100))
	fmt.Println("ok: all steps passed")
}

// devices boots the guest (its init in llfree.test=sdk-net) with a network interface on o.tap
// (static IP configuration, MMDS allowed), a vsock device and MMDS V2 with a document, as the
// SDK configures them, and reaches the guest through each: HTTP to its httpd, an echo over
// vsock through Firecracker's CONNECT, and its console line saying what MMDS told it.
func devices(o options) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bootTimeout := 10 * time.Minute
	uds := filepath.Join(o.dir, "v.sock")
	cfg := firecracker.Config{
		SocketPath:      filepath.Join(o.dir, "devices.sock"),
		VMID:            "sdk_devices",
		KernelImagePath: o.kernel,
		InitrdPath:      o.initrd,
		KernelArgs:      o.bootArgs,
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(o.memMib),
		},
		NetworkInterfaces: firecracker.NetworkInterfaces{{
			StaticConfiguration: &firecracker.StaticNetworkConfiguration{
				MacAddress:  "06:00:0a:00:02:02",
				HostDevName: o.tap,
				IPConfiguration: &firecracker.IPConfiguration{
					IPAddr:  net.IPNet{IP: net.IPv4(10, 0, 2, 2), Mask: net.CIDRMask(24, 32)},
					Gateway: net.IPv4(10, 0, 2, 1),
					IfName:  "eth0",
				},
			},
			AllowMMDS: true,
		}},
		VsockDevices: []firecracker.VsockDevice{{ID: "vsock0", Path: uds, CID: 3}},
		MmdsVersion:  firecracker.MMDSv2,
	}
	out := &console{}
	m, err := machine(ctx, o, cfg, out)
	check(err, "NewMachine with a network interface, vsock and MMDS V2")
	document := map[string]interface{}{
		"latest": map[string]interface{}{"meta-data": map[string]interface{}{"instance-id": "i-sdk"}},
	}
	m.Handlers.FcInit = m.Handlers.FcInit.AppendAfter(firecracker.CreateMachineHandlerName,
		firecracker.NewSetMetadataHandler(document))
	check(m.Start(ctx), "Start (network-interfaces, vsock, mmds/config, mmds, InstanceStart)")
	check(out.waitFor("LLFREE-L2 sdk-ready", bootTimeout, m), "the guest is up")
	expect(strings.Contains(out.String(), "LLFREE-L2 mmds instance-id=i-sdk"),
		"the guest read its MMDS V2 document", "console: %q", out.String())

	// The network: the guest's httpd through the tap.
	client := http.Client{Timeout: 2 * time.Minute}
	response, err := client.Get("http://10.0.2.2:8080/hello")
	check(err, "GET http://10.0.2.2:8080/hello")
	body, err := io.ReadAll(response.Body)
	response.Body.Close()
	check(err, "the answer's body")
	expect(strings.TrimSpace(string(body)) == "llfree-sdk", "the guest answered over the network", "body %q", body)

	// vsock: Firecracker's handshake on the device's socket, then the guest's echo.
	conn, err := net.Dial("unix", uds)
	check(err, "connect to the vsock socket")
	_, err = fmt.Fprintf(conn, "CONNECT 5000\n")
	check(err, "CONNECT 5000")
	reader := bufio.NewReader(conn)
	line, err := reader.ReadString('\n')
	check(err, "the handshake's answer")
	expect(strings.HasPrefix(line, "OK "), "OK from the guest's port", "line %q", line)
	_, err = fmt.Fprintf(conn, "echo\nhello over vsock")
	check(err, "write to the guest over vsock")
	echoed := make([]byte, len("hello over vsock"))
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	_, err = io.ReadFull(reader, echoed)
	check(err, "read the guest's echo")
	expect(string(echoed) == "hello over vsock", "the guest echoed over vsock", "%q", echoed)
	conn.Close()

	// MMDS through the API, as the SDK reads it.
	var got map[string]interface{}
	check(m.GetMetadata(ctx, &got), "GetMetadata")
	expect(fmt.Sprint(got) == fmt.Sprint(document), "the document as put", "%v", got)

	check(m.Shutdown(ctx), "Shutdown (SendCtrlAltDel)")
	waitCtx, waitCancel := context.WithTimeout(ctx, bootTimeout)
	defer waitCancel()
	check(m.Wait(waitCtx), "the VMM ended with status 0")
	fmt.Println("ok: all steps passed")
}

// jailed starts the VMM as the SDK starts a jailed Firecracker (JailerCfg with the naive
// chroot strategy, which links the kernel, initrd and root drive into the jail, and the
// SDK's NUMA node 0 cpuset), boots the guest, reads the instance and shuts it down.
func jailed(o options) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bootTimeout := 10 * time.Minute
	out := &console{}
	node := 0
	cfg := firecracker.Config{
		VMID: "sdk-jailed",
		// The SDK passes --no-seccomp unless told.
		Seccomp:         firecracker.SeccompConfig{Enabled: true},
		KernelImagePath: o.kernel,
		InitrdPath:      o.initrd,
		KernelArgs:      o.bootArgs,
		Drives:          firecracker.NewDrivesBuilder(o.rootfs).Build(),
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(o.memMib),
		},
		JailerCfg: &firecracker.JailerConfig{
			ID:             "sdk-jailed",
			UID:            &o.uid,
			GID:            &o.gid,
			NumaNode:       &node,
			ExecFile:       o.vmm,
			JailerBinary:   o.jailer,
			ChrootBaseDir:  filepath.Join(o.dir, "jail"),
			ChrootStrategy: firecracker.NewNaiveChrootStrategy(o.kernel),
			CgroupVersion:  o.cgroupVersion,
			Stdout:         out,
			Stderr:         os.Stderr,
		},
	}
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	m, err := firecracker.NewMachine(ctx, cfg, firecracker.WithLogger(logrus.NewEntry(logger)))
	check(err, "NewMachine with JailerCfg")
	started = append(started, m)
	check(m.Start(ctx), "Start through the jailer (links into the chroot, boot-source, drives, InstanceStart)")
	check(out.waitFor(o.ready, bootTimeout, m), "the jailed guest runs")
	info, err := m.DescribeInstanceInfo(ctx)
	check(err, "DescribeInstanceInfo")
	expect(*info.State == "Running" && *info.ID == "sdk-jailed", "instance info", "state %q, id %q", *info.State, *info.ID)
	pid, err := m.PID()
	check(err, "the VMM's pid")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err, "the VMM's /proc status")
	for _, want := range []string{
		fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d\n", o.uid, o.uid, o.uid, o.uid),
		fmt.Sprintf("Gid:\t%d\t%d\t%d\t%d\n", o.gid, o.gid, o.gid, o.gid),
		"CapEff:\t0000000000000000\n", "CapBnd:\t0000000000000000\n", "NoNewPrivs:\t1\n", "Seccomp:\t2\n",
	} {
		expect(strings.Contains(string(status), want), "the jailed VMM's "+strings.Split(want, ":")[0], "status %q", status)
	}
	check(m.Shutdown(ctx), "Shutdown (SendCtrlAltDel)")
	waitCtx, waitCancel := context.WithTimeout(ctx, bootTimeout)
	defer waitCancel()
	check(m.Wait(waitCtx), "the VMM ended with status 0")
	fmt.Println("ok: all steps passed")
}
