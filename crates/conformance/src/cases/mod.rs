//! The cases, one module per group. Names are `group.what`, unique and stable: they are
//! compared across runs. Which item of the compatibility list (COMPAT.md, "what a
//! transparent socket shim must get right") each group covers:
//!
//! | module | groups | COMPAT item |
//! |---|---|---|
//! | `fds` | `fd.` | 1 real fd per socket, lowest free number, past 1024 |
//! | `poll`, `epoll` | `poll.` `ppoll.` `select.` `pselect.` `epoll.` | 2 readiness, mixed with kernel fds |
//! | `nonblock`, `blocking` | `nb.` `blk.` | 3 blocking and non-blocking, EPIPE/SIGPIPE |
//! | `signals` | `sig.` | 4 EINTR vs SA_RESTART, handlers making socket calls |
//! | `procs` | `proc.` | 5 fork, exec, posix_spawn, vfork-style clone, daemon |
//! | `dup` | `dup.` | 6 dup family, SCM_RIGHTS, close/shutdown racing a blocked recv |
//! | `options` | `opt.` | 7 setsockopt/getsockopt |
//! | `entry`, `msg`, `udp`, `ipv6`, `errors` | `io.` `msg.` `udp.` `v6.` `err.` | 8 other entry points, datagrams, IPv6, errnos |
//! | `names` | `gai.` | 9 name resolution |
//! | `passthrough` | `unix.` `netlink.` | 10 non-inet families untouched |
//! | `threads` | `thr.` | 11 threads |
//! | `cleanup` | `clean.` | 12 cleanup, RLIMIT_NOFILE |
//! | `bulk` | `bulk.` | large transfers with checksums |
//! | `integrity` | `int.` | no byte lost, no send that lies: close/shutdown racing another thread's sends, sends after a reset, a small send buffer, epoll across a refused connect |

use std::fmt;

mod blocking;
mod bulk;
mod cleanup;
mod dup;
mod entry;
mod epoll;
mod errors;
mod fds;
mod integrity;
mod ipv6;
mod msg;
mod names;
mod nonblock;
mod options;
mod passthrough;
mod poll;
mod procs;
mod signals;
mod threads;
mod udp;

/// What a case returns: its result text, or a set-up failure (`step=ERRNO`).
pub type Res = Result<String, String>;

/// One conformance case.
pub struct Case {
    /// `group.what`.
    pub name: &'static str,
    /// Runs in a forked child; must be deterministic.
    pub run: fn() -> Res,
    /// Deadline before the runner kills it and prints `TIMEOUT`.
    pub timeout_ms: u32,
}

impl Case {
    pub const fn new(name: &'static str, run: fn() -> Res) -> Case {
        Case {
            name,
            run,
            timeout_ms: 5_000,
        }
    }

    /// For the large transfers: a longer deadline.
    pub const fn slow(self) -> Case {
        Case {
            timeout_ms: 60_000,
            ..self
        }
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Every case, in the order they run.
pub fn all() -> Vec<Case> {
    let groups: [&[Case]; 20] = [
        fds::CASES,
        poll::CASES,
        epoll::CASES,
        nonblock::CASES,
        blocking::CASES,
        signals::CASES,
        procs::CASES,
        dup::CASES,
        options::CASES,
        entry::CASES,
        msg::CASES,
        udp::CASES,
        ipv6::CASES,
        names::CASES,
        errors::CASES,
        passthrough::CASES,
        threads::CASES,
        cleanup::CASES,
        bulk::CASES,
        integrity::CASES,
    ];
    groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|c| Case {
            name: c.name,
            run: c.run,
            timeout_ms: c.timeout_ms,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_grouped() {
        let all = all();
        let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
        assert!(names.iter().all(|n| n.contains('.') && !n.contains(' ')));
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "duplicate case names");
        assert!(before >= 110, "only {before} cases");
    }
}
