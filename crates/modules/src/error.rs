//! The errors of loading, starting and running a module.

use std::time::Duration;

/// What went wrong with a module or an instance. Every failure of a running instance
/// stops it: the server should fail the instance's socket and carry on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not a valid module, or the module does not follow ferry's ABI
    /// (an import that is not ferry's, a missing export, a wrong signature, more memory
    /// than the cap at start).
    #[error("bad module: {0}")]
    BadModule(String),
    /// No module was loaded under this id.
    #[error("unknown module id {0}")]
    UnknownModule(u32),
    /// Every instance slot of the pool is in use (`Limits::max_instances`).
    #[error("no free instance slot (max_instances = {0})")]
    NoCapacity(u32),
    /// The module trapped (out-of-bounds access, `unreachable`, stack overflow, bad
    /// pointer handed to a host call, ...).
    #[error("module trapped: {0}")]
    Trap(String),
    /// A callback ran past its deadline (or, with fuel interruption, its fuel).
    #[error("callback exceeded its deadline of {0:?}")]
    Deadline(Duration),
    /// The module tried to hold more memory than the cap: linear memory growth, host
    /// buffers, buffer handles, or output of one callback.
    #[error("memory limit exceeded: {0}")]
    MemoryLimit(String),
    /// A callback returned a negative status.
    #[error("module reported failure {0}")]
    ModuleFailed(i32),
    /// The instance failed earlier; it cannot be used again.
    #[error("instance is stopped after an earlier failure")]
    Stopped,
    /// The instance finished (a callback returned 1, or it was closed); it takes no
    /// more input.
    #[error("instance has finished")]
    Finished,
    /// A file handed to the instance cannot be used (fstat failed).
    #[error("file {index}: {source}")]
    File {
        /// Index of the file in the `files` given at start.
        index: usize,
        /// Why.
        source: std::io::Error,
    },
    /// The engine failed for another reason (configuration, instantiation).
    #[error("engine: {0}")]
    Engine(String),
}

/// Why a host call or the resource limiter stopped the instance. Travels inside the
/// engine's error from the host function to [`crate::Instance`], which turns it into an
/// [`Error`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostStop {
    #[error("memory limit: {0}")]
    MemoryLimit(String),
    #[error("host call {call}: range [{ptr}, {ptr}+{len}) is outside the module's memory")]
    OutOfBounds {
        call: &'static str,
        ptr: u32,
        len: u32,
    },
    #[error("host call {0} without an exported memory")]
    NoMemory(&'static str),
}
