//! Host socket I/O straight from and into channel buffers: the only place the server
//! passes shared-memory pointers to the kernel (reached only through the seam's
//! `SysIo`). Owns: turning validated spans into iovecs. Must not: take a span that
//! `Buffers::span` has not checked, or decide anything.

use std::io;
use std::os::fd::BorrowedFd;

use ferry_ring::{BufSpan, Buffers};
use ferry_sys::Received;

use crate::sock::TxItem;

/// Most buffers one vectored send takes.
pub(crate) const MAX_IOV: usize = 64;
/// Most bytes one vectored send takes: past this, one call keeps every buffer of a bulk
/// sender in flight at once and stalls its pipeline (measured: 256 KiB writes ran at
/// 0.44x native with no byte cap).
const MAX_BATCH_BYTES: usize = 128 * 1024;

/// Sends the unsent parts of several queued items in one `sendmsg` (the destination and
/// flags of the first apply, but `MSG_OOB` only from the last); returns the bytes the
/// kernel took.
pub(crate) fn send_items<'a>(
    fd: BorrowedFd<'_>,
    items: impl Iterator<Item = &'a TxItem>,
) -> io::Result<usize> {
    let mut iov: [(*const u8, usize); MAX_IOV] = [(std::ptr::null(), 0); MAX_IOV];
    let mut n = 0;
    let mut first: Option<&TxItem> = None;
    let mut oob = 0;
    let mut bytes = 0;
    for item in items.take(MAX_IOV) {
        // Urgent data marks the last byte sent: only when it is the last item here.
        oob = item.flags & libc::MSG_OOB;
        let len = item.span.len() as usize;
        let sent = item.sent.min(len);
        iov[n] = (
            item.bufs
                .as_mut_ptr(item.span)
                .wrapping_add(sent)
                .cast_const(),
            len - sent,
        );
        n += 1;
        bytes += len - sent;
        first.get_or_insert(item);
        if bytes >= MAX_BATCH_BYTES {
            break;
        }
    }
    let Some(first) = first else { return Ok(0) };
    // SAFETY: each (pointer, length) lies inside a span `Buffers::span` validated, in a
    // region its item's `Buffers` keeps mapped while the items are borrowed; the kernel
    // only reads.
    unsafe {
        ferry_sys::send_iov(
            fd,
            &iov[..n],
            first.to.as_ref(),
            &first.control,
            first.flags & !libc::MSG_OOB | oob,
        )
    }
}

/// Receives into the given spans, in order (non-blocking); control messages into
/// `control` when given.
pub(crate) fn recv_spans(
    fd: BorrowedFd<'_>,
    bufs: &Buffers,
    spans: &[BufSpan],
    flags: i32,
    control: Option<&mut [u8]>,
) -> io::Result<Received> {
    let iov: Vec<(*mut u8, usize)> = spans
        .iter()
        .map(|sp| (bufs.as_mut_ptr(*sp), sp.len() as usize))
        .collect();
    // SAFETY: every span was validated by `Buffers::span` and belongs to a buffer this
    // side allocated and has not lent out, inside the region `bufs` keeps mapped; the
    // kernel writes at most each span's length.
    unsafe { ferry_sys::recv_raw(fd, &iov, flags, control) }
}
