//! Captured output of a call, capped.

use std::collections::VecDeque;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Captured output: everything up to `cap` bytes, else the first and last `cap / 2` bytes and
/// how much was left out in between.
pub(super) struct Capture {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: usize,
}

impl Capture {
    pub(super) fn new(cap: usize) -> Self {
        Capture { cap, head: Vec::new(), tail: VecDeque::new(), total: 0 }
    }

    pub(super) async fn read_from(&mut self, mut pipe: impl AsyncRead + Unpin) -> io::Result<()> {
        let mut buf = [0u8; 8192];
        loop {
            let n = pipe.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            self.push(&buf[..n]);
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        let head_room = (self.cap / 2).saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(head_room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        bytes = rest;
        self.tail.extend(bytes);
        let keep = self.cap - self.cap / 2;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }

    pub(super) fn into_string(self) -> String {
        let omitted = self.total - self.head.len() - self.tail.len();
        let mut bytes = self.head;
        if omitted > 0 {
            bytes.extend_from_slice(format!("\n[... {omitted} bytes omitted ...]\n").as_bytes());
        }
        bytes.extend(self.tail);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
