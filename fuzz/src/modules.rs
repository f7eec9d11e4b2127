//! Target `modules`: a module binding as a sandbox sends it, through what the server
//! does with it (`crates/server/src/modules.rs`): [`Binding::decode`], the module
//! cache by SHA-256, [`ModuleHost::load`] (the text or binary module compiled and
//! checked against ferry's ABI), [`ModuleHost::start_shared`] with the binding's
//! properties and files, the program's data fed to the instance, its end of input, and
//! every action it asks for performed by an [`Outbox`] on a socket, as the server does.
//!
//! The data fed is the binding's property values, in order (at most four buffers); the
//! registered files the binding may name are one: handle 0, a 4 KiB memfd. The limits
//! are the server's defaults ([`ModuleConfig::default`]: 16 MiB, 5 ms per callback).
//!
//! Properties: nothing panics; a malformed module is [`Error::BadModule`]; a module that
//! loads but misbehaves fails with an error and stops only its instance; a callback
//! returns within its deadline (libFuzzer's `-timeout` catches one that does not).
//!
//! The harness keeps one host, as a server does, but makes a new one after
//! [`HOST_MODULES`] modules: a host never forgets a module it compiled (see
//! docs/SECURITY.md on the server's cache), and the fuzzer loads a new one per input.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use ferry_modules::{Error, ModuleHost, ModuleId, Outbox};
use ferry_proto::{Binding, ModuleRef, module_hash};
use ferry_server::ModuleConfig;

/// Modules compiled by one host before the harness starts a fresh one.
pub const HOST_MODULES: usize = 64;
/// Input buffers fed to an instance, at most.
const MAX_FEEDS: usize = 4;
/// Rounds of writing output and reading it back, at most.
const MAX_ROUNDS: usize = 64;

struct Host {
    host: ModuleHost,
    by_hash: HashMap<[u8; 32], ModuleId>,
}

/// The one registered file (handle 0).
fn registered() -> &'static Arc<OwnedFd> {
    static FILE: OnceLock<Arc<OwnedFd>> = OnceLock::new();
    FILE.get_or_init(|| {
        let fd = rustix::fs::memfd_create("ferry-fuzz-file", rustix::fs::MemfdFlags::CLOEXEC)
            .expect("memfd_create");
        let body: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        rustix::io::write(&fd, &body).expect("write to a memfd");
        Arc::new(fd)
    })
}

fn host() -> &'static Mutex<Option<Host>> {
    static HOST: Mutex<Option<Host>> = Mutex::new(None);
    &HOST
}

/// One input.
pub fn run(data: &[u8]) {
    let Ok(binding) = Binding::decode(data) else {
        return;
    };
    // The server's order: files first (unknown handle: EBADF), then the module.
    let mut files = Vec::new();
    for &h in &binding.handles {
        if h != 0 {
            return;
        }
        files.push(Arc::clone(registered()));
    }
    let mut guard = host().lock().unwrap_or_else(|p| p.into_inner());
    let fresh = guard
        .as_ref()
        .is_none_or(|h| h.by_hash.len() >= HOST_MODULES);
    if fresh {
        *guard = None;
        let host = ModuleHost::new(ModuleConfig::default().limits).expect("module host");
        *guard = Some(Host {
            host,
            by_hash: HashMap::new(),
        });
    }
    let h = guard.as_mut().expect("made above");
    let id = match binding.module {
        ModuleRef::Bytes(bytes) => {
            let hash = module_hash(bytes);
            match h.by_hash.get(&hash) {
                Some(&id) => id,
                None => match h.host.load(bytes) {
                    Ok(id) => {
                        h.by_hash.insert(hash, id);
                        id
                    }
                    Err(e) => {
                        assert!(matches!(e, Error::BadModule(_)), "load failed with {e}");
                        return;
                    }
                },
            }
        }
        ModuleRef::Hash(hash) => match h.by_hash.get(&hash) {
            Some(&id) => id,
            None => return,
        },
    };
    drive(&h.host, id, &binding, files);
}

/// Starts an instance, feeds it, ends its input, writes its output.
fn drive(host: &ModuleHost, id: ModuleId, binding: &Binding<'_>, files: Vec<Arc<OwnedFd>>) {
    let (mut inst, actions) = match host.start_shared(id, &binding.props, files) {
        Ok(started) => started,
        Err(e) => {
            assert!(!matches!(e, Error::UnknownModule(_)), "{e}");
            return;
        }
    };
    let (out, sink) = ferry_sys::socketpair(
        libc::AF_UNIX,
        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
    )
    .expect("socketpair");
    let mut outbox = Outbox::new();
    outbox.set_copy_max(ferry_server::ModuleConfig::default().copy_max);
    outbox.push(actions);
    if !write_out(&mut outbox, &out, &sink) {
        return;
    }
    for (_, value) in binding.props.iter().take(MAX_FEEDS) {
        if inst.is_finished() {
            break;
        }
        match inst.feed(value.as_bytes().to_vec()) {
            Ok(actions) => outbox.push(actions),
            Err(_) => {
                assert!(
                    inst.is_stopped(),
                    "a failed callback left the instance running"
                );
                return;
            }
        }
        if !write_out(&mut outbox, &out, &sink) {
            return;
        }
    }
    if !inst.is_finished() {
        match inst.close() {
            Ok(actions) => {
                assert!(inst.is_finished());
                outbox.push(actions);
            }
            Err(_) => {
                assert!(inst.is_stopped());
                return;
            }
        }
    }
    write_out(&mut outbox, &out, &sink);
    assert!(matches!(inst.feed(Vec::new()), Err(Error::Finished)));
}

/// Writes queued output as the server does when the socket is writable, reading it out
/// at the other end; false when the output failed (a file shorter than its range).
fn write_out(outbox: &mut Outbox, out: &OwnedFd, sink: &OwnedFd) -> bool {
    let mut scratch = vec![0u8; 64 * 1024];
    for _ in 0..MAX_ROUNDS {
        if outbox.is_empty() {
            return true;
        }
        if let Err(e) = outbox.advance(out.as_fd()) {
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
            return false;
        }
        while let Ok(n) = rustix::io::read(sink, &mut scratch) {
            if n == 0 {
                break;
            }
        }
    }
    true
}
