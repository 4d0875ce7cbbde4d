//! `hotplug` mode: how long a guest takes to gain and give back 1 GiB through virtio-mem,
//! asked through our API (`PATCH /hotplug/memory`) or QEMU's QMP (`qom-set` of the
//! `vmem0` device's `requested-size`), and with `--balloon` (our VMM) how long the same guest
//! takes to give and take 1 GiB through its balloon.
//!
//! The guest runs `llfree.test=hotplug`, which reports its MemTotal whenever it changes.
//! Each time is from the request until the guest's line saying MemTotal changed by 1 GiB
//! (stamped when the line came), and also until the device says it is done: for the plug its
//! plugged size 1 GiB (the guest's requests answered; the guest polls its MemTotal every 0.1 s
//! and more, which blurs the line's time), for the unplug 0 and for the inflation the balloon's
//! actual size 1 GiB (from then on the memory is free on the host).

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{json, Value};
use vmm_cli::ApiClient;

use crate::balloon::{self, api_call, poll, GIB_KIB, GIB_MIB};
use crate::qmp::Qmp;
use crate::{Measured, Vmm, TIMEOUT};

/// QEMU's virtio-mem-pci device: `-device virtio-mem-pci,id=vmem0,...`.
const QEMU_DEVICE: &str = "/machine/peripheral/vmem0";

/// The mode's options: `--api SOCKET` or `--qmp SOCKET`, and `--balloon`.
pub struct Options {
    control: Socket,
    balloon: bool,
}

enum Socket {
    Api(PathBuf),
    Qmp(PathBuf),
}

impl Options {
    /// Parses the options between the run count and `--`.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let (mut control, mut balloon) = (None, false);
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut socket = || {
                args.next()
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("{arg} needs a socket path"))
            };
            match arg.as_str() {
                "--api" => control = Some(Socket::Api(socket()?)),
                "--qmp" => control = Some(Socket::Qmp(socket()?)),
                "--balloon" => balloon = true,
                _ => return Err(format!("unknown option {arg}")),
            }
        }
        let control = control.ok_or("hotplug needs --api SOCKET or --qmp SOCKET")?;
        if balloon && matches!(control, Socket::Qmp(_)) {
            return Err(
                "--balloon needs --api: QEMU's balloon target is below its boot RAM".into(),
            );
        }
        Ok(Options { control, balloon })
    }
}

/// Where the requests go.
enum Control {
    Api(ApiClient),
    Qmp(Qmp),
}

impl Control {
    fn connect(socket: &Socket) -> Result<Self, String> {
        Ok(match socket {
            Socket::Api(path) => Control::Api(ApiClient::new(path)),
            Socket::Qmp(path) => Control::Qmp(Qmp::connect(path, TIMEOUT)?),
        })
    }

    /// Asks the guest to have `mib` MiB plugged.
    fn request_plugged(&mut self, mib: u64) -> Result<(), String> {
        match self {
            Control::Api(api) => {
                let body = format!(r#"{{"requested_size_mib":{mib}}}"#);
                api_call(api, "PATCH", "/hotplug/memory", Some(&body)).map(drop)
            }
            Control::Qmp(qmp) => qmp.set(QEMU_DEVICE, "requested-size", json!(mib << 20)),
        }
    }

    /// What the device has plugged, in MiB.
    fn plugged_mib(&mut self) -> Result<u64, String> {
        let value = match self {
            Control::Api(api) => {
                api_call(api, "GET", "/hotplug/memory", None)?["plugged_size_mib"].as_u64()
            }
            Control::Qmp(qmp) => qmp.get(QEMU_DEVICE, "size")?.as_u64().map(|b| b >> 20),
        };
        value.ok_or_else(|| "no plugged size".into())
    }

    /// Our VMM's guest memory counters (GET /memory's `guest`; none through QMP).
    fn guest_memory(&self) -> Option<Value> {
        match self {
            Control::Api(api) => api_call(api, "GET", "/memory", None)
                .ok()
                .map(|memory| memory["guest"].clone()),
            Control::Qmp(_) => None,
        }
    }

    fn api(&self) -> &ApiClient {
        match self {
            Control::Api(api) => api,
            Control::Qmp(_) => unreachable!("Options::parse refuses --balloon with --qmp"),
        }
    }
}

/// One run: plug 1 GiB, unplug it; with `--balloon` plug it again, inflate the balloon by
/// 1 GiB and deflate it.
pub fn measure(command: &[String], options: &Options) -> Result<Measured, String> {
    let vmm = Vmm::start(command)?;
    let booted = vmm.wait_memtotal(|_| true)?.1;
    let mut control = Control::connect(&options.control)?;
    let mut times = Vec::new();

    let faults = |memory: &Value| memory["faults"].as_u64();
    let before = control.guest_memory();
    let asked = Instant::now();
    control.request_plugged(GIB_MIB)?;
    let plugged = poll(|| Ok(control.plugged_mib()? >= GIB_MIB), "plug")?;
    let (grown, _) = vmm.wait_memtotal(|kib| kib >= booted + GIB_KIB)?;
    times.push(("hotplug plug-device", plugged - asked));
    times.push(("hotplug plug", grown - asked));
    // Ours: the faults of the guest's boot RAM while it adds the memory (its struct pages),
    // and since the VMM started, how much of a fault's time its handler thread spends.
    if let (Some(before), Some(after)) = (before, control.guest_memory()) {
        if let (Some(before), Some(after)) = (faults(&before), faults(&after)) {
            println!("hotplug faults: {} while plugging", after - before);
        }
        println!("fault latency: {}", after["fault_latency"]);
    }

    let asked = Instant::now();
    control.request_plugged(0)?;
    let unplugged = poll(|| Ok(control.plugged_mib()? == 0), "unplug")?;
    let (shrunk, _) = vmm.wait_memtotal(|kib| kib <= booted)?;
    times.push(("hotplug unplug", unplugged - asked));
    times.push(("hotplug unplug-memtotal", shrunk - asked));

    if options.balloon {
        control.request_plugged(GIB_MIB)?;
        vmm.wait_memtotal(|kib| kib >= booted + GIB_KIB)?;
        times.extend(balloon::cycle(control.api(), &vmm, booted + GIB_KIB)?);
    }
    Ok(times)
}
