//! ferry's fuzz targets. Each target in `fuzz_targets/` is a thin `fuzz_target!` over the
//! `run` function of the module of the same name, which drives one part of ferry that
//! reads bytes a sandboxed program controls and checks what must hold for any input:
//!
//! | target | drives |
//! |---|---|
//! | [`records`] | ring records, control messages, hello, socket addresses, pair names |
//! | [`binding`] | module bindings (`FMB2`) |
//! | [`cmsg`] | control messages: the send-side check, the receive-side placing |
//! | [`ring`] | a channel region whose shared memory the peer wrote |
//! | [`modules`] | module bindings through loading, starting, feeding, output |
//! | [`server`] | a protocol server driven by a hostile channel |
//! | [`core`] | the server's socket logic in-process, every event's order and content chosen |
//! | [`frame`] | a NIC server (nic mode) fed hostile frames on its queue; the frame functions |
//! | [`dns`] | the DNS forwarder's UDP handling: datagrams from the sandbox and from upstream |
//! | [`rings`] | a VM guest's virtio rings (`ferry vm`): descriptors, rings and buffers the guest wrote |
//!
//! Every target must never panic, hang or grow memory without bound. `seeds` writes the
//! starting corpus (`cargo run --example seeds`).
#![deny(unsafe_code)]

pub mod binding;
pub mod cmsg;
pub mod core;
pub mod dns;
pub mod frame;
pub mod input;
pub mod modules;
#[allow(unsafe_code)]
mod netns;
pub mod records;
pub mod ring;
pub mod rings;
pub mod seeds;
pub mod server;
