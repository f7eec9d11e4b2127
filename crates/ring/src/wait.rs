//! Spin-then-sleep waiting (paper S0, "SBW") and the sleep/wake handshake.
//!
//! A waiter spins for a bounded span (pure `spin_loop` first, then `sched_yield` between
//! checks, paced by `YieldPacer`), and only then announces that it sleeps and blocks on a futex word. A waker
//! issues the (costly) wake only when the announcement says someone sleeps, so while both
//! sides are busy no system call is made at all.
//!
//! The handshake is Dekker's: each party stores its own word, issues `fence(SeqCst)`, and
//! loads the other party's word.
//!
//! ```text
//! waiter                                  waker
//! seq0 = seq.load(Acquire)                publish (tail or head store, Release)
//! sleeping.swap(1)                        fence(SeqCst)          [F2]
//! fence(SeqCst)                 [F1]      if sleeping.swap(0) != 0 {
//! if condition() { clear; return }            seq.fetch_add(1, Release)
//! futex_wait(seq, seq0)                       futex_wake(seq)
//! sleeping.store(0)                       }
//! ```
//!
//! The waker claims the wake ([`claim_sleeper`]: the swap leaves the flag clear), so
//! one sleep costs one wake however many publishes come before the sleeper is back.
//! Both parties change the flag with exchanges: one chain of read-modify-writes, each
//! reading the newest (loom, whose model keeps concurrent relaxed stores unordered,
//! found a lost wake-up with a plain store on the waiter's side).
//!
//! The two SeqCst fences are totally ordered. If F1 comes first, the waker's flag load
//! sees 1 and it wakes; if F2 comes first, the waiter's re-check sees the published
//! index and it does not sleep. A wake that lands between the re-check and the futex
//! call is not lost either: it bumped `seq` after the waiter read `seq0`, so
//! `futex_wait` returns at once (`EAGAIN`). Both fences are needed: without either, the
//! store and the following load of that party may be reordered and both parties miss
//! each other.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::sync::{AtomicU32, Ordering, fence, spin_hint, yield_now};

/// `WaitCell::sleeping`: the owner is awake (spinning or busy).
pub(crate) const AWAKE: u32 = 0;
/// `WaitCell::sleeping`: the owner sleeps on the futex word.
pub(crate) const SLEEP_FUTEX: u32 = 1;
/// `WaitCell::sleeping`: the owner sleeps elsewhere (epoll on the doorbell eventfd).
pub(crate) const SLEEP_DOORBELL: u32 = 2;

/// The shared half of one waiter (in the ring's control block).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct WaitCell {
    /// The futex word: bumped by every wake so a sleeper that raced with it returns.
    pub(crate) seq: AtomicU32,
    /// `AWAKE`, `SLEEP_FUTEX` or `SLEEP_DOORBELL`, set by the waiter (a waker claiming
    /// the wake puts `AWAKE` back: [`claim_sleeper`]). Any other
    /// value (a misbehaving peer) is treated like `SLEEP_FUTEX`: at worst a spare wake.
    pub(crate) sleeping: AtomicU32,
}

/// A spin budget that follows the waits it serves, as Linux's adaptive halt-polling
/// does: a wait that outlasted the whole span (`max`) burnt it for nothing, so the
/// budget halves (to none after a few such waits, and an idle wait then costs a sleep,
/// not the span); a wait that ended within the span but after the budget would have
/// been caught by a longer spin, so the budget doubles back (from `max / 8`). Waits
/// that end within the budget leave it as it is. A patient budget
/// ([`AdaptiveSpin::patient`]) shrinks only after several such waits in a row and is
/// whole again after one the span would have caught: for a program's waits, where an
/// event loop's long waits come between bursts of short ones. Pure: the caller measures
/// its waits.
#[derive(Clone, Copy, Debug)]
pub struct AdaptiveSpin {
    max: Duration,
    budget: Duration,
    /// Waits that outlasted the span in a row before the budget shrinks.
    patience: u8,
    /// Such waits in a row so far.
    streak: u8,
}

impl AdaptiveSpin {
    /// A budget of `max` at first, halved by every wait that outlasts it.
    pub const fn new(max: Duration) -> AdaptiveSpin {
        AdaptiveSpin {
            max,
            budget: max,
            patience: 1,
            streak: 0,
        }
    }

    /// A budget of `max` at first, halved only after `patience` waits in a row that
    /// outlasted the span, and back to `max` after a wait the span would have caught.
    pub const fn patient(max: Duration, patience: u8) -> AdaptiveSpin {
        AdaptiveSpin {
            max,
            budget: max,
            patience: if patience == 0 { 1 } else { patience },
            streak: 0,
        }
    }

    /// The span it never exceeds.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// How long the next wait may spin.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// A wait lasted `d` in all (its spin, and its sleep if it came to one).
    pub fn waited(&mut self, d: Duration) {
        if d > self.max {
            self.streak = self.streak.saturating_add(1);
            if self.streak < self.patience {
                return;
            }
            self.budget /= 2;
            if self.budget < self.max / 16 {
                self.budget = Duration::ZERO;
            }
            return;
        }
        self.streak = 0;
        if d > self.budget {
            self.budget = if self.patience > 1 {
                self.max
            } else {
                (self.budget * 2).max(self.max / 8).min(self.max)
            };
        }
    }
}

/// Paces the yields of a spin's yielding phase. S0's SBW yields every turn, for the
/// thread waited for may need this very CPU; but a `sched_yield` that comes back at once
/// found nothing else to run here (the thread waited for runs on another CPU), and
/// yielding again at once only adds a system call and delays noticing the answer. So
/// after such a quick yield the spin checks without yielding for [`YieldPacer::CALM`],
/// then yields again; a yield that took longer (another thread ran) keeps the spin
/// yielding every turn. Bounded like the spin it paces: a thread that becomes runnable
/// on this CPU in the calm window waits at most that window.
#[derive(Clone, Copy, Debug, Default)]
pub struct YieldPacer {
    /// Until when turns do not yield (a quick yield was seen).
    calm_until: Option<Instant>,
    /// Yields made.
    yields: u64,
}

impl YieldPacer {
    /// A yield shorter than this ran nothing else.
    pub const QUICK: Duration = Duration::from_micros(2);
    /// How long turns go without yielding after a quick yield.
    pub const CALM: Duration = Duration::from_micros(5);

    /// A fresh pacer: its first pause yields.
    pub const fn new() -> YieldPacer {
        YieldPacer {
            calm_until: None,
            yields: 0,
        }
    }

    /// One idle turn of a spin: inside a calm window, `spins` busy-wait hints; else a
    /// `sched_yield`, timed. True when it yielded.
    pub fn pause(&mut self, spins: u32) -> bool {
        if let Some(until) = self.calm_until {
            if Instant::now() < until {
                for _ in 0..spins.max(1) {
                    spin_hint();
                }
                return false;
            }
            self.calm_until = None;
        }
        let t0 = Instant::now();
        yield_now();
        self.yields += 1;
        let back = Instant::now();
        if back.saturating_duration_since(t0) < Self::QUICK {
            self.calm_until = back.checked_add(Self::CALM);
        }
        true
    }

    /// Yields made so far.
    pub fn yields(&self) -> u64 {
        self.yields
    }
}

/// How long to spin before sleeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinPolicy {
    /// Total time to spin (checking the condition) before announcing sleep.
    pub span: Duration,
    /// Within `span`, busy-spin with `spin_loop` this long, then `sched_yield` between
    /// checks.
    pub pure_spin: Duration,
}

impl Default for SpinPolicy {
    /// Span 200 µs, pure spin 2 µs: the span covers the round trips of a ping-pong
    /// through a veth pair on a 2-vCPU VM up to about their 99th percentile (ferry's E2
    /// benchmark; docs/results/history.md).
    fn default() -> Self {
        SpinPolicy {
            span: Duration::from_micros(200),
            pure_spin: Duration::from_micros(2),
        }
    }
}

impl SpinPolicy {
    /// Never sleep: spin with `spin_loop` forever (until the timeout).
    pub const SPIN: SpinPolicy = SpinPolicy {
        span: Duration::MAX,
        pure_spin: Duration::MAX,
    };
    /// Check once, then sleep (no spinning at all).
    pub const SLEEP: SpinPolicy = SpinPolicy {
        span: Duration::ZERO,
        pure_spin: Duration::ZERO,
    };

    /// Spin for `span`, the first `pure_spin` of it without yielding.
    pub const fn new(span: Duration, pure_spin: Duration) -> SpinPolicy {
        SpinPolicy { span, pure_spin }
    }
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitResult {
    /// The condition holds (records available / space free / `extra()` true).
    Ready,
    /// The timeout passed first.
    TimedOut,
    /// The futex wait was interrupted by a signal (`EINTR`).
    Interrupted,
    /// The condition does not hold and the channel is closed (either side called
    /// [`crate::Region::close`]): it never will.
    PeerClosed,
}

/// Counters of one waiter/waker, process-local (never read from shared memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Calls of a wait function.
    pub waits: u64,
    /// Spin iterations (condition checks after the first).
    pub spin_iters: u64,
    /// Waits that ended without sleeping.
    pub ready_in_spin: u64,
    /// Times the waiter slept (futex waits, plus `arm_sleep` calls that armed).
    pub sleeps: u64,
    /// Wakes issued to the peer (futex wake or doorbell write).
    pub wakes_sent: u64,
    /// Wake checks that found the peer awake: no system call.
    pub wakes_avoided: u64,
}

/// What a blocking primitive reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Parked {
    /// Woken, or the word had changed already, or spurious: re-check.
    Woken,
    TimedOut,
    Interrupted,
}

/// The blocking primitive: the futex normally, a mutex/condvar under loom.
pub(crate) trait Park {
    /// Block while `*word == expected`, for at most `timeout`.
    fn park(
        &self,
        word: &AtomicU32,
        expected: u32,
        timeout: Option<Duration>,
    ) -> Result<Parked, Error>;
    /// Wake every thread blocked on `word`.
    fn unpark(&self, word: &AtomicU32);
}

/// The waker's check: after publishing, is the peer asleep? Returns its `sleeping`
/// value (`AWAKE` = no wake needed) and claims the wake: the flag is swapped back to
/// `AWAKE`, so the waker's further publishes before the sleeper announces again find
/// it awake and make no system call (a burst of sends to a sleeping server rang its
/// doorbell once per send). The sleeper cannot miss the one wake it gets: the swap
/// reads the flag as a load would, and the sleeper re-announces before every block
/// and re-checks after every wake.
pub(crate) fn claim_sleeper(cell: &WaitCell) -> u32 {
    // [F2] Dekker: orders our publish (the Release store of tail/head just before) with
    // the read of the waiter's flag; pairs with [F1] in `sleep_once`. Without it the
    // read could be satisfied before the store is visible and a waiter that re-checked
    // in between would sleep with nobody to wake it.
    fence(Ordering::SeqCst);
    cell.sleeping.swap(AWAKE, Ordering::AcqRel)
}

/// Wake a sleeper found by [`claim_sleeper`] on the futex word.
pub(crate) fn wake<P: Park>(cell: &WaitCell, park: &P) {
    bump(cell);
    park.unpark(&cell.seq);
}

/// Change the futex word so that a waiter about to block on its old value returns.
pub(crate) fn bump(cell: &WaitCell) {
    // Release: a waiter that reads the new value with Acquire also sees our publish.
    cell.seq.fetch_add(1, Ordering::Release);
}

/// How one announce/re-check/park round ended.
#[derive(Debug)]
pub(crate) enum Slept {
    /// The re-check found the condition settled: no sleep.
    Settled(WaitResult),
    /// Slept; the condition must be checked again.
    Parked(Parked),
}

/// The waiter's announcement: set the sleeping flag to `how`, fence, re-check. `Ok(None)`
/// = armed (the flag stays set: block now, and [`disarm`] after waking); `Ok(Some(_))`
/// or an error = settled at the re-check (the flag is cleared again).
pub(crate) fn announce(
    cell: &WaitCell,
    how: u32,
    check: &mut impl FnMut() -> Result<Option<WaitResult>, Error>,
) -> Result<Option<WaitResult>, Error> {
    // An exchange, not a store: wakers claim the flag with exchanges too
    // ([`claim_sleeper`]), and the flag's changes are then one chain that each party
    // reads the newest of (the fences below order the rest).
    cell.sleeping.swap(how, Ordering::AcqRel);
    // [F1] Dekker: the flag store must be visible before we re-read the peer's index;
    // pairs with [F2] in `claim_sleeper`. Either the waker sees our flag or we see its index.
    fence(Ordering::SeqCst);
    let settled = check();
    if !matches!(settled, Ok(None)) {
        disarm(cell);
    }
    settled
}

/// Clear the sleeping flag (awake again).
pub(crate) fn disarm(cell: &WaitCell) {
    cell.sleeping.store(AWAKE, Ordering::Relaxed);
}

/// The waiter's half: announce, fence, re-check, block. `check` returns `Some` when the
/// wait is over (ready or closed).
pub(crate) fn sleep_once<P: Park>(
    cell: &WaitCell,
    park: &P,
    timeout: Option<Duration>,
    check: &mut impl FnMut() -> Result<Option<WaitResult>, Error>,
) -> Result<Slept, Error> {
    // Read the futex word before announcing: a wake after this point changes it, so
    // `park` returns at once instead of missing it.
    let seq = cell.seq.load(Ordering::Acquire);
    if let Some(r) = announce(cell, SLEEP_FUTEX, check)? {
        return Ok(Slept::Settled(r));
    }
    let parked = park.park(&cell.seq, seq, timeout);
    disarm(cell);
    parked.map(Slept::Parked)
}

/// The whole wait: spin per `policy`, then sleep rounds until `check` says done, the
/// timeout passes or a signal interrupts.
pub(crate) fn wait_until<P: Park>(
    cell: &WaitCell,
    park: &P,
    policy: SpinPolicy,
    timeout: Option<Duration>,
    stats: &mut WaitStats,
    mut check: impl FnMut() -> Result<Option<WaitResult>, Error>,
) -> Result<WaitResult, Error> {
    stats.waits += 1;
    if let Some(r) = check()? {
        stats.ready_in_spin += 1;
        return Ok(r);
    }
    let start = Instant::now();
    let deadline = timeout.and_then(|t| start.checked_add(t));
    if !policy.span.is_zero() {
        let mut yielding = policy.pure_spin.is_zero();
        let mut pacer = YieldPacer::new();
        let mut n: u32 = 0;
        loop {
            if yielding {
                pacer.pause(4);
            } else {
                spin_hint();
            }
            stats.spin_iters += 1;
            if let Some(r) = check()? {
                stats.ready_in_spin += 1;
                return Ok(r);
            }
            n = n.wrapping_add(1);
            // Reading the clock costs about as much as a check; in the pure-spin phase
            // read it every 16th round only.
            if yielding || n & 15 == 0 {
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(WaitResult::TimedOut);
                }
                let spun = now - start;
                if spun >= policy.span {
                    break;
                }
                yielding = spun >= policy.pure_spin;
            }
        }
    }
    loop {
        let remaining = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(r) if !r.is_zero() => Some(r),
                _ => return Ok(check()?.unwrap_or(WaitResult::TimedOut)),
            },
            None => None,
        };
        match sleep_once(cell, park, remaining, &mut check)? {
            Slept::Settled(r) => return Ok(r),
            Slept::Parked(p) => {
                stats.sleeps += 1;
                if let Some(r) = check()? {
                    return Ok(r);
                }
                if p == Parked::Interrupted {
                    return Ok(WaitResult::Interrupted);
                }
                // Woken without the condition (a spare wake), or a timeout that the
                // deadline check at the top of the loop will confirm.
            }
        }
    }
}

/// Park on a futex in shared memory (non-private: the word is keyed by the memfd page,
/// so it works across processes).
#[cfg(not(loom))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Futex;

#[cfg(not(loom))]
impl Park for Futex {
    fn park(
        &self,
        word: &AtomicU32,
        expected: u32,
        timeout: Option<Duration>,
    ) -> Result<Parked, Error> {
        match crate::sys::futex_wait(word, expected, timeout) {
            Ok(()) => Ok(Parked::Woken),
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(Parked::Woken),
                Some(libc::ETIMEDOUT) => Ok(Parked::TimedOut),
                Some(libc::EINTR) => Ok(Parked::Interrupted),
                _ => Err(Error::Futex(e)),
            },
        }
    }

    fn unpark(&self, word: &AtomicU32) {
        crate::sys::futex_wake(word);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_spin_budget_shrinks_on_idle_waits_and_grows_back_on_short_ones() {
        let us = Duration::from_micros;
        let mut a = AdaptiveSpin::new(us(200));
        a.waited(us(30));
        assert_eq!(
            a.budget(),
            us(200),
            "a wait the spin catches changes nothing"
        );
        let mut seen = Vec::new();
        for _ in 0..6 {
            a.waited(Duration::from_millis(5));
            seen.push(a.budget().as_micros());
        }
        assert_eq!(seen, [100u128, 50, 25, 12, 0, 0]);
        assert_eq!(a.budget(), Duration::ZERO, "idle waits end the spinning");
        let mut back = Vec::new();
        for _ in 0..5 {
            a.waited(us(150));
            back.push(a.budget().as_micros());
        }
        assert_eq!(back, [25u128, 50, 100, 200, 200]);
        let mut p = AdaptiveSpin::patient(us(200), 4);
        let mut seen = Vec::new();
        for i in 0..9 {
            // Three long waits, then a short one the span catches: never shrinks.
            p.waited(if i % 4 == 3 {
                us(30)
            } else {
                Duration::from_millis(5)
            });
            seen.push(p.budget().as_micros());
        }
        assert_eq!(seen, [200u128; 9], "a patient budget waits for a streak");
        // The ninth wait began a streak: three more reach four in a row.
        let mut seen = Vec::new();
        for _ in 0..5 {
            p.waited(Duration::from_millis(5));
            seen.push(p.budget().as_micros());
        }
        assert_eq!(seen, [200u128, 200, 100, 50, 25], "four in a row halve it");
        p.waited(us(150));
        assert_eq!(p.budget(), us(200), "one caught by the span restores it");
        let mut none = AdaptiveSpin::new(Duration::ZERO);
        none.waited(us(1));
        assert_eq!(none.budget(), Duration::ZERO, "no span, no spin");
    }

    #[test]
    fn a_pacer_never_goes_longer_than_its_calm_window_without_yielding() {
        let mut pacer = YieldPacer::new();
        let start = Instant::now();
        let mut last_yield: Option<Instant> = None;
        let (mut pauses, mut calm) = (0u64, 0u64);
        while start.elapsed() < Duration::from_millis(5) {
            let before = Instant::now();
            pauses += 1;
            if pacer.pause(1) {
                last_yield = Some(Instant::now());
            } else {
                calm += 1;
                let since = last_yield.map(|t| before.saturating_duration_since(t));
                assert!(
                    since.is_some_and(|d| d < YieldPacer::CALM),
                    "a turn without a yield {since:?} after the last yield"
                );
            }
        }
        assert_eq!(pacer.yields(), pauses - calm);
        assert!(pacer.yields() >= 1);
    }

    #[test]
    fn ready_at_once_counts_as_ready_in_spin() {
        let cell = WaitCell::default();
        let mut st = WaitStats::default();
        let r = wait_until(&cell, &Futex, SpinPolicy::SLEEP, None, &mut st, || {
            Ok(Some(WaitResult::Ready))
        });
        assert_eq!(r.unwrap(), WaitResult::Ready);
        assert_eq!((st.waits, st.ready_in_spin, st.sleeps), (1, 1, 0));
    }

    #[test]
    fn times_out_after_spinning_then_sleeping() {
        let cell = WaitCell::default();
        let mut st = WaitStats::default();
        let p = SpinPolicy::new(Duration::from_micros(200), Duration::from_micros(20));
        let t0 = Instant::now();
        let r = wait_until(
            &cell,
            &Futex,
            p,
            Some(Duration::from_millis(20)),
            &mut st,
            || Ok(None),
        );
        assert_eq!(r.unwrap(), WaitResult::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert!(st.spin_iters > 0 && st.sleeps >= 1, "{st:?}");
        assert_eq!(cell.sleeping.load(Ordering::Relaxed), AWAKE);
    }

    #[test]
    fn sleeper_is_woken_by_flagged_wake() {
        let cell = Arc::new(WaitCell::default());
        let flag = Arc::new(AtomicBool::new(false));
        let (c2, f2) = (cell.clone(), flag.clone());
        let t = std::thread::spawn(move || {
            let mut st = WaitStats::default();
            let r = wait_until(&c2, &Futex, SpinPolicy::SLEEP, None, &mut st, || {
                Ok(f2.load(Ordering::Acquire).then_some(WaitResult::Ready))
            });
            (r.unwrap(), st)
        });
        while cell.sleeping.load(Ordering::Relaxed) == AWAKE {
            std::thread::yield_now();
        }
        flag.store(true, Ordering::Release);
        assert_eq!(claim_sleeper(&cell), SLEEP_FUTEX);
        wake(&cell, &Futex);
        let (r, st) = t.join().unwrap();
        assert_eq!(r, WaitResult::Ready);
        assert!(st.sleeps >= 1);
        assert_eq!(claim_sleeper(&cell), AWAKE);
    }
}
