//! Host socket I/O straight from and into channel buffers: the only place the server
//! passes shared-memory pointers to the kernel.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use ferry_ring::{BufSpan, Buffers};
use ferry_sys::Received;

/// Sends `span[sent..]` on `fd` (non-blocking); returns the bytes the kernel took.
pub(crate) fn send_span(
    fd: BorrowedFd<'_>,
    bufs: &Buffers,
    span: BufSpan,
    sent: usize,
    to: Option<&SocketAddr>,
    flags: i32,
) -> io::Result<usize> {
    let len = (span.len() as usize).saturating_sub(sent);
    let ptr = bufs
        .as_mut_ptr(span)
        .wrapping_add(sent.min(span.len() as usize));
    // SAFETY: `Buffers::span` validated `span` against the region, which `bufs` keeps
    // mapped; `ptr..ptr+len` lies inside it (sent <= span.len()). The kernel only reads.
    unsafe { ferry_sys::send_raw(fd, ptr, len, to, flags) }
}

/// Receives into the given spans, in order (non-blocking).
pub(crate) fn recv_spans(
    fd: BorrowedFd<'_>,
    bufs: &Buffers,
    spans: &[BufSpan],
    flags: i32,
) -> io::Result<Received> {
    let iov: Vec<(*mut u8, usize)> = spans
        .iter()
        .map(|sp| (bufs.as_mut_ptr(*sp), sp.len() as usize))
        .collect();
    // SAFETY: every span was validated by `Buffers::span` and belongs to a buffer this
    // side allocated and has not lent out, inside the region `bufs` keeps mapped; the
    // kernel writes at most each span's length.
    unsafe { ferry_sys::recv_raw(fd, &iov, flags) }
}
