//! The single-node Redis lock in fair mode (`dlock-redis`, `RedisLocker` with `.fair(true)`,
//! the default): the Lua scripts of `scripts.rs` run atomically by one server, the client loop
//! of `acquire/mod.rs` (one script call per attempt; joining the queue; sleeping until notified
//! or until the fallback timer), the pub/sub notification of the head waiter
//! (`acquire/notify.rs`), the withdrawal of an acquire that ends without a lease
//! (`acquire/pending.rs`), and the lease kept by the renewal driver (`renew.rs`,
//! `dlock-core/src/renewal.rs`).
//!
//! A fair release with waiters grants the live head in the release script (`pass_on`: the
//! head's owner value, the next token, published to the head with the number of the head's
//! queued attempt whose grant details it used), and the head takes the lease counted from that
//! attempt's send only when it is the last attempt the head saw answered (`acquire::direct`,
//! `granted_directly`); heads of an older client, which leave no grant details, get a
//! reservation instead (the `older heads` cases).
//!
//! The server keeps, with expiries on ITS clock: the lock key (our owner value, or a
//! reservation `r:<entry>` for the queue's head), the fence counter (`next_token`: the
//! counter plus one, raised to at least the server clock, the "clock floor"), the queue (list
//! of entries) and its deadlines hash. A restart loses every key; the server's clock goes on.
//!
//! Messages (script calls, replies, pub/sub notifications) are delivered in any order
//! (reordered), lost and duplicated under a budget; processes pause (with `faults` on nothing
//! forces a step on time); a holder may crash; a waiter may give up (cancel or wait timeout).
//!
//! Cases: `today, loss` (a lost or duplicated message, a cancel, a holder crash, pauses),
//! `today, restart` (a restart that loses every key, a holder crash, pauses), `today, fair`
//! (3 clients, the fair scheduler, a lost notification, a holder crash: FIFO and the bounds),
//! `today, late announcements` (2 clients × 2 acquires, notifications up to 2 units late,
//! pauses, a holder crash), and the negative controls `announcement of any attempt` (the
//! head takes a direct grant whatever attempt it names, the rule before attempt numbers),
//! `fence without floor` and `unguarded release`.
//!
//! Where it abstracts the code:
//! - Time is whole units of 0.5 s. TTL 3 s = 6 units; the renewal period TTL/3 = 2; the drift
//!   allowance (TTL/100 + 2 ms = 32 ms) and the loss margin (drift + TTL/10 at most 200 ms =
//!   232 ms) are one unit each (rounded up); the request timeout (TTL/3 at most 2 s) 2 units;
//!   the refresh period (the TTL at most 1 s) 2 units, so an entry lives 6; the retry delay
//!   after a slow reply (50 ms) is 0 (the retry is sent at once).
//! - Every script call and reply is delivered (or lost) before time moves on: delays are
//!   shorter than a unit, so a request's reply is never late for its validity and request
//!   timeouts only follow a lost message. Pub/sub notifications ride another connection: in
//!   the `late announcements` cases they may arrive up to 2 units after they were sent (after
//!   later replies, and after the grant they announce expired); elsewhere within the unit.
//!   The server's clock runs with the clients' (the lease model checks clock drift).
//! - A token is `max(counter + 1, server clock × 16)`: 16 tokens per unit stand for the
//!   microseconds of a unit (a run grants far fewer than 16 per unit). A restart takes one
//!   unit (the server is not back within the microsecond it went down in).
//! - An entry's id and the owner value are one id per acquire, `(client, acquire number)`
//!   (the code draws a random owner value and an entry `<locker id>.<seq>` per acquire).
//! - One lock name, one lease per client; the fence key's 7-day lifetime is left out (it
//!   never passes within a run), and so are Redis Cluster, Sentinel, `wait_for_replicas`, the
//!   read-write lock and semaphore, and the non-fair mode.
//! - Every acquire starts with the fast attempt: the `contended` hint that queues at once is
//!   left out (it only skips the barging-capable fast path).
//! - A restart keeps the clients' connections (requests in flight are served by the restarted
//!   server or lost under the budget); the notifier's resubscription wakes every waiter
//!   (`Notifier::wake_all`).
//! - A direct grant's TTL capped at the entry lifetime less 1 ms is the TTL in units (the
//!   entry lives one TTL). An attempt's number is the client's request number. One that
//!   reaches a waiter with an attempt in flight is kept (of several, the one naming the
//!   latest attempt, as the notifier keeps them) and checked after the reply.
//! - A renewal whose reply is lost is not retried: the lease is lost at its deadline.
//! - The give-back of a grant whose reply came after its validity (`acquire`, "grant arrived
//!   after its validity") is out of reach (replies come within the unit); a property checks
//!   that it stays so.
//! - One believer at a time is judged among the leases granted since the same restart: a
//!   restart without persistence lets the lock be granted again while the old holder still
//!   believes until its next renewal (documented in the README, "Persistence"); across it the
//!   tokens and the fenced resource must hold.
//! - In the fair configuration a holder releases `hold` units after its grant (or crashes),
//!   clients start their acquire at any time, and waiters never give up.
//! - A fenced resource is written directly (no message): a holder writes once per lease, while
//!   it believes or after its deadline passed (a paused process that did not look).

use stateright::{Model, Property};

use crate::check::{Bound, Case, Outcome, explore};
use crate::net::{Net, Sent};

/// TTL in units.
const TTL: u8 = 6;
/// Renewal period (TTL/3).
const PERIOD: u8 = 2;
/// Drift allowance subtracted from every deadline.
const DRIFT: u8 = 1;
/// `loss_margin`: `lost()` fires this long before the deadline.
const MARGIN: u8 = 1;
/// The request timeout (TTL/3 at most 2 s).
const REQUEST_TIMEOUT: u8 = 2;
/// `refresh_period`: the TTL at most 1 s.
const REFRESH: u8 = 2;
/// `entry_lifetime`: three refresh periods.
const ENTRY_LIFE: u8 = 3 * REFRESH;
/// Tokens per unit of the server clock (the clock floor's microseconds).
const PER_UNIT: u16 = 16;

/// A variant of the scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The scripts as they are.
    Today,
    /// `next_token` without its clock floor (a plain counter + 1): a negative control.
    NoClockFloor,
    /// `RELEASE_FAIR_HEAD` without its owner check (`GET lock ~= owner`): a negative control.
    UnguardedRelease,
    /// The scripts as they are, with heads of an older client that leaves no grant details:
    /// `pass_on` reserves the lock for the head (`r:<entry>`) and only wakes it.
    OlderHeads,
    /// The head takes a direct grant whatever attempt its announcement names, counted from
    /// its last answered attempt (the rule before attempt numbers): a negative control.
    AnyAttempt,
}

/// The model's parameters.
#[derive(Debug, Clone)]
pub struct RedisModel {
    /// How many clients.
    pub clients: u8,
    /// How many acquires each client starts at most.
    pub attempts: u8,
    /// The longest a message travels before it is delivered (or lost).
    pub max_delay: u8,
    /// The longest a pub/sub notification travels: it rides another connection than the
    /// script calls and their replies, so it may arrive after later replies, and after time
    /// moved on.
    pub notify_delay: u8,
    /// Time stops here.
    pub horizon: u8,
    /// Losses and duplications of messages (faults on only).
    pub faults_budget: u8,
    /// Pub/sub notifications that may be lost (also in the fair configuration: the fallback
    /// timer covers them).
    pub notify_losses: u8,
    /// Server restarts that lose every key.
    pub restarts: u8,
    /// Acquires that may be given up (cancel or wait timeout).
    pub cancels: u8,
    /// How far the server's clock may gain on the clients' over the run.
    pub max_skew: u8,
    /// Faults on: loss, duplication, pauses, cancels, any client may crash. Off: every due step
    /// is urgent, holders release within `hold`, only a holder may crash.
    pub faults: bool,
    /// Fair configuration: a holder releases this long after its grant.
    pub hold: u8,
    /// Fair configuration: a waiter is granted at most this long after its acquire started.
    pub wait_bound: u8,
    /// Fair configuration: a crashed holder's lock goes to a waiter at most this long after
    /// the crash + TTL + 1 (or after the waiter started, whichever is later).
    pub crash_slack: u8,
    /// Which scripts.
    pub variant: Variant,
}

/// An owner value and queue entry: `(client, acquire number)`.
pub type Id = (u8, u8);

/// The lock key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Val {
    /// A holder's owner value.
    Owner(Id),
    /// `r:<entry>`: reserved for the queue's head (`pass_on`).
    Reserved(Id),
}

/// What a message says. `start` is the client's clock when it sent the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// `FAST_ACQUIRE_BODY` (`scripts::fast_acquire`, the first attempt of every acquire).
    FastAcquire {
        /// The owner value.
        owner: Id,
        /// When it was sent.
        start: u8,
        /// The client's request number (a reply answers only its own request).
        req: u8,
    },
    /// `ACQUIRE_FAIR_HEAD` + `ACQUIRE_FAIR_TAIL` (a queued attempt; entry = owner id).
    AcquireFair {
        /// The owner value and entry.
        owner: Id,
        /// When it was sent.
        start: u8,
        /// The client's request number (a reply answers only its own request).
        req: u8,
    },
    /// `RENEW_SRC` (`SingleBackend::renew`): compare-and-PEXPIRE.
    Renew {
        /// The owner value.
        owner: Id,
        /// When it was sent.
        start: u8,
    },
    /// `RELEASE_FAIR_HEAD` + `RELEASE_FAIR_TAIL` (`SingleBackend::release_keys`).
    ReleaseFair {
        /// The owner value.
        owner: Id,
    },
    /// `WITHDRAW_BODY` (`SingleBackend::withdraw_waiter`).
    Withdraw {
        /// The owner value and entry.
        owner: Id,
    },
    /// `{1, token}`.
    Granted {
        /// The attempt it answers.
        start: u8,
        /// The client's request number (a reply answers only its own request).
        req: u8,
        /// The fencing token.
        token: u16,
        /// Restarts before the grant (a model ghost).
        epoch: u8,
        /// The server's script re-granted our own key (a ghost).
        regrant: bool,
    },
    /// `{0, pttl, is_head}`.
    Held {
        /// The attempt it answers.
        start: u8,
        /// The client's request number (a reply answers only its own request).
        req: u8,
        /// The holder's remaining TTL.
        pttl: u8,
        /// Our entry is the queue's head.
        head: bool,
    },
    /// `{0, -3, 0, head_ms_left}`: free, but another waiter's turn.
    Turn {
        /// The attempt it answers.
        start: u8,
        /// The client's request number (a reply answers only its own request).
        req: u8,
        /// How long the head's entry lives.
        left: u8,
    },
    /// The renewal extended the key.
    Extended {
        /// The renewal it answers.
        start: u8,
    },
    /// The renewal found the key gone or someone else's.
    NotOwner {
        /// The renewal it answers.
        start: u8,
    },
    /// `publish(entry)`: the pub/sub message to the entry's locker; for a direct grant
    /// (`pass_on` granting the head) also the token, the restarts before the grant and the
    /// number of the head's queued attempt whose grant details it used.
    Notify {
        /// The entry it names.
        entry: Id,
        /// The direct grant, if it is one.
        grant: Option<Announced>,
    },
}

/// A direct grant as `pass_on` announces it (`<entry> <token> <owner> <attempt>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Announced {
    /// The fencing token.
    pub token: u16,
    /// Restarts before the grant (a model ghost).
    pub epoch: u8,
    /// The head's queued attempt that left the grant details (its request number).
    pub attempt: u8,
}

/// A message in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    /// When it was sent (global time).
    pub sent: u8,
    /// The client it is from or to.
    pub client: u8,
    /// What it says.
    pub body: Body,
}

impl Sent for Msg {
    fn sent(&self) -> u8 {
        self.sent
    }
}

/// A client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// Not acquiring, not holding.
    Idle,
    /// `acquire`: an attempt sent at `start` awaits its reply. `since`: the acquire's start;
    /// `queued`: it has an entry (`join_queue`); `permit`: a notification came meanwhile.
    Attempt {
        /// When the acquire started.
        since: u8,
        /// When this attempt was sent.
        start: u8,
        /// Its request number.
        req: u8,
        /// Whether it joined the queue.
        queued: bool,
        /// A notification's permit is stored (`Notify::notify_one`).
        permit: bool,
        /// A direct grant announced meanwhile, kept by the notifier (of several, the one
        /// after the latest attempt) for the check after the reply (`granted_directly`).
        grant: Option<Announced>,
    },
    /// `doze`: sleeping until notified or until `until`.
    Dozing {
        /// When the last attempt that queued or refreshed us (answered "not granted") was
        /// sent: a direct grant's deadline counts from it (`acquire::direct::start_of`).
        asked: u8,
        /// That attempt's number (its request number): a direct grant is taken only when
        /// its announcement names it.
        attempt: u8,
        /// When the acquire started.
        since: u8,
        /// The fallback timer.
        until: u8,
        /// Whether it joined the queue.
        queued: bool,
    },
    /// Holding the lease.
    Holding {
        /// `start + TTL − drift` of the request that last extended it.
        deadline: u8,
        /// The start of the request that last extended it.
        extended: u8,
        /// The start of a renewal in flight.
        renewing: Option<u8>,
        /// The fencing token.
        token: u16,
        /// Grant order among accepted grants (a ghost).
        seq: u8,
        /// Restarts before the grant (a ghost).
        epoch: u8,
        /// When it was granted.
        granted: u8,
        /// Whether it wrote the fenced resource.
        wrote: bool,
    },
    /// Crashed: takes no more steps.
    Crashed {
        /// When.
        at: u8,
    },
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Global time (every client's clock).
    pub now: u8,
    /// How far the server's clock is ahead.
    pub skew: u8,
    /// The lock key: value and expiry (server clock).
    pub lock: Option<(Val, u8)>,
    /// The fence counter.
    pub fence: Option<u16>,
    /// The queue (`:q`) with each entry's deadline (`:qt`) and the number of the queued
    /// attempt that left its grant details (`g:<entry>`: the client's request number), in
    /// order.
    pub queue: Vec<(Id, u8, u8)>,
    /// The queue keys' expiry (only ever extended).
    pub q_exp: u8,
    /// The clients.
    pub clients: Vec<Client>,
    /// Acquires each client started (the next acquire's number).
    pub started: Vec<u8>,
    /// Requests (attempts) each client sent: the last one's number.
    pub reqs: Vec<u8>,
    /// Messages in flight (sorted: a multiset).
    pub net: Net<Msg>,
    /// Losses and duplications left.
    pub faults_left: u8,
    /// Notification losses left.
    pub notify_losses_left: u8,
    /// Cancels (an acquire given up) left.
    pub cancels_left: u8,
    /// Restarts so far.
    pub epoch: u8,
    /// Whether a crash happened.
    pub crashed: bool,
    /// Ghost: the highest token the server issued and to whom.
    pub issued: Option<(u16, Id)>,
    /// Ghost: accepted grants so far, and the last accepted token.
    pub accepted: (u8, u16),
    /// Ghost: a token repeated or went back.
    pub token_regress: bool,
    /// Ghost: the fenced resource's highest token and the grant order of its last writer.
    pub resource: Option<(u16, u8)>,
    /// Ghost: the resource accepted an earlier holder's write after a later one's.
    pub resource_bad: bool,
    /// Ghost: the lock was freed by a holder's key expiring (fairness may be lost once).
    pub expired_free: bool,
    /// Ghost: a waiter was overtaken by a later arrival (not after an expiry).
    pub overtaken: bool,
    /// Ghost: a grant reply came after its validity.
    pub late_grant: bool,
    /// Ghost: a crashed holder's lock was granted again.
    pub regranted: bool,
    /// Ghost: the sometimes-flags (see `properties`).
    pub seen: u8,
}

const SEEN_QUEUE_HANDOFF: u8 = 1;
const SEEN_REGRANT: u8 = 2;
const SEEN_RESTART_GRANT: u8 = 4;
const SEEN_WITHDRAW: u8 = 8;
const SEEN_WRITE_REJECTED: u8 = 16;
const SEEN_NOTIFY_LOST_GRANT: u8 = 32;
const SEEN_NOTIFY_LOST: u8 = 64;
const SEEN_OTHER_ATTEMPT: u8 = 128;

/// A step, named after what the code does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Time passes one unit (keys expire by the server's clock).
    Tick,
    /// The server's clock gains one unit on the clients'.
    ServerClockGains,
    /// The server restarts without persistence: every key is lost; one unit passes.
    Restart,
    /// `acquire`: a new acquire's first attempt (`scripts::fast_acquire`).
    Acquire(u8),
    /// `doze` ends (notified, or the fallback timer): the next attempt (`attempt`, queued).
    Wake(u8),
    /// `attempt` timed out (`Pending::after_failure`, slow): the next attempt at once.
    RequestTimeout(u8),
    /// The acquire ends without a lease (cancel or wait timeout): `Pending::timeout` / `Drop`
    /// withdraws (`withdraw_waiter`, or `release_keys` before it queued).
    GiveUp(u8),
    /// The renewal driver's round (`SingleBackend::renew`).
    Renew(u8),
    /// `Lease::release` → `SingleBackend::release_keys`.
    Release(u8),
    /// `lost()` fires: the deadline less the loss margin passed.
    Lost(u8),
    /// The client's process dies.
    Crash(u8),
    /// The holder writes the fenced resource with its token.
    Write(u8),
    /// A message arrives (a script runs, a reply or notification is read).
    Deliver(Msg),
    /// A message is lost.
    Lose(Msg),
    /// A message is duplicated.
    Duplicate(Msg),
}

impl RedisModel {
    fn clock(s: &State) -> u8 {
        s.now + s.skew
    }

    fn deadline(start: u8) -> u8 {
        start + TTL - DRIFT
    }

    /// The steps a fair scheduler must take before time may pass.
    fn due(&self, s: &State, i: usize) -> bool {
        match s.clients[i] {
            Client::Attempt { start, .. } => s.now >= start + REQUEST_TIMEOUT,
            Client::Dozing { until, .. } => s.now >= until,
            Client::Holding {
                deadline,
                extended,
                renewing,
                granted,
                ..
            } => {
                s.now + MARGIN >= deadline
                    || (renewing.is_none() && s.now >= extended + PERIOD)
                    || s.now >= granted + self.hold
            }
            _ => false,
        }
    }

    /// Drops what expired by the server's clock.
    fn expire(s: &mut State) {
        let clock = Self::clock(s);
        if let Some((val, exp)) = s.lock
            && clock >= exp
        {
            if matches!(val, Val::Owner(_)) {
                s.expired_free = true;
            }
            s.lock = None;
        }
        if !s.queue.is_empty() && clock >= s.q_exp {
            s.queue.clear();
        }
        if s.queue.is_empty() {
            s.q_exp = 0;
        }
    }

    /// `next_token` (TOKEN_PRELUDE) with a fence lifetime > 0: counter + 1, raised to the
    /// server clock.
    fn next_token(&self, s: &mut State) -> u16 {
        let mut tok = s.fence.unwrap_or(0) + 1;
        if self.variant != Variant::NoClockFloor {
            tok = tok.max(u16::from(Self::clock(s)) * PER_UNIT);
        }
        s.fence = Some(tok);
        tok
    }

    /// Ghosts of a server grant to `owner`: token order, FIFO.
    fn granted(&self, s: &mut State, owner: Id, token: u16) {
        if s.issued == Some((token, owner)) {
            // Our own grant again (`ACQUIRE_FAIR_HEAD` after a direct grant): not a new one.
            return;
        }
        match s.issued {
            Some((t, o)) if token < t || (token == t && o != owner) => s.token_regress = true,
            _ => {}
        }
        if s.issued.is_none_or(|(t, _)| token >= t) {
            s.issued = Some((token, owner));
        }
        let clock = Self::clock(s);
        let pos = s
            .queue
            .iter()
            .position(|&(e, _, _)| e == owner)
            .unwrap_or(s.queue.len());
        let ahead = s.queue[..pos]
            .iter()
            .any(|&(e, dl, _)| e != owner && dl > clock);
        if ahead && !s.expired_free {
            s.overtaken = true;
        }
        s.expired_free = false;
    }

    fn live_until(s: &State, e: Id, clock: u8) -> Option<u8> {
        s.queue
            .iter()
            .find(|&&(x, _, _)| x == e)
            .map(|&(_, dl, _)| dl)
            .filter(|&dl| dl > clock)
    }

    /// `live_head`: drops dead heads; the live head and its deadline.
    fn live_head(s: &mut State, clock: u8) -> Option<(Id, u8)> {
        while let Some(&(head, dl, _)) = s.queue.first() {
            if dl > clock {
                return Some((head, dl));
            }
            s.queue.remove(0);
        }
        None
    }

    fn publish(s: &mut State, entry: Id, grant: Option<Announced>) {
        s.net.send(Msg {
            sent: s.now,
            client: entry.0,
            body: Body::Notify { entry, grant },
        });
    }

    /// `pass_on`: grant the live head with the next token, for its TTL but not past its
    /// entry's deadline, and tell it (a head of an older client: reserve the lock for it and
    /// tell it); or free the lock.
    fn pass_on(&self, s: &mut State) {
        let clock = Self::clock(s);
        match Self::live_head(s, clock) {
            Some((head, dl)) if self.variant == Variant::OlderHeads => {
                let px = TTL.min(dl - clock).max(1);
                Self::publish(s, head, None);
                s.lock = Some((Val::Reserved(head), clock + px));
            }
            Some((head, dl)) => {
                let px = TTL.min(dl - clock).max(1);
                // `live_head` left the head first: the attempt of its grant details.
                let attempt = s.queue.first().map_or(0, |q| q.2);
                let token = self.next_token(s);
                self.granted(s, head, token);
                let epoch = s.epoch;
                Self::publish(
                    s,
                    head,
                    Some(Announced {
                        token,
                        epoch,
                        attempt,
                    }),
                );
                s.lock = Some((Val::Owner(head), clock + px));
                // `LPOP` and `forget`.
                s.queue.retain(|&(e, _, _)| e != head);
            }
            None => s.lock = None,
        }
    }

    /// One script run by the server.
    fn server(&self, s: &mut State, m: &Msg) {
        let clock = Self::clock(s);
        let live = s.lock.filter(|&(_, exp)| clock < exp);
        let reply = |s: &mut State, body| {
            s.net.send(Msg {
                sent: s.now,
                client: m.client,
                body,
            })
        };
        let epoch = s.epoch;
        match m.body {
            Body::FastAcquire { owner, start, req } => match live {
                None => {
                    s.lock = Some((Val::Owner(owner), clock + TTL));
                    let token = self.next_token(s);
                    self.granted(s, owner, token);
                    reply(
                        s,
                        Body::Granted {
                            start,
                            req,
                            token,
                            epoch,
                            regrant: false,
                        },
                    );
                }
                Some((Val::Owner(o), _)) if o == owner => {
                    s.lock = Some((Val::Owner(owner), clock + TTL));
                    let token = self.next_token(s);
                    self.granted(s, owner, token);
                    reply(
                        s,
                        Body::Granted {
                            start,
                            req,
                            token,
                            epoch,
                            regrant: true,
                        },
                    );
                }
                Some((_, exp)) => reply(
                    s,
                    Body::Held {
                        start,
                        req,
                        pttl: exp - clock,
                        head: false,
                    },
                ),
            },
            Body::AcquireFair { owner, start, req } => {
                // ACQUIRE_FAIR_HEAD: our own earlier grant.
                if let Some((Val::Owner(o), _)) = live
                    && o == owner
                {
                    s.lock = Some((Val::Owner(owner), clock + TTL));
                    let mut token = s.fence.unwrap_or(0);
                    if token < 1 {
                        token = self.next_token(s);
                    }
                    self.granted(s, owner, token);
                    reply(
                        s,
                        Body::Granted {
                            start,
                            req,
                            token,
                            epoch,
                            regrant: true,
                        },
                    );
                    return;
                }
                // ACQUIRE_FAIR_TAIL.
                let head = Self::live_head(s, clock);
                let mut holder = live.map(|(v, _)| v);
                if let Some(Val::Reserved(e)) = holder
                    && Self::live_until(s, e, clock).is_none()
                {
                    s.lock = None;
                    holder = None;
                }
                let reserved_for_us = holder == Some(Val::Reserved(owner));
                if reserved_for_us || (holder.is_none() && head.is_none_or(|(h, _)| h == owner)) {
                    s.lock = Some((Val::Owner(owner), clock + TTL));
                    let token = self.next_token(s);
                    self.granted(s, owner, token);
                    s.queue.retain(|&(e, _, _)| e != owner);
                    if reserved_for_us {
                        s.seen |= SEEN_QUEUE_HANDOFF;
                    }
                    reply(
                        s,
                        Body::Granted {
                            start,
                            req,
                            token,
                            epoch,
                            regrant: false,
                        },
                    );
                    return;
                }
                let dl = clock + ENTRY_LIFE;
                // The deadline and the grant details (`g:<entry>`, with this attempt's number).
                match s.queue.iter_mut().find(|(e, _, _)| *e == owner) {
                    Some(entry) => {
                        entry.1 = dl;
                        entry.2 = req;
                    }
                    None => s.queue.push((owner, dl, req)),
                }
                s.q_exp = s.q_exp.max(dl);
                match (holder, s.lock) {
                    (Some(_), Some((_, exp))) => {
                        let head = s.queue.first().is_some_and(|&(e, _, _)| e == owner);
                        reply(
                            s,
                            Body::Held {
                                start,
                                req,
                                pttl: exp - clock,
                                head,
                            },
                        );
                    }
                    _ => {
                        // Free, but the head's turn (the head is live: `holder` is none and
                        // the head is another entry).
                        let (h, hdl) = head.unwrap_or((owner, dl));
                        Self::publish(s, h, None);
                        reply(
                            s,
                            Body::Turn {
                                start,
                                req,
                                left: hdl - clock,
                            },
                        );
                    }
                }
            }
            Body::Renew { owner, start } => match live {
                Some((Val::Owner(o), _)) if o == owner => {
                    s.lock = Some((Val::Owner(owner), clock + TTL));
                    reply(s, Body::Extended { start });
                }
                _ => reply(s, Body::NotOwner { start }),
            },
            Body::ReleaseFair { owner } => {
                let unguarded = self.variant == Variant::UnguardedRelease;
                let ours = match live {
                    Some((Val::Owner(o), _)) => o == owner || unguarded,
                    Some(_) => unguarded,
                    None => false,
                };
                if !ours {
                    return;
                }
                if s.queue.is_empty() {
                    s.lock = None;
                } else {
                    self.pass_on(s);
                }
            }
            Body::Withdraw { owner } => {
                let was_head = s.queue.first().is_some_and(|&(e, _, _)| e == owner);
                s.queue.retain(|&(e, _, _)| e != owner);
                let holder = live.map(|(v, _)| v);
                if holder == Some(Val::Owner(owner)) || holder == Some(Val::Reserved(owner)) {
                    self.pass_on(s);
                } else if was_head && let Some((h, _)) = Self::live_head(s, clock) {
                    Self::publish(s, h, None);
                }
            }
            _ => {}
        }
    }

    /// A reply or notification read by client `m.client`.
    fn client(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        let c = s.clients[i];
        s.clients[i] = match (c, m.body) {
            (
                Client::Attempt {
                    since,
                    start,
                    req,
                    queued,
                    permit,
                    grant,
                },
                body,
            ) => match body {
                Body::Notify { entry, grant: g }
                    if queued && entry == (i as u8, s.started[i] - 1) =>
                {
                    // The notifier keeps the announcement after the latest attempt.
                    let grant = match (grant, g) {
                        (Some(old), Some(new)) if old.attempt > new.attempt => Some(old),
                        (old, new) => new.or(old),
                    };
                    Client::Attempt {
                        since,
                        start,
                        req,
                        queued,
                        permit: true,
                        grant,
                    }
                }
                Body::Granted {
                    req: r0,
                    token,
                    epoch,
                    regrant,
                    ..
                } if r0 == req => self.accept(s, start, token, epoch, regrant, queued),
                Body::Held {
                    req: r0,
                    pttl,
                    head,
                    ..
                } if r0 == req => {
                    if !queued {
                        // Join the queue and try again at once with the queue script.
                        return self.attempt(s, i, since, true);
                    }
                    let sleep = if head { pttl.min(REFRESH) } else { REFRESH };
                    return self.doze(s, i, since, (start, req), sleep, permit, grant);
                }
                Body::Turn { req: r0, left, .. } if r0 == req => {
                    let sleep = left.min(REFRESH);
                    return self.doze(s, i, since, (start, req), sleep, permit, grant);
                }
                _ => c,
            },
            (
                Client::Dozing {
                    since,
                    queued,
                    asked,
                    attempt,
                    ..
                },
                Body::Notify { entry, grant },
            ) if queued && entry == (i as u8, s.started[i] - 1) => {
                match self.granted_directly(s, grant, (asked, attempt)) {
                    Some(lease) => lease,
                    None => return self.attempt(s, i, since, true),
                }
            }
            (
                Client::Holding {
                    deadline,
                    extended,
                    renewing: Some(r),
                    token,
                    seq,
                    epoch,
                    granted,
                    wrote,
                },
                Body::Extended { start },
            ) if r == start => Client::Holding {
                deadline: deadline.max(Self::deadline(start)),
                extended: extended.max(start),
                renewing: None,
                token,
                seq,
                epoch,
                granted,
                wrote,
            },
            (
                Client::Holding {
                    renewing: Some(r), ..
                },
                Body::NotOwner { start },
            ) if r == start => Client::Idle,
            // A late or duplicated reply, or a notification for nobody waiting.
            (c, _) => c,
        };
    }

    /// A grant a client accepts (a `Granted` reply, or a direct grant): the ghosts of
    /// token order, late grants and what was seen, and the lease counted from `start`.
    fn accept(
        &self,
        s: &mut State,
        start: u8,
        token: u16,
        epoch: u8,
        regrant: bool,
        queued: bool,
    ) -> Client {
        if s.now >= Self::deadline(start) {
            s.late_grant = true;
        }
        if token <= s.accepted.1 && s.accepted.0 > 0 {
            s.token_regress = true;
        }
        if s.crashed
            && s.clients
                .iter()
                .any(|c| matches!(c, Client::Crashed { .. }))
        {
            s.regranted = true;
        }
        if regrant {
            s.seen |= SEEN_REGRANT;
        }
        if epoch > 0 {
            s.seen |= SEEN_RESTART_GRANT;
        }
        if s.notify_losses_left < self.notify_losses && queued {
            s.seen |= SEEN_NOTIFY_LOST_GRANT;
        }
        s.accepted = (s.accepted.0 + 1, token);
        Client::Holding {
            deadline: Self::deadline(start),
            extended: start,
            renewing: None,
            token,
            seq: s.accepted.0,
            epoch,
            granted: s.now,
            wrote: false,
        }
    }

    /// `attempt`: sends the next attempt (fast unless `queued`).
    fn attempt(&self, s: &mut State, i: usize, since: u8, queued: bool) {
        let owner = (i as u8, s.started[i] - 1);
        let start = s.now;
        s.reqs[i] = s.reqs[i].wrapping_add(1);
        let req = s.reqs[i];
        let body = if queued {
            Body::AcquireFair { owner, start, req }
        } else {
            Body::FastAcquire { owner, start, req }
        };
        s.net.send(Msg {
            sent: s.now,
            client: i as u8,
            body,
        });
        s.clients[i] = Client::Attempt {
            since,
            start,
            req,
            queued,
            permit: false,
            grant: None,
        };
    }

    /// `doze`: a stored permit wakes it at once (and a direct grant kept meanwhile is checked
    /// against the attempt just answered, `asked`: its send and number); otherwise it sleeps
    /// `sleep`.
    #[allow(clippy::too_many_arguments)]
    fn doze(
        &self,
        s: &mut State,
        i: usize,
        since: u8,
        asked: (u8, u8),
        sleep: u8,
        permit: bool,
        grant: Option<Announced>,
    ) {
        if !permit {
            s.clients[i] = Client::Dozing {
                asked: asked.0,
                attempt: asked.1,
                since,
                until: s.now + sleep,
                queued: true,
            };
        } else if let Some(lease) = self.granted_directly(s, grant, asked) {
            s.clients[i] = lease;
        } else {
            self.attempt(s, i, since, true);
        }
    }

    /// `granted_directly`: a direct grant is taken when its announcement names the last
    /// queued attempt answered "not granted" (`asked`: its send and number), counted from that
    /// attempt's send, unless that leaves less than a renewal period (then the next attempt
    /// re-arms the key). [`Variant::AnyAttempt`] takes it whatever attempt it names.
    fn granted_directly(
        &self,
        s: &mut State,
        grant: Option<Announced>,
        (sent, number): (u8, u8),
    ) -> Option<Client> {
        let g = grant?;
        if g.attempt != number {
            s.seen |= SEEN_OTHER_ATTEMPT;
        }
        let named = g.attempt == number || self.variant == Variant::AnyAttempt;
        if !named || Self::deadline(sent) < s.now + PERIOD {
            return None;
        }
        s.seen |= SEEN_QUEUE_HANDOFF;
        Some(self.accept(s, sent, g.token, g.epoch, false, true))
    }

    fn believers(s: &State) -> impl Iterator<Item = u8> + '_ {
        s.clients.iter().filter_map(|c| match *c {
            Client::Holding {
                deadline, epoch, ..
            } if s.now < deadline => Some(epoch),
            _ => None,
        })
    }

    fn waiting_since(c: &Client) -> Option<u8> {
        match *c {
            Client::Attempt { since, .. } | Client::Dozing { since, .. } => Some(since),
            _ => None,
        }
    }
}

impl Model for RedisModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.clients as usize;
        vec![State {
            now: 0,
            skew: 0,
            lock: None,
            fence: None,
            queue: Vec::new(),
            q_exp: 0,
            clients: vec![Client::Idle; n],
            started: vec![0; n],
            reqs: vec![0; n],
            net: Net::default(),
            faults_left: if self.faults { self.faults_budget } else { 0 },
            notify_losses_left: self.notify_losses,
            cancels_left: self.cancels,
            epoch: 0,
            crashed: false,
            issued: None,
            accepted: (0, 0),
            token_regress: false,
            resource: None,
            resource_bad: false,
            expired_free: false,
            overtaken: false,
            late_grant: false,
            regranted: false,
            seen: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let n = self.clients;
        let overdue = s.net.iter().any(|m| {
            let delay = match m.body {
                Body::Notify { .. } => self.notify_delay.max(self.max_delay),
                _ => self.max_delay,
            };
            s.now >= m.sent + delay
        });
        let urgent = !self.faults && (0..n as usize).any(|i| self.due(s, i));
        let can_tick = !overdue && !urgent && s.now < self.horizon;
        if can_tick {
            actions.push(Action::Tick);
            if s.epoch < self.restarts {
                actions.push(Action::Restart);
            }
        }
        if self.faults && s.skew < self.max_skew {
            actions.push(Action::ServerClockGains);
        }
        for i in 0..n {
            let iu = i as usize;
            match s.clients[iu] {
                Client::Idle if s.started[iu] < self.attempts => actions.push(Action::Acquire(i)),
                Client::Attempt { start, .. } => {
                    if s.now >= start + REQUEST_TIMEOUT {
                        actions.push(Action::RequestTimeout(i));
                    }
                    if s.cancels_left > 0 {
                        actions.push(Action::GiveUp(i));
                    }
                }
                Client::Dozing { until, .. } => {
                    if s.now >= until {
                        actions.push(Action::Wake(i));
                    }
                    if s.cancels_left > 0 {
                        actions.push(Action::GiveUp(i));
                    }
                }
                Client::Holding {
                    deadline,
                    extended,
                    renewing,
                    wrote,
                    granted,
                    ..
                } => {
                    if renewing.is_none() && s.now >= extended + PERIOD {
                        actions.push(Action::Renew(i));
                    }
                    if self.faults && !wrote {
                        actions.push(Action::Write(i));
                    }
                    if s.now + MARGIN >= deadline {
                        actions.push(Action::Lost(i));
                    } else if self.faults || s.now >= granted + self.hold {
                        actions.push(Action::Release(i));
                    }
                    if !s.crashed {
                        actions.push(Action::Crash(i));
                    }
                }
                _ => {}
            }
        }
        for m in s.net.distinct() {
            actions.push(Action::Deliver(*m));
            let notify = matches!(m.body, Body::Notify { .. });
            if s.faults_left > 0 || (notify && s.notify_losses_left > 0) {
                actions.push(Action::Lose(*m));
            }
            if s.faults_left > 0 {
                actions.push(Action::Duplicate(*m));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Tick => {
                s.now += 1;
                Self::expire(&mut s);
            }
            Action::ServerClockGains => {
                s.skew += 1;
                Self::expire(&mut s);
            }
            Action::Restart => {
                s.now += 1;
                s.epoch += 1;
                s.lock = None;
                s.fence = None;
                s.queue.clear();
                s.q_exp = 0;
                // The notifier resubscribes and wakes every waiter.
                for i in 0..s.clients.len() {
                    match s.clients[i] {
                        Client::Attempt { queued: true, .. } => {
                            if let Client::Attempt { permit, .. } = &mut s.clients[i] {
                                *permit = true;
                            }
                        }
                        Client::Dozing {
                            since,
                            queued: true,
                            ..
                        } => self.attempt(&mut s, i, since, true),
                        _ => {}
                    }
                }
            }
            Action::Acquire(i) => {
                let iu = i as usize;
                s.started[iu] += 1;
                let now = s.now;
                self.attempt(&mut s, iu, now, false);
            }
            Action::Wake(i) => {
                if let Client::Dozing { since, queued, .. } = s.clients[i as usize] {
                    self.attempt(&mut s, i as usize, since, queued);
                }
            }
            Action::RequestTimeout(i) => {
                if let Client::Attempt { since, queued, .. } = s.clients[i as usize] {
                    self.attempt(&mut s, i as usize, since, queued);
                }
            }
            Action::GiveUp(i) => {
                let iu = i as usize;
                let queued = match s.clients[iu] {
                    Client::Attempt { queued, .. } | Client::Dozing { queued, .. } => queued,
                    _ => return None,
                };
                let owner = (i, s.started[iu] - 1);
                let body = if queued {
                    Body::Withdraw { owner }
                } else {
                    Body::ReleaseFair { owner }
                };
                s.net.send(Msg {
                    sent: s.now,
                    client: i,
                    body,
                });
                s.clients[iu] = Client::Idle;
                s.cancels_left -= 1;
                s.seen |= SEEN_WITHDRAW;
            }
            Action::Renew(i) => {
                let iu = i as usize;
                if let Client::Holding { renewing, .. } = &mut s.clients[iu] {
                    *renewing = Some(s.now);
                }
                let owner = (i, s.started[iu] - 1);
                s.net.send(Msg {
                    sent: s.now,
                    client: i,
                    body: Body::Renew {
                        owner,
                        start: s.now,
                    },
                });
            }
            Action::Release(i) => {
                let iu = i as usize;
                s.clients[iu] = Client::Idle;
                let owner = (i, s.started[iu] - 1);
                s.net.send(Msg {
                    sent: s.now,
                    client: i,
                    body: Body::ReleaseFair { owner },
                });
            }
            Action::Lost(i) => s.clients[i as usize] = Client::Idle,
            Action::Crash(i) => {
                s.crashed = true;
                s.clients[i as usize] = Client::Crashed { at: s.now };
            }
            Action::Write(i) => {
                let Client::Holding { token, seq, .. } = s.clients[i as usize] else {
                    return None;
                };
                if let Client::Holding { wrote, .. } = &mut s.clients[i as usize] {
                    *wrote = true;
                }
                match s.resource {
                    Some((high, _)) if token < high => s.seen |= SEEN_WRITE_REJECTED,
                    Some((_, last)) => {
                        if seq < last {
                            s.resource_bad = true;
                        }
                        s.resource = Some((token, seq.max(last)));
                    }
                    None => s.resource = Some((token, seq)),
                }
            }
            Action::Deliver(m) => {
                s.net.take(&m)?;
                match m.body {
                    Body::FastAcquire { .. }
                    | Body::AcquireFair { .. }
                    | Body::Renew { .. }
                    | Body::ReleaseFair { .. }
                    | Body::Withdraw { .. } => self.server(&mut s, &m),
                    _ => self.client(&mut s, &m),
                }
            }
            Action::Lose(m) => {
                s.net.take(&m)?;
                if matches!(m.body, Body::Notify { .. }) && s.notify_losses_left > 0 {
                    s.notify_losses_left -= 1;
                    s.seen |= SEEN_NOTIFY_LOST;
                } else {
                    s.faults_left -= 1;
                }
            }
            Action::Duplicate(m) => {
                s.net.send(m);
                s.faults_left -= 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![
            Property::always("one believer at a time", |_, s: &State| {
                let e: Vec<u8> = Self::believers(s).collect();
                !e.iter().enumerate().any(|(k, a)| e[k + 1..].contains(a))
            }),
            Property::always("tokens strictly increase in grant order", |_, s: &State| {
                !s.token_regress
            }),
            Property::always(
                "fenced resource: no write from an earlier holder after a later one's",
                |_, s: &State| !s.resource_bad,
            ),
            Property::always(
                "no grant reply later than its validity (model reach)",
                |_, s: &State| !s.late_grant,
            ),
        ];
        if self.faults {
            if self.faults_budget > 0 {
                p.push(Property::sometimes(
                    "a re-grant of our own key accepted",
                    |_, s: &State| s.seen & SEEN_REGRANT != 0,
                ));
            }
            if self.restarts > 0 {
                p.push(Property::sometimes(
                    "a restart, then a grant above every earlier token",
                    |_, s: &State| s.seen & SEEN_RESTART_GRANT != 0,
                ));
                p.push(Property::sometimes(
                    "a stale write rejected by its token",
                    |_, s: &State| s.seen & SEEN_WRITE_REJECTED != 0,
                ));
            }
            if self.notify_delay > 0 {
                p.push(Property::sometimes(
                    "a direct grant announced after another attempt",
                    |_, s: &State| s.seen & SEEN_OTHER_ATTEMPT != 0,
                ));
            }
            if self.cancels > 0 {
                p.push(Property::sometimes(
                    "an acquire withdrawn",
                    |_, s: &State| s.seen & SEEN_WITHDRAW != 0,
                ));
            }
        } else {
            p.extend([
                Property::always(
                    "a waiter is granted within the wait bound",
                    |m: &Self, s: &State| {
                        s.clients
                            .iter()
                            .filter_map(Self::waiting_since)
                            .all(|since| s.now <= since + m.wait_bound)
                    },
                ),
                Property::always(
                    "FIFO: no waiter overtaken by a later arrival",
                    |_, s: &State| !s.overtaken,
                ),
                Property::always(
                    "crashed holder's lock granted within TTL + slack",
                    |m: &Self, s: &State| {
                        let at = s.clients.iter().find_map(|&c| match c {
                            Client::Crashed { at } => Some(at),
                            _ => None,
                        });
                        let Some(at) = at else { return true };
                        s.regranted
                            || s.clients
                                .iter()
                                .filter_map(Self::waiting_since)
                                .all(|since| s.now <= (at + TTL + 1).max(since) + m.crash_slack)
                    },
                ),
                Property::sometimes("a handoff through the queue", |_, s: &State| {
                    s.seen & SEEN_QUEUE_HANDOFF != 0
                }),
                Property::sometimes("a crashed holder's lock granted again", |_, s: &State| {
                    s.regranted
                }),
                Property::sometimes(
                    "a lost notification, the waiter granted by its timer",
                    |_, s: &State| s.seen & SEEN_NOTIFY_LOST_GRANT != 0,
                ),
            ]);
        }
        p
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

/// Which faults a case turns on (with `faults` on).
#[derive(Clone, Copy)]
struct Faults {
    /// Lost or duplicated messages.
    budget: u8,
    /// Server restarts.
    restarts: u8,
    /// Acquires given up.
    cancels: u8,
    /// How late a pub/sub notification may arrive (0: within the unit).
    notify_delay: u8,
}

fn faulty(bound: Bound, f: Faults, attempts: u8, variant: Variant) -> Outcome {
    let horizon = match (bound, f.budget > 0, attempts > 1) {
        // Late notifications (with two acquires each, no loss): far enough for a direct grant
        // to expire unseen and the lock to be taken again while its announcement travels.
        (Bound::Quick, _, _) if f.notify_delay > 0 => 6,
        (Bound::Full, _, _) if f.notify_delay > 0 => 7,
        (Bound::Quick, _, true) => 0,
        (Bound::Full, _, true) => 1,
        (Bound::Quick, true, _) => 5,
        (Bound::Quick, false, _) => 7,
        (Bound::Full, true, _) => 7,
        (Bound::Full, false, _) => 12,
    };
    let model = RedisModel {
        clients: 2,
        attempts,
        max_delay: 0,
        notify_delay: f.notify_delay,
        horizon,
        faults_budget: f.budget,
        notify_losses: 0,
        restarts: f.restarts,
        cancels: f.cancels,
        max_skew: 0,
        faults: true,
        hold: 0,
        wait_bound: 0,
        crash_slack: 0,
        variant,
    };
    let delivery = match f.notify_delay {
        0 => "delivery within the unit".to_owned(),
        d => format!("replies within the unit, notifications up to {d} units late"),
    };
    let desc = format!(
        "2 clients × {attempts} acquires, TTL {TTL}, horizon {horizon}, {delivery} (reordered), {} lost/duplicated, {} restart, {} cancel, a holder crash, pauses",
        f.budget, f.restarts, f.cancels
    );
    explore(model, desc)
}

fn fair(bound: Bound, variant: Variant) -> Outcome {
    let horizon = match bound {
        Bound::Quick => 10,
        Bound::Full => 20,
    };
    let model = RedisModel {
        clients: 3,
        attempts: 1,
        max_delay: 0,
        notify_delay: 0,
        horizon,
        faults_budget: 0,
        notify_losses: 1,
        restarts: 0,
        cancels: 0,
        max_skew: 0,
        faults: false,
        hold: 2,
        wait_bound: 12,
        crash_slack: 0,
        variant,
    };
    let desc = format!(
        "3 clients × 1 acquire, TTL {TTL}, horizon {horizon}, delivery within the unit (reordered), hold = {}, 1 lost notification, a holder crash, fair; wait ≤ {}, crash regrant ≤ crash + TTL + 1",
        model.hold, model.wait_bound
    );
    explore(model, desc)
}

/// The model's name in the table.
const MODEL: &str = "redis";

/// The Redis single-node (fair mode) model's cases.
pub fn cases() -> Vec<Case> {
    const LOSS: Faults = Faults {
        budget: 1,
        restarts: 0,
        cancels: 1,
        notify_delay: 0,
    };
    const RESTART: Faults = Faults {
        budget: 0,
        restarts: 1,
        cancels: 0,
        notify_delay: 0,
    };
    const DUP: Faults = Faults {
        budget: 1,
        restarts: 0,
        cancels: 0,
        notify_delay: 0,
    };
    // Two acquires each, so that a lock whose direct grant expired unseen can be taken by the
    // other client's next acquire while the late announcement travels.
    const LATE: Faults = Faults {
        budget: 0,
        restarts: 0,
        cancels: 0,
        notify_delay: 2,
    };
    vec![
        Case::holds(MODEL, "today, loss", |b| faulty(b, LOSS, 1, Variant::Today)),
        Case::holds(MODEL, "today, restart", |b| {
            faulty(b, RESTART, 1, Variant::Today)
        }),
        Case::holds(MODEL, "today, fair", |b| fair(b, Variant::Today)),
        Case::holds(MODEL, "today, loss, older heads", |b| {
            faulty(b, LOSS, 1, Variant::OlderHeads)
        }),
        Case::holds(MODEL, "today, fair, older heads", |b| {
            fair(b, Variant::OlderHeads)
        }),
        Case::holds(MODEL, "today, late announcements", |b| {
            faulty(b, LATE, 2, Variant::Today)
        }),
        Case::control(
            MODEL,
            "announcement of any attempt",
            "one believer at a time",
            |b| faulty(b, LATE, 2, Variant::AnyAttempt),
        ),
        Case::control(
            MODEL,
            "fence without floor",
            "tokens strictly increase in grant order",
            |b| faulty(b, RESTART, 1, Variant::NoClockFloor),
        ),
        Case::control(MODEL, "unguarded release", "one believer at a time", |b| {
            faulty(b, DUP, 2, Variant::UnguardedRelease)
        }),
    ]
}
