//! Redlock (`dlock-redis/src/redlock/`): N independent Redis nodes, a quorum of `N/2 + 1`,
//! the fast acquire script sent to every node, the validity `TTL − elapsed − drift`
//! (`quorum.rs`), the majority-max fencing token with the write-back to the granting nodes
//! below it before the lease is handed out and the background raise of every other node
//! (`acquire.rs`, `raise.rs`), renewal and release fanned out to every node with the per-lease
//! tally (`renew.rs`, `tally.rs`), and the client lease of `dlock-core/src/renewal.rs`
//! (deadline = start of the request + TTL − drift, `lost()` a margin before it, a renewal every
//! TTL/3, an undecided round retried at once).
//!
//! Each node holds the lock key (owner value, expiry on THAT node's clock) and its fence
//! counter. Redlock calls the script with a fence lifetime of 0 (`scripts::fast_acquire(..,
//! false)`): the token is the plain counter + 1, never raised to the node's clock, so a node
//! that restarts empty starts its counter again at 0 — the model does exactly that. Node 0 may
//! restart once, losing key and counter; it is down (every message to it is lost) for a stated
//! time first — the README's assumption is longer than the TTL. Messages are delayed up to a
//! bound, lost under a budget, reordered; processes pause (no step is forced on time); node
//! 0's clock may gain on global time up to a bound; a holder may crash (its locker dies with
//! it, and with it the background raises not yet delivered).
//!
//! The cases run 3 nodes and 5 (`today, 5 nodes`, `today, fair, 5 nodes`). `today` restarts
//! node 0 within a horizon shorter than its downtime (it stays down: a node lost); `today,
//! restart` runs long enough for it to come back and grant again (a `sometimes` property, so
//! the case fails if the rejoin is out of reach), with fair scheduling so the run fits.
//!
//! Where it abstracts the code (to fit the bounds; see each case's bound string):
//! - time is whole units: TTL = 4, the drift allowance `TTL/100 + 2 ms` = 1 unit, the loss
//!   margin `drift + TTL/10` = 1, renewal every TTL/3 = 1 unit; drift is a bounded absolute skew
//!   (node 0's clock gains at most 1 unit over the run) rather than a rate, and only node 0's
//!   clock moves and only node 0 restarts: the nodes are alike, so node 0 names whichever
//!   node the fault hits; the jump control moves it by 4 more. Two nodes faulty at once are
//!   not explored;
//! - messages are requests only: a node runs the script when the request arrives and its reply
//!   reaches the client at once, or is lost (`LoseReply`); delivery happens within the time unit
//!   the request was sent in (`max_delay` 0: reordered, lost, but never across a tick), and the
//!   per-node timeout is one unit. A late reply is therefore a lost one, and a paused client
//!   (no step is forced when `pauses` is on) stands for a slow round trip;
//! - a fan-out (`join_all` over the nodes: acquire, renew, release) reaches the nodes in index
//!   order, interleaved freely with every other message: a partial-order reduction (the full
//!   interleaving did not fit in). Deliveries to different nodes touch different node state
//!   and different reply slots, and a client acts on its replies only once all are in or the
//!   timeout passed, so only each node's order of the requests it receives matters; fan-outs in
//!   flight that share one node order can realize every such per-node order;
//! - nodes `1..N` are interchangeable, so states that differ by a renaming of them are one
//!   state (`redlock/symmetry.rs`: an exact symmetry reduction, applied only when no fan-out is
//!   part-way, so every fan-out in flight keeps one shared order). A trace names nodes as
//!   the canonical state before each step does;
//! - client 1 starts its first acquire after client 0 did (the clients are alike; a run where
//!   client 1 starts first is a run of this model with the clients renamed);
//! - a lost background raise is re-sent while its locker lives (`raise::run` retries): the loss
//!   only delays it; nothing is re-sent once the locker crashed;
//! - the random retry delay is one unit; an undecided renewal round is retried at once; a round
//!   not settled within TTL/3 is undecided (`Renewal::Retry`);
//! - a node's error is a lost message; `Outcome::Unreachable` (giving up when too many nodes
//!   fail outright) is not modelled — every failed attempt retries;
//! - replies to releases and background raises are not modelled (they change nothing checked);
//! - one lock name, one lease per client, one acquire per client (retries free); owner values
//!   are `(client, attempt)` pairs, as unique as the code's random 128-bit ones;
//! - the fenced resource keeps the highest token it accepted and accepts `token ≥ highest`
//!   (a holder writes again with its own token); a paused holder may write after its deadline.

use stateright::{Model, Property};

use crate::check::{Bound, Case, Outcome, explore};
use crate::net::{Net, Sent};

mod symmetry;

/// The most nodes the model has room for.
const MAX_NODES: usize = 5;

/// How a grant's fencing token is made (the negative controls change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// The code as it is: the majority-max, the granting laggards raised before the lease is
    /// handed out, every other node raised in the background.
    Today,
    /// A negative control: no background raise of the nodes that did not grant.
    NoBackgroundRaise,
}

/// The Redlock model's parameters.
#[derive(Debug, Clone)]
pub struct RedlockModel {
    /// How many nodes (3 or 5).
    pub nodes: usize,
    /// The TTL in time units.
    pub ttl: u8,
    /// The drift allowance `TTL/100 + 2 ms`, in units.
    pub drift: u8,
    /// How far each node's clock may gain on global time over the run.
    pub max_skew: u8,
    /// A negative control: node 0's clock may jump forward by this much more (Kleppmann).
    pub jump: u8,
    /// The longest a message travels before it is delivered (or lost).
    pub max_delay: u8,
    /// The run's horizon.
    pub horizon: u8,
    /// How many acquires each client starts (its retries are not counted).
    pub attempts: u8,
    /// How many messages may be lost.
    pub faults_budget: u8,
    /// Faults on: loss, node clocks gaining, node 0 restarting, writes to the fenced resource;
    /// the liveness properties are not judged. Off: none of them.
    pub faults: bool,
    /// Processes pause: no step is forced on time. Off: a due step is urgent (time waits for
    /// it), the fair scheduling the liveness properties need.
    pub pauses: bool,
    /// `Some(d)`: node 0 may restart empty once, down for `d` units first.
    pub restart_down: Option<u8>,
    /// Whether a holder may crash.
    pub crash: bool,
    /// How tokens are made.
    pub fencing: Fencing,
}

/// What a message says. `start` identifies the client's request round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// `fast_acquire` (`FAST_ACQUIRE_BODY` in `scripts.rs`) with this owner value.
    Acquire {
        /// The attempt's owner value.
        owner: u8,
    },
    /// Its reply: `{1, counter}` or `{0, pttl}`.
    AcquireReply {
        /// The attempt's owner value.
        owner: u8,
        /// Whether it granted.
        granted: bool,
        /// The node's new counter when it granted.
        counter: u8,
    },
    /// `RAISE_FENCE_SRC`: the write-back before the lease is handed out (`acquire.rs`).
    Raise {
        /// The attempt's owner value.
        owner: u8,
        /// The token.
        token: u8,
    },
    /// Its reply.
    Raised {
        /// The attempt's owner value.
        owner: u8,
    },
    /// `RAISE_FENCE_SRC` sent by `raise::run` in the background.
    BackgroundRaise {
        /// The token.
        token: u8,
    },
    /// `RENEW_SRC`: compare-and-`PEXPIRE`.
    Renew {
        /// The lease's owner value.
        owner: u8,
        /// When the round started.
        start: u8,
    },
    /// Its reply: 1 extended, 0 not ours.
    RenewReply {
        /// When the round started.
        start: u8,
        /// Whether it extended.
        extended: bool,
    },
    /// `RELEASE_PLAIN_SRC`: compare-and-delete (`unlock_all`).
    Release {
        /// The owner value.
        owner: u8,
    },
}

/// A message in flight between a client and a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    /// When it was sent (global time).
    pub sent: u8,
    /// The client.
    pub client: u8,
    /// The node it reaches next.
    pub node: u8,
    /// The last node of its fan-out (a fan-out reaches the nodes in index order).
    pub last: u8,
    /// What it says.
    pub body: Body,
}

impl Sent for Msg {
    fn sent(&self) -> u8 {
        self.sent
    }
}

/// One node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Node {
    /// The lock key: owner value and expiry on this node's clock.
    pub key: Option<(u8, u8)>,
    /// The fence counter (`GET fence`, 0 when absent).
    pub counter: u8,
    /// How far this node's clock is ahead of global time.
    pub skew: u8,
    /// Down (restarting) until this time: messages to it are lost.
    pub down_until: u8,
}

/// A renewal round in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Round {
    /// When it was sent.
    pub start: u8,
    /// Nodes that answered.
    pub answered: u8,
    /// Nodes that extended.
    pub extended: u8,
}

/// A client (its locker and its one lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// Not holding; may start an acquire while it has attempts.
    Idle,
    /// An attempt failed; retries once `since + 1` is reached.
    Waiting {
        /// When it failed.
        since: u8,
    },
    /// `attempt`: the acquire is out on every node. `replies[k]`: 0 none yet, 1 refused,
    /// `2 + c` granted at counter `c`.
    Acquiring {
        /// When the attempt started (`Instant::now()` before the sends).
        start: u8,
        /// Its owner value.
        owner: u8,
        /// The replies so far.
        replies: [u8; MAX_NODES],
    },
    /// The write-back of the token to the granting laggards, before the lease is handed out.
    Raising {
        /// When the attempt started.
        start: u8,
        /// Its owner value.
        owner: u8,
        /// The token.
        token: u8,
        /// Their timeout: `budget.min(validity left)`.
        until: u8,
        /// Nodes known to hold a counter ≥ the token (bit k).
        at_token: u8,
        /// Laggards whose write-back is not answered yet (bit k).
        pending: u8,
    },
    /// Holding a lease.
    Holding {
        /// The owner value.
        owner: u8,
        /// The fencing token.
        token: u8,
        /// Which grant this is (1, 2, ...), in grant order.
        grant: u8,
        /// The deadline (`deadline_from`).
        deadline: u8,
        /// The start of the request that made or last extended it.
        extended: u8,
        /// The renewal round in flight.
        renewing: Option<Round>,
    },
    /// Crashed while holding at `at`: no more steps.
    Crashed {
        /// When.
        at: u8,
    },
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Global time (= every client's clock).
    pub now: u8,
    /// The nodes (only the first `nodes` are used).
    pub nodes: [Node; MAX_NODES],
    /// Whether node 0 restarted already.
    pub restarted: bool,
    /// Whether node 0, back from its restart, granted an acquire.
    pub rejoined: bool,
    /// The two clients.
    pub clients: [Client; 2],
    /// Acquires each client may still start.
    pub attempts: [u8; 2],
    /// Attempts each client made (the owner values).
    pub seq: [u8; 2],
    /// Messages in flight (sorted: a multiset).
    pub net: Net<Msg>,
    /// Losses left.
    pub faults_left: u8,
    /// Grants so far.
    pub grants: u8,
    /// The last grant's token.
    pub last_token: u8,
    /// A grant's token was not above the previous grant's.
    pub token_repeated: bool,
    /// The fenced resource: the highest token it accepted and the grant that wrote last.
    pub resource: Option<(u8, u8)>,
    /// The resource accepted a write of an earlier grant after a later grant's write.
    pub stale_write: bool,
    /// The client granted last, and whether the lock ever passed between clients.
    pub last_holder: Option<u8>,
    /// Whether the lock passed from one client to the other.
    pub handoff: bool,
    /// When the contender of a crashed holder was granted.
    pub regranted: Option<u8>,
    /// A release while the other client was trying: when (cleared by the next grant).
    pub freed_at: Option<u8>,
    /// Whether a grant ever came after such a release.
    pub regrant_after_release: bool,
    /// Whether a grant's token came from a majority with different counters (a write-back).
    pub wrote_back: bool,
    /// Whether a holder lost its lease (`lost()` or a renewal saying gone).
    pub losses: bool,
}

/// A step, named after the code it models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Time passes one unit.
    Tick,
    /// A node's clock gains one unit on global time.
    NodeClockGains(u8),
    /// Node 0 restarts: key and fence counter lost (no persistence), down for a while.
    NodeRestarts,
    /// `acquire::attempt`: notes `start`, sends `fast_acquire` to every node (a retry of
    /// `acquire`'s loop or a new acquire).
    Attempt(u8),
    /// `acquire::attempt` once every reply is in or the node timeout passed: `token_plan`
    /// and `validity` (`quorum.rs`); a grant, the write-back, or `unlock_all` and a retry.
    Collect(u8),
    /// `acquire::attempt` after the write-backs answered or timed out: hands out the lease
    /// (`raise_detached` for the others) or unlocks every node.
    CollectRaises(u8),
    /// `Renewer::renew` (`renew.rs`): the driver's round, due TTL/3 after the last extension.
    Renew(u8),
    /// The round's bound passed without a verdict: `Renewal::Retry`.
    RenewTimeout(u8),
    /// `Lease::release` → `Renewer::release`: stops believing, `unlock_all`.
    Release(u8),
    /// The deadline less the loss margin passed: `lost()` fires.
    Lost(u8),
    /// The holder's process dies (its locker too).
    Crash(u8),
    /// The holder writes to the fenced resource with its token.
    Write(u8),
    /// A request reaches its node, which runs it; the reply reaches the client at once.
    Deliver(Msg),
    /// A request reaches its node, which runs it; the reply is lost.
    LoseReply(Msg),
    /// A request is lost.
    Lose(Msg),
}

fn count(mask: u8) -> usize {
    mask.count_ones() as usize
}

impl RedlockModel {
    fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }

    /// The per-node timeout of an attempt: one round trip.
    fn budget(&self) -> u8 {
        self.max_delay.max(1)
    }

    fn period(&self) -> u8 {
        self.ttl / 3
    }

    /// `loss_margin`: the drift allowance plus a tenth of the TTL.
    fn margin(&self) -> u8 {
        self.drift + self.ttl / 10
    }

    /// `validity` in `quorum.rs`: `TTL − elapsed − drift`, `None` unless positive.
    fn validity(&self, start: u8, now: u8) -> Option<u8> {
        self.ttl
            .checked_sub(now - start)
            .and_then(|v| v.checked_sub(self.drift))
            .filter(|v| *v > 0)
    }

    fn deadline(&self, start: u8) -> u8 {
        start + self.ttl - self.drift
    }

    fn all_nodes(&self) -> u8 {
        ((1u16 << self.nodes) - 1) as u8
    }

    fn send(s: &mut State, client: u8, node: u8, body: Body) {
        s.net.send(Msg {
            sent: s.now,
            client,
            node,
            last: node,
            body,
        });
    }

    /// One request to every node (`join_all` over the nodes).
    fn fan_out(&self, s: &mut State, client: u8, body: Body) {
        s.net.send(Msg {
            sent: s.now,
            client,
            node: 0,
            last: self.nodes as u8 - 1,
            body,
        });
    }

    /// The rest of a fan-out after its message to `m.node`.
    fn advance(s: &mut State, m: &Msg) {
        if m.node < m.last {
            s.net.send(Msg {
                node: m.node + 1,
                ..*m
            });
        }
    }

    fn unlock_all(&self, s: &mut State, client: u8, owner: u8) {
        self.fan_out(s, client, Body::Release { owner });
    }

    /// The steps a fair scheduler takes before time may pass.
    fn due(&self, s: &State, i: usize) -> bool {
        match s.clients[i] {
            Client::Idle => s.attempts[i] > 0,
            Client::Waiting { since } => s.now > since,
            Client::Acquiring { start, replies, .. } => {
                s.now >= start + self.budget() || replies[..self.nodes].iter().all(|r| *r > 0)
            }
            Client::Raising { until, pending, .. } => s.now >= until || pending == 0,
            Client::Holding {
                deadline,
                extended,
                renewing,
                ..
            } => {
                s.now + self.margin() >= deadline
                    || match renewing {
                        None => s.now >= extended + self.period(),
                        Some(r) => s.now >= r.start + self.period(),
                    }
            }
            Client::Crashed { .. } => false,
        }
    }

    /// A node runs a script; its reply reaches the client at once unless `reply_lost`.
    fn node(&self, s: &mut State, m: &Msg, reply_lost: bool) {
        let k = m.node as usize;
        let node = &mut s.nodes[k];
        if s.now < node.down_until {
            return;
        }
        let clock = s.now + node.skew;
        if node.key.is_some_and(|(_, exp)| clock >= exp) {
            node.key = None;
        }
        let reply = match m.body {
            Body::Acquire { owner } => {
                // `SET NX PX`, or our own earlier grant re-armed; then `next_token` with a
                // lifetime of 0: the plain counter + 1.
                if node.key.is_none_or(|(o, _)| o == owner) {
                    node.key = Some((owner, clock + self.ttl));
                    node.counter += 1;
                    if k == 0 && s.restarted {
                        s.rejoined = true;
                    }
                    Body::AcquireReply {
                        owner,
                        granted: true,
                        counter: node.counter,
                    }
                } else {
                    Body::AcquireReply {
                        owner,
                        granted: false,
                        counter: 0,
                    }
                }
            }
            Body::Raise { owner, token } => {
                node.counter = node.counter.max(token);
                Body::Raised { owner }
            }
            Body::BackgroundRaise { token } => {
                node.counter = node.counter.max(token);
                return;
            }
            Body::Renew { owner, start } => {
                let extended = node.key.is_some_and(|(o, _)| o == owner);
                if extended {
                    node.key = Some((owner, clock + self.ttl));
                }
                Body::RenewReply { start, extended }
            }
            Body::Release { owner } => {
                if node.key.is_some_and(|(o, _)| o == owner) {
                    node.key = None;
                }
                return;
            }
            _ => return,
        };
        if !reply_lost && !matches!(s.clients[m.client as usize], Client::Crashed { .. }) {
            self.client(s, &Msg { body: reply, ..*m });
        }
    }

    /// A reply reaches its client.
    fn client(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        let k = m.node as usize;
        match (&mut s.clients[i], m.body) {
            (
                Client::Acquiring { owner, replies, .. },
                Body::AcquireReply {
                    owner: o,
                    granted,
                    counter,
                },
            ) if *owner == o && replies[k] == 0 => {
                replies[k] = if granted { 2 + counter } else { 1 };
            }
            (
                Client::Raising {
                    owner,
                    pending,
                    at_token,
                    ..
                },
                Body::Raised { owner: o },
            ) if *owner == o && *pending & (1 << k) != 0 => {
                *pending &= !(1 << k);
                *at_token |= 1 << k;
            }
            (
                Client::Holding {
                    renewing: Some(r), ..
                },
                Body::RenewReply { start, extended },
            ) if r.start == start => {
                r.answered += 1;
                if extended {
                    r.extended += 1;
                }
                let r = *r;
                self.settle(s, i, r);
            }
            // A reply to a request this client no longer waits for (late or after a timeout).
            _ => {}
        }
    }

    /// `Tally::verdict` on the answers so far; acts when the round is settled.
    fn settle(&self, s: &mut State, i: usize, r: Round) {
        let q = self.quorum() as u8;
        let refused = r.answered - r.extended;
        let Client::Holding {
            owner,
            deadline,
            extended,
            ..
        } = s.clients[i]
        else {
            return;
        };
        if r.extended >= q {
            // `Renewal::Extended`: the deadline counts from this round's start.
            if let Client::Holding {
                deadline: d,
                extended: e,
                renewing,
                ..
            } = &mut s.clients[i]
            {
                *d = deadline.max(self.deadline(r.start));
                *e = extended.max(r.start);
                *renewing = None;
            }
        } else if refused as usize + self.quorum() > self.nodes {
            // `Renewal::Lost(Gone)`: the lease ends and every node is unlocked.
            s.clients[i] = Client::Idle;
            s.losses = true;
            self.unlock_all(s, i as u8, owner);
        }
    }

    /// Hands out the lease (`driver.register`) after `raise_detached` to the `below` nodes.
    fn grant(&self, s: &mut State, i: usize, start: u8, owner: u8, token: u8, at_token: u8) {
        if self.fencing == Fencing::Today {
            let below = self.all_nodes() & !at_token;
            for k in 0..self.nodes as u8 {
                if below & (1 << k) != 0 {
                    Self::send(s, i as u8, k, Body::BackgroundRaise { token });
                }
            }
        }
        s.grants += 1;
        if s.grants > 1 && token <= s.last_token {
            s.token_repeated = true;
        }
        s.last_token = token;
        if matches!(s.clients[1 - i], Client::Crashed { .. }) && s.regranted.is_none() {
            s.regranted = Some(s.now);
        }
        if s.freed_at.is_some() {
            s.regrant_after_release = true;
        }
        s.freed_at = None;
        if s.last_holder.is_some_and(|h| h as usize != i) {
            s.handoff = true;
        }
        s.last_holder = Some(i as u8);
        s.clients[i] = Client::Holding {
            owner,
            token,
            grant: s.grants,
            deadline: self.deadline(start),
            extended: start,
            renewing: None,
        };
    }

    /// A failed attempt unlocks every node. The code (`acquire::attempt`) skips the nodes that
    /// answered "held by another owner": the attempt's one `SET NX` there was refused, so its
    /// compare-and-delete would be a no-op; the model keeps the superset, which changes nothing
    /// it checks.
    fn fail(&self, s: &mut State, i: usize, owner: u8) {
        self.unlock_all(s, i as u8, owner);
        s.clients[i] = Client::Waiting { since: s.now };
    }

    fn collect(&self, s: &mut State, i: usize) {
        let Client::Acquiring {
            start,
            owner,
            replies,
        } = s.clients[i]
        else {
            return;
        };
        let granted: Vec<(usize, u8)> = (0..self.nodes)
            .filter(|&k| replies[k] >= 2)
            .map(|k| (k, replies[k] - 2))
            .collect();
        if granted.len() >= self.quorum() {
            // `token_plan`: the max of the granting counters; the laggards below it.
            let token = granted.iter().map(|g| g.1).max().unwrap_or(0);
            let mut at_token = 0u8;
            let mut laggards = 0u8;
            for &(k, c) in &granted {
                if c >= token {
                    at_token |= 1 << k;
                } else {
                    laggards |= 1 << k;
                }
            }
            let at_max = count(at_token);
            if at_max < self.quorum() {
                if let Some(left) = self.validity(start, s.now) {
                    for k in 0..self.nodes as u8 {
                        if laggards & (1 << k) != 0 {
                            Self::send(s, i as u8, k, Body::Raise { owner, token });
                        }
                    }
                    s.clients[i] = Client::Raising {
                        start,
                        owner,
                        token,
                        until: s.now + self.budget().min(left),
                        at_token,
                        pending: laggards,
                    };
                    return;
                }
            } else if self.validity(start, s.now).is_some() {
                self.grant(s, i, start, owner, token, at_token);
                return;
            }
        }
        self.fail(s, i, owner);
    }

    fn collect_raises(&self, s: &mut State, i: usize) {
        let Client::Raising {
            start,
            owner,
            token,
            at_token,
            ..
        } = s.clients[i]
        else {
            return;
        };
        if count(at_token) >= self.quorum() && self.validity(start, s.now).is_some() {
            s.wrote_back = true;
            self.grant(s, i, start, owner, token, at_token);
        } else {
            self.fail(s, i, owner);
        }
    }

    fn two_believe(&self, s: &State) -> bool {
        s.clients
            .iter()
            .filter(|c| matches!(c, Client::Holding { deadline, .. } if s.now < *deadline))
            .count()
            > 1
    }

    /// The bound on a regrant after a release while the other client tries: the release's
    /// delivery, the attempt in flight, the retry delay and one more attempt.
    fn release_bound(&self) -> u8 {
        self.max_delay + 2 * self.budget() + 1 + 1
    }

    /// Whether node 0 may restart and be back before the horizon (then its rejoin must be
    /// reached; otherwise it restarts and stays down for the rest of the run).
    fn rejoin_in_reach(&self) -> bool {
        self.restart_down.is_some_and(|d| d < self.horizon)
    }

    /// The slack over the TTL for a crashed holder's lock.
    fn crash_slack(&self) -> u8 {
        2 * self.budget() + self.period() + 1
    }
}

impl Model for RedlockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            nodes: [Node::default(); MAX_NODES],
            restarted: false,
            rejoined: false,
            clients: [Client::Idle; 2],
            attempts: [self.attempts; 2],
            seq: [0; 2],
            net: Net::default(),
            faults_left: if self.faults { self.faults_budget } else { 0 },
            grants: 0,
            last_token: 0,
            token_repeated: false,
            resource: None,
            stale_write: false,
            last_holder: None,
            handoff: false,
            regranted: None,
            freed_at: None,
            regrant_after_release: false,
            wrote_back: false,
            losses: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let overdue = s.net.overdue(s.now, self.max_delay);
        let urgent = !self.pauses && (0..2).any(|i| self.due(s, i));
        if !overdue && !urgent && s.now < self.horizon {
            actions.push(Action::Tick);
        }
        if self.faults {
            for k in 0..1 {
                let max = self.max_skew + if k == 0 { self.jump } else { 0 };
                if s.nodes[k].skew < max {
                    actions.push(Action::NodeClockGains(k as u8));
                }
            }
            if self.restart_down.is_some() && !s.restarted {
                actions.push(Action::NodeRestarts);
            }
        }
        let crashed = s
            .clients
            .iter()
            .any(|c| matches!(c, Client::Crashed { .. }));
        for i in 0..2u8 {
            let iu = i as usize;
            match s.clients[iu] {
                // The clients are alike: client 1 starts after client 0 did (a run where it
                // starts first is this one with the clients renamed).
                Client::Idle if s.attempts[iu] > 0 && (i == 0 || s.attempts[0] < self.attempts) => {
                    actions.push(Action::Attempt(i))
                }
                Client::Waiting { since } if s.now > since => actions.push(Action::Attempt(i)),
                Client::Acquiring { .. } if self.due(s, iu) => actions.push(Action::Collect(i)),
                Client::Raising { .. } if self.due(s, iu) => actions.push(Action::CollectRaises(i)),
                Client::Holding {
                    token,
                    grant,
                    deadline,
                    extended,
                    renewing,
                    ..
                } => {
                    match renewing {
                        None if s.now >= extended + self.period() => actions.push(Action::Renew(i)),
                        Some(r) if s.now >= r.start + self.period() => {
                            actions.push(Action::RenewTimeout(i))
                        }
                        _ => {}
                    }
                    if s.now + self.margin() >= deadline {
                        actions.push(Action::Lost(i));
                    } else {
                        actions.push(Action::Release(i));
                        if self.crash && !crashed {
                            actions.push(Action::Crash(i));
                        }
                    }
                    // A write that changes what the resource keeps (a paused holder may
                    // write after its deadline: the token must stop it).
                    let changes = match s.resource {
                        None => true,
                        Some((max, last)) => token >= max && last != grant,
                    };
                    if changes && self.faults {
                        actions.push(Action::Write(i));
                    }
                }
                _ => {}
            }
        }
        for m in s.net.distinct() {
            actions.push(Action::Deliver(*m));
            if s.faults_left > 0 {
                actions.push(Action::Lose(*m));
                if matches!(
                    m.body,
                    Body::Acquire { .. } | Body::Raise { .. } | Body::Renew { .. }
                ) {
                    actions.push(Action::LoseReply(*m));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::NodeClockGains(k) => s.nodes[k as usize].skew += 1,
            Action::NodeRestarts => {
                s.restarted = true;
                let down = self.restart_down.unwrap_or(0);
                let n = &mut s.nodes[0];
                n.key = None;
                n.counter = 0;
                n.down_until = s.now + down;
            }
            Action::Attempt(i) => {
                let iu = i as usize;
                if s.clients[iu] == Client::Idle {
                    s.attempts[iu] -= 1;
                }
                s.seq[iu] += 1;
                let owner = (i << 4) | s.seq[iu];
                self.fan_out(&mut s, i, Body::Acquire { owner });
                s.clients[iu] = Client::Acquiring {
                    start: s.now,
                    owner,
                    replies: [0; MAX_NODES],
                };
            }
            Action::Collect(i) => self.collect(&mut s, i as usize),
            Action::CollectRaises(i) => self.collect_raises(&mut s, i as usize),
            Action::Renew(i) => {
                let now = s.now;
                if let Client::Holding {
                    owner, renewing, ..
                } = &mut s.clients[i as usize]
                {
                    *renewing = Some(Round {
                        start: now,
                        answered: 0,
                        extended: 0,
                    });
                    let owner = *owner;
                    self.fan_out(&mut s, i, Body::Renew { owner, start: now });
                }
            }
            Action::RenewTimeout(i) => {
                if let Client::Holding { renewing, .. } = &mut s.clients[i as usize] {
                    *renewing = None;
                }
            }
            Action::Release(i) => {
                if let Client::Holding { owner, .. } = s.clients[i as usize] {
                    if matches!(
                        s.clients[1 - i as usize],
                        Client::Waiting { .. } | Client::Acquiring { .. } | Client::Raising { .. }
                    ) {
                        s.freed_at = Some(s.now);
                    }
                    s.clients[i as usize] = Client::Idle;
                    self.unlock_all(&mut s, i, owner);
                }
            }
            Action::Lost(i) => {
                s.clients[i as usize] = Client::Idle;
                s.losses = true;
            }
            Action::Crash(i) => s.clients[i as usize] = Client::Crashed { at: s.now },
            Action::Write(i) => {
                if let Client::Holding { token, grant, .. } = s.clients[i as usize] {
                    match s.resource {
                        Some((max, _)) if token < max => {}
                        Some((_, last)) => {
                            if grant < last {
                                s.stale_write = true;
                            }
                            s.resource = Some((token, grant));
                        }
                        None => s.resource = Some((token, grant)),
                    }
                }
            }
            Action::Deliver(m) => {
                s.net.take(&m)?;
                Self::advance(&mut s, &m);
                self.node(&mut s, &m, false);
            }
            Action::LoseReply(m) => {
                s.net.take(&m)?;
                s.faults_left -= 1;
                Self::advance(&mut s, &m);
                self.node(&mut s, &m, true);
            }
            Action::Lose(m) => {
                s.net.take(&m)?;
                s.faults_left -= 1;
                Self::advance(&mut s, &m);
                // `raise::run` retries a raise that did not answer while the locker lives.
                if matches!(m.body, Body::BackgroundRaise { .. })
                    && !matches!(s.clients[m.client as usize], Client::Crashed { .. })
                {
                    s.net.send(Msg { sent: s.now, ..m });
                }
            }
        }
        Some(symmetry::canonical(self.nodes, s))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("one believer at a time", |m: &Self, s: &State| {
                !m.two_believe(s)
            }),
            Property::always("tokens strictly increase in grant order", |_, s: &State| {
                !s.token_repeated
            }),
            Property::always("fenced resource rejects stale writes", |_, s: &State| {
                !s.stale_write
            }),
            Property::always("on-time renewals keep the lease", |m: &Self, s: &State| {
                m.faults || !s.losses
            }),
            Property::always(
                "a released lock is granted again in time",
                |m: &Self, s: &State| {
                    m.faults || s.freed_at.is_none_or(|r| s.now <= r + m.release_bound())
                },
            ),
            Property::always(
                "crash released within TTL + slack",
                |m: &Self, s: &State| {
                    let crashed = s.clients.iter().find_map(|&c| match c {
                        Client::Crashed { at } => Some(at),
                        _ => None,
                    });
                    match crashed {
                        // Applies while the other client wants the lock.
                        Some(at) if !m.faults && !s.clients.contains(&Client::Idle) => {
                            s.regranted.is_some() || s.now <= at + m.ttl + m.crash_slack()
                        }
                        _ => true,
                    }
                },
            ),
            Property::sometimes("a handoff", |_, s: &State| s.handoff),
            Property::sometimes("a released lock granted again", |_, s: &State| {
                s.regrant_after_release
            }),
            Property::sometimes(
                "a crashed holder's lock granted again",
                |m: &Self, s: &State| !m.crash || s.regranted.is_some(),
            ),
        ];
        if self.rejoin_in_reach() {
            properties.push(Property::sometimes(
                "a restarted node grants again",
                |_, s: &State| s.rejoined,
            ));
        }
        properties
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

/// One case's configuration.
#[derive(Debug, Clone, Copy)]
struct Setup {
    nodes: usize,
    /// The horizon and the loss budget at the quick and at the full bound.
    bounds: [(u8, u8); 2],
    /// How far node 0's clock may gain.
    skew: u8,
    faults: bool,
    pauses: bool,
    jump: u8,
    restart_down: Option<u8>,
    crash: bool,
    fencing: Fencing,
}

fn run(bound: Bound, setup: Setup) -> Outcome {
    let (ttl, attempts, nodes) = (4, 1, setup.nodes);
    let (horizon, faults_budget) = match bound {
        Bound::Quick => setup.bounds[0],
        Bound::Full => setup.bounds[1],
    };
    let faults_budget = if setup.faults { faults_budget } else { 0 };
    let model = RedlockModel {
        nodes,
        ttl,
        drift: 1,
        max_skew: setup.skew,
        jump: setup.jump,
        max_delay: 0,
        horizon,
        attempts,
        faults_budget,
        faults: setup.faults,
        pauses: setup.pauses,
        restart_down: setup.restart_down,
        crash: setup.crash,
        fencing: setup.fencing,
    };
    let mut desc = format!(
        "{nodes} nodes, 2 clients × {attempts} acquire (retries free), TTL {ttl}, drift 1, horizon {horizon}, delay ≤ 0 (within the tick)"
    );
    if setup.faults {
        desc += &format!(
            ", node clocks +{}, {faults_budget} lost",
            setup.skew + setup.jump
        );
        match setup.restart_down {
            Some(d) if d < horizon => desc += &format!(", node 0 restarts empty (down {d})"),
            Some(d) => desc += &format!(", node 0 restarts empty and stays down (down {d})"),
            None => {}
        }
    } else {
        desc += ", no faults";
    }
    desc += if setup.pauses { ", pauses" } else { ", fair" };
    if setup.crash {
        desc += ", a holder crash";
    }
    explore(model, desc)
}

/// The code as it is under every fault, pauses included (the quick bound fits 2 units: node 0
/// restarts and stays down; `RESTART` reaches its rejoin).
const TODAY: Setup = Setup {
    nodes: 3,
    bounds: [(2, 1), (3, 1)],
    skew: 1,
    faults: true,
    pauses: true,
    jump: 0,
    restart_down: Some(5),
    crash: false,
    fencing: Fencing::Today,
};

/// Fair scheduling and no faults but a holder crash: the liveness properties.
const FAIR: Setup = Setup {
    bounds: [(8, 0), (12, 0)],
    faults: false,
    pauses: false,
    restart_down: None,
    crash: true,
    ..TODAY
};

/// A restart that comes back: node 0 restarts empty, down longer than the TTL (the README's
/// assumption), and votes again before the horizon; a loss, no pauses (time waits for due
/// steps), so the run is long enough to see the rejoin.
const RESTART: Setup = Setup {
    bounds: [(6, 0), (6, 1)],
    pauses: false,
    ..TODAY
};

/// A negative control needs only its counterexample, found within one unit.
const CONTROL: Setup = Setup {
    bounds: [(1, 1), (1, 1)],
    restart_down: None,
    ..TODAY
};

/// The model's name in the table.
const MODEL: &str = "redlock";

/// The Redlock model's cases.
pub fn cases() -> Vec<Case> {
    vec![
        Case::holds(MODEL, "today", |b| run(b, TODAY)),
        Case::holds(MODEL, "today, fair", |b| run(b, FAIR)),
        Case::holds(MODEL, "today, restart", |b| run(b, RESTART)),
        Case::holds(MODEL, "today, 5 nodes", |b| {
            run(
                b,
                Setup {
                    nodes: 5,
                    bounds: [(0, 1), (1, 1)],
                    ..TODAY
                },
            )
        }),
        Case::holds(MODEL, "today, fair, 5 nodes", |b| {
            run(b, Setup { nodes: 5, ..FAIR })
        }),
        Case::control(MODEL, "clock jump", "one believer at a time", |b| {
            // The jump needs no loss.
            run(
                b,
                Setup {
                    bounds: [(1, 0), (1, 0)],
                    jump: 3,
                    ..CONTROL
                },
            )
        }),
        Case::control(
            MODEL,
            "restart, no downtime",
            "one believer at a time",
            |b| {
                run(
                    b,
                    Setup {
                        bounds: [(1, 0), (1, 0)],
                        restart_down: Some(0),
                        ..CONTROL
                    },
                )
            },
        ),
        // With the downtime the code assumes nobody believes at once, but a node that did not
        // grant keeps its low counter, and after the restart it and the empty node make a
        // majority whose maximum repeats a token.
        Case::control(
            MODEL,
            "no background raise",
            "tokens strictly increase in grant order",
            |b| {
                run(
                    b,
                    Setup {
                        bounds: [(6, 1), (6, 1)],
                        skew: 0,
                        fencing: Fencing::NoBackgroundRaise,
                        ..RESTART
                    },
                )
            },
        ),
    ]
}
