//! A history recorder and its checkers: what each client believed and did, on one monotonic
//! clock, checked afterwards for belief overlap, token monotonicity and fenced safety.
//!
//! ```
//! use dlock_conformance::history::History;
//! use dlock_core::FencingToken;
//! let h = History::new();
//! h.grant(0, FencingToken(1));
//! h.release(0, FencingToken(1));
//! h.grant(1, FencingToken(2));
//! h.lost(1, FencingToken(2));
//! assert!(h.belief_overlap().is_ok());
//! assert!(h.token_monotonicity().is_ok());
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dlock_core::FencingToken;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An acquire returned a lease.
    Grant,
    /// The holder started releasing.
    Release,
    /// The holder's `lost()` fired.
    Lost,
    /// The holder's operation was accepted by the fenced resource.
    OpAccepted,
    /// The holder's operation was rejected by the fenced resource.
    OpRejected,
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Which client.
    pub client: usize,
    /// What happened.
    pub kind: Kind,
    /// The token of the lease it concerns.
    pub token: FencingToken,
    /// When (monotonic clock).
    pub at: Instant,
}

/// A belief-overlap violation report.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlaps {
    /// How many intervals overlap an earlier one.
    pub count: usize,
    /// Total overlapping time.
    pub total: Duration,
    /// The first overlap, in words.
    pub first: String,
}

/// Records events from any number of tasks.
#[derive(Debug, Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Records `kind` for `client`'s lease `token`, now.
    pub fn record(&self, client: usize, kind: Kind, token: FencingToken) {
        let event = Event {
            client,
            kind,
            token,
            at: Instant::now(),
        };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// Records a grant.
    pub fn grant(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Grant, token);
    }

    /// Records the start of a release.
    pub fn release(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Release, token);
    }

    /// Records a loss notification.
    pub fn lost(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Lost, token);
    }

    /// Records a fenced operation's outcome.
    pub fn op(&self, client: usize, token: FencingToken, accepted: bool) {
        self.record(
            client,
            if accepted {
                Kind::OpAccepted
            } else {
                Kind::OpRejected
            },
            token,
        );
    }

    /// Every event, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        events.sort_by_key(|e| e.at);
        events
    }

    /// Belief intervals: from each grant to the first release or loss of the same (client,
    /// token), or to `now` when neither happened.
    pub fn beliefs(&self) -> Vec<(usize, FencingToken, Instant, Instant)> {
        let events = self.events();
        let now = Instant::now();
        events
            .iter()
            .filter(|e| e.kind == Kind::Grant)
            .map(|g| {
                let end = events
                    .iter()
                    .filter(|e| e.client == g.client && e.token == g.token && e.at >= g.at)
                    .filter(|e| matches!(e.kind, Kind::Release | Kind::Lost))
                    .map(|e| e.at)
                    .min()
                    .unwrap_or(now);
                (g.client, g.token, g.at, end)
            })
            .collect()
    }

    /// C3: no two clients' belief intervals overlap.
    ///
    /// # Errors
    /// The overlaps found.
    pub fn belief_overlap(&self) -> Result<(), Overlaps> {
        let mut beliefs = self.beliefs();
        beliefs.sort_by_key(|b| b.2);
        let mut count = 0;
        let mut total = Duration::ZERO;
        let mut first = None;
        let mut reach: Option<(usize, FencingToken, Instant)> = None;
        for &(client, token, start, end) in &beliefs {
            if let Some((c, t, until)) = reach {
                if start < until {
                    count += 1;
                    total += until.min(end) - start;
                    first.get_or_insert_with(|| {
                        format!(
                            "client {client} (token {token}) was granted while client {c} (token {t}) still believed it held the lock"
                        )
                    });
                }
            }
            if reach.is_none_or(|(_, _, until)| end > until) {
                reach = Some((client, token, end));
            }
        }
        match first {
            None => Ok(()),
            Some(first) => Err(Overlaps {
                count,
                total,
                first,
            }),
        }
    }

    /// C2: grant tokens strictly increase in grant order.
    ///
    /// # Errors
    /// The first pair out of order.
    pub fn token_monotonicity(&self) -> Result<(), String> {
        let grants: Vec<Event> = self
            .events()
            .into_iter()
            .filter(|e| e.kind == Kind::Grant)
            .collect();
        match grants.windows(2).find(|w| w[1].token <= w[0].token) {
            None => Ok(()),
            Some(w) => Err(format!(
                "client {} was granted token {} after client {} was granted token {}",
                w[1].client, w[1].token, w[0].client, w[0].token
            )),
        }
    }

    /// C1: no accepted operation carries a token lower than one accepted before it.
    ///
    /// # Errors
    /// The first stale operation that was accepted.
    pub fn fenced_safety(&self) -> Result<(), String> {
        let mut highest: Option<Event> = None;
        for e in self
            .events()
            .into_iter()
            .filter(|e| e.kind == Kind::OpAccepted)
        {
            if let Some(h) = highest {
                if e.token < h.token {
                    return Err(format!(
                        "client {}'s operation with token {} was accepted after client {}'s with token {}",
                        e.client, e.token, h.client, h.token
                    ));
                }
            }
            if highest.is_none_or(|h| e.token >= h.token) {
                highest = Some(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken(n)
    }

    #[test]
    fn sequential_holds_pass_every_checker() {
        let h = History::new();
        for i in 0..5u64 {
            let c = (i % 2) as usize;
            h.grant(c, t(i + 1));
            h.op(c, t(i + 1), true);
            h.release(c, t(i + 1));
        }
        assert_eq!(h.belief_overlap(), Ok(()));
        assert_eq!(h.token_monotonicity(), Ok(()));
        assert_eq!(h.fenced_safety(), Ok(()));
    }

    #[test]
    fn overlapping_beliefs_are_found() {
        let h = History::new();
        h.grant(0, t(1));
        std::thread::sleep(Duration::from_millis(2));
        h.grant(1, t(2));
        h.release(1, t(2));
        h.lost(0, t(1));
        let err = h
            .belief_overlap()
            .expect_err("client 1 was granted while client 0 believed");
        assert_eq!(err.count, 1);
        assert!(err.total > Duration::ZERO);
        assert!(err.first.contains("client 1"), "{}", err.first);
    }

    #[test]
    fn a_loss_ends_the_belief() {
        let h = History::new();
        h.grant(0, t(1));
        h.lost(0, t(1));
        h.grant(1, t(2));
        assert_eq!(h.belief_overlap(), Ok(()));
    }

    #[test]
    fn repeated_or_decreasing_tokens_are_found() {
        let h = History::new();
        h.grant(0, t(5));
        h.release(0, t(5));
        h.grant(1, t(5));
        assert!(h.token_monotonicity().is_err());
    }

    #[test]
    fn a_stale_accepted_operation_is_found() {
        let h = History::new();
        h.op(1, t(7), true);
        h.op(0, t(6), false);
        assert_eq!(h.fenced_safety(), Ok(()), "a rejected stale op is fine");
        h.op(0, t(6), true);
        assert!(h.fenced_safety().is_err());
    }
}
