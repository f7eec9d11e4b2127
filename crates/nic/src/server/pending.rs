//! TCP flows the sandbox opens, until their host connect ends. A SYN the rules allow
//! makes a host socket and starts a non-blocking connect to the destination; the SYN
//! waits beside it (a *pending* flow: a copy of the SYN, no stack socket, no timer,
//! nothing due until the host socket reports). When the connect succeeds, a stack
//! socket listens on that destination and the SYN goes to it (the SYN-ACK leaves at
//! once: `tcp.rs` from then on); when it fails, the SYN goes to the stack with no socket
//! to take it (the sandbox gets a reset). A pending flow whose sandbox end is gone (a
//! reset from it, or the reset its kernel answers to a [`frame::probe`](crate::frame::probe)
//! sent every [`PROBE_EVERY`]: `FlowTable::probe_due`) ends, and its host connect
//! with it.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use ferry_egress::{Lease, What};
use tracing::debug;

use super::flows::{Flow, Key, Proto};
use super::{NicServer, connect_host, watch};

/// How often a pending TCP flow asks the sandbox's kernel whether its connect still
/// waits ([`frame::probe`](crate::frame::probe)).
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(2);
/// Largest SYN a pending flow keeps (options make ~80 bytes; only data in the SYN, which
/// needs a Fast Open cookie ferry never gives, makes more): a larger one is reset.
pub(crate) const SYN_MAX: usize = 1024;

/// A TCP flow whose host connect is under way: the sandbox's SYN waits with it.
#[derive(Debug)]
pub(crate) struct Pending {
    pub host: OwnedFd,
    pub key: Key,
    /// The SYN's frame, the latest the sandbox sent.
    pub syn: Vec<u8>,
    pub lease: Option<Lease>,
    /// When the sandbox was last asked whether the connect still waits.
    pub probed: Instant,
}

impl NicServer {
    /// A SYN (`frame`) from the sandbox for a new flow `src` → `dst`: the host connect,
    /// and the SYN kept until it ends. Whether the SYN was taken; `false`: it goes to the
    /// stack now, to a stack socket when the connect has already succeeded, to none when
    /// refused (the stack then resets the connection).
    pub(super) fn open_tcp(&mut self, src: SocketAddr, dst: SocketAddr, frame: &[u8]) -> bool {
        // DNS over TCP to the guest's resolver goes to the first upstream (checked
        // against the policy at start); its flow is the gateway's port as the guest sees it.
        let resolver = self.tcp_resolver(dst);
        let admitted = if resolver.is_some() {
            self.gate.room(self.held(), &mut self.stats)
        } else {
            self.gate
                .admit(What::Connect, dst, self.held(), &mut self.stats)
        };
        if !admitted {
            return false;
        }
        if frame.len() > SYN_MAX {
            self.stats.malformed += 1;
            return false;
        }
        let bond = self.cfg.egress.as_ref();
        let to = resolver.unwrap_or(dst);
        let (host, lease, done) = match connect_host(&*self.io, bond, (libc::SOCK_STREAM, 0), to) {
            Ok(x) => x,
            Err(e) => {
                debug!("{}: connect to {dst}: {e}", self.id);
                self.stats.connect_failed += 1;
                return false;
            }
        };
        let _ = self.io.no_delay(host.as_fd());
        let id = self.flows.new_id();
        if watch(&self.epoll, host.as_fd(), id).is_err() {
            return false;
        }
        self.stats.tcp_flows += 1;
        let key = Key {
            proto: Proto::Tcp,
            sandbox: src,
            remote: dst,
        };
        if done {
            self.establish(id, key, host, lease);
            return false;
        }
        let p = Pending {
            host,
            key,
            syn: frame.to_vec(),
            lease,
            probed: self.clock.now(),
        };
        self.add_flow(id, Flow::Pending(p));
        true
    }

    /// Pending flow `id`'s host connect has ended: its SYN goes to a stack socket (the
    /// SYN-ACK leaves), or to none (the sandbox gets a reset).
    pub(super) fn connected(&mut self, id: u64) {
        let Some(Flow::Pending(p)) = self.flows.remove(id) else {
            return;
        };
        let err = self.io.connect_result(p.host.as_fd()).unwrap_or(libc::EIO);
        if err == 0 {
            self.establish(id, p.key, p.host, p.lease);
        } else {
            debug!(
                "{}: connect to {}: {}",
                self.id,
                p.key.remote,
                io::Error::from_raw_os_error(err)
            );
            self.stats.connect_failed += 1;
            let _ = self.epoll.delete(p.host.as_fd());
        }
        self.stack.feed(&mut self.port, &p.syn, self.clock.now());
    }

    /// A segment from the sandbox for pending flow `id` (`frame`): a retransmitted SYN
    /// replaces the one kept, a reset ends the flow (its host connect with it); anything
    /// else has nothing to take it yet.
    pub(super) fn pending_segment(&mut self, id: u64, syn: bool, rst: bool, frame: &[u8]) {
        if rst {
            if let Some(f) = self.flows.remove(id) {
                let _ = self.epoll.delete(f.host());
                self.stats.abandoned += 1;
            }
        } else if syn
            && frame.len() <= SYN_MAX
            && let Some(Flow::Pending(p)) = self.flows.get_mut(id)
        {
            p.syn.clear();
            p.syn.extend_from_slice(frame);
        }
    }
}
