//! The server's ordering and readiness rules, one test (or two) per rule, driven
//! in-process over the scripted fake of `ferry_server::testkit`: request records into a
//! real channel ring, host and pair events one at a time, completions and pair effects
//! read back. Deterministic: no threads, no kernel sockets, no timing.
//!
//! Each test names the rule it guards; the closing note of issue 17 lists the break of
//! each rule that was tried on purpose and the test that caught it.

use std::net::SocketAddr;

use ferry_proto::{
    CMP_DRAIN_TOKEN, CMP_RENEW_PAIR, Call, Cmp, CmpKind, Ctl, CtlKind, Op, REQ_FILLED,
    REQ_NONBLOCK, Req, WireAddr,
};
use ferry_server::testkit::Harness;

const REMOTE: &str = "192.0.2.7:80";

fn remote() -> SocketAddr {
    REMOTE.parse().unwrap()
}

fn kind(c: &Cmp) -> CmpKind {
    c.kind().unwrap()
}

fn connect_req(id: u32, tag: u32, flags: u16) -> Req {
    Req {
        tag,
        flags,
        ..Req::new(Op::Connect, id).with_addr(&WireAddr::from(remote()))
    }
}

/// The final answer to `tag` among `cs`.
fn done(cs: &[Cmp], tag: u32) -> Cmp {
    *cs.iter()
        .find(|c| kind(c) == CmpKind::Done && c.tag == tag)
        .unwrap_or_else(|| panic!("no Done for tag {tag} in {cs:?}"))
}

/// A stream made through `ch` and connected to the remote at once.
fn connected(h: &mut Harness, ch: u32) -> u32 {
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    let cs = h.call(ch, connect_req(id, 1, 0));
    assert_eq!(done(&cs, 1).result, 0, "connect: {cs:?}");
    id
}

/// A harness (`rx_pair`: the pair receive path), a channel, and a stream of it
/// connected to the remote.
fn connected_stream(rx_pair: bool) -> (Harness, u32, u32) {
    let mut h = Harness::new(rx_pair);
    let ch = h.channel();
    let id = connected(&mut h, ch);
    (h, ch, id)
}

/// The shim sends `data` on `id` from `ch` (a lent buffer, tag 0) and the server takes
/// it in a pass over the rings; the completions that pass published.
fn shim_sends(h: &mut Harness, ch: u32, id: u32, data: &[u8]) -> Vec<Cmp> {
    let req = h.send_req(ch, id, data);
    h.call(ch, req)
}

/// The shim found no free buffer after taking `seen` BufReturns: it fills `id`'s pair
/// (marker and filler) and says `WantRoom`.
fn shim_wants_room(h: &mut Harness, ch: u32, id: u32, seen: u32) {
    h.app(id).filler();
    let call = Call::WantRoom {
        sock: id,
        returns_seen: seen,
    };
    h.call(ch, call.encode());
}

// Rule: pair input vs ring sends. Bytes the program wrote straight into its pair go
// out after the sends it queued in the ring before writing them.

#[test]
fn pair_input_waits_for_sends_queued_before_it() {
    let (mut h, ch, id) = connected_stream(true);
    // The host socket is full: the ring send waits in the socket's queue.
    h.peer(id).room(Some(0));
    shim_sends(&mut h, ch, id, b"ring-1 ");
    // Room comes back, but the pair's input event is seen before the host's EPOLLOUT.
    h.peer(id).room(None);
    h.app(id).write(b"pair-2");
    h.pair_event(id, libc::EPOLLIN);
    assert_eq!(
        h.peer(id).view().sent,
        b"",
        "the pair's bytes jumped the queued send"
    );
    h.host_event(id, libc::EPOLLOUT);
    assert_eq!(h.peer(id).view().sent, b"ring-1 pair-2");
    assert_eq!(h.app(id).view().unread, 0);
}

#[test]
fn pair_input_waits_for_sends_still_in_the_ring() {
    let (mut h, ch, id) = connected_stream(true);
    // The shim queued a send in the ring, then the program wrote into the pair; the
    // pair's event comes before the server has taken the ring's record.
    let req = h.send_req(ch, id, b"ring-1 ");
    h.push(ch, req);
    h.app(id).write(b"pair-2");
    h.pair_event(id, libc::EPOLLIN);
    assert_eq!(h.peer(id).view().sent, b"ring-1 pair-2");
}

// Rule: partial sends. A send the host socket takes in part keeps its place and its
// buffer until the rest is out.

#[test]
fn a_partial_send_keeps_its_buffer_and_its_place() {
    let (mut h, ch, id) = connected_stream(false);
    h.peer(id).room(Some(3));
    let a = h.send_req(ch, id, b"abcdef");
    h.push(ch, a);
    let b = h.send_req(ch, id, b"ghi");
    let cs = h.call(ch, b);
    assert_eq!(h.peer(id).view().sent, b"abc");
    assert!(
        cs.iter().all(|c| kind(c) != CmpKind::BufReturn),
        "a buffer came back before its bytes were out: {cs:?}"
    );
    h.peer(id).room(None);
    h.host_event(id, libc::EPOLLOUT);
    assert_eq!(h.peer(id).view().sent, b"abcdefghi");
    let returned = h
        .completions(ch)
        .iter()
        .filter(|c| kind(c) == CmpKind::BufReturn)
        .count();
    assert_eq!(returned, 2);
}

// Rule: WantRoom. A shim that found no free buffer filled its pair (so the fd polls
// unwritable); the filler goes when a buffer comes back to that channel — at once if
// one came back after the shim looked, else at the next BufReturn.

#[test]
fn want_room_drains_the_filler_at_the_next_buffer_return() {
    let (mut h, ch, id) = connected_stream(false);
    h.peer(id).room(Some(0));
    shim_sends(&mut h, ch, id, b"x");
    // The shim has taken 0 BufReturns when it finds no buffer.
    shim_wants_room(&mut h, ch, id, 0);
    assert!(h.app(id).view().unread > 0, "drained with no buffer back");
    h.peer(id).room(None);
    h.host_event(id, libc::EPOLLOUT);
    assert_eq!(
        h.app(id).view().unread,
        0,
        "the buffer came back, the filler stayed"
    );
    let cs = h.completions(ch);
    assert!(cs.iter().any(|c| kind(c) == CmpKind::BufReturn), "{cs:?}");
}

#[test]
fn want_room_after_a_buffer_came_back_drains_at_once() {
    let (mut h, ch, id) = connected_stream(false);
    shim_sends(&mut h, ch, id, b"x");
    // A BufReturn is in the ring; the shim looked before taking it (it saw 0).
    shim_wants_room(&mut h, ch, id, 0);
    assert_eq!(
        h.app(id).view().unread,
        0,
        "a wake-up was lost: the filler stays"
    );
}

// Rule: filler drain. On a stream of the pair path, the program's own bytes in front
// of the filler's marker go out first; the filler is drained when the read reaches
// the mark.

#[test]
fn the_programs_bytes_before_a_filler_go_out_then_the_filler_is_drained() {
    let (mut h, ch, id) = connected_stream(true);
    h.peer(id).room(Some(0));
    shim_sends(&mut h, ch, id, b"ring ");
    h.app(id).write(b"own");
    shim_wants_room(&mut h, ch, id, 0);
    assert_eq!(h.peer(id).view().sent, b"");
    h.peer(id).room(None);
    h.host_event(id, libc::EPOLLOUT);
    assert_eq!(h.peer(id).view().sent, b"ring own");
    assert_eq!(h.app(id).view().unread, 0, "the filler was not drained");
}

// Rule: last bytes at close. What the program wrote into its pair before closing goes
// out, and a filler never does: after a connect's filler was drained (the kernel's
// FIONREAD still counts its marker), and with a filler still in the pair.

/// A non-blocking connect whose shim put a filler in the pair, then succeeds.
fn filled_connect_succeeds(h: &mut Harness, ch: u32) -> u32 {
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    h.peer(id).connect_result(libc::EINPROGRESS);
    h.app(id).filler();
    h.call(ch, connect_req(id, 1, REQ_NONBLOCK | REQ_FILLED));
    h.peer(id).connect_outcome(0);
    h.host_event(id, libc::EPOLLOUT);
    id
}

/// The program closes `id` and the shim says so (`Release`, tag 9).
fn program_closes(h: &mut Harness, ch: u32, id: u32) {
    h.app(id).close();
    let cs = h.call(ch, Call::Release { sock: id, tag: 9 }.encode());
    assert_eq!(done(&cs, 9).result, 0, "release: {cs:?}");
}

#[test]
fn the_programs_last_bytes_go_out_at_close_after_a_connect_filler() {
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = filled_connect_succeeds(&mut h, ch);
    assert_eq!(h.app(id).view().unread, 0, "the connect's filler stayed");
    h.app(id).write(b"last words");
    let peer = h.peer(id);
    program_closes(&mut h, ch, id);
    assert_eq!(peer.view().sent, b"last words");
}

#[test]
fn a_filler_left_in_the_pair_at_close_is_not_sent() {
    // The close is heard of by the shim's Release, or by the pair's hang-up.
    for by_release in [true, false] {
        let (mut h, ch, id) = connected_stream(true);
        h.peer(id).room(Some(0));
        shim_sends(&mut h, ch, id, b"ring ");
        h.app(id).write(b"own");
        shim_wants_room(&mut h, ch, id, 0);
        let peer = h.peer(id);
        if by_release {
            program_closes(&mut h, ch, id);
        } else {
            h.app(id).close();
            h.pair_event(id, libc::EPOLLHUP);
        }
        peer.room(None);
        h.host_event(id, libc::EPOLLOUT);
        let sent = peer.view().sent;
        assert!(
            sent == b"ring own",
            "by_release {by_release}: {} bytes sent",
            sent.len()
        );
    }
}

// Rule: token take-back after accept. A listener's readiness token goes back when the
// accept took the last connection, and stays while more wait.

fn listener(h: &mut Harness, ch: u32) -> u32 {
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let bind = Req {
        tag: 1,
        ..Req::new(Op::Bind, id).with_addr(&WireAddr::from(local))
    };
    assert_eq!(done(&h.call(ch, bind), 1).result, 0);
    let listen = Req {
        tag: 2,
        a: 16,
        ..Req::new(Op::Listen, id)
    };
    assert_eq!(done(&h.call(ch, listen), 2).result, 0);
    h.call(ch, Req::new(Op::WantToken, id));
    assert_eq!(
        h.app(id).view().to_app,
        b"",
        "a token with nothing to accept"
    );
    id
}

fn accept(h: &mut Harness, ch: u32, id: u32) -> Ctl {
    let msg = Ctl {
        sock: id,
        a: 1,
        ..Ctl::new(CtlKind::Accept, id)
    };
    *h.control(ch, msg).last().expect("an accept reply")
}

#[test]
fn the_accept_of_the_last_connection_takes_the_token_back() {
    let mut h = Harness::new(false);
    let ch = h.channel();
    let id = listener(&mut h, ch);
    h.peer(id).connection("198.51.100.1:5000".parse().unwrap());
    h.host_event(id, libc::EPOLLIN);
    assert_eq!(
        h.app(id).view().to_app,
        [1],
        "no token for a waiting connection"
    );
    let r = accept(&mut h, ch, id);
    assert!(r.result > 0, "accept failed: {r:?}");
    assert_eq!(r.c, 1, "the token stays with nothing left to accept");
}

#[test]
fn the_token_stays_while_connections_wait() {
    let mut h = Harness::new(false);
    let ch = h.channel();
    let id = listener(&mut h, ch);
    h.peer(id).connection("198.51.100.1:5000".parse().unwrap());
    h.peer(id).connection("198.51.100.2:5000".parse().unwrap());
    h.host_event(id, libc::EPOLLIN);
    let r = accept(&mut h, ch, id);
    assert!(r.result > 0);
    assert_eq!(r.c, 0, "token taken back with a connection still waiting");
    let r = accept(&mut h, ch, id);
    assert_eq!(r.c, 1);
    let r = accept(&mut h, ch, id);
    assert_eq!(r.result, -libc::EAGAIN);
}

// Rule: refused connect. A blocking connect that fails leaves the socket able to
// connect again (the server dissolves it); a failed non-blocking one shows POLLERR |
// POLLHUP on the program's fd (the pair is detached), the next connect reports the
// error, and the one after it asks for a new pair.

#[test]
fn a_refused_blocking_connect_fails_and_resets_the_socket() {
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    // The connect is in progress (the request parks), then refused.
    h.peer(id).connect_result(libc::EINPROGRESS);
    let cs = h.call(ch, connect_req(id, 5, 0));
    assert!(
        cs.iter().all(|c| c.tag != 5),
        "answered while in progress: {cs:?}"
    );
    h.peer(id).connect_outcome(libc::ECONNREFUSED);
    h.host_event(id, libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP);
    let cs = h.completions(ch);
    assert_eq!(done(&cs, 5).result, -libc::ECONNREFUSED);
    assert_eq!(
        h.peer(id).view().unspecs,
        1,
        "the socket was not put back to unconnected"
    );
    assert!(!h.app(id).view().detached);
}

#[test]
fn a_refused_nonblocking_connect_detaches_the_pair_then_reports_then_renews() {
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    h.peer(id).connect_result(libc::EINPROGRESS);
    h.app(id).filler();
    let cs = h.call(ch, connect_req(id, 1, REQ_NONBLOCK | REQ_FILLED));
    assert_eq!(done(&cs, 1).result, -libc::EINPROGRESS);
    assert!(
        h.app(id).view().unread > 0,
        "the filler went before the connect ended"
    );
    h.peer(id).connect_outcome(libc::ECONNREFUSED);
    h.host_event(id, libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP);
    assert!(
        h.app(id).view().detached,
        "the program's fd would not poll POLLERR|POLLHUP"
    );
    // The next connect reports the failure and resets the socket.
    let cs = h.call(ch, connect_req(id, 2, REQ_NONBLOCK));
    assert_eq!(done(&cs, 2).result, -libc::ECONNREFUSED);
    assert_eq!(h.peer(id).view().unspecs, 1);
    // The one after asks the shim to renew the pair first.
    let cs = h.call(ch, connect_req(id, 3, REQ_NONBLOCK));
    let d = done(&cs, 3);
    assert_eq!(d.result, -libc::ECONNABORTED);
    assert_ne!(d.flags & CMP_RENEW_PAIR, 0);
}

#[test]
fn a_second_connect_that_takes_the_refusal_ends_the_one_in_progress() {
    // The kernel reports a connect's outcome to whichever call asks first, and the
    // socket is unconnected again. The server once kept the first connect "in
    // progress", took a late writable event for its success, and parked the next
    // blocking connect where nothing would answer it (the fuzz target's stall).
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    h.peer(id).connect_result(libc::EINPROGRESS);
    let cs = h.call(ch, connect_req(id, 1, REQ_NONBLOCK));
    assert_eq!(done(&cs, 1).result, -libc::EINPROGRESS);
    h.peer(id).connect_result(libc::ECONNREFUSED);
    let cs = h.call(ch, connect_req(id, 2, REQ_NONBLOCK));
    assert_eq!(done(&cs, 2).result, -libc::ECONNREFUSED);
    h.host_event(id, libc::EPOLLOUT);
    h.peer(id).connect_result(libc::EINPROGRESS);
    let cs = h.call(ch, connect_req(id, 3, 0));
    assert!(
        cs.iter().all(|c| c.tag != 3),
        "answered in progress: {cs:?}"
    );
    h.peer(id).connect_outcome(0);
    h.host_event(id, libc::EPOLLOUT);
    let cs = h.completions(ch);
    assert_eq!(
        done(&cs, 3).result,
        0,
        "the blocking connect was never answered"
    );
}

#[test]
fn a_writable_edge_from_before_a_blocking_connect_does_not_end_it() {
    // The host socket's first edge (writable, hung up: not connected yet) may be read
    // after the connect started. The waiting connect's outcome comes from the kernel's
    // next connect, which says EALREADY then: it stays parked until the real edge.
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    h.peer(id).connect_result(libc::EINPROGRESS);
    let cs = h.call(ch, connect_req(id, 4, 0));
    assert!(
        cs.iter().all(|c| c.tag != 4),
        "answered in progress: {cs:?}"
    );
    h.host_event(id, libc::EPOLLOUT | libc::EPOLLHUP);
    let cs = h.completions(ch);
    assert!(
        cs.iter().all(|c| c.tag != 4),
        "a stale edge ended the connect: {cs:?}"
    );
    h.peer(id).connect_outcome(0);
    h.host_event(id, libc::EPOLLOUT);
    let cs = h.completions(ch);
    assert_eq!(done(&cs, 4).result, 0);
}

#[test]
fn a_connect_whose_error_another_call_took_is_no_success() {
    // SO_ERROR 0 when the connect ends, but no peer: it failed (a receive or a
    // getsockopt took the error). It once counted as connected, and the program's
    // next connect then parked for ever.
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    h.peer(id).connect_result(libc::EINPROGRESS);
    h.app(id).filler();
    let cs = h.call(ch, connect_req(id, 1, REQ_NONBLOCK | REQ_FILLED));
    assert_eq!(done(&cs, 1).result, -libc::EINPROGRESS);
    h.peer(id).connect_error_taken();
    h.host_event(id, libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP);
    assert!(
        h.app(id).view().detached,
        "a failed connect counted as a connection"
    );
    let cs = h.call(ch, connect_req(id, 2, REQ_NONBLOCK));
    assert_eq!(done(&cs, 2).result, -libc::ECONNABORTED);
}

#[test]
fn a_nonblocking_connect_that_succeeds_drains_the_filler() {
    let mut h = Harness::new(true);
    let ch = h.channel();
    let id = filled_connect_succeeds(&mut h, ch);
    assert!(!h.app(id).view().detached);
    assert_eq!(
        h.app(id).view().unread,
        0,
        "still unwritable after the connect"
    );
}

// Rule: room in a pair is watched only once a pump waits for it. The program's every
// read makes room, and a pair watched for it from the start reported each read of a
// request/response stream to the loop (and woke a sleeping server) for nothing.

#[test]
fn room_in_the_pair_is_watched_only_once_a_pump_waits_for_it() {
    let out = libc::EPOLLOUT.cast_unsigned();
    let (mut h, _ch, id) = connected_stream(true);
    h.peer(id).input(b"ping");
    h.host_event(id, libc::EPOLLIN);
    assert_eq!(h.app(id).view().to_app, b"ping");
    let watched = h.pair_watch(id).expect("the pair is in the loop");
    assert_eq!(watched & out, 0, "watched for room at once: {watched:#x}");
    h.app(id).room(Some(0));
    h.peer(id).input(b"pong");
    h.host_event(id, libc::EPOLLIN);
    assert_eq!(h.app(id).view().to_app, b"ping", "the full pair took bytes");
    let watched = h.pair_watch(id).expect("the pair is in the loop");
    assert_ne!(
        watched & out,
        0,
        "a pump waits, room unwatched: {watched:#x}"
    );
    h.app(id).room(None);
    h.pair_event(id, libc::EPOLLOUT);
    assert_eq!(h.app(id).view().to_app, b"pingpong");
}

// Rule: hang-up mirroring. The host socket's hang-up reaches the program's end only
// after the end of the stream has, and the channel's completions (the EPIPE it
// reports) are published first.

#[test]
fn a_hang_up_is_mirrored_only_after_the_bytes_before_it() {
    let (mut h, ch, id) = connected_stream(true);
    h.app(id).room(Some(0));
    h.peer(id).input(b"bye");
    h.peer(id).fin();
    h.host_event(
        id,
        libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLHUP,
    );
    let p = h.app(id).view();
    assert!(!p.eof && !p.hup, "ended before its bytes: {p:?}");
    let cs = h.completions(ch);
    assert!(
        cs.iter()
            .any(|c| kind(c) == CmpKind::AsyncError && c.result == -libc::EPIPE),
        "the hang-up's EPIPE is not reported: {cs:?}"
    );
    h.app(id).room(None);
    h.pair_event(id, libc::EPOLLOUT);
    let p = h.app(id).view();
    assert_eq!(p.to_app, b"bye");
    assert!(p.eof && p.hup, "{p:?}");
}

#[test]
fn the_hang_ups_error_is_published_before_the_hang_up_is_mirrored() {
    let (mut h, ch, id) = connected_stream(true);
    h.completions(ch);
    h.peer(id).fin();
    // The program looks at its ring the moment its fd reports POLLHUP, before the
    // server's turn ends.
    h.host_event_only(id, libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP);
    assert!(h.app(id).view().hup);
    let cs = h.completions(ch);
    assert!(
        cs.iter()
            .any(|c| kind(c) == CmpKind::AsyncError && c.result == -libc::EPIPE),
        "POLLHUP seen before the EPIPE that goes with it: {cs:?}"
    );
}

// Rule: end of stream. The pair path mirrors the end (0, or the error, reported once
// to the receive that asks); on the ring path a polled stream that has ended keeps its
// token (it stays readable with no edge to come).

#[test]
fn the_end_of_a_stream_reaches_the_pair_and_its_error_is_reported_once() {
    let (mut h, ch, id) = connected_stream(true);
    h.peer(id).input(b"last");
    h.peer(id).reset(libc::ECONNRESET);
    h.host_event(id, libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP);
    let p = h.app(id).view();
    assert_eq!(p.to_app, b"last");
    assert!(p.eof, "the end did not reach the pair: {p:?}");
    let recv = |tag| Req {
        tag,
        a: 100,
        ..Req::new(Op::Recv, id)
    };
    let cs = h.call(ch, recv(7));
    assert_eq!(done(&cs, 7).result, -libc::ECONNRESET);
    let cs = h.call(ch, recv(8));
    assert_eq!(done(&cs, 8).result, 0);
}

// The program's `shutdown(SHUT_RD)` is answered once the end it makes is taken: the
// shim shuts its end's read side next and asks how the stream ended, and must hear
// EOF, not the EAGAIN of a stream still open (the kernel's epoll reports the end only
// in a later turn; the conformance case `io.shutdown_rd` saw EAGAIN under load).
#[test]
fn a_read_shutdown_is_answered_with_the_end_taken() {
    let (mut h, ch, id) = connected_stream(true);
    let shut = Call::Shutdown {
        sock: id,
        tag: 4,
        how: libc::SHUT_RD,
    };
    let cs = h.call(ch, shut.encode());
    assert_eq!(done(&cs, 4).result, 0, "shutdown: {cs:?}");
    assert!(h.app(id).view().eof, "the end did not reach the pair");
    let ended = Req {
        tag: 5,
        ..Req::new(Op::Recv, id)
    };
    let cs = h.call(ch, ended);
    assert_eq!(done(&cs, 5).result, 0, "how the stream ended: {cs:?}");
}

#[test]
fn an_ended_stream_keeps_its_token() {
    let (mut h, ch, id) = connected_stream(false);
    h.call(ch, Req::new(Op::WantToken, id));
    h.peer(id).input(b"abc");
    h.host_event(id, libc::EPOLLIN);
    assert_eq!(h.app(id).take_output(), [1]);
    let recv = |tag| Req {
        tag,
        a: 100,
        ..Req::new(Op::Recv, id)
    };
    let cs = h.call(ch, recv(1));
    let d = done(&cs, 1);
    assert_eq!(d.result, 3);
    assert_ne!(
        d.flags & CMP_DRAIN_TOKEN,
        0,
        "an empty socket kept its token"
    );
    h.call(ch, Req::new(Op::TokenDrained, id));
    assert_eq!(h.app(id).take_output(), b"", "a token for an empty socket");
    h.peer(id).fin();
    h.host_event(id, libc::EPOLLIN | libc::EPOLLRDHUP);
    assert_eq!(
        h.app(id).take_output(),
        [1],
        "no token for the end of the stream"
    );
    assert!(h.app(id).view().eof);
    let cs = h.call(ch, recv(2));
    let d = done(&cs, 2);
    assert_eq!(d.result, 0);
    assert_eq!(
        d.flags & CMP_DRAIN_TOKEN,
        0,
        "the token went, but the ended stream stays readable"
    );
}

// Rule: on the ring path, a polled stream's end reaches the pair after its token: the
// token is one write and the end (shutting the pair's write side) another, and nothing
// can be written after the end. (A program can still see the token's EPOLLIN before the
// end's EPOLLRDHUP: two writes are two wake-ups; see conformance's known differences.)

#[test]
fn the_token_goes_into_the_pair_before_the_end_of_the_stream() {
    let (mut h, ch, id) = connected_stream(false);
    h.call(ch, Req::new(Op::WantToken, id));
    h.peer(id).fin();
    h.host_event(id, libc::EPOLLIN | libc::EPOLLRDHUP);
    let p = h.app(id).view();
    assert_eq!(p.to_app, [1], "no token for the end of the stream");
    assert_eq!(p.eof_after, Some(1), "the end came before the token: {p:?}");
}

// Rule: urgent data. On the pair path the urgent byte goes into the pair out of band,
// at its place in the stream.

#[test]
fn urgent_data_reaches_the_pair_at_its_mark() {
    let (mut h, _, id) = connected_stream(true);
    h.peer(id).input(b"ab");
    h.peer(id).urgent(b'!');
    h.peer(id).input(b"cd");
    h.host_event(id, libc::EPOLLIN | libc::EPOLLPRI);
    let p = h.app(id).view();
    assert_eq!(p.to_app, b"abcd");
    assert_eq!(
        p.oob,
        [(2, b'!')],
        "the urgent byte is lost or out of place"
    );
}

// Rule: back-pressure. A program that does not read its completions stops having its
// requests taken (they wait in its ring) once a bounded backlog has built up; nothing
// is lost and the order holds when it reads them again.

#[test]
fn completions_that_back_up_stop_the_channels_requests_and_lose_nothing() {
    let (mut h, ch, id) = connected_stream(false);
    h.completions(ch);
    let mut tag = 0u32;
    let mut turns = 0;
    while h.ring_waiting(ch) == 0 {
        while h.ring_room(ch) > 0 {
            tag += 1;
            h.push(
                ch,
                Req {
                    tag,
                    ..Req::new(Op::Pending, id)
                },
            );
        }
        h.turn();
        turns += 1;
        assert!(turns < 100, "requests are taken without bound");
    }
    assert_eq!(h.backpressure_count(), 1);
    let held = h.backlog(ch);
    assert!((2048..2048 + 256).contains(&held), "backlog of {held}");
    // The program reads its completions again: every answer comes, in order.
    let mut next = 1;
    for _ in 0..200 {
        for c in h.completions(ch) {
            assert_eq!(kind(&c), CmpKind::Done);
            assert_eq!(c.tag, next, "out of order");
            next += 1;
        }
        if next > tag {
            break;
        }
        h.turn();
    }
    assert_eq!(next, tag + 1, "answers lost");
}

// The harness itself: a fuzzer makes millions of harnesses in one process, so one that
// is dropped must give back every descriptor it (or the server under it) took.

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn harnesses_leave_no_descriptors_behind() {
    let cycle = || {
        let (mut h, ch, _) = connected_stream(true);
        let l = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        h.call(ch, Req::new(Op::Bind, l).with_addr(&WireAddr::from(local)));
        h.call(ch, Req::new(Op::Listen, l));
        // One connection accepted, one left waiting when the harness goes.
        h.peer(l).connection("198.51.100.1:5000".parse().unwrap());
        h.peer(l).connection("198.51.100.2:5000".parse().unwrap());
        let msg = Ctl {
            sock: l,
            a: 1,
            ..Ctl::new(CtlKind::Accept, l)
        };
        h.control(ch, msg);
    };
    cycle();
    let before = open_fds();
    for _ in 0..50 {
        cycle();
    }
    // Other tests of this binary open and close descriptors meanwhile: allow a few.
    let after = open_fds();
    assert!(
        after < before + 20,
        "{before} descriptors before, {after} after 50 harnesses"
    );
}

/// A spare TCP socket is made in a turn with nothing to do, once a program asked for a
/// TCP socket, and only a TCP socket of its family takes it; the socket it becomes works
/// as one made at the call.
#[test]
fn a_tcp_socket_after_an_idle_turn_is_the_spare_made_in_it() {
    let mut h = Harness::new(true);
    let ch = h.channel();
    h.idle();
    let first = connected(&mut h, ch);
    assert_eq!(
        h.sockets_made_ahead(),
        0,
        "nothing is made before a TCP socket"
    );
    h.idle();
    let udp = h.socket(ch, libc::AF_INET, libc::SOCK_DGRAM);
    assert_eq!(
        h.sockets_made_ahead(),
        0,
        "a datagram socket leaves the spare"
    );
    let second = connected(&mut h, ch);
    assert_eq!(h.sockets_made_ahead(), 1);
    assert!(second > first && h.has_socket(second));
    shim_sends(&mut h, ch, second, b"hello");
    assert_eq!(h.peer(second).view().sent, b"hello");
    h.idle();
    let v6 = h.socket(ch, libc::AF_INET6, libc::SOCK_STREAM);
    assert_eq!(h.sockets_made_ahead(), 1, "an IPv4 spare is no IPv6 socket");
    h.idle();
    let v6b = h.socket(ch, libc::AF_INET6, libc::SOCK_STREAM);
    assert_eq!(
        h.sockets_made_ahead(),
        2,
        "after an IPv6 socket, an IPv6 spare"
    );
    let ids = [first, udp, second, v6, v6b];
    assert!(ids.iter().all(|id| h.has_socket(*id)), "{ids:?}");
}

/// The next spare waits for the `connect` of the socket just taken: a turn idle for
/// 10 µs between a `socket()` and its `connect` makes nothing (the spare's calls would
/// delay that `connect`), one after the `connect` makes it; a socket that is not
/// connected (a listener's) gets its spare after 50 µs idle, or before the server sleeps.
#[test]
fn the_spare_waits_for_the_connect_that_follows_a_socket() {
    let us = std::time::Duration::from_micros;
    let mut h = Harness::new(true);
    let ch = h.channel();
    connected(&mut h, ch);
    h.idle_after(us(10));
    connected(&mut h, ch);
    assert_eq!(h.sockets_made_ahead(), 1, "made after the first connect");
    let id = h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    h.idle_after(us(10));
    let cs = h.call(ch, connect_req(id, 1, 0));
    assert_eq!(done(&cs, 1).result, 0, "connect: {cs:?}");
    h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    assert_eq!(h.sockets_made_ahead(), 1, "nothing made before the connect");
    h.idle_after(us(10));
    h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    assert_eq!(
        h.sockets_made_ahead(),
        1,
        "nor after a socket left unconnected"
    );
    h.idle_after(us(50));
    h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    assert_eq!(
        h.sockets_made_ahead(),
        2,
        "made after 50 µs without a connect"
    );
    h.idle();
    h.socket(ch, libc::AF_INET, libc::SOCK_STREAM);
    assert_eq!(h.sockets_made_ahead(), 3, "made before the server sleeps");
}

/// A spare is added to the loop for the pair path when it is made; a channel that
/// receives through the ring takes it too, and its socket works.
#[test]
fn a_spare_taken_by_a_ring_channel_works() {
    let mut h = Harness::new(false);
    let ch = h.channel();
    let first = connected(&mut h, ch);
    h.idle();
    let second = connected(&mut h, ch);
    assert_eq!(h.sockets_made_ahead(), 1);
    assert!(second > first && h.has_socket(second));
    shim_sends(&mut h, ch, second, b"ring");
    assert_eq!(h.peer(second).view().sent, b"ring");
}
