//! The VMM's event loop on its own thread (event-manager): stop signals, guest memory fault
//! errors, device queue notifications and console input.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::session::{Session, MEMORY_WAIT_CHECK};
use super::signals::{SignalFd, StopSignals};
use super::StopCause;
use crate::seccomp::ThreadKind;

pub(super) use vmm_devices::event_loop::Subscriber;

/// Stops the VM on SIGINT or SIGTERM.
struct StopSignalSubscriber {
    signals: Arc<SignalFd>,
    session: Arc<Session>,
}

impl MutEventSubscriber for StopSignalSubscriber {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(self.signals.as_ref(), EventSet::IN)) {
            log::error!("cannot watch SIGINT and SIGTERM: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        while let Some(signal) = self.signals.take() {
            log::info!("signal {signal}: stopping the VM");
            self.session.request_stop(StopCause::Signal(signal));
        }
    }
}

/// Reports guest memory faults that cannot be served and stops the VM.
struct GuestFaultSubscriber {
    session: Arc<Session>,
}

impl MutEventSubscriber for GuestFaultSubscriber {
    fn init(&mut self, ops: &mut EventOps) {
        let event = self.session.memory().fault_event();
        if let Err(e) = ops.add(Events::new(event, EventSet::IN)) {
            log::error!("cannot watch guest memory faults: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        // The count does not matter: every vCPU's error is looked at.
        let _ = self.session.memory().fault_event().read();
        self.session.guest_fault_reported();
    }
}

/// Arms `timer` to expire every `period` and watches it.
fn watch_timer(timer: &mut TimerFd, period: Duration, ops: &mut EventOps) -> io::Result<()> {
    timer.reset(period, Some(period)).map_err(io::Error::from)?;
    ops.add(Events::new(timer, EventSet::IN))
        .map_err(|e| io::Error::other(e.to_string()))
}

/// Looks at the waits for memory every [`MEMORY_WAIT_CHECK`] (`--wait-for-memory`).
struct MemoryWaitSubscriber {
    timer: TimerFd,
    session: Arc<Session>,
}

impl MutEventSubscriber for MemoryWaitSubscriber {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = watch_timer(&mut self.timer, MEMORY_WAIT_CHECK, ops) {
            log::error!("cannot watch how long the guest waits for memory: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        // Expirations only need reading; how many passed does not matter.
        let _ = self.timer.wait();
        self.session.watch_memory_waits();
    }
}

/// How often the legacy devices' interrupts are looked at (see [`LegacyInterruptWatch`]).
const LEGACY_INTERRUPT_CHECK: Duration = Duration::from_millis(250);

/// Raises the serial port's and the i8042's interrupt again where one is pending and the guest
/// has not come for it for a whole [`LEGACY_INTERRUPT_CHECK`]: their edge-triggered interrupts,
/// once lost, would stall the guest's console or keyboard for good.
struct LegacyInterruptWatch {
    timer: TimerFd,
    session: Arc<Session>,
    serial_seen: u64,
    keyboard_seen: u64,
}

impl MutEventSubscriber for LegacyInterruptWatch {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = watch_timer(&mut self.timer, LEGACY_INTERRUPT_CHECK, ops) {
            log::error!("cannot watch the serial port's and keyboard's interrupts: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.timer.wait();
        if let Some(serial) = self.session.serial() {
            self.serial_seen = serial.raise_stalled_interrupt(self.serial_seen);
        }
        if let Some(keyboard) = self.session.keyboard() {
            self.keyboard_seen = keyboard.raise_stalled_interrupt(self.keyboard_seen);
        }
    }
}

/// How long the guest's start waits for the event loop to stack its seccomp filter.
const CONFINE_TIMEOUT: Duration = Duration::from_secs(5);

/// Stacks the event loop's own seccomp filter (`devices`) on its thread when the guest's start
/// asks, once the process is locked down and before the guest may run (see
/// [`request_confinement`]), and says when it has.
struct ConfineSubscriber {
    request: Arc<EventFd>,
    entered: SyncSender<()>,
}

impl MutEventSubscriber for ConfineSubscriber {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(self.request.as_ref(), EventSet::IN)) {
            log::error!("cannot watch the event loop's seccomp request: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.request.read();
        if let Err(e) = crate::seccomp::enter(ThreadKind::Devices) {
            log::error!("event loop: {e}");
        }
        let _ = self.entered.try_send(());
    }
}

/// Wakes the event loop through `request` to stack its filter and waits until it has, at most
/// [`CONFINE_TIMEOUT`].
fn request_confinement(request: &EventFd, entered: &Receiver<()>) {
    if let Err(e) = request.write(1) {
        log::error!("cannot wake the event loop to stack its seccomp filter: {e}");
        return;
    }
    if entered.recv_timeout(CONFINE_TIMEOUT).is_err() {
        log::warn!(
            "the event loop did not stack its seccomp filter within {CONFINE_TIMEOUT:?}: it \
             runs under the process filter"
        );
    }
}

/// Ends the loop when its event is signalled.
struct QuitSubscriber {
    event: Arc<EventFd>,
    quit: Arc<AtomicBool>,
}

impl MutEventSubscriber for QuitSubscriber {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(self.event.as_ref(), EventSet::IN)) {
            log::error!("cannot watch the event loop's quit event: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        self.quit.store(true, Ordering::Release);
    }
}

/// The event loop, being set up.
pub(super) struct EventLoop {
    manager: EventManager<Subscriber>,
    quit_event: Arc<EventFd>,
    quit: Arc<AtomicBool>,
}

impl EventLoop {
    /// A loop that handles `signals` and the fault errors of `session`'s memory.
    pub fn new(session: &Arc<Session>, signals: &StopSignals) -> io::Result<Self> {
        let mut manager: EventManager<Subscriber> =
            EventManager::new().map_err(|e| io::Error::other(e.to_string()))?;
        let quit_event = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let quit = Arc::new(AtomicBool::new(false));
        manager.add_subscriber(Box::new(QuitSubscriber {
            event: quit_event.clone(),
            quit: quit.clone(),
        }));
        manager.add_subscriber(Box::new(StopSignalSubscriber {
            signals: signals.fd().clone(),
            session: session.clone(),
        }));
        manager.add_subscriber(Box::new(GuestFaultSubscriber {
            session: session.clone(),
        }));
        manager.add_subscriber(Box::new(LegacyInterruptWatch {
            timer: TimerFd::new()?,
            session: session.clone(),
            serial_seen: u64::MAX,
            keyboard_seen: u64::MAX,
        }));
        let request = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let (entered, confined) = std::sync::mpsc::sync_channel(1);
        manager.add_subscriber(Box::new(ConfineSubscriber {
            request: request.clone(),
            entered,
        }));
        session.on_locked_down(Box::new(move || request_confinement(&request, &confined)));
        if session.config().wait_for_memory {
            manager.add_subscriber(Box::new(MemoryWaitSubscriber {
                timer: TimerFd::new()?,
                session: session.clone(),
            }));
        }
        Ok(EventLoop {
            manager,
            quit_event,
            quit,
        })
    }

    /// Adds a subscriber (a device's queues, console input).
    pub fn add(&mut self, subscriber: Subscriber) {
        self.manager.add_subscriber(subscriber);
    }

    /// Adds several subscribers.
    pub fn add_all(&mut self, subscribers: Vec<Subscriber>) {
        subscribers.into_iter().for_each(|s| self.add(s));
    }

    /// Runs the loop on its own thread until the returned handle is dropped.
    pub fn start(self) -> io::Result<EventThread> {
        let EventLoop {
            mut manager,
            quit_event,
            quit,
        } = self;
        let thread = std::thread::Builder::new()
            .name("vmm-events".into())
            .spawn(move || {
                // Where the process is locked down already (a VMM that waited for a snapshot
                // to load), the loop's filter is stacked now, beside the rest of the setup,
                // not on the guest's start (see `request_confinement`).
                if let Err(e) = crate::seccomp::enter(ThreadKind::Devices) {
                    log::error!("event loop: {e}");
                }
                while !quit.load(Ordering::Acquire) {
                    if let Err(e) = manager.run() {
                        log::error!("event loop: {e}");
                        return;
                    }
                }
            })?;
        Ok(EventThread {
            quit_event,
            thread: Some(thread),
        })
    }
}

/// The running event loop; dropping it ends and joins the thread.
pub(super) struct EventThread {
    quit_event: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for EventThread {
    fn drop(&mut self) {
        if let Err(e) = self.quit_event.write(1) {
            log::error!("cannot stop the event loop: {e}");
            return;
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the event loop thread panicked");
            }
        }
    }
}
