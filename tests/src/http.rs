//! A deliberately small HTTP/1.1 client over a plain TcpStream for the HTTP API's
//! end-to-end tests: it sends exactly the bytes a test wants (hostile headers, bodies
//! cut short, a connection dropped midway) and reads answers, chunked or not, and
//! server-sent events. Loopback only.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    /// The server-sent events of the body: (event name, data) per event; comment lines
    /// (keep-alives) come back as ("comment", text).
    pub fn events(&self) -> Vec<(String, String)> {
        sse_events(&self.text())
    }
}

pub fn sse_events(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = String::from("message");
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(c) = line.strip_prefix(':') {
                out.push(("comment".to_string(), c.trim().to_string()));
            } else if let Some(v) = line.strip_prefix("event:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            }
        }
        if !data.is_empty() {
            out.push((name, data.join("\n")));
        }
    }
    out
}

/// The raw request bytes: `Host` and `Content-Length` added unless given in `headers`.
pub fn request_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\n");
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if !has("host") {
        r.push_str(&format!("host: {addr}\r\n"));
    }
    if !has("content-length") {
        r.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    if !has("content-type") && !body.is_empty() {
        r.push_str("content-type: application/json\r\n");
    }
    r.push_str("connection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(&request_bytes(addr, method, path, headers, body))
        .unwrap();
    read_response(&mut BufReader::new(s))
}

pub fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Response {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"")
}

/// Status line and headers.
pub fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// One chunk of a chunked body (None at the last, empty chunk).
pub fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data).ok()?;
    data.truncate(size);
    (size > 0).then_some(data)
}

pub fn read_response(r: &mut impl BufRead) -> Response {
    let (status, headers) = read_head(r);
    let body = read_body(r, &headers);
    Response {
        status,
        headers,
        body,
    }
}

/// The body that follows a head (chunked, sized, or up to the end of the connection).
pub fn read_body(r: &mut impl BufRead, headers: &[(String, String)]) -> Vec<u8> {
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(r) {
            body.extend(c);
        }
    } else if let Some((_, n)) = headers.iter().find(|(k, _)| k == "content-length") {
        body.resize(n.parse().expect("content-length"), 0);
        r.read_exact(&mut body).expect("body");
    } else {
        r.read_to_end(&mut body).expect("body");
    }
    body
}
