//! UDP and echo flows: they bypass the stack. Each (sandbox end, destination) is a flow
//! on a connected host UDP socket, each (sandbox address and echo identifier,
//! destination) one on an unprivileged ping socket; what the host socket receives is
//! framed back here (`frame::udp`, `frame::echo_reply`). A datagram or echo request
//! the rules refuse is answered at once with "administratively prohibited". Flows idle
//! [`UDP_IDLE`](super::flows::UDP_IDLE) (echo: [`ECHO_IDLE`](super::flows::ECHO_IDLE))
//! are closed by the reap.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};

use ferry_egress::{Lease, What};
use tracing::warn;

use super::flows::{Flow, Key, Proto};
use super::{NicServer, connect_host};
use crate::frame;
use crate::timing::Stage;

/// Why a ping socket cannot be made, most often.
const PING_HINT: &str = " (the host's net.ipv4.ping_group_range must include ferry's group)";

/// Most datagrams read from one host socket per event.
const DGRAM_BATCH: usize = 64;

/// A UDP or echo flow.
#[derive(Debug)]
pub(crate) struct Dgram {
    pub host: OwnedFd,
    /// The sandbox's end (for echo: its address and the request's identifier as port).
    pub sandbox: SocketAddr,
    /// The destination (for echo: its address, port 0).
    pub remote: SocketAddr,
    pub _lease: Option<Lease>,
}

impl Dgram {
    pub fn key(&self, proto: Proto) -> Key {
        Key {
            proto,
            sandbox: self.sandbox,
            remote: self.remote,
        }
    }
}

/// The ICMP message a ping socket sends for an echo request (`v4`: ICMP, else ICMPv6)
/// with sequence number `seq`, into `msg` (8 bytes of header, then the data): type,
/// code, checksum and identifier are the kernel's to fill in.
fn echo_request_header(v4: bool, seq: u16) -> [u8; 8] {
    let ty = if v4 { 8 } else { 128 };
    let s = seq.to_be_bytes();
    [ty, 0, 0, 0, 0, 0, s[0], s[1]]
}

/// The sequence number and data of an echo reply a ping socket received (`v4`: ICMP),
/// or `None` for anything else.
fn echo_reply_parts(v4: bool, msg: &[u8]) -> Option<(u16, &[u8])> {
    let reply = if v4 { 0 } else { 129 };
    if msg.len() < 8 || msg[0] != reply {
        return None;
    }
    Some((u16::from_be_bytes([msg[6], msg[7]]), &msg[8..]))
}

impl NicServer {
    /// The datagram flow for `key`, made (host socket connected to its remote end) if
    /// new and admitted.
    fn dgram_flow(&mut self, key: Key) -> Option<u64> {
        if let Some(id) = self.flows.find(&key) {
            return Some(id);
        }
        let echo = key.proto == Proto::Echo;
        let remote = key.remote;
        let what = if echo { What::Echo } else { What::Datagram };
        if !self.gate.admit(what, remote, self.held(), &mut self.stats) {
            return None;
        }
        let proto = match (echo, remote.is_ipv4()) {
            (false, _) => 0,
            (true, true) => libc::IPPROTO_ICMP,
            (true, false) => libc::IPPROTO_ICMPV6,
        };
        let bond = self.cfg.egress.as_ref();
        let (host, lease, _) = match connect_host(
            &*self.io,
            bond,
            (libc::SOCK_DGRAM, proto),
            remote,
        ) {
            Ok(x) => x,
            Err(e) => {
                if let Some(n) = self.failures.tick() {
                    warn!(
                        "{}: cannot open a {} socket to {remote}: {e}{} ({n} since the last line)",
                        self.id,
                        if echo { "ping" } else { "UDP" },
                        if echo { PING_HINT } else { "" }
                    );
                }
                return None;
            }
        };
        let id = self.flows.new_id();
        if self
            .epoll
            .add(host.as_fd(), libc::EPOLLIN as u32, id)
            .is_err()
        {
            return None;
        }
        let d = Dgram {
            host,
            sandbox: key.sandbox,
            remote,
            _lease: lease,
        };
        if echo {
            self.stats.echo_flows += 1;
            self.add_flow(id, Flow::Echo(d));
        } else {
            self.stats.udp_flows += 1;
            self.add_flow(id, Flow::Udp(d));
        }
        Some(id)
    }

    /// Answers `frame` (refused) with "administratively prohibited".
    fn prohibit(&mut self, dst: IpAddr, frame: &[u8]) {
        let gw = self.cfg.plan.gateway_for(dst);
        let link = self.link;
        self.port
            .queue(|out| frame::prohibited(out, link, gw, frame));
    }

    /// A UDP datagram from the sandbox (`frame`, carrying `payload`).
    pub(super) fn udp_out(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        frame: &[u8],
    ) {
        if self.is_resolver(dst) {
            let now = self.clock.now();
            self.dns_query(src, payload, now);
            return;
        }
        let key = Key {
            proto: Proto::Udp,
            sandbox: src,
            remote: dst,
        };
        let Some(id) = self.dgram_flow(key) else {
            self.prohibit(dst.ip(), frame);
            return;
        };
        let now = self.clock.now();
        let Some(Flow::Udp(f)) = self.flows.active(id, now) else {
            return;
        };
        let timing = &mut self.port.timing;
        let t0 = timing.start();
        let sent = self.io.send(f.host.as_fd(), payload);
        timing.end(Stage::HostSend, t0, sent.is_ok());
        if sent.is_ok() {
            self.stats.bytes_out += payload.len() as u64;
        }
    }

    /// An echo request from the sandbox (`frame`, carrying `data`).
    pub(super) fn echo_out(
        &mut self,
        (src, dst): (IpAddr, IpAddr),
        (ident, seq): (u16, u16),
        data: &[u8],
        frame: &[u8],
    ) {
        let key = Key {
            proto: Proto::Echo,
            sandbox: SocketAddr::new(src, ident),
            remote: SocketAddr::new(dst, 0),
        };
        let Some(id) = self.dgram_flow(key) else {
            self.prohibit(dst, frame);
            return;
        };
        let now = self.clock.now();
        let Some(Flow::Echo(f)) = self.flows.active(id, now) else {
            return;
        };
        let msg = &mut self.buf[..8 + data.len()];
        msg[..8].copy_from_slice(&echo_request_header(dst.is_ipv4(), seq));
        msg[8..].copy_from_slice(data);
        let timing = &mut self.port.timing;
        let t0 = timing.start();
        let sent = self.io.send(f.host.as_fd(), msg);
        timing.end(Stage::HostSend, t0, sent.is_ok());
    }

    /// Datagrams (or echo replies) arrived on flow `id`'s host socket: framed to the
    /// sandbox.
    pub(super) fn host_dgram_ready(&mut self, id: u64) {
        let now = self.clock.now();
        let link = self.link;
        let (f, echo) = match self.flows.get_mut(id) {
            Some(Flow::Udp(f)) => (f, false),
            Some(Flow::Echo(f)) => (f, true),
            _ => return,
        };
        let mut got_any = false;
        for _ in 0..DGRAM_BATCH {
            let timing = &mut self.port.timing;
            let t0 = timing.start();
            let got = self.io.recv(f.host.as_fd(), &mut self.buf);
            timing.end(Stage::HostRecv, t0, got.is_ok());
            let Ok(n) = got else {
                break;
            };
            got_any = true;
            let msg = &self.buf[..n];
            let (remote, sandbox) = (f.remote, f.sandbox);
            if echo {
                let Some((seq, data)) = echo_reply_parts(remote.is_ipv4(), msg) else {
                    continue;
                };
                self.port.queue(|out| {
                    let to = (remote.ip(), sandbox.ip());
                    frame::echo_reply(out, link, to.0, to.1, sandbox.port(), seq, data)
                });
            } else {
                self.stats.bytes_in += n as u64;
                self.port
                    .queue(|out| frame::udp(out, link, remote, sandbox, msg));
            }
        }
        if got_any {
            self.flows.active(id, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_messages_carry_the_sandboxs_sequence_and_data_only() {
        assert_eq!(echo_request_header(true, 0x0102), [8, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(echo_request_header(false, 7), [128, 0, 0, 0, 0, 0, 0, 7]);
        let reply = [0, 0, 0xaa, 0xbb, 0x12, 0x34, 0, 9, b'h', b'i'];
        assert_eq!(echo_reply_parts(true, &reply), Some((9, &b"hi"[..])));
        // Not a reply of the family, or too short: nothing goes back.
        assert_eq!(echo_reply_parts(false, &reply), None);
        assert_eq!(echo_reply_parts(true, &reply[..7]), None);
        let mut r6 = reply;
        r6[0] = 129;
        assert_eq!(echo_reply_parts(false, &r6), Some((9, &b"hi"[..])));
    }
}
