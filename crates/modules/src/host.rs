//! [`ModuleHost`]: the engine, its pool of instance slots, the loaded modules.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module, ModuleExport,
    OptLevel, PoolingAllocationConfig, Store,
};

use crate::abi;
use crate::instance::{self, Instance, State};
use crate::ticker::Ticker;
use crate::{Action, Error};

/// Wasm page size.
const PAGE: usize = 64 * 1024;
/// Table elements an instance may have (function tables of compiled C or Rust).
pub(crate) const TABLE_ELEMENTS: usize = 10_000;

/// How a callback that runs too long is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// Wall-clock deadline: a ticker thread advances the engine's epoch and compiled
    /// code checks it at function entries and loop heads (the default; cheapest).
    Epoch,
    /// A fuel budget per callback (every wasm operator costs about one unit);
    /// deterministic, but not a time, and the counting slows the code down.
    Fuel(u64),
}

/// The limits every instance of a [`ModuleHost`] runs under.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Cap on an instance's linear memory, and separately on the host buffers it holds
    /// (including what one callback emits). Rounded up to 64 KiB pages.
    pub memory_bytes: usize,
    /// How long one callback (`init`, `on_data`, `on_close`) may run.
    pub deadline: Duration,
    /// Instances alive at once (slots of the pooling allocator).
    pub max_instances: u32,
    /// How the deadline is enforced.
    pub interrupt: Interrupt,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 16 << 20,
            deadline: Duration::from_millis(10),
            max_instances: 256,
            interrupt: Interrupt::Epoch,
        }
    }
}

/// A loaded module's handle in its [`ModuleHost`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleId(pub u32);

/// A module compiled once, pre-linked against the ABI, with its exports resolved.
pub(crate) struct Loaded {
    pub(crate) pre: InstancePre<State>,
    pub(crate) memory: ModuleExport,
    pub(crate) init: ModuleExport,
    pub(crate) on_data: ModuleExport,
    pub(crate) on_close: Option<ModuleExport>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("on_close", &self.on_close.is_some())
            .finish()
    }
}

/// Shared by the host and every instance it started (instances keep the ticker alive).
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) limits: Limits,
    /// Rounded-up memory cap.
    pub(crate) cap: usize,
    /// Epoch ticks per deadline (epoch mode).
    pub(crate) deadline_ticks: u64,
    pub(crate) ticker: Option<Ticker>,
}

/// Compiles modules once and starts instances of them in microseconds: an engine with a
/// pooling allocator (slots, memories and tables reserved up front), modules
/// pre-instantiated against ferry's ABI, a memory cap and a deadline per callback.
///
/// `Send + Sync`: modules can be loaded and instances started from any thread.
pub struct ModuleHost {
    inner: Arc<Inner>,
    linker: Linker<State>,
    modules: RwLock<Vec<Arc<Loaded>>>,
    /// Instances built ahead of time ([`ModuleHost::prewarm`]), by module id.
    spares: Mutex<Vec<Vec<Instance>>>,
}

impl std::fmt::Debug for ModuleHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleHost")
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

impl ModuleHost {
    /// Makes the engine. With [`Interrupt::Epoch`] the epoch ticker's thread starts with
    /// the first callback.
    pub fn new(limits: Limits) -> Result<ModuleHost, Error> {
        if limits.max_instances == 0 || limits.memory_bytes == 0 || limits.deadline.is_zero() {
            return Err(Error::Engine("limits must be non-zero".into()));
        }
        let cap = limits.memory_bytes.div_ceil(PAGE).saturating_mul(PAGE);
        let n = limits.max_instances;

        let mut pool = PoolingAllocationConfig::default();
        pool.total_core_instances(n)
            .total_memories(n)
            .total_tables(n)
            .max_memories_per_module(1)
            .max_tables_per_module(1)
            .table_elements(TABLE_ELEMENTS)
            .max_memory_size(cap)
            // Reset a freed slot's first pages with memset instead of madvise: the next
            // start finds them resident (no page faults) — small modules live there.
            .linear_memory_keep_resident(128 * 1024)
            .table_keep_resident(16 * 1024);

        let mut config = Config::new();
        config
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            .cranelift_opt_level(OptLevel::Speed)
            .wasm_multi_memory(false)
            .wasm_memory64(false)
            .max_wasm_stack(512 * 1024);

        match limits.interrupt {
            Interrupt::Epoch => config.epoch_interruption(true),
            Interrupt::Fuel(_) => config.consume_fuel(true),
        };
        let engine = Engine::new(&config).map_err(|e| Error::Engine(format!("{e:#}")))?;

        // The deadline is enforced to within one tick late, never early (see `arm`).
        let period =
            (limits.deadline / 4).clamp(Duration::from_micros(100), Duration::from_millis(50));
        let deadline_ticks = limits.deadline.as_nanos().div_ceil(period.as_nanos()) as u64 + 1;
        let ticker = match limits.interrupt {
            Interrupt::Epoch => Some(Ticker::new(engine.clone(), period)),
            Interrupt::Fuel(_) => None,
        };

        let mut linker = Linker::new(&engine);
        instance::define_imports(&mut linker).map_err(|e| Error::Engine(format!("{e:#}")))?;

        Ok(ModuleHost {
            inner: Arc::new(Inner {
                engine,
                limits,
                cap,
                deadline_ticks,
                ticker,
            }),
            linker,
            modules: RwLock::new(Vec::new()),
            spares: Mutex::new(Vec::new()),
        })
    }

    /// The limits the host was made with.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Compiles a module (binary wasm or text `.wat`), checks it against the ABI (only
    /// ferry's imports, the required exports, memory within the cap) and pre-links it.
    /// Compiling takes milliseconds; do it once per module.
    pub fn load(&self, wasm_or_wat: &[u8]) -> Result<ModuleId, Error> {
        let wasm = wat::parse_bytes(wasm_or_wat).map_err(|e| Error::BadModule(e.to_string()))?;
        let module = Module::new(&self.inner.engine, &wasm)
            .map_err(|e| Error::BadModule(format!("{e:#}")))?;
        let has_close = abi::validate(&module, self.inner.cap)?;
        let export = |name: &str| {
            module
                .get_export_index(name)
                .ok_or_else(|| Error::BadModule(format!("missing export `{name}`")))
        };
        let loaded = Loaded {
            memory: export(abi::EXPORT_MEMORY)?,
            init: export(abi::EXPORT_INIT)?,
            on_data: export(abi::EXPORT_ON_DATA)?,
            on_close: if has_close {
                Some(export(abi::EXPORT_ON_CLOSE)?)
            } else {
                None
            },
            pre: self
                .linker
                .instantiate_pre(&module)
                .map_err(|e| Error::BadModule(format!("{e:#}")))?,
        };
        let mut modules = self.modules.write().unwrap_or_else(|p| p.into_inner());
        let id =
            u32::try_from(modules.len()).map_err(|_| Error::Engine("too many modules".into()))?;
        modules.push(Arc::new(loaded));
        Ok(ModuleId(id))
    }

    fn loaded(&self, id: ModuleId) -> Result<Arc<Loaded>, Error> {
        let modules = self.modules.read().unwrap_or_else(|p| p.into_inner());
        modules
            .get(id.0 as usize)
            .cloned()
            .ok_or(Error::UnknownModule(id.0))
    }

    /// Makes a fresh instance of module `id` without running `init` (for measuring
    /// start and init apart; [`ModuleHost::start`] does both and uses spares). `props`
    /// are the read-only key/value properties the module sees; `files` are the files it
    /// may send ranges of (`emit_file`), addressed by their index.
    pub fn instantiate<K: AsRef<str>, V: AsRef<str>>(
        &self,
        id: ModuleId,
        props: &[(K, V)],
        files: Vec<OwnedFd>,
    ) -> Result<Instance, Error> {
        let mut inst = self.build(id)?;
        inst.set_inputs(props, files)?;
        Ok(inst)
    }

    fn build(&self, id: ModuleId) -> Result<Instance, Error> {
        let loaded = self.loaded(id)?;
        let mut store = Store::new(&self.inner.engine, State::new(self.inner.cap));
        store.limiter(|s| &mut s.limiter);
        Instance::new(Arc::clone(&self.inner), id, loaded, store)
    }

    /// Makes an instance of module `id` and runs its `init`; returns the instance and
    /// the actions `init` asked for. Takes a spare built by [`ModuleHost::prewarm`]
    /// when there is one (then only the inputs are installed and `init` runs: about a
    /// microsecond), else instantiates (a few microseconds: the module is pre-linked,
    /// the slot comes from the pool). See [`ModuleHost::instantiate`] for the
    /// arguments.
    pub fn start<K: AsRef<str>, V: AsRef<str>>(
        &self,
        id: ModuleId,
        props: &[(K, V)],
        files: Vec<OwnedFd>,
    ) -> Result<(Instance, Vec<Action>), Error> {
        self.start_shared(id, props, files.into_iter().map(Arc::new).collect())
    }

    /// [`ModuleHost::start`] with files shared with their owner (e.g. a server's table
    /// of registered files): the instance keeps a reference to each, nothing is
    /// duplicated, and a file stays open while an instance or an action refers to it.
    pub fn start_shared<K: AsRef<str>, V: AsRef<str>>(
        &self,
        id: ModuleId,
        props: &[(K, V)],
        files: Vec<Arc<OwnedFd>>,
    ) -> Result<(Instance, Vec<Action>), Error> {
        let t0 = std::time::Instant::now();
        let mut inst = match self.take_spare(id) {
            Some(i) => i,
            None => self.build(id)?,
        };
        inst.set_shared_inputs(props, files)?;
        let t1 = std::time::Instant::now();
        let actions = inst.init()?;
        inst.timing = (t1 - t0, t1.elapsed());
        Ok((inst, actions))
    }

    fn take_spare(&self, id: ModuleId) -> Option<Instance> {
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        spares.get_mut(id.0 as usize)?.pop()
    }

    /// Builds instances of module `id` ahead of time until `count` spares wait, so that
    /// the next `start`s skip instantiation. Call it when the server is idle (after a
    /// batch of events); spares hold pool slots. Returns the number of spares.
    pub fn prewarm(&self, id: ModuleId, count: usize) -> Result<usize, Error> {
        loop {
            let have = {
                let spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
                spares.get(id.0 as usize).map_or(0, Vec::len)
            };
            if have >= count {
                return Ok(have);
            }
            let inst = self.build(id)?;
            let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
            let n = id.0 as usize;
            if spares.len() <= n {
                spares.resize_with(n + 1, Vec::new);
            }
            spares[n].push(inst);
        }
    }

    /// Drops the spares of every module (their slots go back to the pool).
    pub fn clear_spares(&self) {
        self.spares
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

impl Inner {
    /// Gives the store one deadline (or one fuel budget) for the next callback.
    pub(crate) fn arm<T>(&self, store: &mut Store<T>) -> Result<(), Error> {
        match self.limits.interrupt {
            Interrupt::Epoch => {
                // The ticker's thread starts with the first callback.
                if !self.ticker.as_ref().is_some_and(Ticker::start) {
                    return Err(Error::Engine("cannot start the epoch ticker".into()));
                }
                store.set_epoch_deadline(self.deadline_ticks);
                Ok(())
            }
            Interrupt::Fuel(f) => store
                .set_fuel(f)
                .map_err(|e| Error::Engine(format!("{e:#}"))),
        }
    }
}
