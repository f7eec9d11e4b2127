//! The vhost-user-net device: what it offers the frontend, and the protocol's callbacks.
//! A kick (the guest put buffers on a ring) only wakes the NIC server of that ring's
//! queue pair; the server reads and writes the rings itself ([`VirtioPair`](crate::VirtioPair)).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringMutex};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;

/// Guest memory as the rings see it.
pub(crate) type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// Feature bits (virtio 1.x, section 5.1.3 and 6).
pub(crate) mod feature {
    pub const NET_CSUM: u64 = 1 << 0;
    pub const NET_GUEST_CSUM: u64 = 1 << 1;
    pub const NET_MRG_RXBUF: u64 = 1 << 15;
    pub const NET_MQ: u64 = 1 << 22;
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    pub const VERSION_1: u64 = 1 << 32;
}

/// Largest ring the device accepts (QEMU's default is 256).
const MAX_QUEUE_SIZE: usize = 1024;

/// What the device refused or lost, over the connection's life.
#[derive(Debug, Default)]
pub struct Counters {
    /// Transmit chains refused: unreadable (an address outside the memory table, a
    /// loop, too long a chain), shorter than the header, or longer than a frame.
    pub bad_tx: AtomicU64,
    /// Receive chains that could take no bytes (unwritable, empty).
    pub bad_rx: AtomicU64,
    /// Used-ring updates or notifications that failed (a ring outside guest memory).
    pub bad_ring: AtomicU64,
    /// Frames towards the guest lost because it posted no room for them in time, and
    /// those that waited for room (the backlog).
    pub rx_lost: AtomicU64,
    pub rx_waited: AtomicU64,
    /// Frames another pair's server took for this one, and those its full inbox lost.
    pub steered: AtomicU64,
    pub steer_lost: AtomicU64,
    /// Frames the guest sent, and frames written to it.
    pub tx_frames: AtomicU64,
    pub rx_frames: AtomicU64,
}

/// A copy of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub bad_tx: u64,
    pub bad_rx: u64,
    pub bad_ring: u64,
    pub rx_lost: u64,
    pub rx_waited: u64,
    pub steered: u64,
    pub steer_lost: u64,
    pub tx_frames: u64,
    pub rx_frames: u64,
}

impl Counters {
    /// The counters now.
    pub fn snapshot(&self) -> CountersSnapshot {
        let r = Ordering::Relaxed;
        CountersSnapshot {
            bad_tx: self.bad_tx.load(r),
            bad_rx: self.bad_rx.load(r),
            bad_ring: self.bad_ring.load(r),
            rx_lost: self.rx_lost.load(r),
            rx_waited: self.rx_waited.load(r),
            steered: self.steered.load(r),
            steer_lost: self.steer_lost.load(r),
            tx_frames: self.tx_frames.load(r),
            rx_frames: self.rx_frames.load(r),
        }
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl std::fmt::Display for CountersSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "vhost-user: frames from the guest {}, to it {} ({} waited for room), lost towards it {}, steered to another server {} (lost {}); refused: tx chains {}, rx chains {}, ring updates {}",
            self.tx_frames,
            self.rx_frames,
            self.rx_waited,
            self.rx_lost,
            self.steered,
            self.steer_lost,
            self.bad_tx,
            self.bad_rx,
            self.bad_ring
        )
    }
}

/// What the backend and its queue pairs share.
pub(crate) struct Inner {
    pub(crate) pairs: usize,
    pub(crate) mem: Mem,
    /// The rings (receive, transmit per pair), known from the first event on.
    pub(crate) vrings: OnceLock<Vec<VringMutex>>,
    /// One per pair: readable when its NIC server has work (a kick, the end).
    pub(crate) wakes: Vec<EventFd>,
    pub(crate) acked: AtomicU64,
    pub(crate) event_idx: AtomicBool,
    /// The frontend has gone.
    pub(crate) gone: AtomicBool,
    pub(crate) counters: Counters,
    /// Frames the guest sent on another pair's queue, for this pair's server
    /// (`steer.rs`), one inbox a pair.
    pub(crate) inboxes: Vec<std::sync::Mutex<ferry_nic::device::Frames>>,
    /// The guest's published TCP ports (their flows are the first server's).
    pub(crate) published: Vec<u16>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("pairs", &self.pairs)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Wakes pair `i`'s server.
    pub(crate) fn wake(&self, i: usize) {
        if let Some(w) = self.wakes.get(i) {
            let _ = w.write(1);
        }
    }
}

/// The vhost-user-net device (see the module's header). Cheap to clone: one device.
#[derive(Clone, Debug)]
pub struct Backend {
    inner: Arc<Inner>,
}

impl Backend {
    /// A device of `pairs` queue pairs (at least one); `published`: the guest's
    /// published TCP ports.
    pub(crate) fn new(pairs: usize, published: &[u16]) -> Result<Backend, Error> {
        let pairs = pairs.max(1);
        let wakes = (0..pairs)
            .map(|_| EventFd::new(EFD_NONBLOCK).map_err(Error::EventFd))
            .collect::<Result<_, _>>()?;
        Ok(Backend {
            inner: Arc::new(Inner {
                pairs,
                mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
                vrings: OnceLock::new(),
                wakes,
                acked: AtomicU64::new(0),
                event_idx: AtomicBool::new(false),
                gone: AtomicBool::new(false),
                counters: Counters::default(),
                inboxes: (0..pairs).map(|_| Default::default()).collect(),
                published: published.to_vec(),
            }),
        })
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    pub(crate) fn memory(&self) -> Mem {
        self.inner.mem.clone()
    }

    /// What was refused and carried so far.
    pub fn counters(&self) -> CountersSnapshot {
        self.inner.counters.snapshot()
    }

    /// The frontend has gone: every pair's server finds its device gone.
    pub fn disconnect(&self) {
        self.inner.gone.store(true, Ordering::SeqCst);
        for i in 0..self.inner.pairs {
            self.inner.wake(i);
        }
    }
}

impl VhostUserBackend for Backend {
    type Bitmap = ();
    type Vring = VringMutex;

    fn num_queues(&self) -> usize {
        2 * self.inner.pairs
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        let mq = if self.inner.pairs > 1 {
            feature::NET_MQ
        } else {
            0
        };
        feature::VERSION_1
            | feature::NET_CSUM
            | feature::NET_GUEST_CSUM
            | feature::NET_MRG_RXBUF
            | feature::RING_EVENT_IDX
            | feature::RING_INDIRECT_DESC
            | mq
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        self.inner.acked.store(features, Ordering::SeqCst);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.inner.event_idx.store(enabled, Ordering::SeqCst);
    }

    fn update_memory(&self, _mem: Mem) -> io::Result<()> {
        // The same atomic the rings read through (given to the daemon by `serve`).
        Ok(())
    }

    fn exit_event(&self, _thread: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Lets the daemon end its worker thread when the connection ends (it joins it).
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringMutex],
        _thread_id: usize,
    ) -> io::Result<()> {
        // All queues are on one worker thread: `vrings` is every ring, in order.
        if vrings.len() == self.num_queues() {
            let _ = self.inner.vrings.set(vrings.to_vec());
        }
        self.inner.wake(usize::from(device_event) / 2);
        Ok(())
    }
}
