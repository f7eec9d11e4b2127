//! Binding a data-path module to a socket ([`CtlKind::BindModule`]): the *binding*, a
//! byte string that travels on the ring in a channel buffer (`Op::BindModule`), or after
//! the [`Ctl`] header in the same control packet (or, when large, in a memfd that rides
//! along first), says which module (its bytes, or the SHA-256 of a module the server
//! already loaded), with which properties, and which of the channel's *registered files*
//! ([`CtlKind::RegisterFile`]) it may send. The files passed with the binding itself
//! ride along with `SCM_RIGHTS`.
//!
//! Layout (all integers little-endian `u32`):
//!
//! ```text
//! magic "FMB2" | kind (0 bytes, 1 hash) | module_len | prop_count | handle_count
//! module bytes (kind 0) or 32-byte SHA-256 (kind 1)
//! prop_count × ( key_len | value_len | key | value )
//! handle_count × handle
//! ```
//!
//! The module's files, by index (its `emit_file`): first the descriptors passed with the
//! binding, in the order sent (`0..nfds`), then the registered files named by the
//! handles, in the order listed (`nfds..nfds + handle_count`). A handle may be listed
//! more than once.
//!
//! [`Binding::decode`] checks every length against the bytes present and the limits
//! below; the server acts only on a decoded binding. Whether a handle is registered is
//! the server's to check (an unknown one fails the binding with `EBADF`).
//!
//! [`CtlKind::BindModule`]: crate::CtlKind::BindModule
//! [`CtlKind::RegisterFile`]: crate::CtlKind::RegisterFile
//! [`Ctl`]: crate::Ctl

use sha2::{Digest, Sha256};

/// First four bytes of a binding.
pub const BINDING_MAGIC: [u8; 4] = *b"FMB2";
/// Largest module accepted (bytes of wasm or wat).
pub const MAX_MODULE_BYTES: usize = 16 << 20;
/// Most properties one binding carries.
pub const MAX_PROPS: usize = 256;
/// Longest property key.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest property value.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Most files one binding passes with `SCM_RIGHTS`.
pub const MAX_FILES: usize = 16;
/// Most registered-file handles one binding names.
pub const MAX_FILE_HANDLES: usize = 16;
/// Most files one channel may have registered at once (handles are below this).
pub const MAX_REGISTERED_FILES: usize = 1024;
/// Largest binding sent inline in the control packet; larger ones travel in a memfd
/// ([`CTL_BLOB_FD`]).
pub const MAX_INLINE_BINDING: usize = 60 * 1024;
/// Largest binding at all (module + properties + header).
pub const MAX_BINDING_BYTES: usize = MAX_MODULE_BYTES + 1024 * 1024;
/// `Ctl.c` flag of a `BindModule`: the binding is in the first descriptor (a memfd of
/// exactly `Ctl.a` bytes), not inline.
pub const CTL_BLOB_FD: i32 = 1;

/// The module a binding names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleRef<'a> {
    /// The module itself (binary wasm or `.wat` text).
    Bytes(&'a [u8]),
    /// The SHA-256 of a module this server already loaded.
    Hash([u8; 32]),
}

/// A decoded binding: borrowed from the packet or file it came in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding<'a> {
    /// Which module.
    pub module: ModuleRef<'a>,
    /// Its properties, in order (UTF-8 keys and values).
    pub props: Vec<(&'a str, &'a str)>,
    /// Registered files of the channel the module may send too (after the files passed
    /// with the binding), by handle.
    pub handles: Vec<u32>,
}

/// Why a binding was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BindingError {
    /// Shorter than its header or than the lengths it declares.
    #[error("binding truncated at byte {0}")]
    Truncated(usize),
    /// Does not start with [`BINDING_MAGIC`].
    #[error("not a module binding (bad magic)")]
    Magic,
    /// Module reference kind unknown, or a hash that is not 32 bytes.
    #[error("bad module reference (kind {0})")]
    Kind(usize),
    /// Empty module or above [`MAX_MODULE_BYTES`].
    #[error("module of {0} bytes (1..={MAX_MODULE_BYTES})")]
    ModuleSize(usize),
    /// More than [`MAX_PROPS`] properties.
    #[error("{0} properties (at most {MAX_PROPS})")]
    TooManyProps(usize),
    /// An empty key, a key above [`MAX_KEY_BYTES`] or a value above
    /// [`MAX_VALUE_BYTES`].
    #[error("property {0}: bad key or value length")]
    PropSize(usize),
    /// A key or value that is not UTF-8.
    #[error("property {0}: not UTF-8")]
    Utf8(usize),
    /// More than [`MAX_FILE_HANDLES`] registered-file handles.
    #[error("{0} file handles (at most {MAX_FILE_HANDLES})")]
    TooManyHandles(usize),
    /// Bytes after the last handle.
    #[error("{0} bytes after the binding")]
    Trailing(usize),
}

/// SHA-256 of a module's bytes: how a module already loaded is named.
pub fn module_hash(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BindingError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(BindingError::Truncated(self.b.len()))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn le32(&mut self) -> Result<u32, BindingError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u32(&mut self) -> Result<usize, BindingError> {
        Ok(self.le32()? as usize)
    }
}

impl<'a> Binding<'a> {
    /// Validates a binding written by an untrusted peer.
    pub fn decode(b: &'a [u8]) -> Result<Binding<'a>, BindingError> {
        let mut r = Reader { b, at: 0 };
        if r.take(4)? != BINDING_MAGIC {
            return Err(BindingError::Magic);
        }
        let kind = r.u32()?;
        let module_len = r.u32()?;
        let count = r.u32()?;
        let handle_count = r.u32()?;
        if count > MAX_PROPS {
            return Err(BindingError::TooManyProps(count));
        }
        if handle_count > MAX_FILE_HANDLES {
            return Err(BindingError::TooManyHandles(handle_count));
        }
        let module = match kind {
            0 => {
                if module_len == 0 || module_len > MAX_MODULE_BYTES {
                    return Err(BindingError::ModuleSize(module_len));
                }
                ModuleRef::Bytes(r.take(module_len)?)
            }
            1 if module_len == 32 => {
                let mut h = [0u8; 32];
                h.copy_from_slice(r.take(32)?);
                ModuleRef::Hash(h)
            }
            other => return Err(BindingError::Kind(other)),
        };
        let mut props = Vec::with_capacity(count);
        for i in 0..count {
            let kl = r.u32()?;
            let vl = r.u32()?;
            if kl == 0 || kl > MAX_KEY_BYTES || vl > MAX_VALUE_BYTES {
                return Err(BindingError::PropSize(i));
            }
            let k = std::str::from_utf8(r.take(kl)?).map_err(|_| BindingError::Utf8(i))?;
            let v = std::str::from_utf8(r.take(vl)?).map_err(|_| BindingError::Utf8(i))?;
            props.push((k, v));
        }
        let mut handles = Vec::with_capacity(handle_count);
        for _ in 0..handle_count {
            handles.push(r.le32()?);
        }
        if r.at != b.len() {
            return Err(BindingError::Trailing(b.len() - r.at));
        }
        Ok(Binding {
            module,
            props,
            handles,
        })
    }

    /// Encodes the binding (the sender's side; lengths are the caller's to keep within
    /// the limits, which `decode` checks).
    pub fn encode(&self) -> Vec<u8> {
        // A length beyond `u32` (far beyond every limit) is written as `u32::MAX`, which
        // `decode` refuses, rather than cut to one it might take.
        let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (kind, m): (u32, &[u8]) = match &self.module {
            ModuleRef::Bytes(b) => (0, b),
            ModuleRef::Hash(h) => (1, h),
        };
        let props: usize = self.props.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        let mut out = Vec::with_capacity(20 + m.len() + props + 4 * self.handles.len());
        out.extend_from_slice(&BINDING_MAGIC);
        for v in [
            kind,
            len32(m.len()),
            len32(self.props.len()),
            len32(self.handles.len()),
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(m);
        for (k, v) in &self.props {
            out.extend_from_slice(&len32(k.len()).to_le_bytes());
            out.extend_from_slice(&len32(v.len()).to_le_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        for h in &self.handles {
            out.extend_from_slice(&h.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Header bytes before the module.
    const HEAD: usize = 20;

    fn sample() -> Vec<u8> {
        Binding {
            module: ModuleRef::Bytes(b"(module)"),
            props: vec![("content-length", "42"), ("content-type", "text/plain")],
            handles: vec![3, 0, u32::MAX],
        }
        .encode()
    }

    #[test]
    fn round_trips() {
        let enc = sample();
        let b = Binding::decode(&enc).unwrap();
        assert_eq!(b.module, ModuleRef::Bytes(b"(module)"));
        assert_eq!(b.props[1], ("content-type", "text/plain"));
        assert_eq!(b.handles, [3, 0, u32::MAX]);
        assert_eq!(b.encode(), enc);
        let h = module_hash(b"(module)");
        let enc = Binding {
            module: ModuleRef::Hash(h),
            props: vec![],
            handles: vec![],
        }
        .encode();
        let b = Binding::decode(&enc).unwrap();
        assert_eq!(b.module, ModuleRef::Hash(h));
        assert!(b.handles.is_empty());
        let most = Binding {
            module: ModuleRef::Hash(h),
            props: vec![],
            handles: (0..u32::try_from(MAX_FILE_HANDLES).unwrap()).collect(),
        };
        assert_eq!(Binding::decode(&most.encode()).unwrap(), most);
    }

    #[test]
    fn hostile_handle_lists_are_refused() {
        let enc = sample();
        let count_at = 16;
        // More handles than allowed, however many bytes follow.
        let most = u32::try_from(MAX_FILE_HANDLES).unwrap();
        for n in [most + 1, 1 << 20, u32::MAX] {
            let mut e = enc.clone();
            e[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
            assert_eq!(
                Binding::decode(&e),
                Err(BindingError::TooManyHandles(n as usize))
            );
        }
        let too_many = Binding {
            module: ModuleRef::Bytes(b"(module)"),
            props: vec![],
            handles: vec![1; MAX_FILE_HANDLES + 1],
        }
        .encode();
        assert!(matches!(
            Binding::decode(&too_many),
            Err(BindingError::TooManyHandles(_))
        ));
        // A count above the handles present: truncated; below: trailing bytes.
        let mut e = enc.clone();
        e[count_at..count_at + 4].copy_from_slice(&4u32.to_le_bytes());
        assert!(matches!(
            Binding::decode(&e),
            Err(BindingError::Truncated(_))
        ));
        let mut e = enc.clone();
        e[count_at..count_at + 4].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(Binding::decode(&e), Err(BindingError::Trailing(4)));
        // A handle cut in the middle.
        assert!(matches!(
            Binding::decode(&enc[..enc.len() - 2]),
            Err(BindingError::Truncated(_))
        ));
        // The old layout (FMB1, no handle count) is not this protocol's.
        let mut e = enc.clone();
        e[3] = b'1';
        assert_eq!(Binding::decode(&e), Err(BindingError::Magic));
    }

    #[test]
    fn every_truncation_is_refused() {
        let enc = sample();
        for n in 0..enc.len() {
            assert!(Binding::decode(&enc[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut long = enc.clone();
        long.push(0);
        assert_eq!(Binding::decode(&long), Err(BindingError::Trailing(1)));
    }

    #[test]
    fn hostile_lengths_are_refused() {
        let mut enc = sample();
        enc[0] = b'X';
        assert_eq!(Binding::decode(&enc), Err(BindingError::Magic));
        let mut enc = sample();
        enc[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Binding::decode(&enc),
            Err(BindingError::ModuleSize(_))
        ));
        let mut enc = sample();
        enc[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Binding::decode(&enc),
            Err(BindingError::TooManyProps(_))
        ));
        let mut enc = sample();
        enc[4..8].copy_from_slice(&1u32.to_le_bytes()); // hash kind with 8-byte "hash"
        assert_eq!(Binding::decode(&enc), Err(BindingError::Kind(1)));
        let mut enc = sample();
        let key_len_at = HEAD + 8;
        enc[key_len_at..key_len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Binding::decode(&enc), Err(BindingError::PropSize(0)));
        let mut enc = sample();
        enc[HEAD + 8 + 8] = 0xff; // first key byte
        assert_eq!(Binding::decode(&enc), Err(BindingError::Utf8(0)));
    }

    #[test]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "pseudo-random bits: cutting them is the point"
    )]
    fn random_bytes_never_panic() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let base = sample();
        for _ in 0..20_000 {
            let mut v = base.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % v.len();
                v[i] = (x >> 32) as u8;
            }
            let _ = Binding::decode(&v);
            let _ = Binding::decode(&v[..(x as usize >> 40) % v.len()]);
        }
    }
}
