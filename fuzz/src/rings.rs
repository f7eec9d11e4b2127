//! Target `rings`: a VM guest's virtio-net device (`ferry vm`, `ferry_vhost`), two
//! queue pairs over real guest memory whose descriptor tables, available and used rings
//! and buffers are the input's bytes, driven as its NIC servers drive it: frames sent to
//! the guest on both pairs (merged buffers, partial checksums, the backlog, steering),
//! what the guest sent read back, twice. Must not panic or hang; each read returns what
//! it appended. See `ferry_vhost::fuzzing::run` for the input's layout.

/// Runs one input.
pub fn run(data: &[u8]) {
    ferry_vhost::fuzzing::run(data);
}
