//! ferry's `LD_PRELOAD` shim (`libferry_preload.so`): it owns the sandboxed program's
//! side of socket mode. It replaces the libc socket API for `AF_INET`/`AF_INET6` TCP and
//! UDP sockets and relays every call over a per-thread shared-memory channel to the
//! protocol server serving that socket, which performs it on a real host socket; it keeps the program's view
//! of those sockets (real descriptors, `errno`, blocking, signals, `fork`) the kernel's.
//! It must not touch any other descriptor's behaviour (unix, netlink and every non-socket
//! descriptor go straight to libc, after one table lookup), must not call the libc socket
//! functions by name (they are its own: its I/O goes through `ferry-sys` system calls),
//! must not panic or unwind into C, and must not trust what the server writes into shared
//! memory beyond what `ferry-ring` validates. With `FERRY_SOCKET` unset it is inert.
//! The protocol is `docs/specs/socket-protocol.md`.
//!
//! # Theory of operation
//!
//! - **Identity** ([`fdtable`], [`ident`]): a ferry socket is, in the program's fd table,
//!   its end of a unix socketpair the server made and named `"\0ferry:<id>:<random>"`;
//!   the server holds the other end. The shim caches fd → id (and blocking mode, type,
//!   timeouts) in a lock-free table and identifies unknown fds with one `getsockname`, so
//!   sockets survive `fork`, `exec`, `dup` and `SCM_RIGHTS`; a socket this process did
//!   not make or accept is claimed once, with its fd as proof, before the first request
//!   about it (`ops::claimed`).
//! - **Channels** ([`chan`], [`tls`]): each thread opens its own channel to a server on
//!   its first call for that server (a socket id names its server); a signal handler that re-enters the shim uses a spare one. After `fork` the
//!   child forgets every inherited channel.
//! - **Calls** ([`ops`], [`data`]): creation and `accept` travel on the control socket
//!   and come back with the program's end of a new pair; sends are copied into channel buffers and
//!   queued fire-and-forget; everything else is a tagged request answered by `Done`.
//!   With `rx_pair` (the server says so in its hello reply, `ferry run --rx pair`, the
//!   default) a connected TCP socket's received bytes arrive in the program's fd itself
//!   and its receives are the kernel's own calls on it ([`data`]); the server is asked
//!   only how the stream ended and for out-of-band data.
//! - **Readiness**: not emulated. The server writes a token byte into its end when the
//!   host socket is readable (or, with `rx_pair`, the received bytes themselves);
//!   `poll`/`select`/`epoll` see it like any other fd. The shim only asks for tokens,
//!   rings the doorbell before the program blocks, and makes a wait for input from a
//!   ferry socket spin for the SBW span before it sleeps ([`fdcalls`]), unless the
//!   process has more than 16 exchanges in flight ([`chan::spin_pays`]).
//! - **Signals** ([`signals`]): the shim wraps the program's signal handlers to know when
//!   one ran during a wait, so `EINTR` versus `SA_RESTART` is the kernel's.
//! - **Entry points** ([`exports`], [`fdcalls`]): `errno` is set at one boundary; a
//!   panic becomes `EIO`, logged once (`FERRY_LOG=1`) with prefix `ferry:`. `syscall()`
//!   is one too: its socket data calls on ferry sockets go where the named function
//!   would (libuv sends datagrams that way); the shim's own system calls never take it.
//!
//! # Limitations
//!
//! - Calls libc makes internally do not reach the shim: glibc's resolver (DNS sockets
//!   are native, inside the sandbox), static binaries and raw system calls. What such
//!   calls write or read on a ferry fd goes through the pair: with `--rx pair` (the
//!   default) that works for a connected stream (stdio on a socket, bash's `/dev/tcp`):
//!   the server sends on what the program wrote there, and a send waits until it has
//!   (`data::pair_taken`); with `--rx ring` it does not.
//! - Control messages travel for datagrams only (`ferry_proto::cmsg`): `recvmsg` gets
//!   what the host socket's options ask for; `sendmsg` may carry source address, TOS/TTL,
//!   traffic class, hop limit, don't-fragment and `UDP_SEGMENT` (others: `EINVAL`). A
//!   stream's are ignored (logged once), and none are received on one.
//!   Option values longer than 32 bytes are refused (`EINVAL`), privileged ones by the
//!   server (`EPERM`); `connect(AF_UNSPEC)`
//!   on a stream fails with `EAFNOSUPPORT` (on a datagram socket it dissolves the
//!   association); `MSG_ERRQUEUE` finds nothing (`EAGAIN`).
//! - A blocking `accept` cannot be interrupted by a signal and ignores `SO_RCVTIMEO`
//!   (control requests cannot be cancelled).
//! - `POLLOUT` is withheld only after a non-blocking send found no free buffer (until one
//!   comes back to that thread's channel), while a non-blocking `connect` is in progress,
//!   and on listeners. Writability follows the channel of the thread that last ran out of
//!   room: another thread's channel may have room while the fd polls unwritable (its
//!   send still succeeds). A refused non-blocking `connect` raises `POLLERR|POLLHUP`;
//!   `epoll_wait` may see `EPOLLOUT` a moment later than the kernel's socket would show
//!   it. `POLLERR` is not raised for a reset stream or a UDP socket's ICMP error.
//! - `O_NONBLOCK` and the timeouts are cached per descriptor: a change made through a
//!   duplicate (or by another process sharing it) is not seen through this one.
//! - Sends on one socket from different threads use different channels, whose order the
//!   server does not relate.
//! - With doorbell batching (`batch > 1`), records not yet announced wait for the next
//!   call that rings; a program that then blocks outside the socket API leaves them
//!   unannounced while the server sleeps.
//!
//! # Borrowed descriptors
//!
//! The shim makes system calls on the program's descriptors (a ferry socket's end of
//! its pair, a file given to `sendfile`) through `ferry_sys::borrow`, whose contract is
//! that the number stays open while the borrow is used. The shim cannot promise that
//! for a descriptor the program owns: another thread of the program may close it during
//! the call. Such a close is the program's race, and costs what it costs natively: the
//! calls fail with `EBADF` or act on whatever file took the number, as the kernel's own
//! call racing that close would. No memory safety rests on it (the calls pass the
//! number to the kernel and nothing else), and the number is never -1 (it came from the
//! fd table or from the program's call). The `SAFETY` comments on those borrows say
//! which descriptor it is and refer here.

pub mod addr;
pub mod carry;
pub mod chan;
pub mod config;
pub mod data;
pub mod errno;
pub mod exports;
pub mod fdcalls;
pub mod fdtable;
pub mod ident;
pub mod iov;
pub mod log;
pub mod ops;
pub mod pending;
pub mod real;
pub mod signals;
pub mod sys;
pub mod tls;

/// Library constructor: reads the environment before the program runs, so the first
/// socket call (possibly in a signal handler) need not.
extern "C" fn ferry_preload_init() {
    // Looks libc's `syscall` up now: the program's `syscall()` (possibly in a signal
    // handler) is the shim's, which forwards to libc's and must not call `dlsym` there.
    // SAFETY: getpid reads none of the six arguments (zeros) and touches no memory.
    unsafe { real::syscall(libc::SYS_getpid, 0, 0, 0, 0, 0, 0) };
    signals::claim_table();
    config::init();
    if config::active() {
        tls::install_hooks();
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = ferry_preload_init;
