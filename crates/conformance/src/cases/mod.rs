//! The cases, one module per group of `docs/COMPAT.md` items. Each module exports
//! `CASES`; names are `group.what`, unique, and stable (they are compared across runs).

use std::fmt;

mod blocking;
mod bulk;
mod cleanup;
mod dup;
mod entry;
mod epoll;
mod errors;
mod fds;
mod ipv6;
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
        Case { name, run, timeout_ms: 5_000 }
    }

    /// For the large transfers: a longer deadline.
    pub const fn slow(self) -> Case {
        Case { timeout_ms: 60_000, ..self }
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Every case, in the order they run.
pub fn all() -> Vec<Case> {
    let groups: [&[Case]; 18] = [
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
        udp::CASES,
        ipv6::CASES,
        names::CASES,
        errors::CASES,
        passthrough::CASES,
        threads::CASES,
        cleanup::CASES,
        bulk::CASES,
    ];
    groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|c| Case { name: c.name, run: c.run, timeout_ms: c.timeout_ms })
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
