//! What MMDS answers a guest's HTTP request (Firecracker's MMDS semantics): `GET` of a path
//! in the document, as JSON (`Accept: application/json`) or in IMDS's text form; with V2, a
//! session token from `PUT /latest/api/token` (`X-metadata-token-ttl-seconds`) is required in
//! `X-metadata-token`. A request is at most [`MAX_REQUEST_BYTES`]; every answer closes the
//! connection.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::store::{Store, MAX_TOKEN_TTL};
use super::Version;

/// Longest request MMDS reads.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// Whether `bytes` hold a whole request head (a request has no body MMDS reads).
pub fn complete(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"\r\n\r\n") || bytes.windows(2).any(|w| w == b"\n\n")
}

fn response(code: u16, reason: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn error(code: u16, reason: &str, message: &str) -> Vec<u8> {
    response(code, reason, "text/plain", message)
}

/// The IMDS text form of `value`: an object's keys a line each (an object's with `/`), a
/// string as it is; `None` for the other types.
fn imds_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(map) => Some(
            map.iter()
                .map(|(key, value)| {
                    if value.is_object() {
                        format!("{key}/")
                    } else {
                        key.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// The answer to the request `bytes` (whole, see [`complete`]).
pub fn answer(
    bytes: &[u8],
    store: &mut Store,
    version: Version,
    imds_compat: bool,
    now: Instant,
) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return error(400, "Bad Request", "The request is not text.");
    };
    let mut lines = text.lines();
    let mut request_line = lines.next().unwrap_or_default().split_whitespace();
    let (Some(method), Some(target), Some(_)) = (
        request_line.next(),
        request_line.next(),
        request_line.next(),
    ) else {
        return error(400, "Bad Request", "Malformed request line.");
    };
    let header = |name: &str| {
        text.lines()
            .skip(1)
            .take_while(|line| !line.is_empty())
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_owned())
            })
    };
    let path = target.split('?').next().unwrap_or_default();
    match method {
        "PUT" if path.trim_end_matches('/') == "/latest/api/token" => {
            if header("X-Forwarded-For").is_some() {
                return error(
                    400,
                    "Bad Request",
                    "MMDS token requests may not carry X-Forwarded-For.",
                );
            }
            let ttl = header("X-metadata-token-ttl-seconds")
                .and_then(|ttl| ttl.parse::<u64>().ok())
                .map(Duration::from_secs)
                .filter(|ttl| !ttl.is_zero() && *ttl <= MAX_TOKEN_TTL);
            match ttl {
                Some(ttl) => response(200, "OK", "text/plain", &store.new_token(ttl, now)),
                None => error(
                    400,
                    "Bad Request",
                    "Token time to live value not found or out of range (1 to 21600 s).",
                ),
            }
        }
        "GET" => {
            let token = header("X-metadata-token");
            if version == Version::V2 && !token.is_some_and(|t| store.token_valid(&t, now)) {
                return error(401, "Unauthorized", "No MMDS token provided, or it is invalid or expired. Use PUT /latest/api/token.");
            }
            let Some(value) = store.lookup(path) else {
                return error(404, "Not Found", "Resource not found.");
            };
            let json = header("Accept").is_some_and(|a| a.contains("application/json"));
            if json && !imds_compat {
                return response(200, "OK", "application/json", &value.to_string());
            }
            match imds_text(value) {
                Some(text) => response(200, "OK", "text/plain", &text),
                None => error(
                    400,
                    "Bad Request",
                    "Cannot retrieve value. The value has an unsupported type.",
                ),
            }
        }
        _ => error(405, "Method Not Allowed", "MMDS takes GET and PUT."),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn store() -> Store {
        let mut store = Store::default();
        store
            .put(
                json!({"latest": {"meta-data": {"ami-id": "ami-12345678", "n": 3,
                        "network": {"mac": "06:00"}}}}),
            )
            .unwrap();
        store
    }

    fn text(answer: &[u8]) -> String {
        String::from_utf8(answer.to_vec()).unwrap()
    }

    #[test]
    fn v1_answers_gets_in_imds_form_or_json() {
        let mut store = store();
        let now = Instant::now();
        let get = |store: &mut Store, request: &str| {
            text(&answer(request.as_bytes(), store, Version::V1, false, now))
        };
        let ami = get(&mut store, "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\n");
        assert!(ami.starts_with("HTTP/1.1 200 OK"), "{ami}");
        assert!(ami.ends_with("\r\n\r\nami-12345678"), "{ami}");
        let listing = get(&mut store, "GET /latest/meta-data/ HTTP/1.0\r\n\r\n");
        assert!(listing.ends_with("ami-id\nn\nnetwork/"), "{listing}");
        let json = get(
            &mut store,
            "GET /latest/meta-data/network HTTP/1.1\r\nAccept: application/json\r\n\r\n",
        );
        assert!(json.ends_with(r#"{"mac":"06:00"}"#), "{json}");
        assert!(get(&mut store, "GET /latest/meta-data/n HTTP/1.1\r\n\r\n").contains(" 400 "));
        assert!(get(&mut store, "GET /nothing HTTP/1.1\r\n\r\n").contains(" 404 "));
        assert!(get(&mut store, "POST / HTTP/1.1\r\n\r\n").contains(" 405 "));
        assert!(get(&mut store, "garbage\r\n\r\n").contains(" 400 "));
        assert!(
            text(&answer(&[0xff, 0xfe], &mut store, Version::V1, false, now)).contains(" 400 ")
        );
    }

    #[test]
    fn v2_wants_a_live_token_for_every_get() {
        let mut store = store();
        let now = Instant::now();
        let get = "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\n";
        assert!(
            text(&answer(get.as_bytes(), &mut store, Version::V2, false, now)).contains(" 401 ")
        );
        let put = "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n";
        let issued = text(&answer(put.as_bytes(), &mut store, Version::V2, false, now));
        let token = issued.rsplit("\r\n\r\n").next().unwrap().to_owned();
        assert_eq!(token.len(), 64, "{issued}");
        let with =
            format!("GET /latest/meta-data/ami-id HTTP/1.1\r\nx-metadata-token: {token}\r\n\r\n");
        let got = text(&answer(
            with.as_bytes(),
            &mut store,
            Version::V2,
            false,
            now,
        ));
        assert!(got.ends_with("ami-12345678"), "{got}");
        let later = now + Duration::from_secs(61);
        assert!(text(&answer(
            with.as_bytes(),
            &mut store,
            Version::V2,
            false,
            later
        ))
        .contains(" 401 "));
        for bad in [
            "PUT /latest/api/token HTTP/1.1\r\n\r\n",
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 0\r\n\r\n",
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 21601\r\n\r\n",
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 5\r\nX-Forwarded-For: a\r\n\r\n",
        ] {
            assert!(text(&answer(bad.as_bytes(), &mut store, Version::V2, false, now)).contains(" 400 "), "{bad}");
        }
        // imds_compat: IMDS's text form even when JSON is asked for.
        let json = format!(
            "GET /latest/meta-data/network HTTP/1.1\r\nX-metadata-token: {token}\r\nAccept: application/json\r\n\r\n"
        );
        assert!(
            text(&answer(json.as_bytes(), &mut store, Version::V2, true, now))
                .ends_with("\r\n\r\nmac")
        );
    }

    #[test]
    fn a_request_is_complete_at_its_empty_line() {
        assert!(!complete(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        assert!(complete(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(complete(b"GET / HTTP/1.0\n\n"));
    }
}
