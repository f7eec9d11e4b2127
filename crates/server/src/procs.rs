//! The sandbox's processes as the server knows them (`/proc`): whether one descends
//! from the sandbox's init, and when one started (a pid used again is another process).
//! A leaf.

/// Whether `pid` is `ancestor` or one of its descendants (walking `/proc/PID/stat`).
pub fn descends_from(mut pid: i32, ancestor: i32) -> bool {
    for _ in 0..4096 {
        if pid == ancestor {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // "pid (comm) state ppid …": comm may contain anything, so parse after the last ')'.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        else {
            return false;
        };
        pid = ppid;
    }
    false
}

/// When process `pid` started (`/proc/PID/stat`'s `starttime`, in clock ticks since
/// boot); `None` when it does not exist.
pub(crate) fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …": starttime is the 20th field after the comm.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}
