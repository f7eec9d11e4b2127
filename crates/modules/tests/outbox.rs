//! `Outbox`: actions written to a non-blocking socket a piece at a time, in order, as
//! a server's event loop would.

mod common;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use common::{random_bytes, tmpdir};
use ferry_modules::{Action, Outbox, perform};

#[test]
fn outbox_resumes_on_a_nonblocking_socket() {
    // sendfile only; both ranges copied; the small range copied, the big one sendfile'd.
    for copy_max in [0, u64::MAX, 2000] {
        resumes_on_a_nonblocking_socket(copy_max);
    }
}

/// A file of `len` random bytes (from `seed`) in a fresh directory `tag`: its bytes and
/// the file, open for reading.
fn random_file(tag: &str, len: usize, seed: u64) -> (Vec<u8>, Arc<OwnedFd>) {
    let path = tmpdir(tag).join("f");
    let data = random_bytes(len, seed);
    std::fs::write(&path, &data).expect("write");
    let file = Arc::new(std::fs::File::open(&path).expect("open").into());
    (data, file)
}

/// A connected TCP pair on 127.0.0.1: (client, server), the server non-blocking, its
/// send buffer and the client's receive buffer `bufs` bytes, so that the socket fills
/// and an outbox has to resume.
fn small_nonblocking_pair(bufs: usize) -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (server, _) = l.accept().expect("accept");
    server.set_nonblocking(true).expect("nonblocking");
    rustix::net::sockopt::set_socket_send_buffer_size(&server, bufs).expect("sndbuf");
    rustix::net::sockopt::set_socket_recv_buffer_size(&client, bufs).expect("rcvbuf");
    (client, server)
}

/// Advances `out` on `server` until it is empty, as an event loop would (each call's
/// count must match what left the queue), reading `chunk` bytes from `client` whenever
/// the socket is full; then everything the client received, and how often it was full.
fn drain(
    mut out: Outbox,
    mut client: TcpStream,
    server: TcpStream,
    chunk: usize,
) -> (Vec<u8>, usize) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; chunk];
    let mut stalls = 0;
    while !out.is_empty() {
        let before = out.pending_bytes();
        let n = out.advance(server.as_fd()).expect("advance");
        assert_eq!(before - out.pending_bytes(), n);
        if !out.is_empty() {
            // The socket is full: the event loop would wait for POLLOUT; read some.
            stalls += 1;
            let k = client.read(&mut buf).expect("read");
            got.extend_from_slice(&buf[..k]);
        }
    }
    drop(server);
    client.read_to_end(&mut got).expect("read rest");
    (got, stalls)
}

fn resumes_on_a_nonblocking_socket(copy_max: u64) {
    let (data, file) = random_file(&format!("outbox-{copy_max}"), 3 << 20, 77);

    let (client, server) = small_nonblocking_pair(64 * 1024);

    let mut want = b"head:".to_vec();
    want.extend_from_slice(&data[100..]);
    want.extend_from_slice(b":mid:");
    want.extend_from_slice(&data[..1000]);
    want.extend_from_slice(b":tail");

    let mut out = Outbox::new();
    out.set_copy_max(copy_max);
    out.push([
        Action::Emit(b"head:".to_vec()),
        Action::EmitFile {
            file: Arc::clone(&file),
            offset: 100,
            len: data.len() as u64 - 100,
        },
        Action::Emit(b":mid:".to_vec()),
        Action::EmitFile {
            file,
            offset: 0,
            len: 1000,
        },
        Action::Emit(Vec::new()),
        Action::Emit(b":tail".to_vec()),
    ]);
    assert_eq!(out.pending_bytes(), want.len() as u64);

    let (got, stalls) = drain(out, client, server, 100_000);
    assert!(
        stalls > 0,
        "a 3 MiB write should fill the socket at least once"
    );
    assert_eq!(got.len(), want.len(), "copy_max {copy_max}");
    assert!(
        got == want,
        "bytes out of order or wrong (copy_max {copy_max})"
    );
}

#[test]
fn perform_reports_a_file_shorter_than_its_range() {
    let dir = tmpdir("outbox-short");
    let path = dir.join("short");
    std::fs::write(&path, b"abc").expect("write");
    let file: Arc<OwnedFd> = Arc::new(std::fs::File::open(&path).expect("open").into());
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let _client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (server, _) = l.accept().expect("accept");
    // The file shrank after the module checked it: the server gets an error, not a hang.
    let e = perform(
        [Action::EmitFile {
            file,
            offset: 0,
            len: 10,
        }],
        &server,
    )
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    // The same when the range is copied: the bytes that exist go out, then the error.
    let mut out = Outbox::new();
    out.set_copy_max(u64::MAX);
    out.push([Action::EmitFile {
        file: Arc::new(std::fs::File::open(&path).expect("open").into()),
        offset: 0,
        len: 10,
    }]);
    let e = out.advance(server.as_fd()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    assert_eq!(out.pending_bytes(), 7, "the 3 bytes of the file went out");
}

#[test]
fn copied_ranges_go_to_a_pipe_too() {
    // Not a socket: the copied bytes go out with write(2), as Emit's do.
    let (data, file) = random_file("outbox-pipe", 300_000, 5);
    let (mut r, w) = std::io::pipe().expect("pipe");
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        r.read_to_end(&mut all).expect("read");
        all
    });
    let mut out = Outbox::new();
    out.set_copy_max(u64::MAX);
    out.push([
        Action::Emit(b"h".to_vec()),
        Action::EmitFile {
            file,
            offset: 1,
            len: data.len() as u64 - 1,
        },
    ]);
    while !out.is_empty() {
        out.advance(w.as_fd()).expect("advance");
    }
    drop(w);
    let got = reader.join().expect("reader");
    assert_eq!(got.len(), data.len());
    assert!(got[0] == b'h' && got[1..] == data[1..]);
}

#[test]
fn many_small_pieces_gather_in_order() {
    // Emitted buffers and small copied ranges alternate (more pieces than one gathered
    // send carries, and ranges longer than one stage), on a socket that fills: every
    // byte arrives once and in order, however the sends split.
    let (data, file) = random_file("outbox-gather", 400_000, 9);
    let (client, server) = small_nonblocking_pair(16 * 1024);

    let mut want = Vec::new();
    let mut actions = Vec::new();
    for i in 0..300u64 {
        let tag = format!("<{i}>").into_bytes();
        want.extend_from_slice(&tag);
        actions.push(Action::Emit(tag));
        if i % 3 == 0 {
            // Every third one a few plain buffers in a row, to fill a gathered send.
            for _ in 0..i % 7 {
                want.push(b'.');
                actions.push(Action::Emit(b".".to_vec()));
            }
        }
        let (offset, len) = if i % 50 == 7 {
            (i, 300_000) // longer than one stage
        } else {
            (i * 131 % 390_000, 1 + i * 17 % 900)
        };
        want.extend_from_slice(&data[offset as usize..(offset + len) as usize]);
        actions.push(Action::EmitFile {
            file: Arc::clone(&file),
            offset,
            len,
        });
    }
    let mut out = Outbox::new();
    out.set_copy_max(u64::MAX);
    out.push(actions);
    assert_eq!(out.pending_bytes(), want.len() as u64);
    let (got, _) = drain(out, client, server, 3000);
    assert_eq!(got.len(), want.len());
    assert!(got == want, "bytes out of order or wrong");
}
