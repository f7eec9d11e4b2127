//! COMPAT 5 — processes: after `fork` both sides hold the socket as with the kernel;
//! `exec` keeps inherited sockets working and closes CLOEXEC ones; `posix_spawn`;
//! daemon-style double fork and `daemon()`; pre-forked workers sharing a listener.

use std::ffi::CString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use libc::c_int;

use super::{Case, Res};
use crate::net::{
    accept, connect, listener, recv_exact, recv_text, send, socket, tcp_pair, tcp_socket, wait_for,
};
use crate::proc::{collect_helper, fork_with, helper_argv, spawn_helper};
use crate::sys::{Ctx, Fd, pipe, set_nonblocking, sleep_ms, zeroed};

pub const CASES: &[Case] = &[
    Case::new(
        "proc.fork_child_writes_parent_reads",
        fork_child_writes_parent_reads,
    ),
    Case::new("proc.fork_both_use", fork_both_use),
    Case::new(
        "proc.fork_child_close_keeps_parent",
        fork_child_close_keeps_parent,
    ),
    Case::new(
        "proc.fork_parent_close_keeps_child",
        fork_parent_close_keeps_child,
    ),
    Case::new("proc.fork_child_exit_no_eof", fork_child_exit_no_eof),
    Case::new("proc.prefork_workers_accept", prefork_workers_accept),
    Case::new("proc.exec_inherited_socket", exec_inherited_socket),
    Case::new("proc.exec_cloexec_closed", exec_cloexec_closed),
    Case::new("proc.exec_fd_cloexec_via_fcntl", exec_fd_cloexec_via_fcntl),
    Case::new("proc.exec_inherited_listener", exec_inherited_listener),
    Case::new("proc.exec_keeps_nonblock", exec_keeps_nonblock),
    Case::new("proc.posix_spawn_inherits", posix_spawn_inherits),
    Case::new("proc.posix_spawn_dup2_action", posix_spawn_dup2_action),
    Case::new("proc.vfork_style_exec", vfork_style_exec),
    Case::new("proc.double_fork_daemon", double_fork_daemon),
    Case::new("proc.daemon_call", daemon_call),
];

fn fork_child_writes_parent_reads() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let child = fork_with(|| {
        let r = send(c.raw(), b"from-child", 0).map_or(1, |_| 0);
        let reply = recv_text(c.raw(), 32, 0);
        if reply == "\"from-parent\"" { r } else { 2 }
    })?;
    let got = recv_text(s.raw(), 32, 0);
    send(s.raw(), b"from-parent", 0).ctx("send")?;
    Ok(format!("parent_got={got} child={}", child.wait()))
}

fn fork_both_use() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let child = fork_with(|| send(c.raw(), b"child;", 0).map_or(1, |_| 0))?;
    let status = child.wait();
    send(c.raw(), b"parent;", 0).ctx("send")?;
    let got = recv_exact(s.raw(), 13)?;
    Ok(format!(
        "peer_got={:?} child={status}",
        String::from_utf8_lossy(&got)
    ))
}

fn fork_child_close_keeps_parent() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    // SAFETY: an integer; the child closes its own copy of `c`'s descriptor, which it
    // does not use afterwards (it exits; the parent's `c` is untouched).
    let child = fork_with(|| unsafe { libc::close(c.raw()) })?;
    let status = child.wait();
    let no_eof = crate::net::poll1(s.raw(), libc::POLLIN, 50).ctx("poll")? == 0;
    send(c.raw(), b"still-open", 0).ctx("send")?;
    Ok(format!(
        "child={status} peer_no_eof={no_eof} peer_got={}",
        recv_text(s.raw(), 32, 0)
    ))
}

fn fork_parent_close_keeps_child() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let (gate_r, gate_w) = pipe(0).ctx("pipe")?;
    let child = fork_with(|| {
        let mut b = [0u8; 1];
        // SAFETY: `b` is a live one-byte local, written for at most its length.
        unsafe { libc::read(gate_r.raw(), b.as_mut_ptr().cast(), 1) };
        send(c.raw(), b"child-after-parent-close", 0).map_or(1, |_| 0)
    })?;
    drop(c);
    let no_eof = crate::net::poll1(s.raw(), libc::POLLIN, 50).ctx("poll")? == 0;
    sys!(libc::write(gate_w.raw(), b"g".as_ptr().cast(), 1)).ctx("write")?;
    let got = recv_text(s.raw(), 64, 0);
    let status = child.wait();
    let eof = recv_text(s.raw(), 8, 0);
    Ok(format!(
        "no_eof_while_child_holds={no_eof} got={got} child={status} then={eof}"
    ))
}

/// redis BGSAVE: the child exits without closing anything; the parent's client goes on.
fn fork_child_exit_no_eof() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let child = fork_with(|| 0)?;
    let status = child.wait();
    let quiet = crate::net::poll1(c.raw(), libc::POLLIN, 50).ctx("poll")? == 0;
    send(s.raw(), b"after-bgsave", 0).ctx("send")?;
    Ok(format!(
        "child={status} no_eof={quiet} got={}",
        recv_text(c.raw(), 32, 0)
    ))
}

/// nginx: the master listens, forks workers, each worker accepts and serves.
fn prefork_workers_accept() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(fork_with(|| match accept(l.raw()) {
            Ok(a) => send(a.raw(), b"served", 0).map_or(1, |_| 0),
            Err(_) => 2,
        })?);
    }
    drop(l);
    let mut replies = Vec::new();
    for _ in 0..2 {
        let c = tcp_socket(libc::AF_INET).ctx("socket")?;
        connect(c.raw(), &addr).ctx("connect")?;
        replies.push(recv_text(c.raw(), 16, 0));
    }
    let statuses: Vec<String> = workers.into_iter().map(|w| w.wait()).collect();
    Ok(format!(
        "replies={} workers={}",
        replies.join(","),
        statuses.join(",")
    ))
}

fn exec_with(mode: &str, fd: c_int) -> Result<String, String> {
    let (child, out) = spawn_helper(&[mode.to_string(), fd.to_string()])?;
    Ok(collect_helper(child, out))
}

fn exec_inherited_socket() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(s.raw(), b"exec-pong", 0).ctx("send")?;
    let helper = exec_with("use", c.raw())?;
    Ok(format!(
        "helper={helper} peer_got={}",
        recv_text(s.raw(), 32, 0)
    ))
}

fn exec_cloexec_closed() -> Res {
    let c = socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0).ctx("socket")?;
    exec_with("closed", c.raw())
}

fn exec_fd_cloexec_via_fcntl() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    sys!(libc::fcntl(c.raw(), libc::F_SETFD, libc::FD_CLOEXEC)).ctx("F_SETFD")?;
    exec_with("closed", c.raw())
}

fn exec_inherited_listener() -> Res {
    let (l, addr) = listener(libc::AF_INET)?;
    let (child, out) = spawn_helper(&["accept".to_string(), l.raw().to_string()])?;
    drop(l);
    let c = tcp_socket(libc::AF_INET).ctx("socket")?;
    connect(c.raw(), &addr).ctx("connect")?;
    let got = recv_text(c.raw(), 32, 0);
    Ok(format!(
        "client_got={got} helper={}",
        collect_helper(child, out)
    ))
}

fn exec_keeps_nonblock() -> Res {
    let (c, _s) = tcp_pair(libc::AF_INET)?;
    set_nonblocking(c.raw(), true).ctx("fcntl")?;
    exec_with("flags", c.raw())
}

/// `posix_spawn` of the helper with stdout on a pipe and, optionally, one more dup2.
fn spawn(args: &[String], extra_dup: Option<(c_int, c_int)>) -> Result<String, String> {
    let (r, w) = pipe(libc::O_CLOEXEC).ctx("pipe")?;
    let argv = helper_argv(args);
    let mut ptrs: Vec<*mut libc::c_char> = argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    ptrs.push(std::ptr::null_mut());
    let mut fa: libc::posix_spawn_file_actions_t = zeroed();
    let env: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let mut envp: Vec<*mut libc::c_char> = env.iter().map(|e| e.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());
    let mut pid = 0;
    // SAFETY: `fa` is a live local the init call initialises before the other calls
    // use it and `destroy` frees it, once; the path is a C string literal; `ptrs` and
    // `envp` are NULL-terminated arrays of pointers into CStrings (`argv`, `env`) that
    // outlive the call; `pid` is a live local out-parameter.
    let rc = unsafe {
        libc::posix_spawn_file_actions_init(&mut fa);
        libc::posix_spawn_file_actions_adddup2(&mut fa, w.raw(), 1);
        if let Some((from, to)) = extra_dup {
            libc::posix_spawn_file_actions_adddup2(&mut fa, from, to);
        }
        let rc = libc::posix_spawn(
            &mut pid,
            c"/proc/self/exe".as_ptr(),
            &fa,
            std::ptr::null(),
            ptrs.as_ptr(),
            envp.as_ptr(),
        );
        libc::posix_spawn_file_actions_destroy(&mut fa);
        rc
    };
    if rc != 0 {
        return Ok(format!("posix_spawn={}", crate::sys::Errno(rc)));
    }
    drop(w);
    Ok(collect_helper(crate::proc::Child::from_pid(pid), r))
}

fn posix_spawn_inherits() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(s.raw(), b"spawn-pong", 0).ctx("send")?;
    let helper = spawn(&["use".into(), c.raw().to_string()], None)?;
    Ok(format!(
        "helper={helper} peer_got={}",
        recv_text(s.raw(), 32, 0)
    ))
}

fn posix_spawn_dup2_action() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let cloexec = Fd::new(sys!(libc::fcntl(c.raw(), libc::F_DUPFD_CLOEXEC, 0)).ctx("dup")?);
    drop(c);
    send(s.raw(), b"fd0-pong", 0).ctx("send")?;
    let helper = spawn(&["use".into(), "0".into()], Some((cloexec.raw(), 0)))?;
    Ok(format!(
        "helper={helper} peer_got={}",
        recv_text(s.raw(), 32, 0)
    ))
}

/// The child of [`vfork_style_exec`]: runs on its own stack in the parent's memory.
extern "C" fn exec_in_shared_memory(argv: *mut libc::c_void) -> c_int {
    // SAFETY: `argv` is what `vfork_style_exec` passed to clone: its `ptrs`, a
    // NULL-terminated array of pointers into CStrings that the parent keeps alive (it is
    // suspended until this child execs or exits, CLONE_VFORK); the path is a literal.
    unsafe {
        libc::execv(
            c"/proc/self/exe".as_ptr(),
            argv.cast::<*const libc::c_char>(),
        )
    };
    127
}

/// vfork semantics — the child borrows the parent's memory and the parent waits until
/// it execs — via `clone(CLONE_VM | CLONE_VFORK)` on a stack of its own. (Rust cannot
/// call `vfork()` itself soundly: it returns twice on one stack.)
fn vfork_style_exec() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    send(s.raw(), b"vfork-pong", 0).ctx("send")?;
    let (r, w) = pipe(libc::O_CLOEXEC).ctx("pipe")?;
    // This process prints nothing itself (results go to the runner's pipe), so its
    // stdout can simply be the helper's pipe; the child then only has to exec.
    sys!(libc::dup2(w.raw(), 1)).ctx("dup2")?;
    drop(w);
    let argv = helper_argv(&["use".to_string(), c.raw().to_string()]);
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let mut stack = vec![0u128; 16 * 1024];
    let top = stack
        .as_mut_ptr()
        .wrapping_add(stack.len())
        .cast::<libc::c_void>();
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    let arg = ptrs.as_mut_ptr().cast::<libc::c_void>();
    // SAFETY: the child runs `exec_in_shared_memory` on `stack` (`top` is one past its
    // end, 16-aligned as u128 elements are; the stack grows down into it), which outlives
    // the child's use of it: CLONE_VFORK suspends this thread until the child execs or
    // exits, and `stack` is dropped only after that. The child shares this memory and
    // only calls execv with `arg`, this frame's live `ptrs`.
    let pid = sys!(unsafe { libc::clone(exec_in_shared_memory, top, flags, arg) }).ctx("clone")?;
    // SAFETY: an integer; stdout is this case process's own (its output goes to the
    // runner's pipe) and was only made the helper's pipe for the clone above.
    unsafe { libc::close(1) };
    let helper = collect_helper(crate::proc::Child::from_pid(pid), r);
    drop(stack);
    Ok(format!(
        "helper={helper} peer_got={}",
        recv_text(s.raw(), 32, 0)
    ))
}

fn double_fork_daemon() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let middle = fork_with(|| {
        // SAFETY: no arguments; makes the forked child a session leader (or fails).
        unsafe { libc::setsid() };
        match fork_with(|| {
            sleep_ms(20);
            send(c.raw(), b"from-grandchild", 0).map_or(1, |_| 0)
        }) {
            Ok(_) => 0,
            Err(_) => 3,
        }
    })?;
    let status = middle.wait();
    drop(c);
    let got = recv_text(s.raw(), 32, 0);
    let eof = recv_text(s.raw(), 8, 0);
    Ok(format!("middle={status} got={got} then={eof}"))
}

fn daemon_call() -> Res {
    let (c, s) = tcp_pair(libc::AF_INET)?;
    let caller = fork_with(|| {
        // SAFETY: integers only; daemon forks and the single-threaded forked child
        // (fork_with) carries on as the daemon, keeping cwd and descriptors.
        if unsafe { libc::daemon(1, 1) } != 0 {
            return 4;
        }
        send(c.raw(), b"from-daemon", 0).map_or(1, |_| 0)
    })?;
    let status = caller.wait();
    drop(c);
    wait_for(s.raw(), libc::POLLIN).ctx("poll")?;
    let got = recv_text(s.raw(), 64, 0);
    Ok(format!(
        "caller={status} got={got} then={}",
        recv_text(s.raw(), 8, 0)
    ))
}
