//! The client lease common to every backend (`dlock-core/src/renewal.rs`, `RenewalDriver`):
//! a grant's deadline counts from the START of the request that made or last extended it, less
//! the drift allowance; `lost()` fires a margin before it; the holder renews every TTL/3.
//!
//! The server is a key with an owner and an expiry on the server's own clock (what every
//! backend reduces to: Redis `PX`, an etcd lease, a ZooKeeper session). Messages are delayed up
//! to a bound, lost, duplicated and reordered; processes pause (nothing forces a step on time);
//! the server's clock gains on the clients' up to a stated skew; a holder may crash.
//!
//! Where it abstracts the code: time is whole units (TTL = `ttl` units) and drift is a bounded
//! absolute skew over the horizon rather than a rate (the code's allowance is
//! `TTL/100 + 2 ms`, covering a 1% rate difference over one lease); the server is one key,
//! not a backend's script; one lease per client.

use stateright::{Model, Property};

use crate::check::{Bound, Case, Outcome, explore};
use crate::net::{Net, Sent};

/// How the client computes a grant's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// `start + TTL − drift` (`RenewalDriver::deadline_from`): the code as it is.
    FromRequestStart,
    /// `reply + TTL − drift`: a negative control (the reply may come long after the server
    /// started the TTL).
    FromReply,
    /// `start + TTL`: a negative control (no allowance for the server's clock running fast).
    NoDriftAllowance,
}

/// The lease model's parameters.
#[derive(Debug, Clone)]
pub struct LeaseModel {
    /// The lease's TTL in time units.
    pub ttl: u8,
    /// The drift allowance subtracted from every deadline.
    pub drift: u8,
    /// How far the server's clock may gain on the clients' over the whole run.
    pub max_skew: u8,
    /// The longest a message may travel before it is delivered (or lost).
    pub max_delay: u8,
    /// The run's horizon: time stops here.
    pub horizon: u8,
    /// How many acquires each client starts at most.
    pub attempts: u8,
    /// How many messages may be lost or duplicated.
    pub faults_budget: u8,
    /// Faults on: loss, duplication, the server's clock gaining, pauses. Off: every step is
    /// taken as soon as it is due (fair scheduling) and nothing is lost — the liveness
    /// configuration. A holder may crash in both.
    pub faults: bool,
    /// How deadlines are computed.
    pub deadline: Deadline,
}

/// A message in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// What a message says. `start` is the client's clock when it sent the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// `acquire` (a `SET NX PX`, a create on the session).
    Acquire {
        /// The client's clock when the request was sent.
        start: u8,
    },
    /// A renewal round (`PEXPIRE` if owner, a keep-alive, a `sync` + read).
    Renew {
        /// The client's clock when the request was sent.
        start: u8,
    },
    /// `release`.
    Release,
    /// The server granted the request sent at `start`.
    Granted {
        /// The client's clock when the request was sent.
        start: u8,
    },
    /// The server refused: somebody else holds it.
    Refused {
        /// The client's clock when the request was sent.
        start: u8,
    },
    /// The renewal sent at `start` extended the key.
    Extended {
        /// The client's clock when the request was sent.
        start: u8,
    },
    /// The renewal found the key gone or somebody else's.
    NotOwner {
        /// The client's clock when the request was sent.
        start: u8,
    },
}

/// A client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// Not holding; may start an acquire.
    Idle,
    /// Refused; retries the acquire (a retry is not a new attempt).
    Waiting,
    /// An acquire sent at `start` is outstanding.
    Acquiring {
        /// When it was sent.
        start: u8,
    },
    /// Holding until `deadline`; `renewing` is the start of an outstanding renewal;
    /// `extended` the start of the request that last extended it.
    Holding {
        /// The promised deadline.
        deadline: u8,
        /// The start of the request that last extended the lease.
        extended: u8,
        /// The start of the outstanding renewal, if any.
        renewing: Option<u8>,
    },
    /// Crashed while holding: takes no more steps.
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
    /// How far the server's clock is ahead of global time.
    pub skew: u8,
    /// The key: owner and expiry on the server's clock.
    pub key: Option<(u8, u8)>,
    /// The two clients.
    pub clients: [Client; 2],
    /// Messages in flight (kept sorted: a multiset).
    pub net: Net<Msg>,
    /// Duplications and losses left.
    pub faults_left: u8,
    /// When the contender of a crashed holder was granted.
    pub regranted: Option<u8>,
    /// The client granted last.
    pub last_holder: Option<u8>,
    /// Whether the lock ever passed from one client to the other.
    pub handoffs: u8,
    /// Whether a holder ever lost its lease (`lost()` fired or a renewal found it gone).
    pub losses: u8,
    /// Acquires each client may still start (bounds the run).
    pub attempts: [u8; 2],
}

/// A step, named after what the code does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Time passes one unit.
    Tick,
    /// The server's clock gains one unit on the clients'.
    ServerClockGains,
    /// `Locker::acquire` sends its request.
    SendAcquire(u8),
    /// The renewal driver's round for this client's lease (due TTL/3 after the last start).
    SendRenew(u8),
    /// `Lease::release`: the holder stops believing, then asks the server.
    Release(u8),
    /// The deadline less the loss margin passed: `lost()` fires and the holder stops.
    Lost(u8),
    /// The holder's process dies.
    Crash(u8),
    /// A message arrives.
    Deliver(Msg),
    /// A message is lost.
    Lose(Msg),
    /// A message is duplicated.
    Duplicate(Msg),
}

impl LeaseModel {
    fn period(&self) -> u8 {
        self.ttl / 3
    }

    /// The loss margin: the drift allowance again plus a tenth of the TTL (`loss_margin`).
    fn margin(&self) -> u8 {
        self.drift + self.ttl / 10
    }

    fn deadline(&self, start: u8, now: u8) -> u8 {
        match self.deadline {
            Deadline::FromRequestStart => start + self.ttl - self.drift,
            Deadline::FromReply => now + self.ttl - self.drift,
            Deadline::NoDriftAllowance => start + self.ttl,
        }
    }

    /// The steps a fair scheduler must take before time may pass.
    fn due(&self, s: &State, i: usize) -> bool {
        match s.clients[i] {
            Client::Idle => s.attempts[i] > 0,
            Client::Waiting => true,
            Client::Holding {
                deadline,
                extended,
                renewing,
            } => {
                s.now + self.margin() >= deadline
                    || (renewing.is_none() && s.now >= extended + self.period())
            }
            _ => false,
        }
    }

    fn server(&self, s: &mut State, m: &Msg) {
        let clock = s.now + s.skew;
        let live = s.key.filter(|&(_, exp)| clock < exp);
        let reply = |body| Msg {
            sent: s.now,
            client: m.client,
            body,
        };
        let out = match m.body {
            Body::Acquire { start } => match live {
                None => {
                    s.key = Some((m.client, clock + self.ttl));
                    reply(Body::Granted { start })
                }
                Some(_) => reply(Body::Refused { start }),
            },
            Body::Renew { start } => match live {
                Some((owner, _)) if owner == m.client => {
                    s.key = Some((owner, clock + self.ttl));
                    reply(Body::Extended { start })
                }
                _ => reply(Body::NotOwner { start }),
            },
            Body::Release => {
                if live.is_some_and(|(owner, _)| owner == m.client) {
                    s.key = None;
                }
                return;
            }
            _ => return,
        };
        s.net.send(out);
    }

    fn client(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        let c = s.clients[i];
        s.clients[i] = match (c, m.body) {
            (Client::Acquiring { start }, Body::Granted { start: s0 }) if s0 == start => {
                if matches!(s.clients[1 - i], Client::Crashed { .. }) && s.regranted.is_none() {
                    s.regranted = Some(s.now);
                }
                if s.last_holder.is_some_and(|h| h as usize != i) {
                    s.handoffs = s.handoffs.saturating_add(1).min(1);
                }
                s.last_holder = Some(i as u8);
                Client::Holding {
                    deadline: self.deadline(start, s.now),
                    extended: start,
                    renewing: None,
                }
            }
            (Client::Acquiring { start }, Body::Refused { start: s0 }) if s0 == start => {
                Client::Waiting
            }
            (
                Client::Holding {
                    deadline,
                    extended,
                    renewing: Some(r),
                },
                Body::Extended { start },
            ) if r == start => Client::Holding {
                deadline: deadline.max(self.deadline(start, s.now)),
                extended: extended.max(start),
                renewing: None,
            },
            (
                Client::Holding {
                    renewing: Some(r), ..
                },
                Body::NotOwner { start },
            ) if r == start => {
                s.losses = 1;
                Client::Idle
            }
            // A late or duplicated reply to a request this client no longer waits for.
            (c, _) => c,
        };
    }

    /// Two clients believe they hold at once.
    fn two_believe(s: &State) -> bool {
        s.clients
            .iter()
            .filter(|c| matches!(c, Client::Holding { deadline, .. } if s.now < *deadline))
            .count()
            > 1
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            skew: 0,
            key: None,
            clients: [Client::Idle; 2],
            net: Net::default(),
            faults_left: if self.faults { self.faults_budget } else { 0 },
            regranted: None,
            last_holder: None,
            handoffs: 0,
            losses: 0,
            attempts: [self.attempts; 2],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let overdue = s.net.overdue(s.now, self.max_delay);
        let urgent = !self.faults && (0..2).any(|i| self.due(s, i));
        if !overdue && !urgent && s.now < self.horizon {
            actions.push(Action::Tick);
        }
        if self.faults && s.skew < self.max_skew {
            actions.push(Action::ServerClockGains);
        }
        for i in 0..2u8 {
            match s.clients[i as usize] {
                Client::Idle if s.attempts[i as usize] > 0 => actions.push(Action::SendAcquire(i)),
                Client::Waiting => actions.push(Action::SendAcquire(i)),
                Client::Holding {
                    deadline,
                    extended,
                    renewing,
                } => {
                    if renewing.is_none() && s.now >= extended + self.period() {
                        actions.push(Action::SendRenew(i));
                    }
                    if s.now + self.margin() >= deadline {
                        actions.push(Action::Lost(i));
                    } else {
                        actions.push(Action::Release(i));
                        if !s
                            .clients
                            .iter()
                            .any(|c| matches!(c, Client::Crashed { .. }))
                        {
                            actions.push(Action::Crash(i));
                        }
                    }
                }
                _ => {}
            }
        }
        for m in s.net.distinct() {
            actions.push(Action::Deliver(m.clone()));
            if s.faults_left > 0 {
                actions.push(Action::Lose(m.clone()));
                actions.push(Action::Duplicate(m.clone()));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        let send = |s: &mut State, i: u8, body| {
            s.net.send(Msg {
                sent: s.now,
                client: i,
                body,
            })
        };
        match action {
            Action::Tick => s.now += 1,
            Action::ServerClockGains => s.skew += 1,
            Action::SendAcquire(i) => {
                let start = s.now;
                if s.clients[i as usize] == Client::Idle {
                    s.attempts[i as usize] -= 1;
                }
                s.clients[i as usize] = Client::Acquiring { start };
                send(&mut s, i, Body::Acquire { start });
            }
            Action::SendRenew(i) => {
                if let Client::Holding { renewing, .. } = &mut s.clients[i as usize] {
                    *renewing = Some(s.now);
                }
                let start = s.now;
                send(&mut s, i, Body::Renew { start });
            }
            Action::Release(i) => {
                s.clients[i as usize] = Client::Idle;
                send(&mut s, i, Body::Release);
            }
            Action::Lost(i) => {
                s.clients[i as usize] = Client::Idle;
                s.losses = 1;
            }
            Action::Crash(i) => s.clients[i as usize] = Client::Crashed { at: s.now },
            Action::Deliver(m) => {
                s.net.take(&m)?;
                match m.body {
                    Body::Acquire { .. } | Body::Renew { .. } | Body::Release => {
                        self.server(&mut s, &m)
                    }
                    _ if matches!(s.clients[m.client as usize], Client::Crashed { .. }) => {}
                    _ => self.client(&mut s, &m),
                }
            }
            Action::Lose(m) => {
                s.net.take(&m)?;
                s.faults_left -= 1;
            }
            Action::Duplicate(m) => {
                s.net.send(m);
                s.faults_left -= 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one believer at a time", |_, s: &State| {
                !Self::two_believe(s)
            }),
            Property::always("on-time renewals keep the lease", |m: &Self, s: &State| {
                m.faults || s.losses == 0
            }),
            Property::always(
                "crash released within TTL + slack",
                |m: &Self, s: &State| {
                    let crashed = s.clients.iter().find_map(|&c| match c {
                        Client::Crashed { at } => Some(at),
                        _ => None,
                    });
                    // Owed only to a contender: one that still wants the lock.
                    let contending = s.clients.iter().zip(s.attempts).any(|(&c, left)| match c {
                        Client::Waiting | Client::Acquiring { .. } => true,
                        Client::Idle => left > 0,
                        _ => false,
                    });
                    match crashed {
                        Some(at) if !m.faults && contending => {
                            s.regranted.is_some() || s.now <= at + m.ttl + 3 * m.max_delay + 1
                        }
                        _ => true,
                    }
                },
            ),
            Property::sometimes("a handoff", |_, s: &State| s.handoffs > 0),
            Property::sometimes("a crashed holder's lock granted again", |_, s: &State| {
                s.regranted.is_some()
            }),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

fn run(bound: Bound, faults: bool, deadline: Deadline) -> Outcome {
    let (ttl, max_delay, horizon, attempts, faults_budget) = match bound {
        Bound::Quick => (9, 1, 12, 1, 1),
        Bound::Full => (9, 1, 16, 1, 2),
    };
    // The fair configuration is small: it runs long enough for a crash's release bound.
    let horizon = if faults { horizon } else { horizon + 8 };
    let model = LeaseModel {
        ttl,
        drift: 1,
        max_skew: 1,
        max_delay,
        horizon,
        attempts,
        faults_budget,
        faults,
        deadline,
    };
    let desc = format!(
        "2 clients × {attempts} acquires, TTL {ttl}, horizon {horizon}, delay ≤ {max_delay}, a crash{}",
        if faults {
            format!(", skew ≤ 1, {faults_budget} lost/duplicated, pauses")
        } else {
            ", fair, no faults".to_owned()
        }
    );
    explore(model, desc)
}

/// The model's name in the table.
const MODEL: &str = "lease";

/// The lease model's cases.
pub fn cases() -> Vec<Case> {
    vec![
        Case::holds(MODEL, "today", |b| run(b, true, Deadline::FromRequestStart)),
        Case::holds(MODEL, "today, fair", |b| {
            run(b, false, Deadline::FromRequestStart)
        }),
        Case::control(
            MODEL,
            "deadline from reply",
            "one believer at a time",
            |b| run(b, true, Deadline::FromReply),
        ),
        Case::control(MODEL, "no drift allowance", "one believer at a time", |b| {
            run(b, true, Deadline::NoDriftAllowance)
        }),
    ]
}
