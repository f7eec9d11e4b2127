//! [`Instance`]: one running module bound to one socket, its host state (buffers,
//! properties, files, recorded actions) and the host calls of the ABI.

use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use wasmtime::{
    Caller, Extern, Linker, Memory, PoolConcurrencyLimitError, ResourceLimiter, Store, Trap,
    TypedFunc,
};

use crate::abi::{self, ERR_ABSENT, ERR_BADF, ERR_INVAL, ERR_RANGE};
use crate::error::HostStop;
use crate::host::{Inner, Loaded, TABLE_ELEMENTS};
use crate::{Action, Error};

/// Buffer handles one instance may hold at once.
pub const MAX_HANDLES: usize = 1024;
/// Longest log message kept (bytes); the rest is cut.
pub const MAX_LOG_BYTES: usize = 1024;
/// Log calls per callback that reach the log; later ones are dropped.
pub const MAX_LOGS_PER_CALLBACK: u32 = 64;

type R<T> = wasmtime::Result<T>;

/// Refuses linear memory (and table) growth beyond the cap: the growth traps and the
/// instance stops with [`Error::MemoryLimit`].
#[derive(Debug)]
pub(crate) struct Limiter {
    cap: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> R<bool> {
        if desired > self.cap {
            return Err(HostStop::MemoryLimit(format!(
                "linear memory growth from {current} to {desired} bytes, cap {}",
                self.cap
            ))
            .into());
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> R<bool> {
        if desired > TABLE_ELEMENTS {
            return Err(HostStop::MemoryLimit(format!(
                "table growth to {desired} elements, cap {TABLE_ELEMENTS}"
            ))
            .into());
        }
        Ok(true)
    }
}

/// The host side of one instance, kept in its wasmtime store.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) limiter: Limiter,
    memory: Option<Memory>,
    props: Vec<(Box<str>, Box<str>)>,
    files: Vec<Arc<OwnedFd>>,
    bufs: Vec<Option<Vec<u8>>>,
    free: Vec<u32>,
    live: usize,
    /// Bytes in live buffers plus bytes emitted by the running callback.
    held: usize,
    /// Bytes emitted by the running callback (released when it returns).
    emitted: usize,
    cap: usize,
    actions: Vec<Action>,
    logs: u32,
}

impl State {
    /// A state with no properties and no files yet (see [`Instance::set_inputs`]).
    pub(crate) fn new(cap: usize) -> State {
        State {
            limiter: Limiter { cap },
            memory: None,
            props: Vec::new(),
            files: Vec::new(),
            bufs: Vec::new(),
            free: Vec::new(),
            live: 0,
            held: 0,
            emitted: 0,
            cap,
            actions: Vec::new(),
            logs: 0,
        }
    }

    fn buf(&self, h: i32) -> Option<&Vec<u8>> {
        self.bufs.get(usize::try_from(h).ok()?)?.as_ref()
    }

    fn buf_mut(&mut self, h: i32) -> Option<&mut Vec<u8>> {
        self.bufs.get_mut(usize::try_from(h).ok()?)?.as_mut()
    }

    /// Accounts `n` more bytes held by the instance.
    fn charge(&mut self, n: usize, call: &str) -> Result<(), HostStop> {
        match self.held.checked_add(n) {
            Some(h) if h <= self.cap => {
                self.held = h;
                Ok(())
            }
            _ => Err(HostStop::MemoryLimit(format!(
                "{call}: host buffers would hold {} + {n} bytes, cap {}",
                self.held, self.cap
            ))),
        }
    }

    /// Stores a buffer (already charged) and returns its handle.
    fn insert(&mut self, v: Vec<u8>) -> Result<i32, HostStop> {
        if self.live >= MAX_HANDLES {
            return Err(HostStop::MemoryLimit(format!(
                "more than {MAX_HANDLES} buffer handles"
            )));
        }
        self.live += 1;
        let idx = match self.free.pop() {
            Some(i) => {
                self.bufs[i as usize] = Some(v);
                i as usize
            }
            None => {
                self.bufs.push(Some(v));
                self.bufs.len() - 1
            }
        };
        Ok(idx as i32)
    }

    fn take(&mut self, h: i32) -> Option<Vec<u8>> {
        let i = usize::try_from(h).ok()?;
        let v = self.bufs.get_mut(i)?.take()?;
        self.free.push(i as u32);
        self.live = self.live.saturating_sub(1);
        Some(v)
    }

    /// Called after every callback: what was emitted is the server's now.
    fn end_callback(&mut self) {
        self.held = self.held.saturating_sub(self.emitted);
        self.emitted = 0;
        self.logs = 0;
    }

    /// Called when the instance stops: nothing it held is useful any more.
    fn release_all(&mut self) {
        self.actions.clear();
        self.bufs.clear();
        self.free.clear();
        self.live = 0;
        self.held = 0;
        self.emitted = 0;
    }
}

/// `ptr..ptr+len` in a memory of `mem_len` bytes, or a trap.
fn mem_range(mem_len: usize, call: &'static str, ptr: i32, len: i32) -> R<Range<usize>> {
    let (p, l) = (ptr as u32, len as u32);
    let start = p as usize;
    match start.checked_add(l as usize) {
        Some(end) if end <= mem_len => Ok(start..end),
        _ => Err(HostStop::OutOfBounds {
            call,
            ptr: p,
            len: l,
        }
        .into()),
    }
}

/// The module's memory and the host state, borrowed together.
fn split<'a>(
    caller: &'a mut Caller<'_, State>,
    call: &'static str,
) -> R<(&'a mut [u8], &'a mut State)> {
    let mem = caller.data().memory.ok_or(HostStop::NoMemory(call))?;
    Ok(mem.data_and_store_mut(caller))
}

/// Defines every import of the ABI (`abi::IMPORTS`) in `linker`.
pub(crate) fn define_imports(linker: &mut Linker<State>) -> R<()> {
    let m = abi::IMPORT_MODULE;

    linker.func_wrap(m, "buf_len", |caller: Caller<'_, State>, h: i32| -> i32 {
        match caller.data().buf(h) {
            Some(b) => i32::try_from(b.len()).unwrap_or(i32::MAX),
            None => ERR_BADF,
        }
    })?;

    linker.func_wrap(
        m,
        "buf_read",
        |mut caller: Caller<'_, State>, h: i32, off: i32, dst: i32, len: i32| -> R<i32> {
            if len < 0 || off < 0 {
                return Ok(ERR_INVAL);
            }
            let (mem, st) = split(&mut caller, "buf_read")?;
            let Some(b) = st.buf(h) else {
                return Ok(ERR_BADF);
            };
            let off = off as usize;
            if off > b.len() {
                return Ok(ERR_RANGE);
            }
            let n = (len as usize).min(b.len() - off);
            let r = mem_range(mem.len(), "buf_read", dst, n as i32)?;
            mem[r].copy_from_slice(&b[off..off + n]);
            Ok(n as i32)
        },
    )?;

    linker.func_wrap(
        m,
        "buf_new",
        |mut caller: Caller<'_, State>, src: i32, len: i32| -> R<i32> {
            if len < 0 {
                return Ok(ERR_INVAL);
            }
            let (mem, st) = split(&mut caller, "buf_new")?;
            let r = mem_range(mem.len(), "buf_new", src, len)?;
            st.charge(r.len(), "buf_new")?;
            Ok(st.insert(mem[r].to_vec())?)
        },
    )?;

    linker.func_wrap(
        m,
        "buf_write",
        |mut caller: Caller<'_, State>, h: i32, off: i32, src: i32, len: i32| -> R<i32> {
            if len < 0 || off < 0 {
                return Ok(ERR_INVAL);
            }
            let (mem, st) = split(&mut caller, "buf_write")?;
            let r = mem_range(mem.len(), "buf_write", src, len)?;
            let Some(cur) = st.buf(h).map(Vec::len) else {
                return Ok(ERR_BADF);
            };
            let off = off as usize;
            if off > cur {
                return Ok(ERR_RANGE);
            }
            let end = off + r.len();
            st.charge(end.saturating_sub(cur), "buf_write")?;
            let Some(b) = st.buf_mut(h) else {
                return Ok(ERR_BADF);
            };
            if end > b.len() {
                b.resize(end, 0);
            }
            b[off..end].copy_from_slice(&mem[r]);
            Ok(0)
        },
    )?;

    linker.func_wrap(
        m,
        "buf_prepend",
        |mut caller: Caller<'_, State>, h: i32, src: i32, len: i32| -> R<i32> {
            if len < 0 {
                return Ok(ERR_INVAL);
            }
            let (mem, st) = split(&mut caller, "buf_prepend")?;
            let r = mem_range(mem.len(), "buf_prepend", src, len)?;
            if st.buf(h).is_none() {
                return Ok(ERR_BADF);
            }
            st.charge(r.len(), "buf_prepend")?;
            let Some(b) = st.buf_mut(h) else {
                return Ok(ERR_BADF);
            };
            b.splice(0..0, mem[r].iter().copied());
            Ok(0)
        },
    )?;

    linker.func_wrap(
        m,
        "buf_slice",
        |mut caller: Caller<'_, State>, h: i32, off: i32, len: i32| -> R<i32> {
            if len < 0 || off < 0 {
                return Ok(ERR_INVAL);
            }
            let st = caller.data_mut();
            let Some(b) = st.buf(h) else {
                return Ok(ERR_BADF);
            };
            let (off, len) = (off as usize, len as usize);
            if off.checked_add(len).is_none_or(|end| end > b.len()) {
                return Ok(ERR_RANGE);
            }
            let part = b[off..off + len].to_vec();
            st.charge(len, "buf_slice")?;
            Ok(st.insert(part)?)
        },
    )?;

    linker.func_wrap(
        m,
        "buf_drop",
        |mut caller: Caller<'_, State>, h: i32| -> i32 {
            let st = caller.data_mut();
            match st.take(h) {
                Some(b) => {
                    st.held = st.held.saturating_sub(b.len());
                    0
                }
                None => ERR_BADF,
            }
        },
    )?;

    linker.func_wrap(m, "emit", |mut caller: Caller<'_, State>, h: i32| -> i32 {
        let st = caller.data_mut();
        match st.take(h) {
            Some(b) => {
                // Still held (counted) until the callback returns.
                st.emitted = st.emitted.saturating_add(b.len());
                if !b.is_empty() {
                    st.actions.push(Action::Emit(b));
                }
                0
            }
            None => ERR_BADF,
        }
    })?;

    linker.func_wrap(
        m,
        "emit_file",
        |mut caller: Caller<'_, State>, file: i32, off: i64, len: i64| -> i32 {
            let st = caller.data_mut();
            let Some(f) = usize::try_from(file).ok().and_then(|i| st.files.get(i)) else {
                return ERR_BADF;
            };
            if off < 0 || len < 0 {
                return ERR_INVAL;
            }
            let size = match rustix::fs::fstat(&**f) {
                Ok(s) => s.st_size,
                Err(_) => return ERR_BADF,
            };
            if off.checked_add(len).is_none_or(|end| end > size) {
                return ERR_RANGE;
            }
            if len > 0 {
                let file = Arc::clone(f);
                st.actions.push(Action::EmitFile {
                    file,
                    offset: off as u64,
                    len: len as u64,
                });
            }
            0
        },
    )?;

    linker.func_wrap(
        m,
        "prop",
        |mut caller: Caller<'_, State>, key: i32, key_len: i32, dst: i32, cap: i32| -> R<i32> {
            if key_len < 0 || cap < 0 {
                return Ok(ERR_INVAL);
            }
            let (mem, st) = split(&mut caller, "prop")?;
            let k = mem_range(mem.len(), "prop", key, key_len)?;
            let Some((_, v)) = st
                .props
                .iter()
                .find(|(pk, _)| pk.as_bytes() == &mem[k.clone()])
            else {
                return Ok(ERR_ABSENT);
            };
            let v = v.as_bytes();
            let n = v.len().min(cap as usize);
            let d = mem_range(mem.len(), "prop", dst, n as i32)?;
            mem[d].copy_from_slice(&v[..n]);
            Ok(i32::try_from(v.len()).unwrap_or(i32::MAX))
        },
    )?;

    linker.func_wrap(
        m,
        "log",
        |mut caller: Caller<'_, State>, level: i32, ptr: i32, len: i32| -> R<()> {
            let (mem, st) = split(&mut caller, "log")?;
            let r = mem_range(mem.len(), "log", ptr, len)?;
            st.logs += 1;
            if st.logs > MAX_LOGS_PER_CALLBACK {
                return Ok(());
            }
            let bytes = &mem[r.start..r.end.min(r.start + MAX_LOG_BYTES)];
            let msg = String::from_utf8_lossy(bytes);
            match level {
                0 => tracing::error!(target: "ferry_modules::guest", "{msg}"),
                1 => tracing::warn!(target: "ferry_modules::guest", "{msg}"),
                2 => tracing::info!(target: "ferry_modules::guest", "{msg}"),
                3 => tracing::debug!(target: "ferry_modules::guest", "{msg}"),
                _ => tracing::trace!(target: "ferry_modules::guest", "{msg}"),
            }
            Ok(())
        },
    )?;
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    New,
    Running,
    Finished,
    Stopped,
}

/// One running module bound to one output (a socket). Not shared: feed it from the
/// thread that owns the socket. Dropping it returns its slot to the pool.
pub struct Instance {
    module: crate::ModuleId,
    store: Store<State>,
    host: Arc<Inner>,
    init: TypedFunc<(), i32>,
    on_data: TypedFunc<i32, i32>,
    on_close: Option<TypedFunc<(), i32>>,
    phase: Phase,
    /// How long [`crate::ModuleHost::start`] took: instance (new or spare, with its
    /// inputs), then `init`.
    pub(crate) timing: (std::time::Duration, std::time::Duration),
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

fn engine_err(e: wasmtime::Error, cap: u32) -> Error {
    if e.downcast_ref::<PoolConcurrencyLimitError>().is_some() {
        Error::NoCapacity(cap)
    } else if let Some(h) = e.downcast_ref::<HostStop>() {
        match h {
            HostStop::MemoryLimit(s) => Error::MemoryLimit(s.clone()),
            other => Error::Trap(other.to_string()),
        }
    } else {
        Error::Engine(format!("{e:#}"))
    }
}

impl Instance {
    pub(crate) fn new(
        host: Arc<Inner>,
        module: crate::ModuleId,
        loaded: Arc<Loaded>,
        mut store: Store<State>,
    ) -> Result<Instance, Error> {
        // A wasm start function (if any) runs here, under the deadline, before the
        // properties are set; ferry modules do their set-up in `init`.
        host.arm(&mut store)?;
        let inst = {
            let _running = host.ticker.as_ref().map(|t| t.enter());
            loaded.pre.instantiate(&mut store)
        }
        .map_err(|e| engine_err(e, host.limits.max_instances))?;
        let bad = |what: &str| Error::BadModule(format!("export `{what}` has the wrong kind"));
        let Some(Extern::Memory(mem)) = inst.get_module_export(&mut store, &loaded.memory) else {
            return Err(bad(abi::EXPORT_MEMORY));
        };
        store.data_mut().memory = Some(mem);
        let func = |store: &mut Store<State>, e| match inst.get_module_export(store, e) {
            Some(Extern::Func(f)) => Ok(f),
            _ => Err(bad("callback")),
        };
        let typed = |e: wasmtime::Error| Error::BadModule(format!("{e:#}"));
        let init = func(&mut store, &loaded.init)?
            .typed(&store)
            .map_err(typed)?;
        let on_data = func(&mut store, &loaded.on_data)?
            .typed(&store)
            .map_err(typed)?;
        let on_close = match &loaded.on_close {
            Some(e) => Some(func(&mut store, e)?.typed(&store).map_err(typed)?),
            None => None,
        };
        Ok(Instance {
            module,
            store,
            host,
            init,
            on_data,
            on_close,
            phase: Phase::New,
            timing: Default::default(),
        })
    }

    /// Gives a new instance (before `init`) its read-only properties and the files it
    /// may send ranges of (`emit_file`, by index). Replaces any given before.
    pub fn set_inputs<K: AsRef<str>, V: AsRef<str>>(
        &mut self,
        props: &[(K, V)],
        files: Vec<OwnedFd>,
    ) -> Result<(), Error> {
        self.set_shared_inputs(props, files.into_iter().map(Arc::new).collect())
    }

    /// [`Instance::set_inputs`] with files shared with their owner (a server's table of
    /// registered files): the instance holds a reference, no descriptor is duplicated.
    pub fn set_shared_inputs<K: AsRef<str>, V: AsRef<str>>(
        &mut self,
        props: &[(K, V)],
        files: Vec<Arc<OwnedFd>>,
    ) -> Result<(), Error> {
        if self.phase != Phase::New {
            return Err(self.not_usable());
        }
        let st = self.store.data_mut();
        st.props.clear();
        st.props.extend(
            props
                .iter()
                .map(|(k, v)| (k.as_ref().into(), v.as_ref().into())),
        );
        st.files = files;
        Ok(())
    }

    /// The module this is an instance of.
    pub fn module(&self) -> crate::ModuleId {
        self.module
    }

    /// Runs the module's `init`. [`crate::ModuleHost::start`] calls it; call it yourself
    /// only after [`crate::ModuleHost::instantiate`].
    pub fn init(&mut self) -> Result<Vec<Action>, Error> {
        if self.phase != Phase::New {
            return Err(self.not_usable());
        }
        self.phase = Phase::Running;
        let f = self.init.clone();
        self.call(|s| f.call(s, ()))
    }

    /// Hands one buffer of input to the module's `on_data`; returns the actions it asked
    /// for, in order. On error the instance is stopped and that callback's actions are
    /// discarded.
    pub fn feed(&mut self, data: Vec<u8>) -> Result<Vec<Action>, Error> {
        if self.phase != Phase::Running {
            return Err(self.not_usable());
        }
        let st = self.store.data_mut();
        st.held = st.held.saturating_add(data.len());
        let h = match st.insert(data) {
            Ok(h) => h,
            Err(HostStop::MemoryLimit(s)) => return Err(self.stop(Error::MemoryLimit(s))),
            Err(other) => return Err(self.stop(Error::Trap(other.to_string()))),
        };
        let f = self.on_data.clone();
        self.call(|s| f.call(s, h))
    }

    /// Ends the input: runs `on_close` (if exported) and finishes the instance.
    pub fn close(&mut self) -> Result<Vec<Action>, Error> {
        if self.phase != Phase::Running {
            return Err(self.not_usable());
        }
        let out = match self.on_close.clone() {
            Some(f) => self.call(|s| f.call(s, ()))?,
            None => Vec::new(),
        };
        self.phase = Phase::Finished;
        Ok(out)
    }

    /// How long [`crate::ModuleHost::start`] took to make this instance (a fresh one or a
    /// spare, with its inputs) and to run its `init`; zero when not started that way.
    pub fn start_timing(&self) -> (std::time::Duration, std::time::Duration) {
        self.timing
    }

    /// Whether the module said it is finished (a callback returned 1) or was closed.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Whether the instance failed and was stopped.
    pub fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }

    /// Bytes of host buffers the instance holds now.
    pub fn held_bytes(&self) -> usize {
        self.store.data().held
    }

    fn not_usable(&self) -> Error {
        match self.phase {
            Phase::Finished => Error::Finished,
            Phase::Stopped => Error::Stopped,
            Phase::New => Error::Engine("instance not initialised (call init)".into()),
            Phase::Running => Error::Engine("instance is running".into()),
        }
    }

    fn stop(&mut self, e: Error) -> Error {
        self.phase = Phase::Stopped;
        self.store.data_mut().release_all();
        e
    }

    fn call(&mut self, f: impl FnOnce(&mut Store<State>) -> R<i32>) -> Result<Vec<Action>, Error> {
        if let Err(e) = self.host.arm(&mut self.store) {
            return Err(self.stop(e));
        }
        let r = {
            let _running = self.host.ticker.as_ref().map(|t| t.enter());
            f(&mut self.store)
        };
        self.store.data_mut().end_callback();
        match r {
            Ok(abi::STATUS_CONTINUE) => Ok(std::mem::take(&mut self.store.data_mut().actions)),
            Ok(abi::STATUS_FINISHED) => {
                self.phase = Phase::Finished;
                Ok(std::mem::take(&mut self.store.data_mut().actions))
            }
            Ok(code) => Err(self.stop(Error::ModuleFailed(code))),
            Err(e) => {
                let err = self.classify(e);
                Err(self.stop(err))
            }
        }
    }

    fn classify(&self, e: wasmtime::Error) -> Error {
        if let Some(t) = e.downcast_ref::<Trap>() {
            return match t {
                Trap::Interrupt | Trap::OutOfFuel => Error::Deadline(self.host.limits.deadline),
                other => Error::Trap(other.to_string()),
            };
        }
        match engine_err(e, self.host.limits.max_instances) {
            Error::Engine(s) => Error::Trap(s),
            other => other,
        }
    }
}
