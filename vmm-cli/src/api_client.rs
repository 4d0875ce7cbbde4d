//! A client for the control API: one request per connection over the Unix socket.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vmm_api::http::is_token;
use vmm_api::model::Fault;

/// Largest response the client accepts.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// How long the client waits for the VMM by default (a pause waits for every vCPU).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of sending a request or reading its response.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The method, path or body cannot be sent.
    #[error("{0}")]
    InvalidRequest(String),
    /// Nothing listens on the socket path (no file there, or a socket left by a VMM that
    /// has exited).
    #[error(
        "no VMM is listening on {} ({source}): start one with `vmm run --api-socket {}`",
        .path.display(),
        .path.display()
    )]
    NotListening {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The socket cannot be reached.
    #[error("cannot connect to the API socket {}: {source}", .path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Sending or receiving failed.
    #[error("API connection failed: {0}")]
    Io(#[from] io::Error),
    /// The response is not HTTP/1.x or too large.
    #[error("malformed API response: {0}")]
    BadResponse(String),
}

/// A response: status and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiResponse {
    /// The HTTP status code.
    pub status: u16,
    /// The body (JSON, or empty).
    pub body: String,
}

impl ApiResponse {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The `fault_message` of an error body, if it has one.
    pub fn fault_message(&self) -> Option<String> {
        serde_json::from_str::<Fault>(&self.body)
            .ok()
            .map(|f| f.fault_message)
    }
}

/// A client of one API socket.
#[derive(Clone, Debug)]
pub struct ApiClient {
    socket: PathBuf,
    timeout: Duration,
}

impl ApiClient {
    /// A client of the socket at `socket`, waiting at most `DEFAULT_TIMEOUT` (30 s).
    pub fn new(socket: impl AsRef<Path>) -> Self {
        ApiClient {
            socket: socket.as_ref().to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same client with another timeout for each read and write.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        ApiClient { timeout, ..self }
    }

    /// Sends `method path` with an optional JSON `body` and returns the response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<ApiResponse, ClientError> {
        if !is_token(method) {
            return Err(ClientError::InvalidRequest(format!(
                "bad HTTP method {method:?}"
            )));
        }
        if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientError::InvalidRequest(format!(
                "bad resource path {path:?}: it must start with '/' and have no spaces"
            )));
        }
        if let Some(body) = body {
            serde_json::from_str::<serde_json::Value>(body).map_err(|e| {
                ClientError::InvalidRequest(format!("the body is not valid JSON: {e}"))
            })?;
        }
        let mut stream = UnixStream::connect(&self.socket).map_err(|source| {
            let path = self.socket.clone();
            match source.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                    ClientError::NotListening { path, source }
                }
                _ => ClientError::Connect { path, source },
            }
        })?;
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n");
        if let Some(body) = body {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("Connection: close\r\n\r\n");
        request.push_str(body.unwrap_or_default());
        stream.write_all(request.as_bytes())?;
        parse_response(&read_response(&mut stream)?)
    }
}

/// Reads one response: up to the end of the body its Content-Length gives (a server may keep
/// the connection open despite `Connection: close`, as Firecracker's does), or without one
/// until the server closes; bounded by [`MAX_RESPONSE_BYTES`]. A reset after data counts as the
/// end: the response was complete.
fn read_response(stream: &mut UnixStream) -> Result<Vec<u8>, ClientError> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(data),
            Ok(n) => {
                data.extend_from_slice(&chunk[..n]);
                if response_length(&data).is_some_and(|length| data.len() >= length) {
                    return Ok(data);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !data.is_empty() => {
                return Ok(data)
            }
            Err(e) => return Err(e.into()),
        }
        if data.len() > MAX_RESPONSE_BYTES {
            return Err(ClientError::BadResponse(format!(
                "larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
    }
}

/// The length of the response that `data` starts with, headers and body, once its headers are
/// complete and give a Content-Length, or its status has no body (204, 304).
fn response_length(data: &[u8]) -> Option<usize> {
    let end = data.windows(4).position(|window| window == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&data[..end]).ok()?;
    let status = head.split(' ').nth(1).unwrap_or_default();
    if status == "204" || status == "304" {
        return Some(end);
    }
    let length = content_length(head.split("\r\n"))?.ok()?;
    end.checked_add(length)
}

/// The Content-Length among the header lines `lines`, if any, parsed.
fn content_length<'a>(
    mut lines: impl Iterator<Item = &'a str>,
) -> Option<Result<usize, std::num::ParseIntError>> {
    lines
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then_some(value)
        })
        .map(|value| value.trim().parse::<usize>())
}

/// Parses a whole HTTP/1.x response.
fn parse_response(data: &[u8]) -> Result<ApiResponse, ClientError> {
    let bad = |why: &str| ClientError::BadResponse(why.to_owned());
    let text = std::str::from_utf8(data).map_err(|_| bad("not UTF-8"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(bad("no status line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    let status = code
        .parse::<u16>()
        .ok()
        .filter(|s| (100..600).contains(s))
        .ok_or_else(|| bad("bad status code"))?;
    let length = content_length(lines)
        .transpose()
        .map_err(|_| bad("bad Content-Length"))?;
    let body = match length {
        Some(length) => body
            .get(..length)
            .ok_or_else(|| bad("the body is shorter than Content-Length"))?,
        None => body,
    };
    Ok(ApiResponse {
        status,
        body: body.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_responses_with_and_without_bodies() {
        let ok = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!(
            (ok.status, ok.body.as_str(), ok.is_success()),
            (200, "{}", true)
        );
        let empty =
            parse_response(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n").unwrap();
        assert_eq!((empty.status, empty.body.as_str()), (204, ""));
        let fault = parse_response(
            b"HTTP/1.1 400 Bad Request\r\n\r\n{\"fault_message\":\"balloon not configured\"}",
        )
        .unwrap();
        assert!(!fault.is_success());
        assert_eq!(
            fault.fault_message().as_deref(),
            Some("balloon not configured")
        );
    }

    #[test]
    fn a_response_ends_at_its_content_length_on_a_connection_left_open() {
        let dir = std::env::temp_dir().join(format!("api-client-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("api.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).unwrap();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .unwrap();
            // Kept open until the client is done, as Firecracker's server does.
            let _ = stream.read(&mut request);
        });
        let started = std::time::Instant::now();
        let response = ApiClient::new(&socket).request("GET", "/", None).unwrap();
        assert_eq!((response.status, response.body.as_str()), (200, "{}"));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        server.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            response_length(b"HTTP/1.1 204 No Content\r\n\r\n"),
            Some(27)
        );
        assert_eq!(response_length(b"HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(response_length(b"HTTP/1.1 200 OK\r\nContent-Len"), None);
        assert_eq!(
            response_length(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n"),
            Some(45)
        );
    }

    #[test]
    fn rejects_malformed_responses() {
        for (bytes, why) in [
            (&b"garbage"[..], "no end of headers"),
            (b"\r\n\r\n", "no status line"),
            (b"SPDY/3 200 OK\r\n\r\n", "not HTTP/1.x"),
            (b"HTTP/1.1 abc OK\r\n\r\n", "bad status code"),
            (b"HTTP/1.1 999 What\r\n\r\n", "bad status code"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                "bad Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}",
                "the body is shorter than Content-Length",
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n\xff", "not UTF-8"),
        ] {
            match parse_response(bytes) {
                Err(ClientError::BadResponse(got)) => assert_eq!(got, why),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn refuses_to_send_malformed_requests() {
        let client = ApiClient::new("/nonexistent/api.sock");
        for (method, path, body) in [
            ("GE T", "/", None),
            ("", "/", None),
            ("GET", "machine", None),
            ("GET", "/a b", None),
            ("GET", "/a\r\nX: y", None),
            ("PUT", "/balloon", Some("{amount_mib: 1}")),
        ] {
            let err = client.request(method, path, body).unwrap_err();
            assert!(matches!(err, ClientError::InvalidRequest(_)), "{err}");
        }
        let err = client.request("GET", "/", None).unwrap_err();
        assert!(matches!(err, ClientError::NotListening { .. }), "{err}");
        assert!(err
            .to_string()
            .starts_with("no VMM is listening on /nonexistent/api.sock"));
    }
}
