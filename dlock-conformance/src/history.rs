//! A history recorder and its checkers: what each client was granted, what its lease promised,
//! what it believed and wrote, and which forced breaks happened, on one monotonic clock —
//! checked afterwards.
//!
//! The checkers judge the backend against its PROMISE, not against how quickly a test task
//! recorded something:
//! - [`History::promise_violations`]: a grant whose reply arrived before another unreleased
//!   lease's latest promised [`deadline`](dlock_core::Lease::deadline) (the instant its backend
//!   said nobody else can be granted) — unless a forced break hit THAT lease first.
//! - [`History::belief_overlap`]: belief intervals end at the first of release, recorded loss
//!   or promised deadline; no later grant may start inside one (same break exemption).
//! - [`History::token_order`]: tokens unique and strictly increasing in grant order.
//! - [`History::fenced_safety`]: every write ATTEMPT is recorded before the resource's guard
//!   sees it; an independent model of a fenced resource, ordering holds by real-time grant
//!   (never by token), decides which attempts should have been accepted, and each outcome the
//!   real resource reported is compared with it.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use dlock_conformance::history::History;
//! use dlock_core::FencingToken;
//! let h = History::new();
//! let t0 = Instant::now();
//! h.grant_until(0, FencingToken(1), t0 + Duration::from_secs(2));
//! h.release(0, FencingToken(1));
//! h.grant_until(1, FencingToken(2), t0 + Duration::from_secs(4));
//! h.lost(1, FencingToken(2));
//! assert!(h.promise_violations().is_ok());
//! assert!(h.belief_overlap().is_ok());
//! assert!(h.token_order().is_ok());
//! ```

use std::cell::Cell;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dlock_core::{Error, FencingToken, LockName};

use crate::TestBackend;

/// The `client` of a [`Kind::Break`] event (a break is nobody's grant).
pub const BREAKER: usize = usize::MAX;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An acquire returned a lease (`until`: its promised deadline, when known).
    Grant,
    /// The holder observed its lease's promised deadline (`until`), e.g. after a renewal.
    Promise,
    /// The holder started releasing.
    Release,
    /// The holder's `lost()` fired.
    Lost,
    /// The holder is about to offer an operation to the fenced resource (recorded BEFORE the
    /// resource's guard sees it; its outcome follows as [`Kind::OpAccepted`] or
    /// [`Kind::OpRejected`]).
    Write,
    /// The holder's operation was accepted by the fenced resource.
    OpAccepted,
    /// The holder's operation was rejected by the fenced resource.
    OpRejected,
    /// A forced server-side break of the lock's current holder started at `at` and returned at
    /// `until` (client [`BREAKER`]; the checkers attribute it to the hold it hit).
    Break,
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Which client ([`BREAKER`] for a break).
    pub client: usize,
    /// What happened.
    pub kind: Kind,
    /// The token of the lease it concerns.
    pub token: FencingToken,
    /// When (monotonic clock).
    pub at: Instant,
    /// Grant / Promise: the promised deadline; Break: when the break call returned.
    pub until: Option<Instant>,
}

/// A checker's findings.
#[derive(Debug, Clone, PartialEq)]
pub struct Violations {
    /// How many violations.
    pub count: usize,
    /// Total time they span (zero where time is not the measure).
    pub total: Duration,
    /// The first one, in words.
    pub first: String,
}

/// The former name of [`Violations`].
pub type Overlaps = Violations;

/// One grant and what became of it, assembled from the events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Which client.
    pub client: usize,
    /// Its token.
    pub token: FencingToken,
    /// When the grant was recorded (its reply had arrived).
    pub granted: Instant,
    /// The latest promised deadline recorded for it.
    pub promised: Option<Instant>,
    /// When its release started.
    pub released: Option<Instant>,
    /// When its loss was recorded.
    pub lost: Option<Instant>,
    /// When the first forced break attributed to it started.
    pub broken: Option<Instant>,
    /// When its first write was accepted.
    pub first_write: Option<Instant>,
}

impl Hold {
    /// Whether the holder still relied on the server at `t`: not released, not broken.
    fn unreleased_at(&self, t: Instant) -> bool {
        self.released.is_none_or(|r| r > t) && self.broken.is_none_or(|b| b > t)
    }

    /// The end of the holder's belief: first of release, recorded loss, promised deadline.
    pub fn belief_end(&self, now: Instant) -> Instant {
        [self.released, self.lost, self.promised]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now)
    }

    fn describe(&self) -> String {
        format!("client {} (token {})", self.client, self.token)
    }
}

/// How holds are ordered as the server granted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// By token (the server's own counter), ties — a reused token — by grant record. Right for
    /// every fenced backend: two grants recorded in either order by their tasks (a holder broken
    /// at once) are still judged in the order the server made them.
    #[default]
    Token,
    /// By grant record only (backends without fencing tokens).
    Record,
}

/// Records events from any number of tasks.
#[derive(Debug, Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
    order: Order,
    partial_counts: bool,
}

tokio::task_local! {
    /// The instant a [`TestBackend::break_holder`] run under [`break_recorded`] marked with
    /// [`deleting_now`].
    static DELETE_AT: Cell<Option<Instant>>;
}

/// Marks the instant a forced break is about to delete (call it in a
/// [`TestBackend::break_holder`] implementation right before the first delete, AFTER opening
/// any client or session and reading the holder): [`break_recorded`] then dates the break from
/// here, not from the call. The earliest mark counts. Outside [`break_recorded`] it does
/// nothing.
pub fn deleting_now() {
    let now = Instant::now();
    let _ = DELETE_AT.try_with(|at| at.set(Some(at.get().map_or(now, |t| t.min(now)))));
}

/// The break errors a history may hold: at most one in this many recorded breaks, rounded up
/// (so one in a short run) — a failed break's victim is unknown and attributed by timing,
/// which can excuse more than it hit.
pub const BREAKS_PER_ERROR: usize = 20;

/// Breaks the holder of `name` in `namespace` and records the break in `history`, dated from
/// the instant the backend marked with [`deleting_now`] (or, when it marks none, from the
/// call) to the call's return, attributed to the tokens it reports. A failed break is recorded
/// with an unknown victim (attributed by timing, counted by [`History::break_errors`]);
/// a break that found no holder is not recorded.
///
/// # Errors
/// The backend's error, after recording it.
///
/// # Cancel safety
/// Not cancel-safe: dropped mid-way, the break may have happened and is not recorded.
pub async fn break_recorded(
    history: &History,
    backend: &dyn TestBackend,
    namespace: &str,
    name: &LockName,
) -> Result<Option<Vec<FencingToken>>, Error> {
    let called = Instant::now();
    let (marked, outcome) = delete_marked(backend.break_holder(namespace, name)).await;
    let ended = Instant::now();
    match &outcome {
        Ok(Some(hit)) => history.forced_break_of(marked.unwrap_or(called), ended, hit),
        Ok(None) => {}
        Err(_) => history.forced_break(marked.unwrap_or(called), ended),
    }
    outcome
}

/// Runs `fut` (a break) and returns the instant it marked with [`deleting_now`], if any.
///
/// # Cancel safety
/// As cancel-safe as `fut`: dropping it drops `fut`.
pub async fn delete_marked<F: Future>(fut: F) -> (Option<Instant>, F::Output) {
    DELETE_AT
        .scope(Cell::new(None), async {
            let out = fut.await;
            (DELETE_AT.with(Cell::get), out)
        })
        .await
}

impl History {
    /// An empty history, holds ordered by token.
    pub fn new() -> History {
        History::default()
    }

    /// An empty history whose holds are ordered as `order` says.
    pub fn ordered_by(order: Order) -> History {
        History {
            events: Mutex::default(),
            order,
            partial_counts: false,
        }
    }

    /// The history of a backend whose tokens are the largest of a majority's per-node counts
    /// (Redlock): a break may report a node's count for a grant still in progress, a token no
    /// grant carries. Only such a history lets that token excuse the larger-token grants
    /// completed while the break ran; elsewhere a token no grant carries excuses nobody.
    pub fn with_partial_counts(mut self) -> History {
        self.partial_counts = true;
        self
    }

    /// Forced breaks whose victim is unknown (the break call failed): attributed by timing.
    pub fn break_errors(&self) -> usize {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|e| e.kind == Kind::Break && e.token == FencingToken(0))
            .count()
    }

    /// Records an event with explicit times (e.g. one reported by another process).
    pub fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// Records `kind` for `client`'s lease `token`, now.
    pub fn record(&self, client: usize, kind: Kind, token: FencingToken) {
        self.record_until(client, kind, token, None);
    }

    fn record_until(&self, client: usize, kind: Kind, token: FencingToken, until: Option<Instant>) {
        self.push(Event {
            client,
            kind,
            token,
            at: Instant::now(),
            until,
        });
    }

    /// Records a grant whose promised deadline is unknown (only belief and token checks see it).
    pub fn grant(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Grant, token);
    }

    /// Records a grant and the deadline its lease promised.
    pub fn grant_until(&self, client: usize, token: FencingToken, deadline: Instant) {
        self.record_until(client, Kind::Grant, token, Some(deadline));
    }

    /// Records the lease's promised deadline as the holder sees it now (call after renewals
    /// and right before releasing: the latest promise is what counts).
    pub fn promise(&self, client: usize, token: FencingToken, deadline: Instant) {
        self.record_until(client, Kind::Promise, token, Some(deadline));
    }

    /// Records the start of a release.
    pub fn release(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Release, token);
    }

    /// Records a loss notification.
    pub fn lost(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Lost, token);
    }

    /// Records a forced server-side break of the current holder, called at `started` and
    /// returned at `ended`, whose victim is not known: the checkers attribute it by timing.
    pub fn forced_break(&self, started: Instant, ended: Instant) {
        self.forced_break_of(started, ended, &[]);
    }

    /// Records a forced server-side break called at `started` and returned at `ended` that hit
    /// the grants with tokens `hit` (as the backend read them in the break itself): one event
    /// per token. Empty: not known, attributed by timing.
    pub fn forced_break_of(&self, started: Instant, ended: Instant, hit: &[FencingToken]) {
        let unknown = [FencingToken(0)];
        let tokens = if hit.is_empty() { &unknown[..] } else { hit };
        for token in tokens {
            self.push(Event {
                client: BREAKER,
                kind: Kind::Break,
                token: *token,
                at: started,
                until: Some(ended),
            });
        }
    }

    /// Records that `client` is about to offer an operation with `token` to the fenced
    /// resource: call it before the resource's guard runs, and [`History::op`] with the
    /// outcome after, both in the resource's own order of operations.
    pub fn write_attempt(&self, client: usize, token: FencingToken) {
        self.record(client, Kind::Write, token);
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

    /// Every hold, in the server's grant order (see [`Order`]), with forced breaks attributed.
    ///
    /// A break whose victim's token is known is attributed to the holds with that token only
    /// (its grant may reach its client, and be recorded, after the break: the server had
    /// granted it before). A reported token that no grant carries excuses nobody, except in a
    /// history [`with_partial_counts`](History::with_partial_counts) (Redlock). A break whose victim is not known (token 0) that started at `b0` and
    /// returned at `b1` is attributed to (a) every hold whose
    /// grant was recorded by `b1` and that was neither released nor past its promise at `b0`
    /// (the holds believed current), and (b) when no hold was believed current at `b0`, the
    /// first hold (in grant order) recorded after `b0`: its grant may have raced the break and
    /// been the one it hit. (b) costs sensitivity only for that one hold's overlaps with its
    /// successors; it never hides another overlap.
    pub fn holds(&self) -> Vec<Hold> {
        let events = self.events();
        let mut holds: Vec<Hold> = Vec::new();
        let mut breaks = Vec::new();
        for e in &events {
            let latest = |holds: &mut Vec<Hold>| -> Option<usize> {
                holds
                    .iter()
                    .rposition(|h| h.client == e.client && h.token == e.token)
            };
            match e.kind {
                Kind::Grant => holds.push(Hold {
                    client: e.client,
                    token: e.token,
                    granted: e.at,
                    promised: e.until,
                    released: None,
                    lost: None,
                    broken: None,
                    first_write: None,
                }),
                Kind::Break => breaks.push((e.at, e.until.unwrap_or(e.at), e.token)),
                Kind::OpRejected | Kind::Write => {}
                kind => {
                    if let Some(i) = latest(&mut holds) {
                        let h = &mut holds[i];
                        match kind {
                            Kind::Promise => h.promised = h.promised.max(e.until),
                            Kind::Release => {
                                h.released.get_or_insert(e.at);
                            }
                            Kind::Lost => {
                                h.lost.get_or_insert(e.at);
                            }
                            _ => {
                                h.first_write.get_or_insert(e.at);
                            }
                        }
                    }
                }
            }
        }
        self.sort(&mut holds);
        for (b0, b1, victim) in breaks {
            let hit = |h: &mut Hold| h.broken = Some(h.broken.map_or(b0, |x| x.min(b0)));
            if victim != FencingToken(0) {
                if holds.iter().any(|h| h.token == victim) {
                    holds.iter_mut().filter(|h| h.token == victim).for_each(hit);
                } else if self.partial_counts {
                    // A token no grant carries: a node's count for a grant still in progress
                    // (Redlock counts per node; the grant's token is the largest count of its
                    // majority). The break may have cost that grant its entries on some nodes:
                    // it hits the grants with a larger token that completed while it ran.
                    holds
                        .iter_mut()
                        .filter(|h| h.token > victim && b0 <= h.granted && h.granted <= b1)
                        .for_each(hit);
                }
                continue;
            }
            let mut seen_current = false;
            for h in holds.iter_mut() {
                let current = h.granted <= b1
                    && h.released.is_none_or(|r| r >= b0)
                    && h.promised.is_none_or(|p| p >= b0);
                if current {
                    seen_current |= h.granted <= b0;
                    hit(h);
                }
            }
            if !seen_current && let Some(h) = holds.iter_mut().find(|h| h.granted > b0) {
                hit(h);
            }
        }
        holds
    }

    fn sort(&self, holds: &mut [Hold]) {
        match self.order {
            Order::Token => holds.sort_by_key(|h| (h.token, h.granted)),
            Order::Record => holds.sort_by_key(|h| h.granted),
        }
    }

    /// Belief intervals `(client, token, granted, end)`: from each grant to the first of its
    /// release, recorded loss or promised deadline, or to now.
    pub fn beliefs(&self) -> Vec<(usize, FencingToken, Instant, Instant)> {
        let now = Instant::now();
        self.holds()
            .iter()
            .map(|h| (h.client, h.token, h.granted, h.belief_end(now)))
            .collect()
    }

    /// Pairs (earlier, later) in the given order where `bad(earlier, later)` holds; `what`
    /// words the first one.
    fn pairs(
        holds: &[Hold],
        mut bad: impl FnMut(&Hold, &Hold) -> Option<Duration>,
        what: impl Fn(&Hold, &Hold, Duration) -> String,
    ) -> Result<(), Violations> {
        let mut count = 0;
        let mut total = Duration::ZERO;
        let mut first = None;
        for (i, later) in holds.iter().enumerate() {
            for earlier in &holds[..i] {
                if let Some(d) = bad(earlier, later) {
                    count += 1;
                    total += d;
                    first.get_or_insert_with(|| what(earlier, later, d));
                }
            }
        }
        match first {
            None => Ok(()),
            Some(first) => Err(Violations {
                count,
                total,
                first,
            }),
        }
    }

    /// Loss before theft, judged against the promise: a grant recorded (its reply arrived)
    /// before the latest promised deadline of an earlier hold that was neither released nor
    /// hit by a forced break by then. Recording delays can only hide a violation, never
    /// invent one: the grant's record is never earlier than its reply.
    ///
    /// # Errors
    /// The violations: count, total time granted early, and the first in words.
    pub fn promise_violations(&self) -> Result<(), Violations> {
        let holds = self.holds();
        Self::pairs(
            &holds,
            |e, l| {
                let promised = e.promised?;
                (l.granted < promised && e.unreleased_at(l.granted)).then(|| promised - l.granted)
            },
            |e, l, d| {
                format!(
                    "{} was granted {d:?} before the promised deadline of {}",
                    l.describe(),
                    e.describe()
                )
            },
        )
    }

    /// No later grant starts inside an earlier hold's belief interval (grant to the first of
    /// release, recorded loss, promised deadline), unless a forced break hit that hold first.
    ///
    /// # Errors
    /// The overlaps found.
    pub fn belief_overlap(&self) -> Result<(), Violations> {
        let holds = self.holds();
        let now = Instant::now();
        Self::pairs(
            &holds,
            |e, l| {
                let end = e.belief_end(now);
                let broken = e.broken.is_some_and(|b| b <= l.granted);
                (e.granted <= l.granted && l.granted < end && !broken).then(|| end - l.granted)
            },
            |e, l, d| {
                format!(
                    "{} was granted while {} still believed it held the lock ({d:?} before that belief ended)",
                    l.describe(),
                    e.describe()
                )
            },
        )
    }

    /// Diagnostics (not a checker): grants recorded while an earlier holder's belief, ended
    /// only by release or RECORDED loss (not by its promise), was open — the measure the old
    /// checker failed on. Those the promise explains are recording artefacts.
    pub fn recorded_overlaps(&self) -> usize {
        let holds = self.holds();
        let mut n = 0;
        for (i, l) in holds.iter().enumerate() {
            n += holds[..i]
                .iter()
                .filter(|e| {
                    let end = [e.released, e.lost].into_iter().flatten().min();
                    e.client != l.client
                        && e.granted <= l.granted
                        && end.is_none_or(|end| l.granted < end)
                        && e.broken.is_none_or(|b| b > l.granted)
                })
                .count();
        }
        n
    }

    /// Diagnostics: how many losses were recorded after their promised deadline, and the
    /// largest such delay (the holder's `lost()` fires by the deadline; a later record is the
    /// recording task's delay, e.g. a frozen process).
    pub fn late_loss_records(&self) -> (usize, Duration) {
        let mut n = 0;
        let mut worst = Duration::ZERO;
        for h in self.holds() {
            if let (Some(lost), Some(p)) = (h.lost, h.promised)
                && lost > p
            {
                n += 1;
                worst = worst.max(lost - p);
            }
        }
        (n, worst)
    }

    /// Tokens are unique, and strictly increase in the order grants were recorded — except for
    /// two grants whose records raced: the lower token's hold was hit by a forced break, or
    /// past its promise, before the higher token's grant was recorded (the server granted them
    /// in token order, their tasks recorded them the other way round).
    ///
    /// # Errors
    /// The violations: count and the first in words.
    pub fn token_order(&self) -> Result<(), Violations> {
        let mut holds = self.holds();
        holds.sort_by_key(|h| h.granted);
        Self::pairs(
            &holds,
            |e, l| {
                if l.token > e.token {
                    return None;
                }
                let raced = l.token < e.token
                    && (l.broken.is_some_and(|b| b <= e.granted)
                        || l.promised.is_some_and(|p| p <= e.granted));
                (!raced).then_some(Duration::ZERO)
            },
            |e, l, _| {
                format!(
                    "{} was granted after {}: tokens not unique and increasing in grant order",
                    l.describe(),
                    e.describe()
                )
            },
        )
    }

    /// The former name of [`History::token_order`].
    ///
    /// # Errors
    /// As [`History::token_order`].
    pub fn token_monotonicity(&self) -> Result<(), String> {
        self.token_order().map_err(|v| v.first)
    }

    /// Each hold's rank (index into [`History::holds`]'s list) in real-time grant order.
    ///
    /// A hold's grant happened at the server no later than the first of: its grant's record
    /// (the reply had arrived), its promised deadline, and the start of a forced break that hit
    /// it. Holds are ordered by that instant (ties by record), never by token: two grants whose
    /// replies raced (the earlier holder broken or expired before the later grant was recorded)
    /// keep the server's order, and a backend that hands a LOWER token to a later grant cannot
    /// hide behind its tokens.
    fn real_time_order(holds: &[Hold]) -> Vec<usize> {
        let key = |h: &Hold| {
            let latest = [Some(h.granted), h.promised, h.broken]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(h.granted);
            (latest, h.granted)
        };
        let mut order: Vec<usize> = (0..holds.len()).collect();
        order.sort_by_key(|&i| key(&holds[i]));
        let mut rank = vec![0; holds.len()];
        for (r, &i) in order.iter().enumerate() {
            rank[i] = r;
        }
        rank
    }

    /// An independent model of the fenced resource, run over the recorded write attempts.
    ///
    /// The model resource accepts an attempt unless a hold LATER in real-time grant order (see
    /// [`History::holds`] for breaks; tokens play no part) already had an attempt accepted BY THE
    /// MODEL; a hold may write any number of times. Attempts are taken in the order recorded
    /// ([`History::write_attempt`] before the resource's guard, the outcome after, in the
    /// resource's own order); an outcome recorded without an attempt is its own attempt.
    pub fn fenced_model(&self) -> FencedModel {
        let holds = self.holds();
        let rank = Self::real_time_order(&holds);
        let mut pending: Vec<(usize, FencingToken, Instant)> = Vec::new();
        let mut newest: Option<usize> = None;
        let mut model = FencedModel::default();
        for e in self.events() {
            let accepted = match e.kind {
                Kind::Write => {
                    pending.push((e.client, e.token, e.at));
                    continue;
                }
                Kind::OpAccepted => true,
                Kind::OpRejected => false,
                _ => continue,
            };
            let attempted = match pending
                .iter()
                .position(|(c, t, _)| *c == e.client && *t == e.token)
            {
                Some(p) => pending.remove(p).2,
                None => e.at,
            };
            model.attempts += 1;
            model.accepted += u64::from(accepted);
            let Some(i) = holds.iter().rposition(|h| {
                h.client == e.client && h.token == e.token && h.granted <= attempted
            }) else {
                model.orphans += 1;
                model.first.get_or_insert_with(|| {
                    format!(
                        "client {} wrote with token {} without a recorded grant",
                        e.client, e.token
                    )
                });
                continue;
            };
            let should = newest.is_none_or(|n| rank[i] >= n);
            if should {
                model.expected += 1;
                newest = Some(newest.map_or(rank[i], |n| n.max(rank[i])));
            }
            if should == accepted {
                continue;
            }
            let later = newest.and_then(|n| rank.iter().position(|&r| r == n));
            if accepted {
                model.stale_accepted += 1;
                model.first.get_or_insert_with(|| {
                    format!(
                        "a write of {} was accepted after the later-granted {} had written",
                        holds[i].describe(),
                        later.map_or_else(|| "?".into(), |j| holds[j].describe())
                    )
                });
            } else {
                model.current_rejected += 1;
                model.first.get_or_insert_with(|| {
                    format!(
                        "a write of {} was rejected, yet no later-granted hold had written",
                        holds[i].describe()
                    )
                });
            }
        }
        model
    }

    /// Fenced safety, judged by [`History::fenced_model`]: every outcome the fenced resource
    /// reported must be the model's. A resource that accepts an equal or lower token from a
    /// superseded holder, a backend that hands the same token to two holders, and a backend
    /// that hands a lower token to a later grant (its writes rejected, the stale holder's
    /// accepted) each fail it.
    ///
    /// # Errors
    /// The violations: count and the first in words.
    pub fn fenced_safety(&self) -> Result<(), Violations> {
        let m = self.fenced_model();
        match m.first {
            None => Ok(()),
            Some(first) => Err(Violations {
                count: m.stale_accepted + m.current_rejected + m.orphans,
                total: Duration::ZERO,
                first,
            }),
        }
    }
}

/// What [`History::fenced_model`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencedModel {
    /// Write outcomes recorded.
    pub attempts: u64,
    /// Of them, accepted by the real resource.
    pub accepted: u64,
    /// Of them, accepted by the model.
    pub expected: u64,
    /// Accepted by the resource, rejected by the model (a superseded holder wrote).
    pub stale_accepted: usize,
    /// Rejected by the resource, accepted by the model (a current holder was refused).
    pub current_rejected: usize,
    /// Writes with no recorded grant of that client and token.
    pub orphans: usize,
    /// The first disagreement, in words.
    pub first: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ev(client: usize, kind: Kind, token: u64, at: Instant, until: Option<Instant>) -> Event {
        Event {
            client,
            kind,
            token: t(token),
            at,
            until,
        }
    }

    #[test]
    fn sequential_holds_pass_every_checker() {
        let h = History::new();
        for i in 0..5u64 {
            let c = (i % 2) as usize;
            h.grant_until(c, t(i + 1), Instant::now() + ms(500));
            h.op(c, t(i + 1), true);
            h.release(c, t(i + 1));
        }
        assert_eq!(h.promise_violations(), Ok(()));
        assert_eq!(h.belief_overlap(), Ok(()));
        assert_eq!(h.token_order(), Ok(()));
        assert_eq!(h.fenced_safety(), Ok(()));
    }

    #[test]
    fn a_grant_before_the_promise_is_a_violation_even_after_a_recorded_loss() {
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(100))));
        h.push(ev(0, Kind::Lost, 1, t0 + ms(10), None));
        h.push(ev(1, Kind::Grant, 2, t0 + ms(60), Some(t0 + ms(200))));
        let v = h.promise_violations().expect_err("granted 40 ms early");
        assert_eq!(v.count, 1);
        assert_eq!(v.total, ms(40));
        assert!(v.first.contains("client 1 (token 2)"), "{}", v.first);
        // The holder itself stopped believing at its loss: no belief overlap.
        assert_eq!(h.belief_overlap(), Ok(()));
    }

    #[test]
    fn a_loss_recorded_after_the_promise_is_no_violation() {
        // The recording artefact: the loss is recorded late, the grant came after the promise.
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(100))));
        h.push(ev(1, Kind::Grant, 2, t0 + ms(120), Some(t0 + ms(300))));
        h.push(ev(0, Kind::Lost, 1, t0 + ms(150), None));
        assert_eq!(h.promise_violations(), Ok(()));
        assert_eq!(h.belief_overlap(), Ok(()));
        assert_eq!(h.recorded_overlaps(), 1, "the old checker's finding");
        assert_eq!(h.late_loss_records(), (1, ms(50)));
    }

    #[test]
    fn the_latest_promise_counts() {
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(100))));
        h.push(ev(0, Kind::Promise, 1, t0 + ms(50), Some(t0 + ms(300))));
        h.push(ev(1, Kind::Grant, 2, t0 + ms(200), Some(t0 + ms(400))));
        assert!(h.promise_violations().is_err());
        assert!(h.belief_overlap().is_err());
    }

    #[test]
    fn a_break_excuses_only_the_hold_it_hit() {
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(500))));
        h.forced_break(t0 + ms(10), t0 + ms(11));
        h.push(ev(1, Kind::Grant, 2, t0 + ms(20), Some(t0 + ms(520))));
        assert_eq!(h.promise_violations(), Ok(()), "client 0 was broken");
        // client 2 is granted while client 1's hold is intact: the earlier break is no excuse.
        h.push(ev(2, Kind::Grant, 3, t0 + ms(40), Some(t0 + ms(540))));
        let v = h.promise_violations().expect_err("client 1 was not broken");
        assert_eq!(v.count, 1, "{v:?}");
        assert!(v.first.contains("client 2 (token 3)"), "{}", v.first);
    }

    #[test]
    fn grants_recorded_out_of_token_order_after_a_break_are_a_race_not_a_violation() {
        let h = History::new();
        let t0 = Instant::now();
        // Token 5 was granted, the break hit it at once, token 6 was granted; token 6's task
        // recorded first.
        h.forced_break(t0, t0 + ms(1));
        h.push(ev(1, Kind::Grant, 6, t0 + ms(2), Some(t0 + ms(500))));
        h.push(ev(0, Kind::Grant, 5, t0 + ms(3), Some(t0 + ms(490))));
        assert_eq!(h.token_order(), Ok(()));
        assert_eq!(h.promise_violations(), Ok(()));
        assert_eq!(h.belief_overlap(), Ok(()));
    }

    #[test]
    fn a_break_by_token_excuses_its_victim_even_when_recorded_late() {
        // The soak's shape: client 0's hold (token 220) is believed current while its release
        // races the break; the break hit token 223, granted by the server but not yet recorded
        // by its client; client 2 (token 225) is granted; client 1's grant reply (223) arrives
        // last. Timing alone cannot tell which hold the break hit.
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 220, t0, Some(t0 + ms(2000))));
        h.forced_break_of(t0 + ms(100), t0 + ms(110), &[t(223)]);
        h.push(ev(0, Kind::Release, 220, t0 + ms(105), None));
        h.push(ev(2, Kind::Grant, 225, t0 + ms(120), Some(t0 + ms(2100))));
        h.push(ev(1, Kind::Grant, 223, t0 + ms(300), Some(t0 + ms(1600))));
        assert_eq!(h.promise_violations(), Ok(()));
        assert_eq!(h.token_order(), Ok(()));
        assert_eq!(h.belief_overlap(), Ok(()));
        // Attributed by timing, the same break lands on client 0's hold, and 223 is flagged.
        let by_timing = History::new();
        for e in h.events() {
            if e.kind == Kind::Break {
                by_timing.forced_break(e.at, e.until.expect("a break's end"));
            } else {
                by_timing.push(e);
            }
        }
        assert!(by_timing.promise_violations().is_err());
        assert!(by_timing.token_order().is_err());
    }

    #[test]
    fn a_break_that_hits_several_owners_excuses_each() {
        // Redlock: the break deleted a released holder's leftover keys (token 97) on some
        // nodes and the new holder's (152) on another, so 154 could win a majority.
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 97, t0, Some(t0 + ms(1900))));
        h.push(ev(0, Kind::Release, 97, t0 + ms(500), None));
        h.forced_break_of(t0 + ms(1300), t0 + ms(1360), &[t(97), t(152)]);
        h.push(ev(2, Kind::Grant, 152, t0 + ms(1310), Some(t0 + ms(3300))));
        h.push(ev(1, Kind::Grant, 154, t0 + ms(1400), Some(t0 + ms(3400))));
        assert_eq!(h.promise_violations(), Ok(()));
        assert_eq!(h.belief_overlap(), Ok(()));
        // Only the leftover's token reported: 152 is not excused.
        let partial = History::new();
        partial.push(ev(0, Kind::Grant, 97, t0, Some(t0 + ms(1900))));
        partial.push(ev(0, Kind::Release, 97, t0 + ms(500), None));
        partial.forced_break_of(t0 + ms(1300), t0 + ms(1360), &[t(97)]);
        partial.push(ev(2, Kind::Grant, 152, t0 + ms(1310), Some(t0 + ms(3300))));
        partial.push(ev(1, Kind::Grant, 154, t0 + ms(1400), Some(t0 + ms(3400))));
        assert!(partial.promise_violations().is_err());
    }

    #[test]
    fn a_break_that_read_a_grant_in_progress_excuses_that_grant() {
        // The 10-minute soak's shape (seed 20261201, redlock): the break deleted a frozen
        // holder's keys (2470) and, on one node, the keys of a grant still in progress, whose
        // count there was 2530; that grant completed as 2531 while the break ran, lost its
        // majority to it, and 2532 was granted 27 ms later.
        let h = History::new().with_partial_counts();
        let t0 = Instant::now();
        h.push(ev(1024, Kind::Grant, 2470, t0, Some(t0 + ms(1977))));
        h.forced_break_of(t0 + ms(1538), t0 + ms(1547), &[t(2470), t(2530)]);
        h.push(ev(2, Kind::Grant, 2531, t0 + ms(1544), Some(t0 + ms(3520))));
        h.push(ev(1, Kind::Grant, 2532, t0 + ms(1571), Some(t0 + ms(3544))));
        assert_eq!(h.promise_violations(), Ok(()));
        assert_eq!(h.belief_overlap(), Ok(()));
        // On a single counter (not Redlock) a token no grant carries excuses nobody.
        let single = History::new();
        for e in h.events() {
            single.push(e);
        }
        let v = single
            .promise_violations()
            .expect_err("only Redlock reports a grant in progress");
        assert!(v.first.contains("(token 2532)"), "{}", v.first);
        // A grant that completed after the break ended was not hit by it.
        let after = History::new().with_partial_counts();
        after.push(ev(1024, Kind::Grant, 2470, t0, Some(t0 + ms(1977))));
        after.forced_break_of(t0 + ms(1538), t0 + ms(1547), &[t(2470), t(2530)]);
        after.push(ev(2, Kind::Grant, 2531, t0 + ms(1550), Some(t0 + ms(3520))));
        after.push(ev(1, Kind::Grant, 2532, t0 + ms(1571), Some(t0 + ms(3544))));
        let v = after.promise_violations().expect_err("2531 was not broken");
        assert!(v.first.contains("client 1 (token 2532)"), "{}", v.first);
    }

    #[test]
    fn a_break_by_token_excuses_no_other_hold() {
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(500))));
        // The break reports a token nobody holds: client 0 is not excused.
        h.forced_break_of(t0 + ms(10), t0 + ms(11), &[t(7)]);
        h.push(ev(1, Kind::Grant, 2, t0 + ms(20), Some(t0 + ms(520))));
        let v = h.promise_violations().expect_err("client 0 was not broken");
        assert!(v.first.contains("client 1 (token 2)"), "{}", v.first);
        assert!(h.belief_overlap().is_err());
    }

    #[test]
    fn without_tokens_holds_follow_the_record() {
        let h = History::ordered_by(Order::Record);
        let t0 = Instant::now();
        // Meaningless tokens (a backend without fencing): the record decides the order.
        h.push(ev(0, Kind::Grant, 9, t0, Some(t0 + ms(100))));
        h.push(ev(0, Kind::Release, 9, t0 + ms(50), None));
        h.push(ev(1, Kind::Grant, 1, t0 + ms(60), Some(t0 + ms(200))));
        assert_eq!(h.promise_violations(), Ok(()));
        let holds = h.holds();
        assert_eq!((holds[0].client, holds[1].client), (0, 1));
    }

    #[test]
    fn repeated_or_decreasing_tokens_are_found() {
        let h = History::new();
        h.grant(0, t(5));
        h.release(0, t(5));
        h.grant(1, t(5));
        assert!(h.token_order().is_err(), "a repeated token");
        let h = History::new();
        h.grant(0, t(5));
        h.release(0, t(5));
        h.grant(1, t(4));
        assert!(h.token_order().is_err(), "a decreasing token");
        assert!(h.token_monotonicity().is_err());
    }

    #[test]
    fn a_superseded_write_is_found_whatever_its_token() {
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 6, t0, Some(t0 + ms(100))));
        h.push(ev(1, Kind::Grant, 7, t0 + ms(200), Some(t0 + ms(300))));
        h.push(ev(1, Kind::OpAccepted, 7, t0 + ms(210), None));
        h.push(ev(0, Kind::OpRejected, 6, t0 + ms(220), None));
        assert_eq!(h.fenced_safety(), Ok(()), "a rejected stale op is fine");
        h.push(ev(0, Kind::OpAccepted, 6, t0 + ms(230), None));
        assert!(h.fenced_safety().is_err());
        // Equal tokens from two holders: the second holder's write came first.
        let h = History::new();
        h.push(ev(0, Kind::Grant, 6, t0, Some(t0 + ms(100))));
        h.push(ev(1, Kind::Grant, 6, t0 + ms(200), Some(t0 + ms(300))));
        h.push(ev(1, Kind::OpAccepted, 6, t0 + ms(210), None));
        h.push(ev(0, Kind::OpAccepted, 6, t0 + ms(230), None));
        let v = h
            .fenced_safety()
            .expect_err("a reused token let the old holder write");
        assert!(v.first.contains("client 0 (token 6)"), "{}", v.first);
    }

    #[test]
    fn the_fenced_model_ignores_tokens() {
        // A lower token handed to a LATER grant: the guard rejects the current holder and
        // accepts the superseded one; ordering by token would see nothing wrong.
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 5, t0, Some(t0 + ms(100))));
        h.push(ev(0, Kind::Write, 5, t0 + ms(10), None));
        h.push(ev(0, Kind::OpAccepted, 5, t0 + ms(11), None));
        h.push(ev(1, Kind::Grant, 4, t0 + ms(150), Some(t0 + ms(250))));
        h.push(ev(1, Kind::Write, 4, t0 + ms(160), None));
        h.push(ev(1, Kind::OpRejected, 4, t0 + ms(161), None));
        h.push(ev(0, Kind::Write, 5, t0 + ms(170), None));
        h.push(ev(0, Kind::OpAccepted, 5, t0 + ms(171), None));
        let m = h.fenced_model();
        assert_eq!((m.current_rejected, m.stale_accepted), (1, 1), "{m:?}");
        assert_eq!((m.attempts, m.accepted, m.expected), (3, 2, 2));
        let v = h
            .fenced_safety()
            .expect_err("the guard followed the wrong order");
        assert!(
            v.first.contains("client 1 (token 4) was rejected"),
            "{}",
            v.first
        );
    }

    #[test]
    fn the_fenced_model_keeps_the_server_order_of_raced_grant_records() {
        // Token 5 was granted, broken at once, token 6 granted; 6's task recorded first and
        // wrote; 5's stale writes are rightly rejected.
        let h = History::new();
        let t0 = Instant::now();
        h.forced_break_of(t0, t0 + ms(1), &[t(5)]);
        h.push(ev(1, Kind::Grant, 6, t0 + ms(2), Some(t0 + ms(500))));
        h.push(ev(1, Kind::Write, 6, t0 + ms(3), None));
        h.push(ev(1, Kind::OpAccepted, 6, t0 + ms(3), None));
        h.push(ev(0, Kind::Grant, 5, t0 + ms(4), Some(t0 + ms(490))));
        h.push(ev(0, Kind::Write, 5, t0 + ms(5), None));
        h.push(ev(0, Kind::OpRejected, 5, t0 + ms(5), None));
        assert_eq!(h.fenced_safety(), Ok(()));
        // The same stale write accepted is caught.
        h.push(ev(0, Kind::Write, 5, t0 + ms(6), None));
        h.push(ev(0, Kind::OpAccepted, 5, t0 + ms(6), None));
        assert_eq!(h.fenced_model().stale_accepted, 1);
    }

    #[test]
    fn a_resource_that_refuses_everyone_fails_the_fenced_model() {
        let h = History::new();
        let t0 = Instant::now();
        h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(100))));
        h.push(ev(0, Kind::Write, 1, t0 + ms(1), None));
        h.push(ev(0, Kind::OpRejected, 1, t0 + ms(2), None));
        assert_eq!(h.fenced_model().current_rejected, 1);
        assert!(h.fenced_safety().is_err());
    }

    #[test]
    fn failed_breaks_are_counted() {
        let h = History::new();
        let t0 = Instant::now();
        h.forced_break_of(t0, t0 + ms(1), &[t(3)]);
        assert_eq!(h.break_errors(), 0);
        h.forced_break(t0 + ms(5), t0 + ms(6));
        assert_eq!(h.break_errors(), 1);
    }

    #[tokio::test]
    async fn a_break_is_dated_from_the_mark_before_its_delete() {
        let called = Instant::now();
        let (marked, (before, after)) = delete_marked(async {
            tokio::time::sleep(ms(5)).await; // opening a session, reading the holder
            let before = Instant::now();
            deleting_now();
            let after = Instant::now();
            tokio::time::sleep(ms(1)).await;
            deleting_now(); // a later node's delete: the earliest mark counts
            (before, after)
        })
        .await;
        let t = marked.expect("marked");
        assert!(called < before && before <= t && t <= after);
        let (none, ()) = delete_marked(async {}).await;
        assert_eq!(none, None);
        deleting_now(); // outside a break: nothing happens
    }

    #[test]
    fn a_break_dated_from_its_call_excuses_a_grant_made_before_its_delete() {
        // The break was called at 100 ms, opened a session and read the holder, and deleted
        // token 1 at 300 ms; token 2 was granted at 200 ms, while token 1's entry was intact.
        let t0 = Instant::now();
        let run = |dated: Instant| {
            let h = History::new();
            h.push(ev(0, Kind::Grant, 1, t0, Some(t0 + ms(1000))));
            h.forced_break_of(dated, t0 + ms(310), &[t(1)]);
            h.push(ev(1, Kind::Grant, 2, t0 + ms(200), Some(t0 + ms(1200))));
            h.promise_violations()
        };
        assert_eq!(run(t0 + ms(100)), Ok(()), "dated from the call: excused");
        let v = run(t0 + ms(300)).expect_err("dated from the delete: caught");
        assert!(v.first.contains("client 1 (token 2)"), "{}", v.first);
    }
}
