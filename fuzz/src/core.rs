//! Target `core`: the server's socket logic in-process, over the scripted fake of
//! [`ferry_server::testkit`]: request records, host events, pair events, arrivals,
//! hang-ups, resets, room and the program's own writes into its pairs, in any order and
//! with any contents, all chosen by the input. Deterministic (no threads, no kernel
//! sockets, no timing), and needs no root: it reaches orderings the `server` target can
//! only hope a scheduler produces.
//!
//! Properties: no panic (the fuzz profile keeps debug assertions, among them the
//! server's check that every error it answers is an `Errno`), no unbounded work (each
//! step is bounded), and the completions a channel holds back stay below the
//! back-pressure bound plus what one pass over a ring adds.

use ferry_proto::{Call, CmpKind, Op, RECORD_SIZE, Req};
use ferry_server::testkit::Harness;

use crate::input::Input;

/// Most steps of one script.
pub const MAX_STEPS: usize = 96;
/// Most sockets a script makes.
const MAX_SOCKETS: usize = 6;
/// The server's back-pressure bound (`BACKLOG_HIGH`) plus one ring of records.
const MAX_HELD: usize = 2048 + 256;

/// Events a step may deliver (any subset of these bits).
const EVENTS: [i32; 6] = [
    libc::EPOLLIN,
    libc::EPOLLOUT,
    libc::EPOLLPRI,
    libc::EPOLLRDHUP,
    libc::EPOLLHUP,
    libc::EPOLLERR,
];

fn events(bits: u8) -> i32 {
    EVENTS
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .fold(0, |acc, (_, e)| acc | e)
}

/// Runs one script.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut h = Harness::new(inp.u8() & 1 == 1);
    let ch = h.channel();
    let mut made = 0;
    for _ in 0..MAX_STEPS {
        if inp.is_empty() || !h.channel_open(ch) {
            break;
        }
        let op = inp.u8();
        let live = h.sockets();
        // A socket of the script's (the server's ids change as sockets go).
        let pick = |inp: &mut Input<'_>| -> Option<u32> {
            let k = usize::from(inp.u8());
            (!live.is_empty()).then(|| live[k % live.len()])
        };
        match op % 16 {
            0 if made < MAX_SOCKETS => {
                made += 1;
                let domain = if inp.u8() & 1 == 0 {
                    libc::AF_INET
                } else {
                    libc::AF_INET6
                };
                let ty = if inp.u8() & 1 == 0 {
                    libc::SOCK_STREAM
                } else {
                    libc::SOCK_DGRAM
                };
                let _ = h.try_socket(ch, domain, ty);
            }
            1 | 2 => {
                // A raw record, its socket field most often one of the script's.
                let mut raw: Req = bytemuck::pod_read_unaligned(&pad(inp.take(RECORD_SIZE)));
                if let Some(id) = pick(&mut inp).filter(|_| raw.op.is_multiple_of(2)) {
                    raw.sock = id;
                }
                if h.ring_room(ch) > 0 {
                    h.push(ch, raw);
                }
            }
            3 => {
                // A well-formed call: a send of chosen bytes (a lent buffer).
                if let Some(id) = pick(&mut inp)
                    && h.ring_room(ch) > 0
                    && let Some(req) = h.try_send_req(ch, id, inp.bytes8())
                {
                    h.push(ch, req);
                }
            }
            4 => {
                if let Some(id) = pick(&mut inp)
                    && h.ring_room(ch) > 0
                {
                    let op = [Op::Recv, Op::WantToken, Op::TokenDrained, Op::Pending];
                    let raw = Req {
                        tag: u32::from(inp.u8()),
                        a: u32::from(inp.u16()),
                        ..Req::new(op[usize::from(inp.u8()) % op.len()], id)
                    };
                    if let Ok(call) = Call::decode(&raw) {
                        h.push(ch, call.encode());
                    }
                }
            }
            5 => h.turn(),
            6 => {
                if let Some(id) = pick(&mut inp) {
                    let ev = events(inp.u8());
                    h.host_event(id, ev);
                }
            }
            7 => {
                if let Some(id) = pick(&mut inp) {
                    let ev = events(inp.u8());
                    h.pair_event(id, ev);
                }
            }
            8 => {
                if let Some(id) = pick(&mut inp) {
                    h.host_input(id, inp.bytes8());
                }
            }
            9 => {
                if let Some(id) = pick(&mut inp) {
                    match inp.u8() % 4 {
                        0 => h.host_fin(id),
                        1 => h.host_reset(id, libc::ECONNRESET),
                        2 => h.host_urgent(id, inp.u8()),
                        _ => h.connect_outcome(id, i32::from(inp.u8() % 4) * libc::ECONNREFUSED),
                    }
                }
            }
            10 => {
                if let Some(id) = pick(&mut inp) {
                    let room = inp.u8();
                    let room = (room != 255).then_some(usize::from(room) * 64);
                    if inp.u8() & 1 == 0 {
                        h.host_room(id, room);
                    } else {
                        h.app_room(id, room);
                    }
                }
            }
            11 => {
                if let Some(id) = pick(&mut inp) {
                    if inp.u8() & 1 == 0 {
                        h.app_write(id, inp.bytes8());
                    } else {
                        h.app_filler(id);
                    }
                }
            }
            12 => {
                if let Some(id) = pick(&mut inp) {
                    h.app_close(id);
                }
            }
            13 => {
                if let Some(id) = pick(&mut inp) {
                    let errno = [0, libc::EINPROGRESS, libc::ECONNREFUSED];
                    h.script_connect(id, errno[usize::from(inp.u8()) % errno.len()]);
                }
            }
            14 => {
                if let Some(id) = pick(&mut inp) {
                    let port = inp.u16();
                    h.host_connection(id, std::net::SocketAddr::from(([198, 51, 100, 1], port)));
                }
            }
            _ => {
                // The shim takes its completions (giving back the buffers lent).
                for c in h.completions(ch) {
                    match c.kind() {
                        Ok(CmpKind::Data) => h.buffer_lent_back(ch, c.buf),
                        Ok(CmpKind::BufReturn) => {
                            h.buffer_returned(ch, c.buf);
                        }
                        _ => {}
                    }
                }
            }
        }
        assert!(h.backlog(ch) <= MAX_HELD, "completions held without bound");
    }
}

/// `bytes` padded with zeros to a record's size.
fn pad(bytes: &[u8]) -> [u8; RECORD_SIZE] {
    let mut out = [0u8; RECORD_SIZE];
    out[..bytes.len()].copy_from_slice(bytes);
    out
}
