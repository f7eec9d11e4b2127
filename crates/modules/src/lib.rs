//! ferry's data-path module host (S3): application-supplied WebAssembly modules that the
//! protocol server runs next to the data, so that a file goes to a socket with a header,
//! compressed or transformed, without passing through the application. This crate owns
//! the module ABI (`docs/MODULES.md`, [`abi`]), compiling and checking modules, starting
//! pooled instances in microseconds, running their callbacks under a memory cap and a
//! deadline, and turning what they ask for into [`Action`]s (bytes to emit, file ranges
//! to `sendfile`). It must not do a module's I/O itself while a module runs (callbacks
//! only record actions; the server performs them, non-blockingly, with [`Outbox`]), must
//! not give modules any capability beyond the ABI (no WASI, no other imports), and must
//! never panic or let one instance's failure affect another or the server: every failure
//! is a typed [`Error`] that stops that instance only.
//!
//! # Use
//!
//! ```no_run
//! use ferry_modules::{Limits, ModuleHost, perform};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let host = ModuleHost::new(Limits::default())?;
//! let id = host.load(include_bytes!("../examples/http_file.wat"))?;
//! # let sock = std::net::TcpStream::connect("127.0.0.1:80")?;
//! let file = std::fs::File::open("index.html")?;
//! let len = file.metadata()?.len().to_string();
//! let (mut inst, actions) = host.start(id, &[("content-length", len.as_str())], vec![file.into()])?;
//! perform(actions, &sock)?; // header, then the file with sendfile
//! let actions = inst.close()?;
//! perform(actions, &sock)?;
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]

pub mod abi;
mod error;
mod host;
mod instance;
mod perform;
mod ticker;

pub use error::Error;
pub use host::{Interrupt, Limits, ModuleHost, ModuleId};
pub use instance::{Instance, MAX_HANDLES, MAX_LOG_BYTES, MAX_LOGS_PER_CALLBACK};
pub use perform::{Action, Outbox, perform};
