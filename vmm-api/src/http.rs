//! The small HTTP/1.1 subset the control API speaks: one request per connection, bodies only
//! with Content-Length, JSON responses. Hand-written (about 300 lines) rather than a crate: the
//! API needs only this subset, and every limit and refusal is explicit here.

mod request;
mod response;

pub use request::is_token;
pub use request::{
    max_body_bytes, read_request, set_max_body_bytes, Method, ParseProgress, Request, RequestError,
    RequestReader, CONTINUE, MAX_BODY_BYTES, MAX_HEAD_BYTES,
};
pub use response::Response;
