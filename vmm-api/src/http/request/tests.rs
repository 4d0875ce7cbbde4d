use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// Sends `bytes` from a real peer socket, closes its write side, and parses.
fn parse(bytes: &[u8]) -> Result<Request, RequestError> {
    let (mut server, mut client) = UnixStream::pair().unwrap();
    client.write_all(bytes).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    read_request(&mut server)
}

fn malformed_reason(bytes: &[u8]) -> String {
    match parse(bytes) {
        Err(RequestError::Malformed(why)) => why,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
    }
}

#[test]
fn parses_a_get_and_a_put_with_body() {
    let get = parse(b"GET /machine HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n").unwrap();
    assert_eq!(
        get,
        Request {
            method: Method::Get,
            target: "/machine".into(),
            body: Vec::new(),
            keep_alive: true,
        }
    );
    let put = parse(
        b"PUT /actions HTTP/1.1\r\ncontent-length: 28\r\n\r\n{\"action_type\":\"Shutdown\"}\r\n",
    )
    .unwrap();
    assert_eq!(put.method, Method::Put);
    assert_eq!(put.body, b"{\"action_type\":\"Shutdown\"}\r\n");
}

#[test]
fn tolerates_bare_line_feeds_and_ignores_bytes_after_the_body() {
    let request =
        parse(b"PATCH /vm HTTP/1.0\nContent-Length: 2\n\n{}GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(
        (request.method, request.body),
        (Method::Patch, b"{}".to_vec())
    );
    assert!(!request.keep_alive, "bytes followed: the connection closes");
    let other = parse(b"DELETE /vm HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(other.method, Method::Other("DELETE".into()));
    assert_eq!(other.method.as_str(), "DELETE");
}

#[test]
fn http_1_1_keeps_the_connection_unless_the_client_closes_it() {
    for (head, keep_alive) in [
        ("GET / HTTP/1.1\r\n\r\n", true),
        ("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", false),
        (
            "GET / HTTP/1.1\r\nconnection: Keep-Alive, Close\r\n\r\n",
            false,
        ),
        ("GET / HTTP/1.0\r\n\r\n", false),
        ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true),
    ] {
        let request = parse(head.as_bytes()).unwrap();
        assert_eq!(request.keep_alive, keep_alive, "{head:?}");
    }
}

#[test]
fn reads_heads_and_bodies_that_arrive_in_pieces() {
    let (mut server, mut client) = UnixStream::pair().unwrap();
    let writer = std::thread::spawn(move || {
        let pieces: [&[u8]; 5] = [
            b"PUT /bal",
            b"loon HTTP/1.1\r",
            b"\nContent-Length: 17\r\n\r",
            b"\n{\"amount_",
            b"mib\":64}",
        ];
        for piece in pieces {
            client.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let request = read_request(&mut server).unwrap();
    writer.join().unwrap();
    assert_eq!(request.target, "/balloon");
    assert_eq!(request.body, b"{\"amount_mib\":64}");
}

#[test]
fn an_empty_connection_is_closed_not_malformed() {
    assert!(matches!(parse(b""), Err(RequestError::Closed)));
    assert_eq!(
        malformed_reason(b"GET / HTTP/1.1\r\nHost: x\r\n"),
        "the connection closed mid-request"
    );
}

#[test]
fn rejects_malformed_request_lines() {
    for line in [
        &b"GET /machine\r\n\r\n"[..],
        b"GET  /machine HTTP/1.1\r\n\r\n",
        b"GET /a b HTTP/1.1\r\n\r\n",
        b"\r\n\r\n",
    ] {
        assert_eq!(
            malformed_reason(line),
            "the request line is not 'METHOD /path HTTP/1.1'"
        );
    }
    assert_eq!(malformed_reason(b"G(T / HTTP/1.1\r\n\r\n"), "bad method");
    for target in [
        &b"GET machine HTTP/1.1\r\n\r\n"[..],
        b"GET /\x01 HTTP/1.1\r\n\r\n",
        b"GET * HTTP/1.1\r\n\r\n",
    ] {
        assert!(malformed_reason(target).starts_with("the request target"));
    }
    assert_eq!(
        malformed_reason(b"GET / FTP/1.0\r\n\r\n"),
        "bad HTTP version"
    );
    assert!(matches!(
        parse(b"GET / HTTP/2.0\r\n\r\n"),
        Err(RequestError::Version(v)) if v == "HTTP/2.0"
    ));
    assert_eq!(
        malformed_reason(b"GET /\xff HTTP/1.1\r\n\r\n"),
        "the head is not ASCII"
    );
}

#[test]
fn rejects_malformed_headers() {
    let cases: [(&[u8], &str); 9] = [
        (
            b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "a header line has no ':'",
        ),
        (
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "bad header name \"Bad Name\"",
        ),
        (b"GET / HTTP/1.1\r\n: x\r\n\r\n", "bad header name \"\""),
        (
            b"GET / HTTP/1.1\r\nA: b\r\n  folded\r\n\r\n",
            "folded header lines are not supported",
        ),
        (
            b"PUT / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
            "Content-Length is not a number",
        ),
        (
            b"PUT / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "Content-Length is not a number",
        ),
        (
            b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            "conflicting Content-Length headers",
        ),
        (
            b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "Transfer-Encoding is not supported; send Content-Length",
        ),
        (
            b"PUT / HTTP/1.1\r\nExpect: magic\r\nContent-Length: 0\r\n\r\n",
            "unsupported Expect: magic",
        ),
    ];
    for (bytes, why) in cases {
        assert_eq!(malformed_reason(bytes), why);
    }
    // Equal duplicates are harmless.
    let ok = parse(b"PUT / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n{}").unwrap();
    assert_eq!(ok.body, b"{}");
}

#[test]
fn bounds_head_and_body_sizes() {
    let mut huge_head = b"GET / HTTP/1.1\r\nX-Filler: ".to_vec();
    huge_head.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES));
    huge_head.extend_from_slice(b"\r\n\r\n");
    let err = parse(&huge_head).unwrap_err();
    assert!(matches!(err, RequestError::HeadTooLarge));
    assert_eq!(err.status(), Some(431));
    let err = parse(b"PUT / HTTP/1.1\r\nContent-Length: 65537\r\n\r\n").unwrap_err();
    assert!(matches!(err, RequestError::BodyTooLarge(65537, _)));
    assert_eq!(err.status(), Some(413));
    let err =
        parse(b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert_eq!(
        malformed_reason(b"PUT / HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}"),
        "the body is shorter than Content-Length"
    );
}

#[test]
fn put_and_patch_need_a_content_length() {
    for bytes in [
        &b"PUT /actions HTTP/1.1\r\n\r\n"[..],
        b"PATCH /vm HTTP/1.1\r\n\r\n",
    ] {
        let err = parse(bytes).unwrap_err();
        assert!(matches!(err, RequestError::LengthRequired));
        assert_eq!(err.status(), Some(400));
    }
    // Free page hinting's PATCHes take no body.
    let stop = parse(b"PATCH /balloon/hinting/stop HTTP/1.1\r\n\r\n").unwrap();
    assert!(stop.body.is_empty());
}

#[test]
fn answers_expect_100_continue_before_the_body() {
    let (mut server, mut client) = UnixStream::pair().unwrap();
    let peer = std::thread::spawn(move || {
        client
            .write_all(b"PATCH /vm HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
            .unwrap();
        let mut interim = [0u8; 25];
        client.read_exact(&mut interim).unwrap();
        client.write_all(b"{}").unwrap();
        interim
    });
    let request = read_request(&mut server).unwrap();
    assert_eq!(request.body, b"{}");
    assert_eq!(&peer.join().unwrap(), b"HTTP/1.1 100 Continue\r\n\r\n");
}

#[test]
fn a_silent_peer_times_out() {
    let (mut server, mut client) = UnixStream::pair().unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let err = read_request(&mut server).unwrap_err();
    assert!(matches!(err, RequestError::Timeout), "{err:?}");
    assert_eq!(err.status(), Some(408));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes give a request or an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse(&bytes);
    }

    /// Requests built from arbitrary header values and bodies parse back exactly.
    #[test]
    fn well_formed_requests_round_trip(
        path in "/[a-z/]{0,30}",
        value in "[ -~]{0,40}",
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = format!(
            "PATCH {path} HTTP/1.1\r\nX-Value: {value}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        bytes.extend_from_slice(&body);
        let request = parse(&bytes).unwrap();
        prop_assert_eq!(request.target, path);
        prop_assert_eq!(request.body, body);
    }
}

#[test]
fn a_reader_fed_one_byte_at_a_time_completes_at_the_last_byte() {
    let bytes = b"PUT /vm HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}";
    let mut reader = RequestReader::default();
    assert!(reader.is_empty());
    let mut continues = 0;
    for (i, byte) in bytes.iter().enumerate() {
        match reader.feed(std::slice::from_ref(byte)).unwrap() {
            ParseProgress::NeedMore => assert!(i + 1 < bytes.len()),
            ParseProgress::SendContinue => continues += 1,
            ParseProgress::Complete(request) => {
                assert_eq!(i + 1, bytes.len());
                assert_eq!(request.method, Method::Put);
                assert_eq!(request.body, b"{}");
            }
        }
    }
    assert_eq!(continues, 1, "100 Continue once, before the body");
    let mut closed = RequestReader::default();
    closed.feed(b"GET / HTTP/1.1\r\n").unwrap();
    assert!(matches!(closed.feed(b""), Err(RequestError::Malformed(_))));
}
