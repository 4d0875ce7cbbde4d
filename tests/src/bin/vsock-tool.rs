//! Both ends of the vsock tests and benchmarks: in the Linux guest over AF_VSOCK, and on the
//! host over Firecracker's Unix socket (`CONNECT <port>`) or, for QEMU's vhost-vsock, over
//! AF_VSOCK to the guest's CID.
//!
//! ```text
//! vsock-tool serve PORT CONNECTIONS          (guest) answer CONNECTIONS connections on PORT:
//!                                            a first line "echo" echoes every byte until
//!                                            EOF; "sink" reads to EOF and answers
//!                                            "len=N crc=HEX"
//! vsock-tool send PORT MIB                   (guest) send MIB MiB to the host's PORT, then
//!                                            read its answer; print "len=N crc=HEX reply=..."
//! vsock-tool rtt (--uds PATH|--cid CID) PORT COUNT
//!                                            (host) COUNT one-byte round trips through "echo"
//! vsock-tool push (--uds PATH|--cid CID) PORT MIB
//!                                            (host) MIB MiB into "sink", timed
//! ```
//!
//! The bytes sent are the same pseudo-random sequence everywhere, so each side can check the
//! other's CRC.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// The host's CID.
const HOST_CID: u32 = 2;
/// Any CID, for a listener.
const ANY_CID: u32 = u32::MAX;

use e2e_tests::vsock_pattern as pattern;

/// An AF_VSOCK address.
fn vsock_address(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all zeroes is valid.
    let mut address: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    address.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    address.svm_cid = cid;
    address.svm_port = port;
    address
}

/// A new AF_VSOCK stream socket.
fn vsock_socket() -> OwnedFd {
    // SAFETY: a plain socket(2) call; checked below.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(
        fd >= 0,
        "socket(AF_VSOCK): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

const ADDRESS_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

/// A connection to `cid`:`port` over AF_VSOCK, as a stream.
fn vsock_connect(cid: u32, port: u32) -> UnixStream {
    use std::os::fd::AsRawFd;
    let socket = vsock_socket();
    let address = vsock_address(cid, port);
    // SAFETY: a valid sockaddr_vm of ADDRESS_LEN bytes that outlives the call.
    let done = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            std::ptr::from_ref(&address).cast(),
            ADDRESS_LEN,
        )
    };
    assert_eq!(
        done,
        0,
        "connect to {cid}:{port}: {}",
        std::io::Error::last_os_error()
    );
    // A stream socket reads and writes as a Unix stream does.
    UnixStream::from(socket)
}

/// A host-side connection to the guest's `port`: Firecracker's handshake on the Unix socket
/// `uds`, or AF_VSOCK to `cid`.
fn host_connect(target: &Target, port: u32) -> UnixStream {
    match target {
        Target::Uds(path) => {
            let mut stream = UnixStream::connect(path).expect("connect to the vsock socket");
            writeln!(stream, "CONNECT {port}").unwrap();
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            reader.read_line(&mut line).unwrap();
            assert!(line.starts_with("OK "), "the handshake answered {line:?}");
            stream
        }
        Target::Cid(cid) => vsock_connect(*cid, port),
    }
}

enum Target {
    Uds(String),
    Cid(u32),
}

fn target(args: &mut std::slice::Iter<'_, String>) -> Target {
    match (args.next().map(String::as_str), args.next()) {
        (Some("--uds"), Some(path)) => Target::Uds(path.clone()),
        (Some("--cid"), Some(cid)) => Target::Cid(cid.parse().expect("a CID")),
        _ => usage(),
    }
}

fn number<T: std::str::FromStr>(arg: Option<&String>) -> T {
    arg.and_then(|a| a.parse().ok()).unwrap_or_else(|| usage())
}

fn usage() -> ! {
    eprintln!("usage: see the source's first lines");
    std::process::exit(2)
}

/// Reads `stream` to its end; its length and CRC.
fn drain(stream: &mut impl Read) -> std::io::Result<(u64, u32)> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut len = 0u64;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok((len, hasher.finalize())),
            Ok(n) => {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes `mib` MiB of the pattern to `stream`; their CRC.
fn fill(stream: &mut impl Write, mib: u64) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0u64;
    while at < mib << 20 {
        pattern(at, &mut buf);
        stream.write_all(&buf).expect("write");
        hasher.update(&buf);
        at += buf.len() as u64;
    }
    hasher.finalize()
}

/// The guest's side: answers `connections` connections on `port`.
fn serve(port: u32, connections: u32) {
    use std::os::fd::AsRawFd;
    let socket = vsock_socket();
    let address = vsock_address(ANY_CID, port);
    // SAFETY: a valid sockaddr_vm of ADDRESS_LEN bytes; then listen on the bound socket.
    unsafe {
        assert_eq!(
            libc::bind(
                socket.as_raw_fd(),
                std::ptr::from_ref(&address).cast(),
                ADDRESS_LEN
            ),
            0,
            "bind: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::listen(socket.as_raw_fd(), 8), 0);
    }
    println!("vsock-tool: listening on {port}");
    for _ in 0..connections {
        // SAFETY: accept on a listening socket; no address wanted.
        let fd = unsafe {
            libc::accept(
                socket.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert!(fd >= 0, "accept: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // A connection that fails (a transport reset after a restore) ends alone.
        if let Err(e) = answer(stream) {
            eprintln!("vsock-tool: a connection ended: {e}");
        }
    }
}

/// Answers one connection: "echo" or "sink".
fn answer(stream: UnixStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut mode = String::new();
    reader.read_line(&mut mode)?;
    let mut stream = stream;
    match mode.trim() {
        "echo" => {
            let mut buf = [0u8; 4096];
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                stream.write_all(&buf[..n])?;
            }
        }
        "sink" => {
            let (len, crc) = drain(&mut reader)?;
            writeln!(stream, "len={len} crc={crc:08x}")
        }
        other => Err(std::io::Error::other(format!("unknown mode {other:?}"))),
    }
}

/// The guest's side: `mib` MiB to the host's `port`, then its answer.
fn send(port: u32, mib: u64) {
    let mut stream = vsock_connect(HOST_CID, port);
    let crc = fill(&mut stream, mib);
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    println!(
        "LLFREE-L2 vsock-sent len={} crc={crc:08x} reply={}",
        mib << 20,
        reply.trim().replace(' ', ",")
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut args = args.iter();
    match args.next().map(String::as_str) {
        Some("serve") => serve(number(args.next()), number(args.next())),
        Some("send") => send(number(args.next()), number(args.next())),
        Some("rtt") => {
            let target = target(&mut args);
            let (port, count): (u32, u32) = (number(args.next()), number(args.next()));
            let mut stream = host_connect(&target, port);
            stream.write_all(b"echo\n").unwrap();
            let mut byte = [0u8; 1];
            let started = Instant::now();
            for _ in 0..count {
                stream.write_all(b"x").unwrap();
                stream.read_exact(&mut byte).unwrap();
            }
            let per = started.elapsed() / count.max(1);
            println!("rtt count={count} us={:.1}", per.as_secs_f64() * 1e6);
        }
        Some("push") => {
            let target = target(&mut args);
            let (port, mib): (u32, u64) = (number(args.next()), number(args.next()));
            let mut stream = host_connect(&target, port);
            stream.write_all(b"sink\n").unwrap();
            let started = Instant::now();
            let crc = fill(&mut stream, mib);
            stream.shutdown(std::net::Shutdown::Write).unwrap();
            let mut reply = String::new();
            stream.read_to_string(&mut reply).unwrap();
            let seconds = started.elapsed().as_secs_f64();
            let expected = format!("len={} crc={crc:08x}", mib << 20);
            assert_eq!(reply.trim(), expected, "the guest got other bytes");
            println!(
                "push mib={mib} seconds={seconds:.2} mib_per_s={:.1}",
                mib as f64 / seconds
            );
        }
        _ => usage(),
    }
}
