//! The new image in the exec and `posix_spawn` cases: `ferry-conformance
//! --child-exec-case MODE FD`. It uses an fd inherited across `execve` and prints one
//! line to stdout, which the case has pointed at a pipe.

use std::process::ExitCode;

use libc::c_int;

use crate::net::{accept, recv_text, send};
use crate::sys::{cloexec_state, nonblock_state, show};

pub fn main(args: &[String]) -> ExitCode {
    let (Some(mode), Some(fd)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<c_int>().ok()),
    ) else {
        eprintln!("usage: --child-exec-case MODE FD");
        return ExitCode::from(2);
    };
    let line = match mode.as_str() {
        // A connected socket inherited across exec: talk over it.
        "use" => {
            let sent = show(send(fd, b"exec-ping", libc::MSG_NOSIGNAL));
            format!("sent={sent} reply={}", recv_text(fd, 64, 0))
        }
        // A socket that was CLOEXEC: the fd must be gone.
        "closed" => match sys!(libc::fcntl(fd, libc::F_GETFD)) {
            Ok(_) => "fd open".to_string(),
            Err(e) => format!("F_GETFD={e}"),
        },
        // An inherited listener: accept one connection and greet it.
        "accept" => match accept(fd) {
            Ok(c) => format!("accepted send={}", show(send(c.raw(), b"from-exec", 0))),
            Err(e) => format!("accept={e}"),
        },
        // File status flags survive exec; the fd-flag does not apply (it was inherited).
        "flags" => {
            let recv = recv_text(fd, 16, 0);
            format!("{} {} recv={recv}", nonblock_state(fd), cloexec_state(fd))
        }
        other => format!("unknown mode {other}"),
    };
    println!("{line}");
    ExitCode::SUCCESS
}
