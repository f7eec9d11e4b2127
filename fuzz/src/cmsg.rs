//! Target `cmsg`: control messages (`ferry_proto::cmsg`) on both paths.
//!
//! Send path (program → host): [`cmsg::sanitize_send`] on the bytes a sandbox attached
//! to a datagram. Properties: it never panics; what it returns is no longer than the
//! input rounded up to the word size and never longer than [`cmsg::MAX_CONTROL`], is well
//! formed, holds only messages of [`cmsg::SEND_ALLOWED`] with an allowed length, and is
//! accepted again unchanged (sanitizing is idempotent); a refusal is `EINVAL`.
//!
//! Receive path (host → program): [`cmsg::put`] into a program's `msg_control` of the
//! size the input's first two bytes choose. Properties: it never writes past the
//! buffer; what it places is well formed, each message a prefix of the one it came
//! from; nothing is cut without `MSG_CTRUNC`; a buffer with room for everything gets
//! everything.

use ferry_proto::cmsg::{self, Cmsg, HDR, MAX_CONTROL, SEND_ALLOWED};

use crate::input::Input;

/// One input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let room = input.u16() as usize % (2 * MAX_CONTROL + HDR);
    let raw = input.rest();
    sanitize(raw);
    put(raw, room);
}

fn sanitize(raw: &[u8]) {
    let clean = match cmsg::sanitize_send(raw) {
        Ok(clean) => clean,
        Err(e) => {
            assert_eq!(e.errno(), libc::EINVAL);
            let _ = e.to_string();
            return;
        }
    };
    assert!(
        clean.len() <= cmsg::align(raw.len()),
        "{raw:?} -> {clean:?}"
    );
    assert!(clean.len() <= MAX_CONTROL);
    assert_eq!(cmsg::check(&clean), Ok(()));
    let mut used = 0;
    for m in cmsg::parse(&clean) {
        let allowed = SEND_ALLOWED
            .iter()
            .find(|(l, t, _)| (*l, *t) == (m.level, m.ty))
            .is_some_and(|(_, _, lens)| lens.contains(&m.data.len()));
        assert!(allowed, "sanitized output holds {m:?}");
        used += cmsg::space(m.data.len());
    }
    assert_eq!(
        used,
        clean.len(),
        "sanitized output has bytes no message covers"
    );
    assert_eq!(
        cmsg::sanitize_send(&clean).as_ref(),
        Ok(&clean),
        "sanitizing is not idempotent"
    );
}

fn put(raw: &[u8], room: usize) {
    // Guard bytes after the program's buffer: `put` must leave them alone.
    const GUARD: usize = 16;
    let mut out = vec![0xa5u8; room + GUARD];
    let placed = cmsg::put(raw, &mut out[..room]);
    assert!(placed.used <= room);
    assert!(
        out[room..].iter().all(|&b| b == 0xa5),
        "put wrote past the buffer"
    );
    let src: Vec<Cmsg<'_>> = cmsg::parse(raw).collect();
    let got: Vec<Cmsg<'_>> = cmsg::parse(&out[..placed.used]).collect();
    assert_eq!(cmsg::check(&out[..placed.used]), Ok(()));
    assert!(got.len() <= src.len());
    for (g, s) in got.iter().zip(&src) {
        assert_eq!((g.level, g.ty), (s.level, s.ty));
        assert!(s.data.starts_with(g.data), "placed data is not a prefix");
    }
    let whole = got.len() == src.len()
        && got
            .iter()
            .zip(&src)
            .all(|(g, s)| g.data.len() == s.data.len());
    assert!(whole || placed.truncated, "cut without MSG_CTRUNC");
    let need: usize = src.iter().map(|m| cmsg::space(m.data.len())).sum();
    if room >= need {
        assert!(!placed.truncated && whole, "room for all, yet cut");
        assert_eq!(placed.used, need);
    }
}
