//! Accepting the HTTP/2 `:authority` that gRPC C-core clients send over a Unix socket.
//!
//! gRPC C-core (Python grpcio, C++, Ruby, PHP, C#) sends the %-encoded socket path as the
//! `:authority` of every request on a `unix:` channel (`tmp%2Fc.sock`), and grpc-java sends
//! the path itself. hyper's HTTP/2 layer (h2) validates that pseudo-header as a URI authority
//! while decoding the HEADERS frame and resets the stream with PROTOCOL_ERROR before any
//! server code sees it, so those clients fail with INTERNAL unless they override the
//! authority. h2 has no option to relax this (hyperium/h2#487 is unmerged), and the
//! authority means nothing on a local socket.
//!
//! So each accepted connection's inbound bytes pass through a [`Rewriter`] before h2 reads
//! them: it follows the frames, decodes each header block with its own HPACK decoder
//! (mirroring the client's dynamic table), and when a block carries an `:authority` that is
//! not a valid authority, re-emits the block with that value replaced by one of the SAME
//! length in which every character outside `[A-Za-z0-9._~-]` became `_`. Everything else in
//! the block is copied byte for byte, so the dynamic table the client encoded against and
//! the one h2 builds stay entry for entry the same size, and later blocks that refer to the
//! entry (indexed) get the repaired value. Blocks without a bad authority, and every other
//! frame, are passed on unchanged. Anything the rewriter does not understand (a malformed
//! block, a block over 256 KiB, not HTTP/2) makes it step aside for the rest of the
//! connection, passing bytes through untouched: h2 then judges them exactly as before.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// A header block larger than this is not inspected (the connection is passed through).
const MAX_BLOCK: usize = 256 << 10;
/// Frames this module writes are at most the size every HTTP/2 peer must accept.
const OUT_FRAME: usize = 16384;
/// SETTINGS_HEADER_TABLE_SIZE of the server (h2's default, which tonic keeps).
const TABLE_SIZE: usize = 4096;

/// Whether `v` is acceptable to h2 as an `:authority`.
fn valid_authority(v: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(v).is_ok()
}

/// The same-length stand-in for an invalid authority.
fn repaired(v: &[u8]) -> Vec<u8> {
    v.iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                b
            } else {
                b'_'
            }
        })
        .collect()
}

#[derive(Debug)]
struct Malformed;

/// The HPACK decoder state h2 will have: the dynamic table's (name, value) entries.
struct Table {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Table {
    fn new() -> Table {
        Table {
            entries: VecDeque::new(),
            size: 0,
            max: TABLE_SIZE,
        }
    }

    fn name(&self, index: usize) -> Result<&[u8], Malformed> {
        match index {
            0 => Err(Malformed),
            1..=61 => Ok(STATIC_NAMES[index - 1].as_bytes()),
            _ => self
                .entries
                .get(index - 62)
                .map(|(n, _)| n.as_slice())
                .ok_or(Malformed),
        }
    }

    fn evict(&mut self) {
        while self.size > self.max {
            let Some((n, v)) = self.entries.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.size += size;
        self.entries.push_front((name, value));
        self.evict();
    }

    fn resize(&mut self, max: usize) {
        self.max = max;
        self.evict();
    }
}

/// Reads an HPACK integer with an `n`-bit prefix at `*i`.
fn read_int(b: &[u8], i: &mut usize, n: u32) -> Result<usize, Malformed> {
    let mask = (1usize << n) - 1;
    let first = *b.get(*i).ok_or(Malformed)? as usize & mask;
    *i += 1;
    if first < mask {
        return Ok(first);
    }
    let mut v = mask;
    let mut shift = 0;
    loop {
        let byte = *b.get(*i).ok_or(Malformed)?;
        *i += 1;
        if shift > 21 {
            return Err(Malformed);
        }
        v += ((byte & 0x7f) as usize) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
}

fn write_int(out: &mut Vec<u8>, mut v: usize, n: u32, first_bits: u8) {
    let mask = (1usize << n) - 1;
    if v < mask {
        out.push(first_bits | v as u8);
        return;
    }
    out.push(first_bits | mask as u8);
    v -= mask;
    while v >= 0x80 {
        out.push((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads an HPACK string literal at `*i`.
fn read_string(b: &[u8], i: &mut usize) -> Result<Vec<u8>, Malformed> {
    let huffman = *b.get(*i).ok_or(Malformed)? & 0x80 != 0;
    let len = read_int(b, i, 7)?;
    let end = i.checked_add(len).ok_or(Malformed)?;
    let raw = b.get(*i..end).ok_or(Malformed)?;
    *i = end;
    if huffman {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// The decoding tree of the HPACK Huffman code: children per node, leaves as `!symbol`.
fn huffman_tree() -> &'static [[i32; 2]] {
    static TREE: OnceLock<Vec<[i32; 2]>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut nodes: Vec<[i32; 2]> = vec![[0, 0]];
        for (sym, &(code, len)) in HUFFMAN_CODES.iter().enumerate() {
            let mut node = 0usize;
            for k in (0..len).rev() {
                let bit = ((code >> k) & 1) as usize;
                if k == 0 {
                    nodes[node][bit] = !(sym as i32);
                } else {
                    if nodes[node][bit] == 0 {
                        nodes.push([0, 0]);
                        nodes[node][bit] = (nodes.len() - 1) as i32;
                    }
                    node = nodes[node][bit] as usize;
                }
            }
        }
        nodes
    })
}

fn huffman_decode(raw: &[u8]) -> Result<Vec<u8>, Malformed> {
    let tree = huffman_tree();
    let mut out = Vec::with_capacity(raw.len() * 8 / 5);
    let (mut node, mut pending_bits) = (0usize, 0);
    for &byte in raw {
        for k in (0..8).rev() {
            let next = tree[node][((byte >> k) & 1) as usize];
            pending_bits += 1;
            if next < 0 {
                let sym = !next;
                if sym == 256 {
                    return Err(Malformed);
                }
                out.push(sym as u8);
                node = 0;
                pending_bits = 0;
            } else if next == 0 {
                return Err(Malformed);
            } else {
                node = next as usize;
            }
        }
    }
    // Padding: at most 7 bits (of the EOS prefix).
    if pending_bits > 7 {
        return Err(Malformed);
    }
    Ok(out)
}

/// Decodes one header block, updating `table` as h2 will, and returns the block rewritten
/// when it carries an invalid `:authority` (None when it passes as it is).
fn fix_block(table: &mut Table, block: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < block.len() {
        let b = block[i];
        if b & 0x80 != 0 {
            let index = read_int(block, &mut i, 7)?;
            table.name(index)?;
            continue;
        }
        if b & 0xe0 == 0x20 {
            let max = read_int(block, &mut i, 5)?;
            if max > TABLE_SIZE {
                return Err(Malformed);
            }
            table.resize(max);
            continue;
        }
        let indexed = b & 0xc0 == 0x40;
        let name_index = read_int(block, &mut i, if indexed { 6 } else { 4 })?;
        let name = if name_index == 0 {
            read_string(block, &mut i)?
        } else {
            table.name(name_index)?.to_vec()
        };
        let value_start = i;
        let value = read_string(block, &mut i)?;
        let mut value = value;
        if name == b":authority" && !value.is_empty() && !valid_authority(&value) {
            let fixed = repaired(&value);
            if valid_authority(&fixed) {
                let o = out.get_or_insert_with(|| Vec::with_capacity(block.len() + 64));
                o.extend_from_slice(&block[copied..value_start]);
                write_int(o, fixed.len(), 7, 0);
                o.extend_from_slice(&fixed);
                copied = i;
                tracing::debug!(
                    "a client sent :authority {:?}; passed on as {:?}",
                    String::from_utf8_lossy(&value),
                    String::from_utf8_lossy(&fixed)
                );
                value = fixed;
            }
        }
        if indexed {
            table.insert(name, value);
        }
    }
    Ok(out.map(|mut o| {
        o.extend_from_slice(&block[copied..]);
        o
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Preface,
    FrameHeader,
    /// Passing a frame's payload through: bytes left.
    Payload(usize),
    /// Stepped aside: every byte passes unchanged.
    Passthrough,
}

/// A header block being collected over HEADERS and CONTINUATION frames.
#[derive(Default)]
struct Block {
    active: bool,
    /// The frames as received, emitted unchanged when nothing is fixed.
    original: Vec<u8>,
    fragment: Vec<u8>,
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
}

/// Rewrites the client-to-server bytes of one HTTP/2 connection (see the module doc).
pub struct Rewriter {
    state: State,
    buf: Vec<u8>,
    table: Table,
    block: Block,
    /// Header blocks rewritten so far.
    pub rewritten: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter {
            state: State::Preface,
            buf: Vec::new(),
            table: Table::new(),
            block: Block::default(),
            rewritten: 0,
        }
    }
}

impl Rewriter {
    pub fn passing_through(&self) -> bool {
        self.state == State::Passthrough && self.buf.is_empty()
    }

    /// Takes bytes from the client; appends what the server should read to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.state == State::Passthrough {
            out.extend_from_slice(input);
            return;
        }
        if let State::Payload(left) = self.state {
            // The common case of a DATA payload arriving: no copy into `buf`.
            if self.buf.is_empty() {
                let n = left.min(input.len());
                out.extend_from_slice(&input[..n]);
                self.state = if n == left {
                    State::FrameHeader
                } else {
                    State::Payload(left - n)
                };
                if n == input.len() {
                    return;
                }
                return self.push(&input[n..], out);
            }
        }
        self.buf.extend_from_slice(input);
        let mut pos = 0;
        loop {
            let rest = &self.buf[pos..];
            match self.state {
                State::Passthrough => {
                    out.extend_from_slice(rest);
                    pos = self.buf.len();
                    break;
                }
                State::Preface => {
                    let n = rest.len().min(PREFACE.len());
                    if rest[..n] != PREFACE[..n] {
                        self.step_aside(out);
                        continue;
                    }
                    if n < PREFACE.len() {
                        break;
                    }
                    out.extend_from_slice(PREFACE);
                    pos += PREFACE.len();
                    self.state = State::FrameHeader;
                }
                State::FrameHeader => {
                    if rest.len() < 9 {
                        break;
                    }
                    let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
                    let (kind, flags) = (rest[3], rest[4]);
                    let stream =
                        u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
                    let header_frame = kind == FRAME_HEADERS || kind == FRAME_CONTINUATION;
                    if !header_frame {
                        if self.block.active {
                            // Only CONTINUATION may follow an unfinished block: h2's call.
                            self.step_aside(out);
                            continue;
                        }
                        out.extend_from_slice(&rest[..9]);
                        pos += 9;
                        self.state = if len == 0 {
                            State::FrameHeader
                        } else {
                            State::Payload(len)
                        };
                        continue;
                    }
                    if len > MAX_BLOCK || self.block.fragment.len() + len > MAX_BLOCK {
                        self.step_aside(out);
                        continue;
                    }
                    if rest.len() < 9 + len {
                        break;
                    }
                    let frame = rest[..9 + len].to_vec();
                    pos += 9 + len;
                    if self.header_frame(kind, flags, stream, &frame, out).is_err() {
                        self.step_aside(out);
                    }
                }
                State::Payload(left) => {
                    let n = left.min(rest.len());
                    out.extend_from_slice(&rest[..n]);
                    pos += n;
                    self.state = if n == left {
                        State::FrameHeader
                    } else {
                        State::Payload(left - n)
                    };
                    if n < left {
                        break;
                    }
                }
            }
        }
        self.buf.drain(..pos);
    }

    /// The client closed its side: whatever is held goes out unchanged.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.block.original);
        out.append(&mut self.buf);
        self.block = Block::default();
        self.state = State::Passthrough;
    }

    /// Steps aside: the held block goes out unchanged, then (through `push`'s Passthrough
    /// arm) the rest of `buf` and everything after it.
    fn step_aside(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.block.original);
        self.block = Block::default();
        self.state = State::Passthrough;
    }

    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Malformed> {
        let payload = &frame[9..];
        // Held first, so that stepping aside after any error emits this frame too.
        self.block.original.extend_from_slice(frame);
        if kind == FRAME_HEADERS {
            if self.block.active {
                return Err(Malformed);
            }
            let mut i = 0;
            let mut pad = 0;
            if flags & FLAG_PADDED != 0 {
                pad = *payload.first().ok_or(Malformed)? as usize;
                i = 1;
            }
            let mut priority = None;
            if flags & FLAG_PRIORITY != 0 {
                let p: [u8; 5] = payload
                    .get(i..i + 5)
                    .ok_or(Malformed)?
                    .try_into()
                    .expect("5");
                priority = Some(p);
                i += 5;
            }
            let end = payload.len().checked_sub(pad).ok_or(Malformed)?;
            let fragment = payload.get(i..end).ok_or(Malformed)?;
            self.block = Block {
                active: true,
                original: std::mem::take(&mut self.block.original),
                fragment: fragment.to_vec(),
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
            };
        } else {
            if !self.block.active || stream != self.block.stream {
                return Err(Malformed);
            }
            self.block.fragment.extend_from_slice(payload);
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        match fix_block(&mut self.table, &self.block.fragment)? {
            None => out.append(&mut self.block.original),
            Some(fixed) => {
                self.write_block(&fixed, out);
                self.rewritten += 1;
            }
        }
        self.block = Block::default();
        Ok(())
    }

    /// HEADERS (+ CONTINUATION) frames carrying `block`, without padding.
    fn write_block(&self, block: &[u8], out: &mut Vec<u8>) {
        let b = &self.block;
        let prio_len = if b.priority.is_some() { 5 } else { 0 };
        let mut rest = block;
        let mut first = true;
        loop {
            let room = OUT_FRAME - if first { prio_len } else { 0 };
            let n = rest.len().min(room);
            let last = n == rest.len();
            let mut flags = if last { FLAG_END_HEADERS } else { 0 };
            let kind = if first {
                if b.end_stream {
                    flags |= FLAG_END_STREAM;
                }
                if b.priority.is_some() {
                    flags |= FLAG_PRIORITY;
                }
                FRAME_HEADERS
            } else {
                FRAME_CONTINUATION
            };
            let len = n + if first { prio_len } else { 0 };
            out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
            out.push(kind);
            out.push(flags);
            out.extend_from_slice(&b.stream.to_be_bytes());
            if let (true, Some(p)) = (first, b.priority) {
                out.extend_from_slice(&p);
            }
            out.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            first = false;
            if last {
                break;
            }
        }
    }
}

/// A connection whose inbound bytes go through a [`Rewriter`].
pub struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    out: Vec<u8>,
    out_pos: usize,
    read_buf: Box<[u8]>,
    eof: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            out_pos: 0,
            read_buf: vec![0; 32 << 10].into_boxed_slice(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.out_pos < me.out.len() {
                let n = buf.remaining().min(me.out.len() - me.out_pos);
                buf.put_slice(&me.out[me.out_pos..me.out_pos + n]);
                me.out_pos += n;
                if me.out_pos == me.out.len() {
                    me.out.clear();
                    me.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if me.eof {
                return Poll::Ready(Ok(()));
            }
            if me.rewriter.passing_through() {
                return Pin::new(&mut me.inner).poll_read(cx, buf);
            }
            let mut rb = ReadBuf::new(&mut me.read_buf);
            match Pin::new(&mut me.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let filled = rb.filled().len();
            if filled == 0 {
                me.eof = true;
                me.rewriter.finish(&mut me.out);
            } else {
                me.rewriter.push(&me.read_buf[..filled], &mut me.out);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FixAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// RFC 7541 Appendix B: (code, bit length) of each symbol 0..=255 and EOS (256).
#[rustfmt::skip]
const HUFFMAN_CODES: [(u32, u8); 257] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28),
    (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28),
    (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10),
    (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6),
    (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7),
    (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5),
    (0x25, 6), (0x26, 6), (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6), (0x76, 7),
    (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14),
    (0x1ffd, 13), (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22), (0x7fffda, 23),
    (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23),
    (0x7fffe2, 23), (0x7fffe3, 23), (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22),
    (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22),
    (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23),
    (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21),
    (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), (0x3fffea, 22), (0x3fffeb, 22),
    (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27),
    (0x7ffffe9, 27), (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), (0x3fffffff, 30),
];

/// RFC 7541 Appendix A: the static table's names (index 1..=61).
#[rustfmt::skip]
const STATIC_NAMES: [&str; 61] = [
    ":authority", ":method", ":method", ":path", ":path", ":scheme",
    ":scheme", ":status", ":status", ":status", ":status", ":status",
    ":status", ":status", "accept-charset", "accept-encoding", "accept-language", "accept-ranges",
    "accept", "access-control-allow-origin", "age", "allow", "authorization", "cache-control",
    "content-disposition", "content-encoding", "content-language", "content-length", "content-location", "content-range",
    "content-type", "cookie", "date", "etag", "expect", "expires",
    "from", "host", "if-match", "if-modified-since", "if-none-match", "if-range",
    "if-unmodified-since", "last-modified", "link", "location", "max-forwards", "proxy-authenticate",
    "proxy-authorization", "range", "referer", "refresh", "retry-after", "server",
    "set-cookie", "strict-transport-security", "transfer-encoding", "user-agent", "vary", "via",
    "www-authenticate",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A full decoder over the same table, for checking what h2 will see.
    fn decode(table: &mut Table, block: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut i = 0;
        let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        while i < block.len() {
            let b = block[i];
            if b & 0x80 != 0 {
                let index = read_int(block, &mut i, 7).unwrap();
                let (n, v) = if index <= 61 {
                    (
                        STATIC_NAMES[index - 1].as_bytes().to_vec(),
                        static_value(index),
                    )
                } else {
                    table.entries[index - 62].clone()
                };
                out.push((s(&n), s(&v)));
            } else if b & 0xe0 == 0x20 {
                let m = read_int(block, &mut i, 5).unwrap();
                table.resize(m);
            } else {
                let indexed = b & 0xc0 == 0x40;
                let ni = read_int(block, &mut i, if indexed { 6 } else { 4 }).unwrap();
                let name = if ni == 0 {
                    read_string(block, &mut i).unwrap()
                } else {
                    table.name(ni).unwrap().to_vec()
                };
                let value = read_string(block, &mut i).unwrap();
                out.push((s(&name), s(&value)));
                if indexed {
                    table.insert(name, value);
                }
            }
        }
        out
    }

    fn static_value(index: usize) -> Vec<u8> {
        match index {
            2 => b"GET".to_vec(),
            3 => b"POST".to_vec(),
            4 => b"/".to_vec(),
            5 => b"/index.html".to_vec(),
            6 => b"http".to_vec(),
            7 => b"https".to_vec(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn rfc7541_request_examples_with_huffman_pass_unchanged() {
        // RFC 7541 C.4.1-C.4.3, and the dynamic table's size after each.
        let mut t = Table::new();
        for (block, size) in [
            ("828684418cf1e3c2e5f23a6ba0ab90f4ff", 57),
            ("828684be5886a8eb10649cbf", 110),
            ("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf", 164),
        ] {
            assert_eq!(fix_block(&mut t, &hex(block)).unwrap(), None);
            assert_eq!(t.size, size);
        }
        let mut t = Table::new();
        let h = decode(&mut t, &hex("828684418cf1e3c2e5f23a6ba0ab90f4ff"));
        assert_eq!(h[3], (":authority".into(), "www.example.com".into()));
    }

    // Two requests from one encoder (Python's hpack, as grpcio's C-core does it: the
    // authority literal with incremental indexing, Huffman-coded; then all indexed).
    const GRPCIO_1: &str = "838644936087a0d1d865fb857bc7a0d1d866372469b51f418c4d35aa2c3e5516122e8393af5f8b1d75d0620d263d4c4d65644082497f864d833505b11f7aa49acac8b57e9339ea602bbcdae1526b2b22c461b0ae05c0a7f541aab7cfda849d29ac5fdf";
    const GRPCIO_2: &str = "8386c2c1c0bfbe";

    #[test]
    fn a_socket_path_authority_is_repaired_in_place_and_in_the_table() {
        let mut ours = Table::new();
        let fixed = fix_block(&mut ours, &hex(GRPCIO_1))
            .unwrap()
            .expect("rewritten");
        // What h2 decodes from the rewritten block.
        let mut h2 = Table::new();
        let h = decode(&mut h2, &fixed);
        assert!(
            h.contains(&(":authority".into(), "tmp_2Fx_2Fc.sock".into())),
            "{h:?}"
        );
        assert!(h.contains(&(":path".into(), "/colibri.v1.Colibri/Status".into())));
        assert!(h.contains(&("te".into(), "trailers".into())));
        assert_eq!(h.len(), 7);
        assert!(valid_authority(b"tmp_2Fx_2Fc.sock"));
        assert_eq!(ours.size, h2.size);
        // The second request refers to the table: unchanged, and h2 sees the repaired value.
        assert_eq!(fix_block(&mut ours, &hex(GRPCIO_2)).unwrap(), None);
        let h = decode(&mut h2, &hex(GRPCIO_2));
        assert!(
            h.contains(&(":authority".into(), "tmp_2Fx_2Fc.sock".into())),
            "{h:?}"
        );
        assert!(h.contains(&(":path".into(), "/colibri.v1.Colibri/Status".into())));
    }

    /// grpc-java and grpcurl send the path itself (raw, never indexed here).
    #[test]
    fn a_raw_path_authority_is_repaired_too() {
        let path = b"/run/user/1000/colibri/colibrid.sock";
        let mut block = vec![0x83, 0x86, 0x11, path.len() as u8];
        block.extend_from_slice(path);
        let mut t = Table::new();
        let fixed = fix_block(&mut t, &block).unwrap().expect("rewritten");
        let h = decode(&mut Table::new(), &fixed);
        assert_eq!(
            h[2],
            (
                ":authority".into(),
                "_run_user_1000_colibri_colibrid.sock".into()
            )
        );
        assert_eq!(t.size, 0);
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A client's bytes: preface, SETTINGS, a padded HEADERS + CONTINUATION with the bad
    /// authority, a DATA frame, then a second HEADERS referring to the table.
    fn client_bytes() -> Vec<u8> {
        let b1 = hex(GRPCIO_1);
        let mut first = vec![3u8]; // pad length
        first.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        first.extend_from_slice(&b1[..20]);
        first.extend_from_slice(&[0, 0, 0]);
        let mut v = PREFACE.to_vec();
        v.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
        v.extend(frame(FRAME_HEADERS, FLAG_PADDED | FLAG_PRIORITY, 1, &first));
        v.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &b1[20..]));
        v.extend(frame(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 2, 8, 1]));
        v.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 3, &hex(GRPCIO_2)));
        v
    }

    fn rewrite(chunks: &[&[u8]]) -> (Vec<u8>, Rewriter) {
        let mut r = Rewriter::default();
        let mut out = Vec::new();
        for c in chunks {
            r.push(c, &mut out);
        }
        r.finish(&mut out);
        (out, r)
    }

    /// Parses frames back: (type, flags, stream, payload).
    fn frames(mut b: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert!(b.starts_with(PREFACE));
        b = &b[PREFACE.len()..];
        let mut out = Vec::new();
        while !b.is_empty() {
            let len = u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize;
            out.push((
                b[3],
                b[4],
                u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
                b[9..9 + len].to_vec(),
            ));
            b = &b[9 + len..];
        }
        out
    }

    #[test]
    fn frames_are_rewritten_whatever_the_read_sizes() {
        let input = client_bytes();
        let (whole, r) = rewrite(&[&input]);
        assert_eq!(r.rewritten, 1);
        // Byte by byte and in odd chunks: the same output.
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(rewrite(&bytes).0, whole);
        let odd: Vec<&[u8]> = input.chunks(7).collect();
        assert_eq!(rewrite(&odd).0, whole);

        let f = frames(&whole);
        assert_eq!(f.len(), 4);
        // SETTINGS unchanged; HEADERS now unpadded, in one frame, priority and stream kept.
        assert_eq!(f[0].0, 0x4);
        assert_eq!(
            (f[1].0, f[1].1, f[1].2),
            (FRAME_HEADERS, FLAG_PRIORITY | FLAG_END_HEADERS, 1)
        );
        assert_eq!(&f[1].3[..5], &[0, 0, 0, 0, 16]);
        let mut t = Table::new();
        let h = decode(&mut t, &f[1].3[5..]);
        assert!(h.contains(&(":authority".into(), "tmp_2Fx_2Fc.sock".into())));
        assert_eq!(f[2], (0x0, FLAG_END_STREAM, 1, vec![0, 0, 0, 0, 2, 8, 1]));
        assert_eq!(f[3], (FRAME_HEADERS, FLAG_END_HEADERS, 3, hex(GRPCIO_2)));
    }

    #[test]
    fn valid_authorities_and_other_bytes_pass_untouched() {
        let mut v = PREFACE.to_vec();
        v.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &hex("828684418cf1e3c2e5f23a6ba0ab90f4ff"),
        ));
        v.extend(frame(0x0, 0, 1, &[1; 40_000]));
        let (out, r) = rewrite(&[&v]);
        assert_eq!(out, v);
        assert_eq!(r.rewritten, 0);
        // Not HTTP/2 at all.
        let junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(rewrite(&[&junk]).0, junk);
    }

    /// Deterministic mutations of a valid stream: never a panic, and whatever is not
    /// rewritten passes through byte for byte (run by CI; fuzz/ has the open-ended version).
    #[test]
    fn mutated_streams_never_panic_and_lose_no_bytes() {
        let base = client_bytes();
        let mut rng = 0x853c_49e6_748f_ea9bu64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        for _ in 0..3000 {
            let mut v = base.clone();
            for _ in 0..1 + next(4) {
                let i = PREFACE.len() + next(v.len() - PREFACE.len());
                match next(3) {
                    0 => v[i] = next(256) as u8,
                    1 => {
                        v.remove(i);
                    }
                    _ => v.insert(i, next(256) as u8),
                }
            }
            let cut = next(v.len());
            let (out, r) = rewrite(&[&v[..cut], &v[cut..]]);
            if r.rewritten == 0 {
                assert_eq!(out, v);
            }
        }
    }
}
