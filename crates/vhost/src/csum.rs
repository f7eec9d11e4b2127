//! Completing a partial checksum (`NEEDS_CSUM`) for a guest that did not offer to: the
//! field at `start + offset` holds the pseudo-header's sum; the Internet checksum of
//! everything from `start` on, that field included, replaces it.

/// The completed checksum of `frame`'s partial (`start`, `offset`): where its field is
/// and what goes there, the frame itself unchanged (the frame is then written to the
/// guest in pieces, the field's two bytes from here). `None`: the partial points outside
/// the frame (the frame is the stack's own, so that does not happen).
pub(crate) fn value(frame: &[u8], (start, offset): (u16, u16)) -> Option<(usize, [u8; 2])> {
    let (start, field) = (usize::from(start), usize::from(start) + usize::from(offset));
    if field + 2 > frame.len() || start > field {
        return None;
    }
    let mut sum: u64 = 0;
    let mut chunks = frame[start..].chunks_exact(2);
    for c in &mut chunks {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(u16::from_be_bytes([*last, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    Some((field, (!(sum as u16)).to_be_bytes()))
}

/// Completes `frame`'s partial checksum in place; a partial outside the frame is left
/// alone.
#[cfg(test)]
pub(crate) fn complete(frame: &mut [u8], partial: (u16, u16)) {
    if let Some((field, v)) = value(frame, partial) {
        frame[field..field + 2].copy_from_slice(&v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Internet checksum of `b` (RFC 1071), for checking.
    fn verify(b: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn a_completed_checksum_verifies_and_bad_offsets_are_ignored() {
        // 4 bytes before `start`, then a "header" whose field at offset 2 holds a seed.
        let mut f = vec![
            0xaa, 0xbb, 0xcc, 0xdd, 0x12, 0x34, 0x00, 0x07, 0x56, 0x78, 0x9a,
        ];
        complete(&mut f, (4, 2));
        // Over [start..] the sum of everything (the seed replaced) is all ones, minus
        // the seed: seed + data + checksum ≡ 0xffff.
        let with_seed = verify(&f[4..]) as u32 + 7;
        let folded = (with_seed & 0xffff) + (with_seed >> 16);
        assert_eq!(folded, 0xffff, "{f:x?}");
        let before = f.clone();
        complete(&mut f, (4, 200));
        complete(&mut f, (10, 0));
        assert_eq!(f, before);
    }
}
