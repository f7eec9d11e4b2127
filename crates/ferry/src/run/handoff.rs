//! The hand-off for programs without the shim (`--handoff` for static and Go programs;
//! docs/DESIGN.md, "Hand-off"): the sandbox's init asks about each TCP connect such a
//! program makes (ferry_sandbox's `HandoffRequests`), and this thread answers with the
//! one admission function's decision — a host socket made here, set the program's
//! options and connected without waiting, when `admit` says `Handoff`; "not a
//! hand-off" otherwise (nic mode then serves the connect, and refuses what the policy
//! refuses).

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use ferry_egress::{Decision, Origin, What, admit};
use ferry_sandbox::{Answer, HandoffRequests, SockOpt};
use ferry_server::Policy;
use tracing::{debug, warn};

/// Starts the thread answering `requests` with `policy`; it ends when the sandbox's
/// init is gone. With an `--egress` bond nothing is handed off (the bond picks each
/// connection's source, which this path does not).
pub(crate) fn serve(requests: HandoffRequests, policy: Policy, bonded: bool) {
    let started = std::thread::Builder::new()
        .name("handoff".into())
        .spawn(move || {
            loop {
                match requests.recv() {
                    Ok(Some(req)) => {
                        let answer = if bonded {
                            Answer::NotHandoff
                        } else {
                            decide(&policy, req.to, &req.opts)
                        };
                        req.answer(answer);
                    }
                    Ok(None) => return,
                    Err(e) => {
                        warn!("the hand-off's requests: {e}");
                        return;
                    }
                }
            }
        });
    if let Err(e) = started {
        warn!("programs without the shim get no hand-off: {e}");
    }
}

/// The answer for a connect to `to` from a sandbox TCP socket with options `opts`.
fn decide(policy: &Policy, to: SocketAddr, opts: &[SockOpt]) -> Answer {
    if admit(policy, What::Connect, Origin::Sandbox, to) != Decision::Handoff {
        return Answer::NotHandoff;
    }
    match connect(to, opts) {
        Ok((sock, in_progress)) => {
            debug!("hand-off of a connect to {to} (no shim)");
            Answer::Socket { sock, in_progress }
        }
        Err(e) => Answer::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// A host TCP socket for `to`, with `opts` set, connected without waiting: the socket
/// and whether the connect is in progress.
fn connect(to: SocketAddr, opts: &[SockOpt]) -> std::io::Result<(OwnedFd, bool)> {
    let domain = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let sock = ferry_sys::socket(
        domain,
        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        0,
    )?;
    for &(level, name, value) in opts {
        if let Err(e) = ferry_sys::setsockopt(sock.as_fd(), level, name, &value.to_ne_bytes()) {
            debug!("hand-off: option ({level}, {name}) = {value}: {e}");
        }
    }
    match ferry_sys::connect(sock.as_fd(), &to) {
        Ok(()) => Ok((sock, false)),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok((sock, true)),
        Err(e) => Err(e),
    }
}
