//! Reading one HTTP/1.x request from a stream, with bounded sizes and strict syntax.
//!
//! Accepted: a request line `METHOD SP /path SP HTTP/1.1` (or 1.0), header lines `Name: value`,
//! lines ending in CRLF (a bare LF is tolerated), and a body only with `Content-Length`.
//! `Transfer-Encoding`, header folding and oversized heads or bodies are refused.
//! `Expect: 100-continue` is answered before the body is read.

use std::io::{self, Read, Write};

/// Largest request line plus headers.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Largest body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

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
    #[error("body of {0} bytes exceeds {MAX_BODY_BYTES} bytes")]
    BodyTooLarge(u64),
    /// A PUT or PATCH came without Content-Length.
    #[error("Content-Length required")]
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
            RequestError::BodyTooLarge(_) => Some(413),
            RequestError::LengthRequired => Some(411),
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
struct Head {
    method: Method,
    target: String,
    content_length: Option<u64>,
    expect_continue: bool,
}

fn parse_head(head: &[u8]) -> Result<Head, RequestError> {
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
    match version {
        "HTTP/1.1" | "HTTP/1.0" => {}
        v if v.starts_with("HTTP/") => return Err(RequestError::Version(v.to_owned())),
        _ => return Err(malformed("bad HTTP version")),
    }
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
        }
    }
    Ok(Head {
        method: Method::parse(method),
        target: target.to_owned(),
        content_length,
        expect_continue,
    })
}

/// Reads one request from `stream`. Bytes after its body (pipelined requests) are ignored: the
/// server answers one request per connection.
pub fn read_request<S: Read + Write>(stream: &mut S) -> Result<Request, RequestError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let mut scanned = 0;
    let end = loop {
        if let Some(end) = head_end(&buf, scanned) {
            break end;
        }
        // A terminator may straddle the next read: rescan the last 3 bytes.
        scanned = buf.len().saturating_sub(3);
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(RequestError::HeadTooLarge);
        }
        let want = chunk.len().min(MAX_HEAD_BYTES + 4 - buf.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) if buf.is_empty() => return Err(RequestError::Closed),
            Ok(0) => return Err(malformed("the connection closed mid-request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_read_error(e)),
        }
    };
    if end > MAX_HEAD_BYTES {
        return Err(RequestError::HeadTooLarge);
    }
    let head = parse_head(&buf[..end])?;
    let length = match (head.content_length, &head.method) {
        (Some(length), _) => length,
        (None, Method::Put | Method::Patch) => return Err(RequestError::LengthRequired),
        (None, _) => 0,
    };
    let length = match usize::try_from(length) {
        Ok(length) if length <= MAX_BODY_BYTES => length,
        _ => return Err(RequestError::BodyTooLarge(length)),
    };
    let mut body = buf.split_off(end);
    if body.len() < length && head.expect_continue {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    if body.len() < length {
        let have = body.len();
        body.resize(length, 0);
        stream
            .read_exact(&mut body[have..])
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    malformed("the body is shorter than Content-Length")
                }
                _ => map_read_error(e),
            })?;
    }
    body.truncate(length);
    Ok(Request {
        method: head.method,
        target: head.target,
        body,
    })
}

#[cfg(test)]
mod tests;
