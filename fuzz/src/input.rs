//! Reading a fuzz input as a sequence of small values: every read succeeds, past the
//! end with zeros, so that any byte string is a valid (if short) script.

/// A cursor over the fuzz input.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Bytes not read yet.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        self.fill(&mut b);
        u16::from_le_bytes(b)
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_le_bytes(b)
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.data.split_at(n.min(self.data.len()));
        self.data = tail;
        head
    }

    /// A byte string prefixed by its length (one byte).
    pub fn bytes8(&mut self) -> &'a [u8] {
        let n = self.u8() as usize;
        self.take(n)
    }

    /// A byte string prefixed by its length (two bytes, little-endian).
    pub fn bytes16(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.take(n)
    }

    /// Fills `out` from the input, zeros past the end.
    pub fn fill(&mut self, out: &mut [u8]) {
        let got = self.take(out.len());
        out[..got.len()].copy_from_slice(got);
        out[got.len()..].fill(0);
    }

    /// A plain-data value read from the next `size_of::<T>()` bytes (zeros past the end).
    pub fn pod<T: bytemuck::Pod>(&mut self) -> T {
        let mut v = T::zeroed();
        self.fill(bytemuck::bytes_of_mut(&mut v));
        v
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_are_zero() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u16(), 0x0201);
        assert_eq!(i.u32(), 3);
        assert!(i.is_empty());
        assert_eq!(i.u8(), 0);
        assert_eq!(i.take(5), &[] as &[u8]);
    }
}
