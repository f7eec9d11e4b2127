//! The frontend's connection, relayed to the daemon (`vhost-user-backend`) message by
//! message, for one reason: QEMU enables a virtio-net device's rings
//! (`SET_VRING_ENABLE`) while it sets the device up, before it sets the features
//! (`SET_FEATURES`), and `vhost` refuses that (the message needs
//! `VHOST_USER_F_PROTOCOL_FEATURES` acked) and drops the connection. Before the first
//! such message the relay sets the features to that bit alone (the frontend sets them
//! all later, when the guest's driver has chosen); every message passes unchanged, its
//! descriptors with it. Replies go back as bytes (the features negotiated carry no
//! descriptors that way).
//!
//! A message is a 12-byte header (request, flags, payload size, little-endian) and its
//! payload; one larger than [`MAX_PAYLOAD`] ends the connection.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

const HDR: usize = 12;
/// Largest payload relayed (the protocol's messages are at most a few KiB).
pub(crate) const MAX_PAYLOAD: usize = 64 * 1024;
const SET_FEATURES: u32 = 2;
const SET_VRING_ENABLE: u32 = 18;
/// `VHOST_USER_F_PROTOCOL_FEATURES`.
const PROTOCOL_FEATURES: u64 = 1 << 30;
/// Header flags: protocol version 1, no reply wanted.
const VERSION_1: u32 = 0x1;

/// What to send before a message of the frontend's.
#[derive(Debug, Default)]
pub(crate) struct Fixup {
    features_set: bool,
}

impl Fixup {
    /// The message to send before one whose request is `request` (pure).
    pub(crate) fn before(&mut self, request: u32) -> Option<[u8; HDR + 8]> {
        match request {
            SET_FEATURES => {
                self.features_set = true;
                None
            }
            SET_VRING_ENABLE if !self.features_set => {
                self.features_set = true;
                let mut m = [0u8; HDR + 8];
                m[0..4].copy_from_slice(&SET_FEATURES.to_le_bytes());
                m[4..8].copy_from_slice(&VERSION_1.to_le_bytes());
                m[8..12].copy_from_slice(&8u32.to_le_bytes());
                m[12..20].copy_from_slice(&PROTOCOL_FEATURES.to_le_bytes());
                Some(m)
            }
            _ => None,
        }
    }
}

/// Reads one message from the frontend: its bytes (header and payload) and the
/// descriptors that came with it. `Ok(None)`: the frontend closed.
fn read_message(front: &UnixStream) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut msg = vec![0u8; HDR];
    let (n, fds) = ferry_sys::recv_with_fds(front.as_fd(), &mut msg, 0)?;
    if n == 0 {
        return Ok(None);
    }
    (&*front).read_exact(&mut msg[n..])?;
    let size = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a vhost-user message of {size} bytes"),
        ));
    }
    msg.resize(HDR + size, 0);
    (&*front).read_exact(&mut msg[HDR..])?;
    Ok(Some((msg, fds)))
}

/// Relays the frontend's messages to the daemon until either side ends.
fn forward(front: &UnixStream, back: &UnixStream) -> io::Result<()> {
    let mut fixup = Fixup::default();
    while let Some((msg, fds)) = read_message(front)? {
        let request = u32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]);
        if let Some(first) = fixup.before(request) {
            (&*back).write_all(&first)?;
        }
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        if borrowed.len() > 24 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a vhost-user message with more than 24 descriptors",
            ));
        }
        // The descriptors ride with the first bytes; the rest follows.
        ferry_sys::send_with_fds(back.as_fd(), &msg[..1], &borrowed)?;
        (&*back).write_all(&msg[1..])?;
    }
    Ok(())
}

/// Relays between `front` (the frontend) and `back` (the daemon) until either ends;
/// then both are shut down.
pub(crate) fn relay(front: UnixStream, back: UnixStream) -> io::Result<()> {
    let (f2, b2) = (front.try_clone()?, back.try_clone()?);
    let replies = std::thread::Builder::new()
        .name("ferry-vhost-relay".into())
        .spawn(move || {
            let _ = io::copy(&mut &b2, &mut &f2);
            let _ = f2.shutdown(std::net::Shutdown::Both);
            let _ = b2.shutdown(std::net::Shutdown::Both);
        })?;
    let r = forward(&front, &back);
    let _ = front.shutdown(std::net::Shutdown::Both);
    let _ = back.shutdown(std::net::Shutdown::Both);
    let _ = replies.join();
    match r {
        // A frontend killed while messages were under way (its unread data resets the
        // connection): the end of a VM, as a close is.
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_set_once_before_an_early_ring_enable_only() {
        let mut f = Fixup::default();
        assert!(f.before(1).is_none(), "GET_FEATURES passes");
        let m = f
            .before(SET_VRING_ENABLE)
            .expect("an early enable gets features first");
        assert_eq!(
            u32::from_le_bytes(m[0..4].try_into().unwrap()),
            SET_FEATURES
        );
        assert_eq!(u32::from_le_bytes(m[8..12].try_into().unwrap()), 8);
        assert_eq!(
            u64::from_le_bytes(m[12..20].try_into().unwrap()),
            PROTOCOL_FEATURES
        );
        assert!(f.before(SET_VRING_ENABLE).is_none(), "once");
        let mut g = Fixup::default();
        assert!(g.before(SET_FEATURES).is_none());
        assert!(g.before(SET_VRING_ENABLE).is_none(), "features already set");
    }

    #[test]
    fn messages_and_their_descriptors_pass_and_oversized_ones_end_the_relay() {
        let (front_peer, front) = UnixStream::pair().unwrap();
        let (back, back_peer) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || relay(front, back));
        // SET_VRING_ENABLE {index 0, num 1} with an eventfd attached.
        let mut m = Vec::new();
        m.extend_from_slice(&SET_VRING_ENABLE.to_le_bytes());
        m.extend_from_slice(&VERSION_1.to_le_bytes());
        m.extend_from_slice(&8u32.to_le_bytes());
        m.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0]);
        let efd = ferry_sys::eventfd().unwrap();
        ferry_sys::send_with_fds(front_peer.as_fd(), &m, &[efd.as_fd()]).unwrap();
        let want = HDR + 8 + m.len();
        let (mut got, mut at, mut fds) = (vec![0u8; want], 0, Vec::new());
        while at < want {
            let (n, f) = ferry_sys::recv_with_fds(back_peer.as_fd(), &mut got[at..], 0).unwrap();
            assert!(n > 0, "the relay closed early");
            at += n;
            fds.extend(f);
        }
        assert_eq!(&got[..4], &SET_FEATURES.to_le_bytes(), "injected first");
        assert_eq!(&got[HDR + 8..], &m[..], "then the message, unchanged");
        assert_eq!(fds.len(), 1, "its descriptor with it");
        // Replies flow back as bytes.
        (&back_peer).write_all(b"reply").unwrap();
        let mut r = [0u8; 5];
        (&front_peer).read_exact(&mut r).unwrap();
        assert_eq!(&r, b"reply");
        // A header claiming a huge payload ends the relay with an error.
        let mut big = Vec::new();
        big.extend_from_slice(&1u32.to_le_bytes());
        big.extend_from_slice(&VERSION_1.to_le_bytes());
        big.extend_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        (&front_peer).write_all(&big).unwrap();
        assert!(t.join().unwrap().is_err());
    }
}
