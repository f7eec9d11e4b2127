//! Data-path modules bound to sockets (S3, `docs/MODULES.md`): the server half of
//! `ferry-modules`.
//!
//! # Theory of operation
//!
//! One [`ModuleHost`] per server, made when the first module is needed (it owns the
//! engine, the instance pool and the epoch thread). A module reaches a socket in one of
//! two ways: the program sends a [`CtlKind::BindModule`] control message (the binding —
//! module bytes or the hash of one already loaded, properties — and the files it may send
//! by `SCM_RIGHTS`), or a rule of the server's [`ModuleConfig`] matches a connection
//! accepted on a published port or a connect to a destination. Modules are compiled once
//! and cached by SHA-256.
//!
//! A program that sends the same files again and again registers them once
//! ([`CtlKind::RegisterFile`], like io_uring's registered files): the descriptor travels
//! and is checked once, the channel's [`FileTable`] keeps it (at most
//! [`MAX_REGISTERED_FILES`], dropped with the channel), and bindings name it by handle —
//! no descriptor passing, no check, no close per binding. An instance shares the table's
//! file (`Arc`), so unregistering a file that a running instance still sends is safe.
//!
//! A bound socket keeps its instance and an [`Outbox`]. The program's sends on it are not
//! sent: `flush_tx` hands them here, and each one is copied out of its channel buffer
//! (which goes back to the program at once), fed to the instance, and what the instance
//! emits is queued in the outbox — only while the outbox holds less than
//! [`HIGH_WATER`] bytes, so a slow peer holds the program's buffers (back-pressure). The
//! outbox is written when the host socket is writable (the same `EPOLLOUT` that drives
//! queued sends). The program's `shutdown(SHUT_WR)` or last `close` ends the input
//! (`Instance::close`); the `SHUT_WR` or the close of the host socket happen once the
//! outbox is empty. When the instance has finished and its output is out, the instance is
//! dropped and the socket is a plain socket again (later sends go out as they are).
//!
//! A module that fails (trap, deadline, memory cap, negative status, a file shorter than
//! it said) stops only its own socket: the connection is reset (`SO_LINGER` 0 +
//! disconnect), the program's parked receives and its next sends fail with `EIO`, and the
//! failure is logged and counted. The event loop is stalled at most one callback's
//! deadline.
//!
//! Owns the bound modules and their outboxes, the module cache and each channel's
//! registered files (reached from outside only through `Modules`' methods). Must not:
//! let a module's failure touch another socket, or keep a program's buffer past its send.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use ferry_modules::{Instance, Limits, ModuleHost, ModuleId, Outbox};
use ferry_proto::{
    Binding, BufRef, CTL_BLOB_FD, Cmp, CmpKind, Ctl, CtlKind, MAX_BINDING_BYTES, MAX_FILES,
    MAX_INLINE_BINDING, MAX_REGISTERED_FILES, ModuleRef, ProtoError, module_hash,
};
use tracing::{debug, warn};

use crate::ops::Errno;
use crate::server::Server;
use crate::sock::Parked;

/// Default of [`ModuleConfig::copy_max`].
pub const DEFAULT_COPY_MAX: u64 = 4 << 20;
/// Stop feeding a module while its outbox holds more than this (bytes).
pub const HIGH_WATER: u64 = 256 * 1024;
/// Finished instances kept for dropping at idle time, at most.
const MAX_SPENT: usize = 32;
/// Largest control packet read (a `Ctl` plus an inline binding).
pub(crate) const CTL_PACKET_MAX: usize = size_of::<Ctl>() + MAX_INLINE_BINDING;

/// Which connections a configured module is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleTarget {
    /// Connections accepted through the published port whose sandbox port is this.
    Port(u16),
    /// Connections the sandbox makes to this destination.
    Dest(SocketAddr),
}

impl std::fmt::Display for ModuleTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleTarget::Port(p) => write!(f, "published port {p}"),
            ModuleTarget::Dest(a) => write!(f, "destination {a}"),
        }
    }
}

/// A module the server binds on its own (`ferry run --module`).
#[derive(Clone)]
pub struct ModuleRule {
    /// Where.
    pub target: ModuleTarget,
    /// The module (binary wasm or `.wat` text).
    pub module: Vec<u8>,
    /// Its properties.
    pub props: Vec<(String, String)>,
}

impl std::fmt::Debug for ModuleRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleRule")
            .field("target", &self.target)
            .field("module_bytes", &self.module.len())
            .field("props", &self.props)
            .finish()
    }
}

/// How the server runs modules.
#[derive(Clone, Debug)]
pub struct ModuleConfig {
    /// Limits of every instance. The deadline is the longest one callback may stall the
    /// event loop.
    pub limits: Limits,
    /// Modules bound by the server itself.
    pub rules: Vec<ModuleRule>,
    /// Instances of each module in use kept ready ahead of time (made when the loop is
    /// idle), so that a start only runs `init`.
    pub spares: usize,
    /// File ranges a module emits of at most this many bytes are copied (`pread` into
    /// a buffer, then `send`) instead of sent with `sendfile` (0: always `sendfile`).
    /// Measured with `ferry bench E6` over veth: copying was faster up to 4 MB,
    /// `sendfile` at 6 MB (docs/MODULES.md).
    pub copy_max: u64,
}

impl Default for ModuleConfig {
    fn default() -> Self {
        ModuleConfig {
            limits: Limits {
                memory_bytes: 16 << 20,
                deadline: Duration::from_millis(5),
                max_instances: 256,
                interrupt: ferry_modules::Interrupt::Epoch,
            },
            rules: Vec::new(),
            spares: 2,
            copy_max: DEFAULT_COPY_MAX,
        }
    }
}

/// A configured module, loaded: where, which, its properties.
type Rule = (ModuleTarget, ModuleId, Vec<(String, String)>);

/// A bound socket's module.
enum Bound {
    /// Running or finished, with output waiting.
    Live { inst: Box<Instance>, outbox: Outbox },
    /// Failed: the connection was reset; sends fail with `EIO` until the program closes.
    Failed,
}

/// One channel's registered files, by handle (the lowest free handle is reused).
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    slots: Vec<Option<Arc<OwnedFd>>>,
}

impl FileTable {
    /// Registers `f`; its handle, or `-ENFILE` when [`MAX_REGISTERED_FILES`] are.
    fn insert(&mut self, f: OwnedFd) -> Result<u32, Errno> {
        let f = Some(Arc::new(f));
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            self.slots[i] = f;
            return Ok(u32::try_from(i).unwrap_or(u32::MAX));
        }
        if self.slots.len() >= MAX_REGISTERED_FILES {
            return Err(Errno(libc::ENFILE));
        }
        self.slots.push(f);
        Ok(u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX))
    }

    /// Forgets handle `h`; false when it is not registered.
    fn remove(&mut self, h: u32) -> bool {
        let gone = self
            .slots
            .get_mut(h as usize)
            .and_then(Option::take)
            .is_some();
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        gone
    }

    fn get(&self, h: u32) -> Option<&Arc<OwnedFd>> {
        self.slots.get(h as usize)?.as_ref()
    }

    /// Whether no file is registered (trailing free slots are dropped as they free up).
    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// The server's module state.
pub(crate) struct Modules {
    cfg: ModuleConfig,
    host: Option<Arc<ModuleHost>>,
    by_hash: HashMap<[u8; 32], ModuleId>,
    rules: Vec<Rule>,
    bound: HashMap<u32, Bound>,
    /// Modules started at least once (kept prewarmed).
    hot: Vec<ModuleId>,
    /// Finished instances, dropped when the loop is idle.
    spent: Vec<Instance>,
    /// Files of ring bindings whose control packet was read first, by channel.
    files: HashMap<u32, VecDeque<Vec<OwnedFd>>>,
    /// Registered files, by channel (dropped with the channel).
    registered: HashMap<u32, FileTable>,
    ctl_buf: Vec<u8>,
}

impl std::fmt::Debug for Modules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modules")
            .field("loaded", &self.by_hash.len())
            .field("bound", &self.bound.len())
            .finish_non_exhaustive()
    }
}

/// Why the configured modules could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The module host could not be made.
    #[error("module host: {0}")]
    Host(ferry_modules::Error),
    /// A configured module does not load.
    #[error("module for {target}: {source}")]
    Load {
        /// Its rule's target.
        target: ModuleTarget,
        /// Why.
        source: ferry_modules::Error,
    },
}

/// What one step of a module's flush says.
enum Step {
    /// Go on: the module took input or its input ended.
    Again,
    /// Stop; whether the socket's sends are handled (the plain path must not send them).
    Stop(bool),
}

/// Feeds `inst` the unsent part of queued send `item`; its actions go to `outbox`.
fn feed_item(
    inst: &mut Instance,
    outbox: &mut Outbox,
    item: &crate::sock::TxItem,
) -> Result<(), String> {
    let mut data = vec![0u8; item.span.len() as usize];
    item.bufs.read(item.span, &mut data);
    data.drain(..item.sent.min(data.len()));
    let actions = inst.feed(data).map_err(|e| e.to_string())?;
    outbox.push(actions);
    Ok(())
}

/// A duration in whole nanoseconds for the counters (saturating).
fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Modules {
    /// Whether published port `port` has a module rule (a connection from it must be
    /// served where the rule is applied).
    pub(crate) fn has_port_rule(&self, port: u16) -> bool {
        self.rules
            .iter()
            .any(|(t, ..)| *t == ModuleTarget::Port(port))
    }

    /// Channel `idx` is gone: the files it sent or registered go with it.
    pub(crate) fn channel_closed(&mut self, idx: u32) {
        self.files.remove(&idx);
        self.registered.remove(&idx);
    }

    /// Loads the configured modules (making the host only if there are any).
    pub(crate) fn new(cfg: ModuleConfig) -> Result<Modules, ModuleError> {
        let mut m = Modules {
            cfg,
            host: None,
            by_hash: HashMap::new(),
            rules: Vec::new(),
            bound: HashMap::new(),
            hot: Vec::new(),
            files: HashMap::new(),
            registered: HashMap::new(),
            spent: Vec::new(),
            ctl_buf: Vec::new(),
        };
        for rule in std::mem::take(&mut m.cfg.rules) {
            let id = m.load(&rule.module).map_err(|e| match e {
                ferry_modules::Error::Engine(_) => ModuleError::Host(e),
                source => ModuleError::Load {
                    target: rule.target,
                    source,
                },
            })?;
            m.rules.push((rule.target, id, rule.props));
        }
        Ok(m)
    }

    fn host(&mut self) -> Result<&Arc<ModuleHost>, ferry_modules::Error> {
        if self.host.is_none() {
            self.host = Some(Arc::new(ModuleHost::new(self.cfg.limits.clone())?));
        }
        Ok(self.host.as_ref().expect("just made"))
    }

    /// Loads (compiles) a module unless one with the same bytes is loaded.
    fn load(&mut self, bytes: &[u8]) -> Result<ModuleId, ferry_modules::Error> {
        let h = module_hash(bytes);
        if let Some(&id) = self.by_hash.get(&h) {
            return Ok(id);
        }
        let id = self.host()?.load(bytes)?;
        self.by_hash.insert(h, id);
        Ok(id)
    }

    /// Whether socket `id` has a module (running, with output waiting, or failed).
    pub(crate) fn is_bound(&self, id: u32) -> bool {
        self.bound.contains_key(&id)
    }

    /// Whether any module still has output to write.
    pub(crate) fn busy(&self) -> bool {
        self.bound
            .values()
            .any(|b| matches!(b, Bound::Live { outbox, .. } if !outbox.is_empty()))
    }

    /// A buffer for one control packet (give it back with [`Modules::put_ctl_buf`]).
    pub(crate) fn take_ctl_buf(&mut self) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.ctl_buf);
        b.resize(CTL_PACKET_MAX, 0);
        b
    }

    pub(crate) fn put_ctl_buf(&mut self, b: Vec<u8>) {
        self.ctl_buf = b;
    }
}

/// The errno a failed binding answers with.
fn bind_errno(e: &ferry_modules::Error) -> Errno {
    use ferry_modules::Error as E;
    Errno(match e {
        E::BadModule(_) | E::UnknownModule(_) | E::File { .. } => libc::EINVAL,
        E::NoCapacity(_) => libc::ENOBUFS,
        E::Engine(_) => libc::ENOMEM,
        _ => libc::EIO,
    })
}

/// Reads a binding that came in a memfd of `len` bytes.
fn read_blob(fd: &OwnedFd, len: usize) -> Result<Vec<u8>, Errno> {
    let st = rustix::fs::fstat(fd).map_err(|e| Errno(e.raw_os_error()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
        || i64::try_from(len).ok() != Some(st.st_size)
        || len > MAX_BINDING_BYTES
    {
        return Err(Errno(libc::EINVAL));
    }
    let mut out = vec![0u8; len];
    let mut at = 0;
    while at < len {
        match rustix::io::pread(fd, &mut out[at..], at as u64) {
            Ok(0) => return Err(Errno(libc::EINVAL)),
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Errno(e.raw_os_error())),
        }
    }
    Ok(out)
}

/// A file a module may send: a regular file open for reading.
fn check_file(fd: &OwnedFd) -> Result<(), Errno> {
    let st = rustix::fs::fstat(fd).map_err(|_| Errno(libc::EBADF))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(Errno(libc::EINVAL));
    }
    let fl = rustix::fs::fcntl_getfl(fd).map_err(|_| Errno(libc::EBADF))?;
    if fl.contains(rustix::fs::OFlags::PATH)
        || fl & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::WRONLY
    {
        return Err(Errno(libc::EBADF));
    }
    Ok(())
}

impl Server {
    /// A `BindModule` control message: `inline` is what followed the header in its
    /// packet. Always answers (0 or a negated errno); never closes the channel.
    pub(crate) fn bind_module_ctl(&mut self, ch: u32, msg: Ctl, inline: &[u8], fds: Vec<OwnedFd>) {
        // Program order: sends queued before the binding go out before the module's
        // output.
        self.drain_rings();
        let result = self.bind_from_ctl(ch, &msg, inline, fds);
        if result.is_err() {
            self.stats.module_refused += 1;
        }
        // Answer first: the program goes on while the output is written.
        self.ctl_reply(ch, Server::new_reply(result));
        if result.is_ok() {
            self.flush_tx(msg.sock);
        }
    }

    fn bind_from_ctl(
        &mut self,
        ch: u32,
        msg: &Ctl,
        inline: &[u8],
        mut fds: Vec<OwnedFd>,
    ) -> Result<(), Errno> {
        let id = msg.sock;
        let Some(s) = self.socks.get_mut(&id) else {
            return Err(Errno(libc::EBADF));
        };
        s.last_ch = ch;
        s.stats.calls += 1;
        let len = usize::try_from(msg.a).map_err(|_| Errno(libc::EINVAL))?;
        let blob = if msg.c & CTL_BLOB_FD != 0 {
            if !inline.is_empty() || fds.is_empty() {
                return Err(Errno(libc::EINVAL));
            }
            read_blob(&fds.remove(0), len)?
        } else {
            if inline.len() != len {
                return Err(Errno(libc::EINVAL));
            }
            inline.to_vec()
        };
        self.bind_blob(ch, id, &blob, usize::try_from(msg.b).ok(), fds)
    }

    /// A binding of channel `ch` and its files, whichever way they came. The module's
    /// files are the passed ones, then the registered ones the binding names.
    fn bind_blob(
        &mut self,
        ch: u32,
        id: u32,
        blob: &[u8],
        declared_files: Option<usize>,
        fds: Vec<OwnedFd>,
    ) -> Result<(), Errno> {
        if fds.len() > MAX_FILES || declared_files != Some(fds.len()) {
            return Err(Errno(libc::EINVAL));
        }
        for f in &fds {
            check_file(f)?;
        }
        let binding = Binding::decode(blob).map_err(|e| {
            debug!("socket {id}: module binding refused: {e}");
            Errno(libc::EINVAL)
        })?;
        let mut files: Vec<Arc<OwnedFd>> = Vec::with_capacity(fds.len() + binding.handles.len());
        files.extend(fds.into_iter().map(Arc::new));
        if !binding.handles.is_empty() {
            let table = self.modules.registered.get(&ch);
            for &h in &binding.handles {
                let f = table.and_then(|t| t.get(h)).ok_or_else(|| {
                    debug!("socket {id}: binding names unregistered file {h}");
                    Errno(libc::EBADF)
                })?;
                files.push(Arc::clone(f));
            }
        }
        let module = match binding.module {
            ModuleRef::Bytes(b) => {
                let before = self.modules.by_hash.len();
                let m = self.modules.load(b).map_err(|e| {
                    warn!("socket {id}: module refused: {e}");
                    bind_errno(&e)
                })?;
                self.stats.modules_loaded += (self.modules.by_hash.len() - before) as u64;
                m
            }
            ModuleRef::Hash(h) => *self.modules.by_hash.get(&h).ok_or(Errno(libc::ENOENT))?,
        };
        self.attach(id, module, &binding.props, files)
    }

    /// A `RegisterFile` control message: checks the file once and enters it in channel
    /// `ch`'s table. Answers with the handle or a negated errno.
    pub(crate) fn register_file_ctl(&mut self, ch: u32, mut fds: Vec<OwnedFd>) {
        let result = match (fds.pop(), fds.is_empty()) {
            (Some(f), true) => check_file(&f).and_then(|()| {
                self.modules
                    .registered
                    .entry(ch)
                    .or_default()
                    .insert(f)
                    .map(u32::cast_signed)
            }),
            _ => Err(Errno(libc::EINVAL)),
        };
        self.ctl_reply(ch, Server::new_reply(result));
    }

    /// An `UnregisterFile` control message (`a` = handle). Bindings this channel queued on
    /// its ring before it still see the file; instances already started keep it open.
    pub(crate) fn unregister_file_ctl(&mut self, ch: u32, msg: Ctl, fds: Vec<OwnedFd>) {
        self.drain_rings();
        if !fds.is_empty() {
            self.ctl_reply(ch, Server::new_reply(Errno(libc::EINVAL)));
            return;
        }
        let known = u32::try_from(msg.a).is_ok_and(|h| {
            self.modules
                .registered
                .get_mut(&ch)
                .is_some_and(|t| t.remove(h))
        });
        if self
            .modules
            .registered
            .get(&ch)
            .is_some_and(FileTable::is_empty)
        {
            self.modules.registered.remove(&ch);
        }
        let result = if known {
            Ok(())
        } else {
            Err(Errno(libc::EBADF))
        };
        self.ctl_reply(ch, Server::new_reply(result));
    }

    /// An `Op::BindModule` record: the binding is in the lent buffer, the files came
    /// just before on the control socket. `Err` means the channel broke the protocol.
    pub(crate) fn bind_module_req(
        &mut self,
        ch: u32,
        id: u32,
        tag: u32,
        binding: BufRef,
        files: u32,
    ) -> Result<(), ProtoError> {
        let Some(chan) = self.chan_mut(ch) else {
            return Ok(());
        };
        let span = chan.lent_span(binding.id, 0, binding.len)?;
        let mut blob = vec![0u8; span.len() as usize];
        chan.ep.bufs.read(span, &mut blob);
        self.give_back(ch, id, binding.id);
        let nfiles = files as usize;
        let fds = if nfiles == 0 {
            Vec::new()
        } else {
            self.take_files(ch)?
        };
        let result = match self.socks.get_mut(&id) {
            None => Err(Errno(libc::EBADF)),
            Some(s) => {
                s.last_ch = ch;
                s.stats.calls += 1;
                self.bind_blob(ch, id, &blob, Some(nfiles), fds)
            }
        };
        if result.is_err() {
            self.stats.module_refused += 1;
        }
        if tag != 0 {
            self.done(ch, id, tag, result);
            // The program waits for this answer, not for the output: publish it now.
            if let Some(c) = self.chan_mut(ch) {
                c.flush();
            }
        } else if let Err(e) = result {
            self.done(ch, id, 0, e);
        }
        if result.is_ok() {
            self.flush_tx(id);
        }
        Ok(())
    }

    /// The files of channel `ch`'s next ring binding: stashed by `ctl_readable`, or the
    /// next control packet (sent before the record, so already queued).
    fn take_files(&mut self, ch: u32) -> Result<Vec<OwnedFd>, ProtoError> {
        if let Some(f) = self
            .modules
            .files
            .get_mut(&ch)
            .and_then(VecDeque::pop_front)
        {
            return Ok(f);
        }
        let Some(chan) = self.chan(ch) else {
            return Err(ProtoError::MissingFiles);
        };
        let mut buf = [0u8; size_of::<Ctl>()];
        match ferry_sys::recv_with_fds(chan.ctl.as_fd(), &mut buf, libc::MSG_DONTWAIT) {
            Ok((n, fds)) if n == buf.len() => {
                let msg: Ctl = bytemuck::pod_read_unaligned(&buf);
                if msg.kind() == Some(CtlKind::Files) {
                    Ok(fds)
                } else {
                    Err(ProtoError::CtlKind(msg.kind))
                }
            }
            _ => Err(ProtoError::MissingFiles),
        }
    }

    /// A `Files` control packet read before its ring record: keep it for the record.
    pub(crate) fn stash_files(&mut self, ch: u32, fds: Vec<OwnedFd>) {
        let q = self.modules.files.entry(ch).or_default();
        if q.len() >= 4 {
            self.bad_channel(ch, "module files without their bindings");
            return;
        }
        q.push_back(fds);
    }

    /// Starts module `module` on socket `id`. A failing `init` fails the socket.
    fn attach<K: AsRef<str>, V: AsRef<str>>(
        &mut self,
        id: u32,
        module: ModuleId,
        props: &[(K, V)],
        files: Vec<Arc<OwnedFd>>,
    ) -> Result<(), Errno> {
        let Some(s) = self.socks.get(&id) else {
            return Err(Errno(libc::EBADF));
        };
        if !s.is_stream() || s.listening() {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        if !s.connected() && !s.connecting() {
            return Err(Errno(libc::ENOTCONN));
        }
        // A module that has finished but whose output is still going out is followed
        // by the new one (its output queues behind); a running one is not replaced.
        let pending = match self.modules.bound.get_mut(&id) {
            None => Outbox::new(),
            Some(Bound::Live { inst, outbox }) if inst.is_finished() => std::mem::take(outbox),
            Some(_) => return Err(Errno(libc::EBUSY)),
        };
        let host = Arc::clone(self.modules.host().map_err(|e| bind_errno(&e))?);
        match host.start_shared(module, props, files) {
            Ok((inst, actions)) => {
                let (make, init) = inst.start_timing();
                self.stats.module_start_ns += nanos(make);
                self.stats.module_init_ns += nanos(init);
                let mut outbox = pending;
                outbox.set_copy_max(self.modules.cfg.copy_max);
                outbox.push(actions);
                let inst = Box::new(inst);
                self.modules.bound.insert(id, Bound::Live { inst, outbox });
                self.stats.modules_started += 1;
                if !self.modules.hot.contains(&module) {
                    self.modules.hot.push(module);
                }
                Ok(())
            }
            Err(e @ ferry_modules::Error::NoCapacity(_)) => {
                warn!("socket {id}: module not started: {e}");
                if let Some(Bound::Live { outbox, .. }) = self.modules.bound.get_mut(&id) {
                    *outbox = pending;
                }
                Err(bind_errno(&e))
            }
            Err(e) => {
                self.module_failed(id, &e.to_string());
                Err(Errno(libc::EIO))
            }
        }
    }

    /// Sends of a module-bound socket: feeds them to the module and writes its output.
    /// Returns false when the socket is (now) a plain socket: the caller sends its queue.
    pub(crate) fn module_flush(&mut self, id: u32) -> bool {
        loop {
            let step = match self.modules.bound.get(&id) {
                None => return false,
                Some(Bound::Failed) => return self.fail_module_sends(id),
                Some(Bound::Live { .. }) => self.module_step(id),
            };
            if let Step::Stop(handled) = step {
                return handled;
            }
        }
    }

    /// Socket `id`'s module failed (reset already): the sends queued for it give their
    /// buffers back, and the program hears `EIO` once.
    fn fail_module_sends(&mut self, id: u32) -> bool {
        let Some(s) = self.socks.get_mut(&id) else {
            return false;
        };
        let items: Vec<_> = s.txq.drain(..).collect();
        let ch = s.last_ch;
        for (i, item) in items.into_iter().enumerate() {
            self.give_back(item.ch, id, item.span.id().0);
            if i == 0 {
                self.complete_on(
                    ch,
                    Cmp::new(CmpKind::AsyncError, id, 0, Errno(libc::EIO).wire()),
                );
            }
        }
        true
    }

    /// One step of socket `id`'s live module: write what its outbox holds, then feed
    /// it the next send, or end its input, or notice that it has finished.
    fn module_step(&mut self, id: u32) -> Step {
        let (Some(s), Some(Bound::Live { inst, outbox })) =
            (self.socks.get_mut(&id), self.modules.bound.get_mut(&id))
        else {
            return Step::Stop(false);
        };
        if s.connecting() {
            return Step::Stop(true);
        }
        let t = std::time::Instant::now();
        let written = outbox.advance(s.fd.as_fd());
        self.stats.module_write_ns += nanos(t.elapsed());
        match written {
            Ok(n) => {
                s.stats.bytes_out += n;
                self.stats.module_bytes_out += n;
                if n > 0 {
                    self.stats.data_syscalls += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.module_failed(id, &format!("writing its output: {e}"));
                return Step::Stop(true);
            }
            Err(e) => {
                // The connection broke (the peer reset it): not the module's fault.
                // Drop the module; the plain path reports the error to the program.
                debug!("socket {id}: module output not written: {e}");
                self.modules.bound.remove(&id);
                return Step::Stop(false);
            }
        }
        if !outbox.is_empty() && outbox.pending_bytes() >= HIGH_WATER {
            // Back-pressure: the program's buffers wait for EPOLLOUT.
            return Step::Stop(true);
        }
        let running = !inst.is_finished();
        if running && let Some(item) = s.txq.pop_front() {
            let fed = feed_item(inst, outbox, &item);
            self.give_back(item.ch, id, item.span.id().0);
            if let Err(why) = fed {
                self.module_failed(id, &why);
                return Step::Stop(true);
            }
            return Step::Again;
        }
        if running && (s.shut_wr_pending || s.app_closed) {
            return match inst.close() {
                Ok(actions) => {
                    outbox.push(actions);
                    Step::Again
                }
                Err(e) => {
                    self.module_failed(id, &e.to_string());
                    Step::Stop(true)
                }
            };
        }
        if running || !outbox.is_empty() {
            return Step::Stop(true);
        }
        Step::Stop(self.module_finished(id))
    }

    /// Socket `id`'s module has finished and its output is written: the socket is a
    /// plain socket again. The instance is dropped when the loop is idle (returning its
    /// slot costs microseconds). Whether the socket's sends were all handled.
    fn module_finished(&mut self, id: u32) -> bool {
        if let Some(Bound::Live { inst, .. }) = self.modules.bound.remove(&id) {
            if self.modules.spent.len() >= MAX_SPENT {
                self.modules.spent.remove(0);
            }
            self.modules.spent.push(*inst);
        }
        debug!("socket {id}: module finished");
        let Some(s) = self.socks.get_mut(&id) else {
            return true;
        };
        if !s.txq.is_empty() {
            return false;
        }
        if s.shut_wr_pending {
            s.shut_wr_pending = false;
            let _ = self.io.shutdown(s.fd.as_fd(), libc::SHUT_WR);
        }
        if s.app_closed {
            self.dirty.push(id);
        }
        true
    }

    /// Whether closed socket `id` may go: its module (if any) is done. Ends the module's
    /// input first.
    pub(crate) fn module_settled(&mut self, id: u32) -> bool {
        match self.modules.bound.get(&id) {
            None => true,
            Some(Bound::Failed) => {
                self.modules.bound.remove(&id);
                true
            }
            Some(Bound::Live { .. }) => {
                self.module_flush(id);
                !self.modules.is_bound(id)
            }
        }
    }

    /// A module failed: stop it, reset its connection, fail the program's operations on
    /// the socket with `EIO`. Nothing else is touched.
    fn module_failed(&mut self, id: u32, why: &str) {
        let io = self.io;
        warn!("socket {id}: module stopped ({why}); resetting the connection");
        self.stats.modules_failed += 1;
        self.modules.bound.insert(id, Bound::Failed);
        let Some(s) = self.socks.get_mut(&id) else {
            return;
        };
        let _ = io.linger_reset(s.fd.as_fd());
        // Disconnecting a TCP socket sends a reset and keeps the descriptor (the program
        // still holds its socket; it is closed when the program closes it).
        let _ = io.connect_unspec(s.fd.as_fd());
        s.shut_wr_pending = false;
        s.hup_reported = true;
        let parked: Vec<Parked> = s.parked.drain(..).collect();
        let items: Vec<_> = s.txq.drain(..).collect();
        let ch = s.last_ch;
        s.mirror_eof(io);
        for item in items {
            self.give_back(item.ch, id, item.span.id().0);
        }
        let mut reported = false;
        for p in parked {
            match p {
                Parked::Recv { ch, tag, .. } | Parked::Connect { ch, tag } => {
                    reported = true;
                    self.complete_on(
                        ch,
                        Cmp::new(CmpKind::Done, id, tag, Errno(libc::EIO).wire()),
                    );
                }
                Parked::Accept { ch, .. } => {
                    self.ctl_reply(ch, Server::new_reply(Errno(libc::EIO)));
                }
            }
        }
        if !reported {
            self.complete_on(
                ch,
                Cmp::new(CmpKind::AsyncError, id, 0, Errno(libc::EIO).wire()),
            );
        }
        if self.socks.get(&id).is_some_and(|s| s.app_closed) {
            self.dirty.push(id);
        }
    }

    fn complete_on(&mut self, ch: u32, c: Cmp) {
        if let Some(chan) = self.chan_mut(ch) {
            chan.complete(c);
        }
    }

    fn give_back(&mut self, ch: u32, id: u32, buf: u32) {
        let mut c = Cmp::new(CmpKind::BufReturn, id, 0, 0);
        c.buf = buf;
        self.complete_on(ch, c);
    }

    /// Socket `id` was just accepted from published port `port`: bind the port's
    /// configured module, if any.
    pub(crate) fn module_on_accept(&mut self, id: u32, port: u16) {
        self.apply_rule(id, ModuleTarget::Port(port));
    }

    /// Socket `id` is connecting (or connected) to `to`: bind the configured module of
    /// that destination, if any.
    pub(crate) fn module_on_connect(&mut self, id: u32, to: SocketAddr) {
        if !self.modules.rules.is_empty() {
            self.apply_rule(id, ModuleTarget::Dest(to));
        }
    }

    fn apply_rule(&mut self, id: u32, target: ModuleTarget) {
        let Some((_, module, props)) = self.modules.rules.iter().find(|(t, ..)| *t == target)
        else {
            return;
        };
        let (module, props) = (*module, props.clone());
        match self.attach(id, module, &props, Vec::new()) {
            Ok(()) => self.flush_tx(id),
            Err(e) => warn!(
                "socket {id}: configured module for {target} not bound (errno {})",
                e.0
            ),
        }
    }

    /// A turn of the loop without requests: drop one finished instance, keep spares of
    /// the modules in use (a little work per idle turn, none on the request path).
    pub(crate) fn module_idle(&mut self) {
        self.modules.spent.pop();
        let Some(host) = self.modules.host.clone() else {
            return;
        };
        for &m in &self.modules.hot {
            if let Err(e) = host.prewarm(m, self.modules.cfg.spares) {
                debug!("prewarm of module {m:?}: {e}");
            }
        }
    }
}
