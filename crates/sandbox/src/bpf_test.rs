//! Runs a seccomp filter in tests as the kernel would, for the classic BPF instructions
//! the sandbox's filters use (load a word of `seccomp_data`, and, jump if equal, jump if
//! any bit set, return): each filter's unit tests check their verdicts through it.

use libc::sock_filter;

/// The verdict of `prog` for system call `nr` of architecture `arch` with `args` (at most
/// six).
pub(crate) fn verdict(prog: &[sock_filter], arch: u32, nr: u32, args: &[u64]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    let (mut pc, mut acc) = (0, 0u32);
    loop {
        let ins = prog[pc];
        let code = u32::from(ins.code);
        pc += 1;
        if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
            let k = ins.k as usize;
            acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
        } else if code == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K {
            acc &= ins.k;
        } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
            pc += usize::from(if acc == ins.k { ins.jt } else { ins.jf });
        } else if code == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K {
            pc += usize::from(if acc & ins.k != 0 { ins.jt } else { ins.jf });
        } else if code == libc::BPF_RET | libc::BPF_K {
            return ins.k;
        } else {
            panic!("unexpected instruction {code:#x}");
        }
    }
}
