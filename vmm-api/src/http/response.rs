//! HTTP/1.1 responses with JSON bodies. Every response closes the connection.

use std::io::{self, Write};

use serde::Serialize;

use crate::model::Fault;

/// A response to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The JSON body, if any.
    pub body: Option<String>,
    /// The request used something Firecracker deprecates: the response says so with a
    /// `Deprecation: true` header, as Firecracker's does.
    pub deprecated: bool,
}

/// The reason phrase of the statuses the server sends.
fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

impl Response {
    /// 200 with `value` as JSON.
    pub fn json<T: Serialize>(value: &T) -> Self {
        match serde_json::to_string(value) {
            Ok(body) => Response {
                status: 200,
                body: Some(body),
                deprecated: false,
            },
            Err(e) => Response::fault(500, format!("cannot serialise the response: {e}")),
        }
    }

    /// 204 without a body.
    pub fn no_content() -> Self {
        Response {
            status: 204,
            body: None,
            deprecated: false,
        }
    }

    /// An error status with `{"fault_message": message}`.
    pub fn fault(status: u16, message: impl Into<String>) -> Self {
        let fault = Fault {
            fault_message: message.into(),
        };
        Response {
            status,
            // A struct with one string field always serialises.
            body: serde_json::to_string(&fault).ok(),
            deprecated: false,
        }
    }

    /// This response with Firecracker's `Deprecation: true` header.
    pub fn deprecated(self) -> Self {
        Response {
            deprecated: true,
            ..self
        }
    }

    /// Writes the response, saying `Connection: close` unless the connection is kept for the
    /// client's next request.
    pub fn write_to<W: Write>(&self, out: &mut W, keep_alive: bool) -> io::Result<()> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        let body = self.body.as_deref().unwrap_or_default();
        if self.body.is_some() {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        if self.deprecated {
            head.push_str("Deprecation: true\r\n");
        }
        if !keep_alive {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        out.write_all(body.as_bytes())?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(response: &Response) -> String {
        let mut out = Vec::new();
        response.write_to(&mut out, false).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_responses_carry_type_and_length() {
        let text = written(&Response::json(&serde_json::json!({"a": 1})));
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\
             Connection: close\r\n\r\n{\"a\":1}"
        );
    }

    #[test]
    fn a_kept_connection_is_not_said_to_close() {
        let mut out = Vec::new();
        Response::no_content().write_to(&mut out, true).unwrap();
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n");
    }

    #[test]
    fn no_content_has_an_empty_body() {
        assert_eq!(
            written(&Response::no_content()),
            "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn faults_are_json() {
        let text = written(&Response::fault(400, "Empty PUT request."));
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
        assert!(
            text.ends_with(r#"{"fault_message":"Empty PUT request."}"#),
            "{text}"
        );
        let quoted = Response::fault(400, "bad \"x\"\n");
        assert_eq!(
            quoted.body.as_deref(),
            Some(r#"{"fault_message":"bad \"x\"\n"}"#)
        );
    }
}
