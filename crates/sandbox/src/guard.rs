//! What a command with volumes may not do: make set-id files or file capabilities.
//!
//! In an idmapped volume what the sandbox's root makes belongs to the host's root, so a
//! set-user-id file it made there would be a set-user-id *root* program on the host,
//! runnable by any host user who reaches it; a file capability written there would
//! count on the host too. The command is therefore started without `CAP_FSETID` (its
//! writes to an existing set-id file clear those bits, as anyone's do) and without
//! `CAP_SETFCAP` (no `security.capability` attributes), and under a seccomp filter that
//! fails with `EPERM` every `chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `open`, `openat`,
//! `creat`, `mknod`, `mknodat` whose mode has the set-user-id or set-group-id bit, and
//! with `ENOSYS` the calls whose mode the filter cannot see (`openat2`, whose mode is in
//! a structure, and `io_uring_setup`: a ring's operations bypass seccomp) and every call
//! of another architecture (32-bit programs, whose calls are numbered otherwise).
//! Installed only when the sandbox has idmapped volumes.

use libc::{c_int, sock_filter};

/// `AUDIT_ARCH_*` of the build's architecture (see watch.rs).
#[cfg(target_arch = "x86_64")]
const ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: Option<u32> = None;

/// x86_64's x32 ABI numbers its calls from here; the calls filtered share their
/// numbers with x86_64's.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `fchmodat2` (Linux 6.6), the same number on x86_64 and the generic table.
const SYS_FCHMODAT2: u32 = 452;

/// linux/capability.h (not in the libc crate).
const CAP_FSETID: c_int = 4;
const CAP_SETFCAP: c_int = 31;

/// The mode bits refused.
const SET_ID: u32 = libc::S_ISUID | libc::S_ISGID;

/// (system call, index of its mode argument).
#[cfg(target_arch = "x86_64")]
const MODE_ARG: [(i64, u8); 9] = [
    (libc::SYS_chmod, 1),
    (libc::SYS_creat, 1),
    (libc::SYS_fchmod, 1),
    (libc::SYS_mknod, 1),
    (libc::SYS_open, 2),
    (libc::SYS_fchmodat, 2),
    (SYS_FCHMODAT2 as i64, 2),
    (libc::SYS_mknodat, 2),
    (libc::SYS_openat, 3),
];
#[cfg(not(target_arch = "x86_64"))]
const MODE_ARG: [(i64, u8); 5] = [
    (libc::SYS_fchmod, 1),
    (libc::SYS_fchmodat, 2),
    (SYS_FCHMODAT2 as i64, 2),
    (libc::SYS_mknodat, 2),
    (libc::SYS_openat, 3),
];

/// The calls refused outright (`ENOSYS`).
const UNSEEN: [i64; 2] = [libc::SYS_openat2, libc::SYS_io_uring_setup];

/// An instruction whose jumps name labels, resolved by [`assemble`].
#[derive(Clone, Copy)]
enum Ins {
    Load(u32),
    And(u32),
    /// Skip the next instruction if the accumulator equals k.
    SkipIfEq(u32),
    /// Jump to the label if the accumulator equals k, else go on.
    JumpEq(u32, Label),
    Ret(u32),
}

#[derive(Clone, Copy)]
enum Label {
    /// The check of argument 1, 2 or 3's mode.
    ModeOf(u8),
    NoSys,
}

const LOAD: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const AND: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// The filter for `arch` (see the module's documentation), built by the launcher.
pub(crate) fn filter(arch: u32) -> Vec<sock_filter> {
    // seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (its low half on
    // little-endian machines; modes are ints).
    let mut prog = vec![
        Ins::Load(4),
        Ins::SkipIfEq(arch),
        Ins::Ret(ENOSYS),
        Ins::Load(0),
        Ins::And(!X32_SYSCALL_BIT),
    ];
    prog.extend(
        UNSEEN
            .iter()
            .map(|&nr| Ins::JumpEq(nr as u32, Label::NoSys)),
    );
    prog.extend(
        MODE_ARG
            .iter()
            .map(|&(nr, arg)| Ins::JumpEq(nr as u32, Label::ModeOf(arg))),
    );
    prog.push(Ins::Ret(ALLOW));
    assemble(&prog)
}

/// `prog` with its jumps resolved, followed by the labels' code: for each mode
/// argument 1–3, load it and refuse a set-id bit; then the returns `ENOSYS`, allow,
/// `EPERM`.
fn assemble(prog: &[Ins]) -> Vec<sock_filter> {
    const ARGS: u8 = 3;
    let mode_of = |a: u8| prog.len() + 2 * usize::from(a - 1);
    let nosys = prog.len() + 2 * usize::from(ARGS);
    let (allow, eperm) = (nosys + 1, nosys + 2);
    let ins = |code: u16, jt: usize, jf: usize, k: u32| sock_filter {
        code,
        jt: jt as u8,
        jf: jf as u8,
        k,
    };
    let mut out = Vec::with_capacity(eperm + 1);
    for (pc, i) in prog.iter().enumerate() {
        out.push(match *i {
            Ins::Load(off) => ins(LOAD, 0, 0, off),
            Ins::And(k) => ins(AND, 0, 0, k),
            Ins::SkipIfEq(k) => ins(JEQ, 1, 0, k),
            Ins::JumpEq(k, Label::ModeOf(a)) => ins(JEQ, mode_of(a) - pc - 1, 0, k),
            Ins::JumpEq(k, Label::NoSys) => ins(JEQ, nosys - pc - 1, 0, k),
            Ins::Ret(k) => ins(RET, 0, 0, k),
        });
    }
    for a in 1..=ARGS {
        out.push(ins(LOAD, 0, 0, 16 + 8 * u32::from(a)));
        let pc = out.len();
        out.push(ins(JSET, eperm - pc - 1, allow - pc - 1, SET_ID));
    }
    out.extend([
        ins(RET, 0, 0, ENOSYS),
        ins(RET, 0, 0, ALLOW),
        ins(RET, 0, 0, EPERM),
    ]);
    out
}

/// In the command's process, after no-new-privileges and before `execve`: drops
/// `CAP_FSETID` and `CAP_SETFCAP` from its bounding set and installs `prog`. Returns
/// the errno of a refusal (the command must then not run).
pub(crate) fn install(prog: &[sock_filter]) -> Result<(), c_int> {
    for cap in [CAP_FSETID, CAP_SETFCAP] {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == -1 {
            return Err(crate::sys::errno());
        }
    }
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: seccomp(2) reads the program through fprog, which lives across the call.
    let r = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog) };
    if r == -1 {
        Err(crate::sys::errno())
    } else {
        Ok(())
    }
}

/// The filter for this build's architecture, if it has one.
pub(crate) fn native_filter() -> Option<Vec<sock_filter>> {
    ARCH.map(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 4]) -> u32 {
        crate::bpf_test::verdict(prog, arch, nr, &args)
    }

    #[test]
    fn set_id_modes_are_refused_and_the_rest_allowed() {
        let Some(arch) = ARCH else { return };
        let prog = filter(arch);
        let v = |nr: i64, args| verdict(&prog, arch, nr as u32, args);
        let (suid, sgid) = (libc::S_ISUID as u64, libc::S_ISGID as u64);
        assert_eq!(v(libc::SYS_fchmod, [3, 0o4755, 0, 0]), EPERM);
        assert_eq!(v(libc::SYS_fchmod, [3, 0o755, 0, 0]), ALLOW);
        assert_eq!(v(libc::SYS_fchmodat, [0, 0, sgid | 0o755, 0]), EPERM);
        assert_eq!(v(libc::SYS_fchmodat, [0, 0, 0o1777, 0]), ALLOW);
        assert_eq!(v(i64::from(SYS_FCHMODAT2), [0, 0, suid, 0]), EPERM);
        assert_eq!(
            v(libc::SYS_openat, [0, 0, libc::O_CREAT as u64, suid | 0o755]),
            EPERM
        );
        assert_eq!(
            v(libc::SYS_openat, [0, 0, libc::O_CREAT as u64, 0o644]),
            ALLOW
        );
        assert_eq!(
            v(libc::SYS_mknodat, [0, 0, libc::S_IFREG as u64 | suid, 0]),
            EPERM
        );
        // The mode's high half does not hide the bits (the kernel reads an int).
        assert_eq!(v(libc::SYS_fchmod, [3, 1 << 32 | suid, 0, 0]), EPERM);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(v(libc::SYS_chmod, [0, 0o6755, 0, 0]), EPERM);
            assert_eq!(v(libc::SYS_open, [0, 0, suid, 0]), EPERM);
            assert_eq!(v(libc::SYS_creat, [0, suid, 0, 0]), EPERM);
            assert_eq!(v(libc::SYS_chmod, [0, 0o755, 0, 0]), ALLOW);
            // x32's numbers are x86_64's with a bit set.
            let x32 = |nr: i64| (nr as u32 | X32_SYSCALL_BIT) as i64;
            assert_eq!(v(x32(libc::SYS_chmod), [0, suid, 0, 0]), EPERM);
        }
        assert_eq!(v(libc::SYS_openat2, [0; 4]), ENOSYS);
        assert_eq!(v(libc::SYS_io_uring_setup, [0; 4]), ENOSYS);
        assert_eq!(v(libc::SYS_read, [0, suid, suid, suid]), ALLOW);
        // Another architecture's calls: refused.
        assert_eq!(verdict(&prog, 0x4000_0003, 15, [0, suid, 0, 0]), ENOSYS);
    }
}
