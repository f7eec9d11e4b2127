//! For the `rings` fuzz target (`fuzz/src/rings.rs`): a device of two queue pairs over
//! real guest memory whose rings and buffers the input writes, driven as the NIC servers
//! drive it. Not an API.

use std::sync::atomic::Ordering;

use ferry_nic::Timing;
use ferry_nic::device::{FrameDevice, Frames};
use vhost_user_backend::{VringMutex, VringT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

/// Guest memory size, and where the input's bytes go (rings first, then buffers).
const MEM: usize = 1 << 20;
const AT: u64 = 0x1000;
const QUEUE: u16 = 16;

/// One input: `features: u8`, then bytes written into guest memory from 0x1000 on
/// (queue q's descriptor table at 0x1000 + q·0x1000 … see [`ring_at`]); frames of
/// sizes taken from the last bytes are sent to the guest on both pairs, and both pairs
/// read what the guest sent, twice. Must not panic or hang; frames read are at most a
/// batch.
pub fn run(data: &[u8]) {
    let Some((&features, rest)) = data.split_first() else {
        return;
    };
    let Ok((backend, mut pairs)) = crate::backend(2, 65520, &[80]) else {
        return;
    };
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]) else {
        return;
    };
    let body = &rest[..rest.len().min(MEM - AT as usize)];
    let _ = mem.write_slice(body, GuestAddress(AT));
    backend
        .inner()
        .mem
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace(mem);
    let vrings: Vec<VringMutex> = (0..4u64)
        .filter_map(|q| {
            let v = <VringMutex as VringT<GuestMemoryAtomic<GuestMemoryMmap>>>::new(
                backend.memory(),
                QUEUE,
            )
            .ok()?;
            let (d, a, u) = ring_at(q);
            v.set_queue_size(QUEUE);
            v.set_queue_info(d, a, u).ok()?;
            v.set_queue_ready(true);
            v.set_enabled(true);
            v.set_queue_event_idx(features & 0x80 != 0);
            Some(v)
        })
        .collect();
    if vrings.len() != 4 || backend.inner().vrings.set(vrings).is_err() {
        return;
    }
    // Bits 0-1: VERSION_1, MRG_RXBUF; bit 2: GUEST_CSUM.
    let acked = (u64::from(features & 1) << 32)
        | (u64::from(features >> 1 & 1) << 15)
        | (u64::from(features >> 2 & 1) << 1);
    backend.inner().acked.store(acked, Ordering::SeqCst);
    let mut out = Frames::new();
    for (k, &b) in rest.iter().rev().take(8).enumerate() {
        let len = usize::from(b) * 64 + k;
        out.push(&vec![b; len]);
        if k % 3 == 0
            && let Some((frame, csum)) = out.last_mut()
            && frame.len() > 40
        {
            *csum = Some((14, 16));
        }
    }
    let mut timing = Timing::new(false);
    for _ in 0..2 {
        for p in &mut pairs {
            let _ = p.send(&out, &mut timing);
            let mut into = Frames::new();
            if let Ok(n) = p.recv(&mut into, 64, &mut timing) {
                assert_eq!(n, into.len());
            }
        }
    }
}

/// Queue `q`'s descriptor table, available ring and used ring.
fn ring_at(q: u64) -> (u64, u64, u64) {
    let base = AT + q * 0x1000;
    (base, base + 0x200, base + 0x400)
}

#[cfg(test)]
mod tests {
    /// The fuzz target's smoke test: inputs of random bytes, some with descriptors that
    /// point into memory, none may panic or hang.
    #[test]
    fn random_rings_neither_panic_nor_hang() {
        let mut x: u32 = 0x9e37_79b9;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for round in 0..300 {
            let len = 1 + (next() as usize % 0x3000);
            let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Half the inputs: small addresses and lengths, so that chains land in
            // memory and frames pass.
            if round % 2 == 0 {
                for (i, b) in data.iter_mut().enumerate().skip(1) {
                    if i % 16 > 3 && i % 16 < 8 || i % 16 > 9 && i % 16 < 12 {
                        *b = 0;
                    }
                    if i % 2 == 0 && i % 16 > 12 {
                        *b %= 16;
                    }
                }
            }
            super::run(&data);
        }
    }
}
