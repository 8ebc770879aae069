//! Stalls of this process, measured so a proof does not count on pings the client library
//! could not send.
//!
//! [`proof_ttl`](crate::renew) rests on the client library sending a packet (a request, or
//! else a ping) at least every `client_ping_after + client_tick`. A stall of the whole process
//! (a freeze, a swap storm, a debugger) holds those pings back too, and the leader's last touch
//! of the session can then be older than the bound assumes: dlock-model's ZooKeeper model found
//! a 3 s stall before a renewal, then a cut between the follower and the leader, let the
//! leader expire a 10 s session about a second before the renewal's deadline.
//!
//! A [`StallClock`] is a beat every [`BEAT`]: a task that notes when it runs. A gap between
//! two beats of at least two beats is a stall: time the process (its runtime, where the client
//! library runs too) did not run; its length less one beat is counted. A proof sent at `t`
//! counts for the TTL less every stall that ended after `t − window` (and one still in
//! progress when the answer is judged), the window being what `proof_ttl` allows for the
//! library's silence (the session timeout less the proof). A stall that ended before that
//! window is harmless: the library pinged again within its usual silence after it, still
//! before the proof's allowance began. So a stall shortens the deadline by at least its length
//! less 40 ms (a shorter gap is timer jitter, not counted, so jitter does not add up); those
//! 40 ms are inside the proof's latency allowance of one client tick. Lateness of the beat
//! under load beyond that counts as a stall: it only shortens deadlines.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// How often the clock beats.
pub(crate) const BEAT: Duration = Duration::from_millis(20);

/// The gaps remembered: at most this many (older ones fall out of every window anyway).
const KEPT: usize = 64;

#[derive(Debug)]
struct Beats {
    /// When the beat last ran.
    last: Instant,
    /// (end of the gap, excess over one beat) of recent gaps longer than a beat.
    gaps: VecDeque<(Instant, Duration)>,
}

/// The process's recent stalls, noted by a beating task (see the module docs).
#[derive(Debug)]
pub(crate) struct StallClock {
    beats: Mutex<Beats>,
    /// How far back a stall still shortens a proof: the session timeout less the proof.
    window: Duration,
    /// When the clock was made: no stall before it is known (or counted).
    created: Instant,
}

impl StallClock {
    /// A clock remembering stalls for `window` (the session timeout less the proof). Its beat
    /// runs on the
    /// current tokio runtime until the clock is dropped; outside a runtime there is no beat,
    /// and every proof then counts as stalled since the clock was made (see
    /// [`StallClock::stalled_before`]).
    pub(crate) fn start(window: Duration) -> Arc<Self> {
        let created = Instant::now();
        let clock = Arc::new(StallClock {
            beats: Mutex::new(Beats {
                last: created,
                gaps: VecDeque::new(),
            }),
            window,
            created,
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(beat(Arc::downgrade(&clock)));
        }
        clock
    }

    fn beats(&self) -> std::sync::MutexGuard<'_, Beats> {
        self.beats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes one beat at `now`.
    fn note(&self, now: Instant) {
        let mut b = self.beats();
        let gap = now.saturating_duration_since(b.last);
        if gap >= 2 * BEAT {
            b.gaps.push_back((now, gap - BEAT));
            if b.gaps.len() > KEPT {
                b.gaps.pop_front();
            }
        }
        b.last = now;
    }

    /// How long the process stalled in the window before `sent` (a proof's send time), as of
    /// now: the excess of every stall that ended after `sent − window`, and of the gap still
    /// open (no beat since `last` for two beats or more), at most the time from the clock's
    /// start to `sent` (so `sent` less it is never before the clock's start). Zero when the
    /// process ran.
    pub(crate) fn stalled_before(&self, sent: Instant) -> Duration {
        let now = Instant::now();
        let b = self.beats();
        let from = sent.checked_sub(self.window).unwrap_or(sent);
        let closed: Duration = b
            .gaps
            .iter()
            .filter(|(end, _)| *end > from)
            .map(|(_, excess)| *excess)
            .sum();
        let open = now.saturating_duration_since(b.last);
        let open = if open >= 2 * BEAT {
            open - BEAT
        } else {
            Duration::ZERO
        };
        (closed + open).min(sent.saturating_duration_since(self.created))
    }
}

/// Beats every [`BEAT`] while the clock lives.
async fn beat(clock: Weak<StallClock>) {
    loop {
        tokio::time::sleep(BEAT).await;
        let Some(clock) = clock.upgrade() else { return };
        clock.note(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_running_process_has_no_stall() {
        let clock = StallClock::start(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(clock.stalled_before(Instant::now()), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_shortens_every_proof_sent_within_the_window_after_it() {
        let clock = StallClock::start(Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = Instant::now();
        // The clock jumps 3 s without the beat running in between: a stall.
        tokio::time::advance(Duration::from_secs(3)).await;
        let open = clock.stalled_before(Instant::now());
        assert!(
            open >= Duration::from_secs(3) - 2 * BEAT,
            "open stall: {open:?}"
        );
        // Once the beat runs again the gap is remembered for the window.
        tokio::time::sleep(BEAT * 2).await;
        let sent = Instant::now();
        let closed = clock.stalled_before(sent);
        assert!(
            closed >= Duration::from_secs(3) - 2 * BEAT,
            "closed: {closed:?}"
        );
        assert!(
            closed <= Duration::from_secs(3) + BEAT,
            "closed: {closed:?}"
        );
        // Past the window it no longer counts.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(clock.stalled_before(Instant::now()), Duration::ZERO);
        assert!(before < sent);
    }
}
