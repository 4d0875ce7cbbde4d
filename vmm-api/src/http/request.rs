//! Reading one HTTP/1.x request from a stream, with bounded sizes and strict syntax.
//!
//! Accepted: a request line `METHOD SP /path SP HTTP/1.1` (or 1.0), header lines `Name: value`,
//! lines ending in CRLF (a bare LF is tolerated), and a body only with `Content-Length`.
//! `Transfer-Encoding`, header folding and oversized heads or bodies are refused.
//! `Expect: 100-continue` is answered before the body is read.

use std::io::{self, Read, Write};

/// Largest request line plus headers.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Largest body, unless the process sets another limit ([`set_max_body_bytes`]).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The process's limit on a request's body (Firecracker's `--http-api-max-payload-size`).
static MAX_BODY: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(MAX_BODY_BYTES);

/// Sets the largest body a request may have, for every API server of the process.
pub fn set_max_body_bytes(bytes: usize) {
    MAX_BODY.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The largest body a request may have.
pub fn max_body_bytes() -> usize {
    MAX_BODY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where a PATCH may come without Content-Length (as curl sends `-X PATCH` without `-d`).
pub const NO_BODY_PATCHES: &str = "/balloon/hinting/";

/// Errors of reading a request. Each but [`RequestError::Closed`] and [`RequestError::Io`] is
/// answered with its status.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The peer closed the connection before sending anything.
    #[error("connection closed")]
    Closed,
    /// Reading or writing the stream failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer was too slow.
    #[error("timed out waiting for the request")]
    Timeout,
    /// The request is not well-formed HTTP/1.x.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The request line and headers are too long.
    #[error("request line and headers exceed {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The body is too long.
    #[error("body of {0} bytes exceeds {1} bytes")]
    BodyTooLarge(u64, usize),
    /// A PUT or PATCH came without Content-Length (answered 400, as Firecracker answers an
    /// empty body), except a PATCH under `/balloon/hinting/`.
    #[error("the request has no body (PUT and PATCH need one, with Content-Length)")]
    LengthRequired,
    /// Not HTTP/1.0 or HTTP/1.1.
    #[error("HTTP version {0} not supported (use HTTP/1.1)")]
    Version(String),
}

impl RequestError {
    /// The status to answer with, if any.
    pub fn status(&self) -> Option<u16> {
        match self {
            RequestError::Closed | RequestError::Io(_) => None,
            RequestError::Timeout => Some(408),
            RequestError::Malformed(_) => Some(400),
            RequestError::HeadTooLarge => Some(431),
            RequestError::BodyTooLarge(..) => Some(413),
            RequestError::LengthRequired => Some(400),
            RequestError::Version(_) => Some(505),
        }
    }
}

/// A request method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
    /// Any other method (answered with Firecracker's 400 "Invalid request method and/or
    /// path").
    Other(String),
}

impl Method {
    fn parse(token: &str) -> Self {
        match token {
            "GET" => Method::Get,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_owned()),
        }
    }

    /// The method's name.
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Other(name) => name,
        }
    }
}

/// A parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The request target as sent (starts with '/').
    pub target: String,
    /// The body (empty without Content-Length).
    pub body: Vec<u8>,
    /// Whether the client keeps the connection for its next request: HTTP/1.1 unless it sends
    /// `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`, and never when more
    /// bytes followed the request (requests are not pipelined).
    pub keep_alive: bool,
}

fn malformed(why: impl Into<String>) -> RequestError {
    RequestError::Malformed(why.into())
}

/// Whether `text` is an RFC 9110 token (method and header names).
pub fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn map_read_error(error: io::Error) -> RequestError {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => RequestError::Timeout,
        _ => RequestError::Io(error),
    }
}

/// Position just past the blank line ending the head, searching `buf` from `from` on.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find_map(|i| {
        let rest = &buf[i..];
        if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else if rest.starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else {
            None
        }
    })
}

/// What the head says about the body.
#[derive(Debug)]
struct RequestHead {
    method: Method,
    target: String,
    content_length: Option<u64>,
    expect_continue: bool,
    keep_alive: bool,
}

fn parse_head(head: &[u8]) -> Result<RequestHead, RequestError> {
    let text = std::str::from_utf8(head).map_err(|_| malformed("the head is not ASCII"))?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(malformed("the request line is not 'METHOD /path HTTP/1.1'"));
    };
    if !is_token(method) {
        return Err(malformed("bad method"));
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(malformed(
            "the request target must be a path starting with '/'",
        ));
    }
    let mut keep_alive = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        v if v.starts_with("HTTP/") => return Err(RequestError::Version(v.to_owned())),
        _ => return Err(malformed("bad HTTP version")),
    };
    let mut content_length = None;
    let mut expect_continue = false;
    for line in lines.take_while(|l| !l.is_empty()) {
        if line.starts_with([' ', '\t']) {
            return Err(malformed("folded header lines are not supported"));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| malformed("a header line has no ':'"))?;
        if !is_token(name) {
            return Err(malformed(format!("bad header name {name:?}")));
        }
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("content-length") {
            let length = value
                .parse::<u64>()
                .ok()
                .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| malformed("Content-Length is not a number"))?;
            if content_length.is_some_and(|l| l != length) {
                return Err(malformed("conflicting Content-Length headers"));
            }
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(malformed(
                "Transfer-Encoding is not supported; send Content-Length",
            ));
        } else if name.eq_ignore_ascii_case("expect") {
            if !value.eq_ignore_ascii_case("100-continue") {
                return Err(malformed(format!("unsupported Expect: {value}")));
            }
            expect_continue = true;
        } else if name.eq_ignore_ascii_case("connection") {
            // A list of options; "close" wins over "keep-alive".
            let options = || value.split(',').map(|o| o.trim_matches([' ', '\t']));
            if options().any(|o| o.eq_ignore_ascii_case("close")) {
                keep_alive = false;
            } else if options().any(|o| o.eq_ignore_ascii_case("keep-alive")) {
                keep_alive = true;
            }
        }
    }
    Ok(RequestHead {
        method: Method::parse(method),
        target: target.to_owned(),
        content_length,
        expect_continue,
        keep_alive,
    })
}

/// What [`RequestReader::feed`] found.
#[derive(Debug)]
pub enum ParseProgress {
    /// The request is not complete yet.
    NeedMore,
    /// The head asks for `100 Continue` before the body: send it, then feed the body.
    SendContinue,
    /// The whole request.
    Complete(Request),
}

/// A request read piece by piece, as its bytes arrive (an event-driven server feeds it what a
/// non-blocking read gave). It holds no buffer until bytes come.
#[derive(Debug, Default)]
pub struct RequestReader {
    buf: Vec<u8>,
    /// How far the search for the head's end got.
    scanned: usize,
    /// The parsed head and the body's length, once the head is complete.
    head: Option<(RequestHead, usize)>,
    continue_sent: bool,
}

impl RequestReader {
    /// Whether no byte came yet.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes `bytes`, the next ones of the request; an empty slice means the peer closed the
    /// connection. Bytes after the body (a pipelined request) are dropped, and the request
    /// then does not keep the connection: it is answered, and the connection closed.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<ParseProgress, RequestError> {
        if bytes.is_empty() {
            return Err(if self.buf.is_empty() {
                RequestError::Closed
            } else if self.head.is_some() {
                malformed("the body is shorter than Content-Length")
            } else {
                malformed("the connection closed mid-request")
            });
        }
        self.buf.extend_from_slice(bytes);
        if self.head.is_none() {
            let Some(end) = head_end(&self.buf, self.scanned) else {
                // A terminator may straddle the next piece: rescan the last 3 bytes.
                self.scanned = self.buf.len().saturating_sub(3);
                if self.buf.len() >= MAX_HEAD_BYTES + 4 {
                    return Err(RequestError::HeadTooLarge);
                }
                return Ok(ParseProgress::NeedMore);
            };
            if end > MAX_HEAD_BYTES {
                return Err(RequestError::HeadTooLarge);
            }
            let head = parse_head(&self.buf[..end])?;
            let length = match (head.content_length, &head.method) {
                (Some(length), _) => length,
                // Firecracker's free page hinting start and stop are PATCHes without a body.
                (None, Method::Patch) if head.target.starts_with(NO_BODY_PATCHES) => 0,
                (None, Method::Put | Method::Patch) => return Err(RequestError::LengthRequired),
                (None, _) => 0,
            };
            let length = match usize::try_from(length) {
                Ok(length) if length <= max_body_bytes() => length,
                _ => return Err(RequestError::BodyTooLarge(length, max_body_bytes())),
            };
            self.buf.drain(..end);
            self.head = Some((head, length));
        }
        let (head, length) = self.head.as_ref().expect("parsed above");
        if self.buf.len() < *length {
            if head.expect_continue && !self.continue_sent {
                self.continue_sent = true;
                return Ok(ParseProgress::SendContinue);
            }
            return Ok(ParseProgress::NeedMore);
        }
        let (head, length) = self.head.take().expect("parsed above");
        let mut body = std::mem::take(&mut self.buf);
        let pipelined = body.len() > length;
        body.truncate(length);
        *self = RequestReader::default();
        Ok(ParseProgress::Complete(Request {
            method: head.method,
            target: head.target,
            body,
            keep_alive: head.keep_alive && !pipelined,
        }))
    }
}

/// The interim response to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Reads one request from `stream`, blocking (see [`RequestReader`]).
pub fn read_request<S: Read + Write>(stream: &mut S) -> Result<Request, RequestError> {
    let mut reader = RequestReader::default();
    let mut chunk = [0u8; 1024];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(map_read_error(e)),
        };
        match reader.feed(&chunk[..n])? {
            ParseProgress::NeedMore => {}
            ParseProgress::SendContinue => stream.write_all(CONTINUE)?,
            ParseProgress::Complete(request) => return Ok(request),
        }
    }
}

#[cfg(test)]
mod tests;
