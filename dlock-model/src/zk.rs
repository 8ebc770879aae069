//! The ZooKeeper backend (`dlock-zk`): a lock queue of EPHEMERAL_SEQUENTIAL nodes, the lowest
//! holding and the next one watching its predecessor (`contend.rs`, `Contender::run`), the
//! czxid as the fencing token, renewals as a `sync` through the leader plus reads of the held
//! node (`renew.rs`, `SessionBackend::renew`), and deadlines of `proof_ttl` (`renew.rs`) as the
//! core's driver computes them (`dlock-core/src/renewal.rs`, `deadline_from`: send time +
//! proof − drift, a round every proof/3; `lost()` fires `loss_margin` before the deadline).
//!
//! The ensemble is a leader and one follower. Client A (the first holder) is connected to the
//! follower, client B (the contender) to the leader. Only the leader expires sessions
//! (`SessionTrackerImpl`): a touch at leader time `T` files the session under
//! `roundToNextInterval(T + timeout)` — the next multiple of the tick strictly after it — and
//! the expirer closes it when that time comes, deleting its ephemeral node and firing the
//! watch on it. A's packets (requests and pings) touch only the follower's table
//! (`LearnerSessionTracker.touchSession`); the leader pings the follower every half tick and
//! touches the sessions of the table the follower answers with, then empties it. A request
//! the follower forwards (`sync`, `create`, `delete`) is checked at the leader
//! (`checkSession`) but touches nothing there. A's client library (zookeeper-client 0.11)
//! checks its connection every client tick and pings after `client_ping_after` of sending
//! nothing. A partition may cut the follower from the leader (the follower then keeps its
//! table, reports nothing, and answers reads from what it had) or A from the follower.
//!
//! Where it abstracts the code:
//! - Time is whole units: 250 ms at `tickTime=2000` with a 10 s session, 500 ms with a 30 s
//!   session, 50 ms at the lab's declared `tickTime=100` with a 2 s session. Every duration is
//!   computed in microseconds with the code's own formulas (`proof_ttl`, `client_tick`,
//!   `client_ping_after`, `connection_timeout`, `drift`, `loss_margin`) and compared with the
//!   unit times exactly (a holder believes at `now` iff `now × unit < send + proof − drift`),
//!   but events happen only on the unit grid: worst cases that need a finer phase are
//!   reached only to the unit (at 250 ms the longest silence of the client before a packet is
//!   1.75 s where it is 2 s − ε in continuous time).
//! - The phases of the leader's pings (`phi`, every unit of a half tick) and of its expiry
//!   grid (`theta`, every unit of a tick) are chosen at the start against A's connect at 0;
//!   the client library's tick counts from the connect. With no latency, no late rounds and
//!   no other requests, the model's earliest leader expiry after a proof is 33 units (8.25 s)
//!   at 10 s / tick 2 s, the brute force `earliest_leader_expiry` (`renew.rs`, 50 ms steps)
//!   8.2 s: they agree to the unit. With the quick bound's faults it is 30 units (7.5 s);
//!   today's deadline is 6.433 s after the proof (A believes for 25 units).
//! - The leader–follower link has no latency (as in `earliest_leader_expiry`): a commit is
//!   seen at once by the follower, a ping answer reaches the leader at once, a forwarded
//!   request is processed at once. Messages between a client and its member travel up to
//!   `max_delay` units; each direction of a connection is FIFO (TCP, and ZooKeeper answers a
//!   session's requests and sends its events in order), the two clients' connections
//!   interleave freely.
//! - The leader's steps (pings, expiry) and the client library's tick are taken on time; when
//!   faults are on, A's create and the driver's rounds may be late by up to `max_pause`
//!   units, and A's session may send one request for another lock at any time (the full
//!   bound) — a packet off the client's tick grid. In the stall cases A's whole process
//!   stalls once, for a stated length, while it is ready to contend or holds (no late rounds
//!   then): it takes no step, its library's pings and the replies it reads included; a proof
//!   counts from its send time less a stall that ended within the session timeout less the
//!   proof before it (`StallClock`; its window rounded down to the unit, so the model counts
//!   no stall the code would not; the code counts a stall to within 40 ms).
//! - One lock, one node per client, one acquire each: A creates its node first; B contends
//!   once A was granted. B's session never expires (B is on the leader, which its own pings
//!   touch at once); B does not renew (it is the last holder: an overlap, if any, starts at
//!   its grant). The create, its listing and the predecessor watch are one step at the
//!   leader (the code's separate `getData` that finds the predecessor gone lists again, as
//!   the event does). The listing after the event reuses the create's send time as its proof
//!   while it is younger than `reuse` (`contend::reused`); B being on the leader, that only
//!   moves B's deadline earlier here: the model does not reach a waiter on a follower, whose
//!   grant rests on the create having been checked at the leader (`contend::reused`).
//! - No reconnects (`reconnected_since`), no session-timeout probes, no lost or duplicated
//!   messages but those a partition drops (a cut is permanent; one per run), no crash with
//!   faults on (a cut of A from its follower is a crash as far as the servers can tell).
//! - Fencing: a resource that refuses lower tokens accepts no write from an earlier holder
//!   after a later one's exactly when tokens increase in grant order, which is what is
//!   checked.

use stateright::{Model, Property};

use crate::check::{Bound, Case, Expect, Outcome, explore};

/// How a renewal proves the session alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// A `sync`, forwarded to the leader, then the reads (`SessionBackend::renew`): the code.
    SyncThenRead,
    /// The reads alone, answered by the follower: a negative control.
    FollowerRead,
}

/// How long a proof counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formula {
    /// Today's `proof_ttl`: timeout − tick/2 − (ping delay + client tick) − client tick.
    Today,
    /// The old one: timeout − tick/2 − connection timeout/8 (a negative control).
    Old,
}

/// What a proof counts from after a stall of A's whole process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stalls {
    /// Its send time less the stall (`StallClock::stalled_before`, `Session::proven_from`,
    /// `SessionBackend::extension`): the code.
    Counted,
    /// Its send time, as if the library had kept pinging: a negative control (the code
    /// before the stall clock).
    Ignored,
}

/// The server settings and time unit of one case.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The negotiated (= requested) session timeout, ms.
    pub timeout_ms: u32,
    /// The servers' `tickTime`, ms.
    pub tick_ms: u32,
    /// The tick declared to the locker (`server_tick_time`), if any.
    pub declared: bool,
    /// One model time unit, ms.
    pub unit_ms: u32,
}

/// How far a case explores.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// Faults on (a cut, late rounds, other requests) or the fair configuration.
    pub faults: bool,
    /// The longest a client–member message travels, units.
    pub max_delay: u8,
    /// How late A's create and rounds may be sent (faults on), units.
    pub max_pause: u8,
    /// Time stops here.
    pub horizon: u8,
    /// Requests for other locks A's session may send (faults on).
    pub others: u8,
    /// The length of the one stall of A's whole process a run may have (0: none).
    pub stall: u8,
}

/// The ZooKeeper model's parameters (durations in units, except where it says µs).
#[derive(Debug, Clone)]
pub struct ZkModel {
    /// The settings it was built from.
    pub setting: Setting,
    /// The session timeout.
    pub timeout: u8,
    /// The server tick (the leader's expiry grid).
    pub tick: u8,
    /// Half a tick (the leader's ping period).
    pub half: u8,
    /// The client library's tick.
    pub client_tick: u8,
    /// The client pings at a tick when it sent nothing for this many units.
    pub ping_after: u8,
    /// A holder believes while `now < extended + believe`.
    pub believe: u8,
    /// `lost()` fires at `extended + lost`.
    pub lost: u8,
    /// A round is due at `extended + period`.
    pub period: u8,
    /// The proof's validity, µs (reported).
    pub proof_us: u64,
    /// A listing after an event reuses the create's proof while it is younger than this
    /// (`contend::reused`: the proof / `REUSE_DIVISOR`, rounded up: never less than the code).
    pub reuse: u8,
    /// The longest a client–member message travels.
    pub max_delay: u8,
    /// How late the driver's round may be sent (faults on).
    pub max_pause: u8,
    /// Time stops here.
    pub horizon: u8,
    /// How many requests for other locks A's session may send (faults on).
    pub others: u8,
    /// Faults on: a partition, late rounds. Off: every due step is urgent, nothing is lost,
    /// and the holder may crash or release (the liveness configuration).
    pub faults: bool,
    /// How the renewal proves the session.
    pub renewal: Proof,
    /// The one stall of A's whole process a run may have, units (0: none).
    pub stall: u8,
    /// A stall that ended within this long before a proof shortens it: the session timeout
    /// less the proof (`StallClock`'s window), rounded down to whole units.
    pub stall_window: u8,
    /// What a proof counts from after a stall.
    pub stalls: Stalls,
}

/// A message in flight between a client and its member.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    /// When it was sent.
    pub sent: u8,
    /// The client it is from or to (0 = A on the follower, 1 = B on the leader).
    pub client: u8,
    /// What it says.
    pub body: Body,
}

/// What a message says; `start` is when the client sent the request it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// `Contender::create`: the EPHEMERAL_SEQUENTIAL create with the listing behind it.
    Create {
        /// Send time (the grant's proof).
        start: u8,
    },
    /// `Contender::run` after a watch fired: `list_children`, behind a `sync` unless it
    /// reuses the create's proof (`contend::reused`).
    List {
        /// The grant's proof: the create's send time when reused, else its own send time.
        start: u8,
    },
    /// `SessionBackend::renew`: `sync` + the read of the held node.
    Renew {
        /// Send time.
        start: u8,
    },
    /// The client library's ping.
    Ping,
    /// `SessionBackend::release`: delete the node.
    Delete,
    /// Any other request of A's session (another lock's acquire, renewal or release): a packet
    /// the follower touches the session for.
    Other,
    /// Our node is the lowest: granted with its czxid.
    Granted {
        /// The request's send time.
        start: u8,
        /// The czxid.
        token: u8,
    },
    /// Not the lowest: the watch on the predecessor is set.
    Behind {
        /// The request's send time.
        start: u8,
    },
    /// The renewal read our node.
    Extended {
        /// The renewal's send time.
        start: u8,
    },
    /// The renewal found the node gone.
    Gone {
        /// The renewal's send time.
        start: u8,
    },
    /// The leader answered `SessionExpired`.
    Ended,
    /// The watch on the predecessor fired.
    Event,
}

impl Body {
    fn is_request(self) -> bool {
        matches!(
            self,
            Body::Create { .. }
                | Body::List { .. }
                | Body::Renew { .. }
                | Body::Ping
                | Body::Delete
                | Body::Other
        )
    }
}

/// A client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// Has not contended yet.
    Ready,
    /// Its create (or its listing after an event) sent at `start` is outstanding.
    Acquiring {
        /// Send time.
        start: u8,
    },
    /// Watching its predecessor.
    Waiting {
        /// Send time of its create (the proof a listing after the event may reuse).
        since: u8,
    },
    /// Holding: believes while `now < extended + believe`.
    Holding {
        /// Send time of the request that last extended it.
        extended: u8,
        /// Send time of the outstanding round.
        renewing: Option<u8>,
        /// Its czxid.
        token: u8,
    },
    /// Released, lost or ended: takes no more steps.
    Done,
    /// Crashed while holding.
    Crashed {
        /// When.
        at: u8,
    },
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Global time.
    pub now: u8,
    /// The leader's next ping to the follower.
    pub leader_ping: u8,
    /// The phase of the leader's expiry grid (its points are `theta` + multiples of the tick).
    pub theta: u8,
    /// A's client library's next tick.
    pub client_tick: u8,
    /// When A last sent a packet.
    pub last_send: u8,
    /// The leader's expiry of A's session (`None`: expired).
    pub expiry: Option<u8>,
    /// A is in the follower's touch table.
    pub touched: bool,
    /// The follower and the leader are connected.
    pub linked: bool,
    /// A and the follower are connected.
    pub client_link: bool,
    /// A partition may still happen.
    pub cuts_left: u8,
    /// What the follower answers reads from while cut: whether A's node was there.
    pub follower_has_a: bool,
    /// Each client's node (its czxid).
    pub nodes: [Option<u8>; 2],
    /// The next zxid.
    pub zxid: u8,
    /// Client `i` watches the other's node.
    pub watch: [bool; 2],
    /// The clients.
    pub clients: [Client; 2],
    /// Messages in flight, in send order.
    pub net: Vec<Msg>,
    /// A's process stalled over `[from, until)`: it took no step then, its client library's
    /// pings included.
    pub stalled: Option<(u8, u8)>,
    /// The last token granted.
    pub last_token: u8,
    /// A grant's token was not above the last one.
    pub token_regressed: bool,
    /// When a holder sent its release (for the waiter's bound).
    pub released: Option<u8>,
    /// The lock passed from A to B.
    pub handoff: bool,
    /// A renewal extended a lease.
    pub extended_once: bool,
    /// A holder lost its lease.
    pub losses: bool,
    /// Other requests A's session may still send.
    pub others_left: u8,
    /// The leader expired A's session while A still believed it held.
    pub expired_early: bool,
    /// B was granted after A crashed or was cut off.
    pub regranted: bool,
}

/// A step, named after the code it models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Time passes one unit.
    Tick,
    /// `Leader.lead` pings the follower; `LearnerHandler` (case `PING`) touches the sessions
    /// of its answer (`Learner.ping`, `LearnerSessionTracker.snapshot`).
    LeaderPing,
    /// `SessionTrackerImpl.run`: the expiry time came; the session is closed, its ephemeral
    /// node deleted and the watch on it fired.
    ExpireSession,
    /// zookeeper-client's `Session` tick: pings after `client_ping_after` of silence.
    ClientTick,
    /// `Contender::create` (A at the start, up to `max_pause` late; B once A was granted).
    Create(u8),
    /// `RenewalDriver`'s round: `SessionBackend::renew`.
    Renew(u8),
    /// `Lease::release` → `SessionBackend::release` (fair configuration).
    Release(u8),
    /// `lost()` fires a `loss_margin` before the deadline.
    Lost(u8),
    /// A's process dies (fair configuration).
    Crash,
    /// A's session sends a request for another lock (faults on; at most `others` per run).
    OtherRequest,
    /// A's whole process stalls (a freeze: its driver, timers and client library alike).
    Stall,
    /// The follower is cut from the leader.
    CutFollower,
    /// A is cut from its follower.
    CutClient,
    /// A message arrives.
    Deliver(Msg),
}

const US: u64 = 1000;

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// `connection_timeout` (`session.rs`): 2/5 of the TTL, at least 500 ms (µs).
fn connection_timeout(ttl: u64) -> u64 {
    (ttl * 2 / 5).max(500 * US)
}

/// `client_tick` (`renew.rs`).
fn client_tick(negotiated: u64, connection: u64) -> u64 {
    let tick = if connection == 0 || connection > negotiated * 3 / 5 {
        negotiated / 20
    } else {
        connection / 8
    };
    tick.max(US)
}

/// `client_ping_after` (`renew.rs`).
fn client_ping_after(tick: u64) -> u64 {
    (tick * 3).min(10_000 * US)
}

/// `proof_ttl` (`renew.rs`) today, and the old formula.
fn proof_ttl(timeout: u64, tick: Option<u64>, formula: Formula) -> u64 {
    let tick = tick.unwrap_or_else(|| (2000 * US).min(timeout / 2));
    match formula {
        Formula::Today => {
            let client = client_tick(timeout, connection_timeout(timeout));
            let silence = client_ping_after(client) + client;
            timeout.saturating_sub(tick / 2 + silence + client)
        }
        Formula::Old => {
            let tick = tick.min(timeout / 2);
            timeout.saturating_sub(tick / 2 + connection_timeout(timeout) / 8)
        }
    }
}

/// `drift` (`dlock-core/src/options.rs`).
fn drift(ttl: u64) -> u64 {
    ttl / 100 + 2 * US
}

/// `contend::REUSE_DIVISOR`.
const REUSE_DIVISOR: u64 = 6;

/// `loss_margin` (`dlock-core/src/options.rs`).
fn loss_margin(ttl: u64) -> u64 {
    drift(ttl) + (ttl / 10).min(200 * US)
}

impl ZkModel {
    /// The model of `setting` with `formula`'s proofs, explored as `knobs` say.
    pub fn new(setting: Setting, formula: Formula, renewal: Proof, knobs: Knobs) -> Self {
        let Knobs {
            faults,
            max_delay,
            max_pause,
            horizon,
            others,
            stall,
        } = knobs;
        let unit = u64::from(setting.unit_ms) * US;
        let timeout = u64::from(setting.timeout_ms) * US;
        let tick = u64::from(setting.tick_ms) * US;
        let exact = |d: u64| -> u8 {
            assert!(
                d.is_multiple_of(unit),
                "{d} µs is not a whole number of units"
            );
            u8::try_from(d / unit).expect("fits")
        };
        let ct = client_tick(timeout, connection_timeout(timeout));
        let proof = proof_ttl(timeout, setting.declared.then_some(tick), formula);
        let valid = proof - drift(proof);
        let units = |d: u64| u8::try_from(ceil_div(d, unit)).expect("fits");
        ZkModel {
            setting,
            timeout: exact(timeout),
            tick: exact(tick),
            half: exact(tick / 2),
            client_tick: exact(ct),
            ping_after: units(client_ping_after(ct)),
            believe: units(valid),
            lost: units(valid - loss_margin(proof)),
            period: units(proof / 3),
            proof_us: proof,
            reuse: units(proof / REUSE_DIVISOR),
            max_delay,
            max_pause,
            horizon,
            others,
            faults,
            renewal,
            stall,
            stall_window: u8::try_from((timeout - proof) / unit).expect("fits"),
            stalls: Stalls::Counted,
        }
    }

    /// This model with proofs counted as `stalls` says after a stall.
    pub fn counting(mut self, stalls: Stalls) -> Self {
        self.stalls = stalls;
        self
    }

    /// Whether A's process is stalled now.
    fn a_stalled(s: &State) -> bool {
        s.stalled.is_some_and(|(_, until)| s.now < until)
    }

    /// What A's proof sent at `start` counts from, as A judges it now: the send time less a
    /// stall that ended within the stall window before it (or later), never before 0.
    fn proven_from(&self, s: &State, start: u8) -> u8 {
        match (self.stalls, s.stalled) {
            (Stalls::Counted, Some((from, until)))
                if u16::from(until)
                    > u16::from(start).saturating_sub(u16::from(self.stall_window))
                    && from <= s.now =>
            {
                start.saturating_sub(until - from)
            }
            _ => start,
        }
    }

    /// `ExpiryQueue.roundToNextInterval(t + timeout)`.
    /// `ExpiryQueue.roundToNextInterval(t + timeout)`: the next point of the grid (the
    /// multiples of the tick, offset by `theta`) strictly after `t + timeout`.
    fn expiry_after(&self, theta: u8, t: u8) -> u8 {
        let at = t + self.timeout;
        at + self.tick - (at + self.tick - theta) % self.tick
    }

    fn believes(&self, s: &State, i: usize) -> bool {
        matches!(s.clients[i], Client::Holding { extended, .. } if s.now < extended + self.believe)
    }

    /// The run is over: B holds and A can no longer believe.
    fn finished(s: &State) -> bool {
        matches!(s.clients[1], Client::Holding { .. })
            && !matches!(s.clients[0], Client::Holding { .. })
    }

    fn renew_due(&self, s: &State, i: usize) -> Option<u8> {
        match s.clients[i] {
            Client::Holding {
                extended,
                renewing: None,
                ..
            } if i == 0 && s.now < extended + self.lost => Some(extended + self.period),
            _ => None,
        }
    }

    fn lost_due(&self, s: &State, i: usize) -> bool {
        matches!(s.clients[i], Client::Holding { extended, .. } if s.now >= extended + self.lost)
    }

    fn create_due(s: &State, i: usize) -> bool {
        s.clients[i] == Client::Ready && (i == 0 || s.last_token > 0)
    }

    fn a_ticks(s: &State) -> bool {
        !matches!(s.clients[0], Client::Crashed { .. }) && s.expiry.is_some() && !Self::a_stalled(s)
    }

    fn lowest(s: &State, i: usize) -> bool {
        match (s.nodes[i], s.nodes[1 - i]) {
            (Some(mine), Some(other)) => mine < other,
            (Some(_), None) => true,
            _ => false,
        }
    }

    fn send(s: &mut State, client: u8, body: Body) {
        s.net.push(Msg {
            sent: s.now,
            client,
            body,
        });
        if client == 0 && body.is_request() {
            s.last_send = s.now;
        }
    }

    /// Node `j` was deleted: fire the other's watch on it.
    fn deleted(s: &mut State, j: usize) {
        s.nodes[j] = None;
        if s.watch[1 - j] {
            s.watch[1 - j] = false;
            // A's watch is registered at the follower: the event is lost if it is cut.
            if j == 0 || s.linked {
                Self::send(s, (1 - j) as u8, Body::Event);
            }
        }
    }

    /// The contender's turn (`Rule::turn`): granted if lowest, else the watch on the
    /// predecessor.
    fn turn(s: &mut State, i: usize, start: u8) -> Body {
        if Self::lowest(s, i) {
            Body::Granted {
                start,
                token: s.nodes[i].unwrap_or(0),
            }
        } else if s.nodes[i].is_some() {
            s.watch[i] = true;
            Body::Behind { start }
        } else {
            Body::Gone { start }
        }
    }

    /// A request reaches the client's member (and the leader, if it goes there).
    fn serve(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        if i == 0 {
            if !s.client_link {
                return;
            }
            // `ZooKeeperServer.submitRequestNow` → `LearnerSessionTracker.touchSession`.
            s.touched = true;
            match m.body {
                Body::Ping | Body::Other => return,
                Body::Renew { start } if self.renewal == Proof::FollowerRead => {
                    let has = if s.linked {
                        s.nodes[0].is_some()
                    } else {
                        s.follower_has_a
                    };
                    let body = if has {
                        Body::Extended { start }
                    } else {
                        Body::Gone { start }
                    };
                    Self::send(s, 0, body);
                    return;
                }
                _ if !s.linked => return,
                _ => {}
            }
            // Forwarded: `PrepRequestProcessor.checkSession`, no touch.
            if s.expiry.is_none() {
                if m.body != Body::Delete {
                    Self::send(s, 0, Body::Ended);
                }
                return;
            }
        }
        let reply = match m.body {
            Body::Create { start } => {
                s.nodes[i] = Some(s.zxid);
                s.zxid += 1;
                Self::turn(s, i, start)
            }
            Body::List { start } => Self::turn(s, i, start),
            Body::Renew { start } => {
                if s.nodes[i].is_some() {
                    Body::Extended { start }
                } else {
                    Body::Gone { start }
                }
            }
            Body::Delete => {
                if s.nodes[i].is_some() {
                    Self::deleted(s, i);
                }
                return;
            }
            _ => return,
        };
        Self::send(s, i as u8, reply);
    }

    /// A reply reaches its client.
    fn receive(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        if i == 0 && !s.client_link {
            return;
        }
        s.clients[i] = match (s.clients[i], m.body) {
            (Client::Acquiring { start }, Body::Granted { start: s0, token }) if s0 == start => {
                if token <= s.last_token && s.last_token > 0 {
                    s.token_regressed = true;
                }
                s.last_token = token;
                if i == 1 {
                    s.handoff = true;
                    s.regranted |= matches!(s.clients[0], Client::Crashed { .. })
                        || !s.linked
                        || !s.client_link;
                }
                Client::Holding {
                    extended: if i == 0 {
                        self.proven_from(s, start)
                    } else {
                        start
                    },
                    renewing: None,
                    token,
                }
            }
            (Client::Acquiring { start }, Body::Behind { start: s0 }) if s0 == start => {
                Client::Waiting { since: start }
            }
            (Client::Waiting { since }, Body::Event) => {
                // `contend::reused`: the create's proof while it is recent, else a new one.
                let start = if s.now - since < self.reuse {
                    since
                } else {
                    s.now
                };
                Self::send(s, i as u8, Body::List { start });
                Client::Acquiring { start }
            }
            (
                Client::Holding {
                    extended,
                    renewing: Some(r),
                    token,
                },
                Body::Extended { start },
            ) if r == start => {
                s.extended_once = true;
                Client::Holding {
                    extended: extended.max(self.proven_from(s, start)),
                    renewing: None,
                    token,
                }
            }
            (
                Client::Holding {
                    renewing: Some(r), ..
                },
                Body::Gone { start },
            ) if r == start => {
                s.losses = true;
                Client::Done
            }
            (Client::Holding { .. }, Body::Ended) => {
                s.losses = true;
                Client::Done
            }
            (Client::Acquiring { .. }, Body::Ended | Body::Gone { .. }) => Client::Done,
            (c, _) => c,
        };
    }
}

impl Model for ZkModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut out = Vec::new();
        for phi in 0..self.half {
            for theta in 0..self.tick {
                out.push(State {
                    now: 0,
                    leader_ping: phi,
                    theta,
                    client_tick: self.client_tick,
                    last_send: 0,
                    expiry: Some(self.expiry_after(theta, 0)),
                    touched: false,
                    linked: true,
                    client_link: true,
                    cuts_left: u8::from(self.faults),
                    follower_has_a: false,
                    nodes: [None; 2],
                    zxid: 1,
                    watch: [false; 2],
                    clients: [Client::Ready; 2],
                    net: Vec::new(),
                    stalled: None,
                    last_token: 0,
                    token_regressed: false,
                    released: None,
                    handoff: false,
                    extended_once: false,
                    losses: false,
                    others_left: if self.faults { self.others } else { 0 },
                    expired_early: false,
                    regranted: false,
                });
            }
        }
        out
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if Self::finished(s) {
            return;
        }
        let now = s.now;
        let leader_due = now >= s.leader_ping || s.expiry.is_some_and(|e| now >= e);
        let tick_due = Self::a_ticks(s) && now >= s.client_tick;
        let stalled = Self::a_stalled(s);
        // A reply to a stalled A waits in its socket until it runs again.
        let held = |m: &Msg| stalled && m.client == 0 && !m.body.is_request();
        let overdue = s
            .net
            .iter()
            .any(|m| now >= m.sent + self.max_delay && !held(m));
        let pause = if self.faults { self.max_pause } else { 0 };
        let client_due = (0..2).filter(|&i| i == 1 || !stalled).any(|i| {
            (Self::create_due(s, i) && (i == 1 || now >= pause))
                || self.lost_due(s, i)
                || self.renew_due(s, i).is_some_and(|d| now >= d + pause)
        });
        if !leader_due && !tick_due && !overdue && !client_due && now < self.horizon {
            actions.push(Action::Tick);
        }
        if now >= s.leader_ping {
            actions.push(Action::LeaderPing);
        }
        if s.expiry.is_some_and(|e| now >= e) {
            actions.push(Action::ExpireSession);
        }
        if tick_due {
            actions.push(Action::ClientTick);
        }
        for i in 0..2u8 {
            let iu = i as usize;
            if i == 0 && stalled {
                continue;
            }
            if Self::create_due(s, iu) {
                actions.push(Action::Create(i));
            }
            if self.renew_due(s, iu).is_some_and(|d| now >= d) {
                actions.push(Action::Renew(i));
            }
            if self.lost_due(s, iu) {
                actions.push(Action::Lost(i));
            } else if !self.faults && matches!(s.clients[iu], Client::Holding { .. }) && i == 0 {
                actions.push(Action::Release(i));
                actions.push(Action::Crash);
            }
        }
        if s.others_left > 0 && !stalled {
            actions.push(Action::OtherRequest);
        }
        if self.stall > 0
            && s.stalled.is_none()
            && matches!(s.clients[0], Client::Ready | Client::Holding { .. })
        {
            actions.push(Action::Stall);
        }
        if s.cuts_left > 0 {
            actions.push(Action::CutFollower);
            actions.push(Action::CutClient);
        }
        // Each direction of each client's connection is FIFO (TCP; ZooKeeper answers a
        // session's requests and sends its events in order): only its oldest message may
        // arrive.
        let mut heads: Vec<(u8, bool)> = Vec::new();
        for m in &s.net {
            let channel = (m.client, m.body.is_request());
            if !heads.contains(&channel) {
                heads.push(channel);
                if !held(m) {
                    actions.push(Action::Deliver(m.clone()));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::LeaderPing => {
                if s.linked && s.touched {
                    s.touched = false;
                    if s.expiry.is_some() {
                        s.expiry = Some(self.expiry_after(s.theta, s.now));
                    }
                }
                s.leader_ping += self.half;
            }
            Action::ExpireSession => {
                s.expired_early |= self.believes(&s, 0);
                s.expiry = None;
                s.touched = false;
                if s.nodes[0].is_some() {
                    Self::deleted(&mut s, 0);
                }
            }
            Action::ClientTick => {
                if s.now >= s.last_send + self.ping_after {
                    Self::send(&mut s, 0, Body::Ping);
                }
                s.client_tick += self.client_tick;
            }
            Action::Create(i) => {
                s.clients[i as usize] = Client::Acquiring { start: s.now };
                let start = s.now;
                Self::send(&mut s, i, Body::Create { start });
            }
            Action::Renew(i) => {
                if let Client::Holding { renewing, .. } = &mut s.clients[i as usize] {
                    *renewing = Some(s.now);
                }
                let start = s.now;
                Self::send(&mut s, i, Body::Renew { start });
            }
            Action::Release(i) => {
                s.clients[i as usize] = Client::Done;
                s.released = Some(s.now);
                Self::send(&mut s, i, Body::Delete);
            }
            Action::Lost(i) => {
                s.clients[i as usize] = Client::Done;
                s.losses = true;
            }
            Action::Crash => s.clients[0] = Client::Crashed { at: s.now },
            Action::Stall => s.stalled = Some((s.now, s.now + self.stall)),
            Action::CutFollower => {
                s.cuts_left -= 1;
                s.linked = false;
                s.follower_has_a = s.nodes[0].is_some();
            }
            Action::OtherRequest => {
                s.others_left -= 1;
                Self::send(&mut s, 0, Body::Other);
            }
            Action::CutClient => {
                s.cuts_left -= 1;
                s.client_link = false;
            }
            Action::Deliver(m) => {
                let at = s.net.iter().position(|x| *x == m)?;
                s.net.remove(at);
                // A crashed client's requests in flight still arrive; replies to it do not.
                if m.body.is_request() {
                    self.serve(&mut s, &m);
                } else if !matches!(s.clients[m.client as usize], Client::Crashed { .. }) {
                    self.receive(&mut s, &m);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one believer at a time", |m: &Self, s: &State| {
                !(m.believes(s, 0) && m.believes(s, 1))
            }),
            Property::always(
                "the leader keeps A's session until A's deadline",
                |_, s: &State| !s.expired_early,
            ),
            Property::always("fencing tokens increase in grant order", |_, s: &State| {
                !s.token_regressed
            }),
            Property::always("on-time renewals keep the lease", |m: &Self, s: &State| {
                m.faults || !s.losses
            }),
            Property::always(
                "a waiter is granted within 4 delays of the release",
                |m: &Self, s: &State| match s.released {
                    Some(r) if !m.faults => s.handoff || s.now <= r + 4 * m.max_delay,
                    _ => true,
                },
            ),
            Property::always(
                "crash released within timeout + 1.5 ticks + 4 delays",
                |m: &Self, s: &State| match s.clients[0] {
                    Client::Crashed { at } if !m.faults => {
                        s.handoff || s.now <= at + m.timeout + m.tick + m.half + 4 * m.max_delay
                    }
                    _ => true,
                },
            ),
            Property::sometimes("a renewal extended the lease", |_, s: &State| {
                s.extended_once
            }),
            Property::sometimes("the lock passed from A to B", |_, s: &State| s.handoff),
            Property::sometimes("the leader expired A's session", |_, s: &State| {
                s.expiry.is_none()
            }),
            Property::sometimes(
                "B granted after A crashed (fair) or was cut off (faults)",
                |_, s: &State| s.regranted,
            ),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

fn describe(m: &ZkModel) -> String {
    let others = if m.faults && m.others > 0 {
        format!(", {} other request(s) of A's session", m.others)
    } else {
        String::new()
    };
    let st = m.setting;
    format!(
        "timeout {} s, tick {} ms{}, unit {} ms; proof {} µs (believes until +{} u, round every {} u), \
         client tick {} u, ping after {} u; delay ≤ {}, horizon {}{}",
        st.timeout_ms / 1000,
        st.tick_ms,
        if st.declared { " (declared)" } else { "" },
        st.unit_ms,
        m.proof_us,
        m.believe,
        m.period,
        m.client_tick,
        m.ping_after,
        m.max_delay,
        m.horizon,
        if m.faults && m.stall > 0 {
            format!(
                ", one cut (follower or A), one stall of A's process of {} u ({:?})",
                m.stall, m.stalls
            )
        } else if m.faults {
            format!(
                ", one cut (follower or A), create and rounds ≤ {} u late{others}",
                m.max_pause
            )
        } else {
            ", fair, release or crash of A".to_owned()
        }
    )
}

const TEN_S: Setting = Setting {
    timeout_ms: 10_000,
    tick_ms: 2000,
    declared: false,
    unit_ms: 250,
};

const THIRTY_S: Setting = Setting {
    timeout_ms: 30_000,
    tick_ms: 2000,
    declared: false,
    unit_ms: 500,
};

const LAB: Setting = Setting {
    timeout_ms: 2000,
    tick_ms: 100,
    declared: true,
    unit_ms: 50,
};

fn faulty(max_pause: u8, horizon: u8, others: u8) -> Knobs {
    Knobs {
        faults: true,
        max_delay: 1,
        max_pause,
        horizon,
        others,
        stall: 0,
    }
}

/// Faults with one stall of A's whole process of `stall` units and no late rounds.
fn stalling(stall: u8, horizon: u8) -> Knobs {
    Knobs {
        stall,
        ..faulty(0, horizon, 0)
    }
}

fn fair(horizon: u8) -> Knobs {
    Knobs {
        faults: false,
        max_delay: 1,
        max_pause: 0,
        horizon,
        others: 0,
        stall: 0,
    }
}

fn run(setting: Setting, formula: Formula, renewal: Proof, knobs: Knobs) -> Outcome {
    run_counting(setting, formula, renewal, knobs, Stalls::Counted)
}

fn run_counting(
    setting: Setting,
    formula: Formula,
    renewal: Proof,
    knobs: Knobs,
    stalls: Stalls,
) -> Outcome {
    let model = ZkModel::new(setting, formula, renewal, knobs).counting(stalls);
    let desc = describe(&model);
    explore(model, desc)
}

fn quick_or(b: Bound, quick: Knobs, full: Knobs) -> Knobs {
    match b {
        Bound::Quick => quick,
        Bound::Full => full,
    }
}

/// The ZooKeeper model's cases.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            model: "zk",
            variant: "today",
            expect: Expect::Holds,
            run: |b| {
                let k = quick_or(b, faulty(2, 56, 0), faulty(2, 56, 1));
                run(TEN_S, Formula::Today, Proof::SyncThenRead, k)
            },
        },
        Case {
            model: "zk",
            variant: "today, fair",
            expect: Expect::Holds,
            run: |b| {
                let k = quick_or(b, fair(64), fair(72));
                run(TEN_S, Formula::Today, Proof::SyncThenRead, k)
            },
        },
        Case {
            model: "zk",
            variant: "today, 30 s",
            expect: Expect::Holds,
            run: |b| {
                let k = quick_or(b, faulty(1, 72, 0), faulty(2, 80, 1));
                run(THIRTY_S, Formula::Today, Proof::SyncThenRead, k)
            },
        },
        Case {
            model: "zk",
            variant: "today, lab tick 100 ms",
            expect: Expect::Holds,
            run: |b| {
                let k = quick_or(b, faulty(2, 64, 0), faulty(2, 72, 1));
                run(LAB, Formula::Today, Proof::SyncThenRead, k)
            },
        },
        Case {
            model: "zk",
            variant: "today, stall 3 s",
            expect: Expect::Holds,
            run: |b| {
                let k = quick_or(b, stalling(12, 44), stalling(12, 64));
                run(TEN_S, Formula::Today, Proof::SyncThenRead, k)
            },
        },
        Case {
            model: "zk",
            variant: "stall not counted",
            expect: Expect::Counterexample("one believer at a time"),
            run: |b| {
                let k = quick_or(b, stalling(12, 44), stalling(12, 64));
                let (f, p) = (Formula::Today, Proof::SyncThenRead);
                run_counting(TEN_S, f, p, k, Stalls::Ignored)
            },
        },
        Case {
            model: "zk",
            variant: "read without sync",
            expect: Expect::Counterexample("one believer at a time"),
            run: |b| {
                let k = quick_or(b, faulty(1, 48, 0), faulty(1, 56, 0));
                run(TEN_S, Formula::Today, Proof::FollowerRead, k)
            },
        },
        Case {
            model: "zk",
            variant: "old proof_ttl",
            expect: Expect::Counterexample("one believer at a time"),
            run: |b| {
                let k = quick_or(b, faulty(2, 56, 0), faulty(2, 64, 0));
                run(TEN_S, Formula::Old, Proof::SyncThenRead, k)
            },
        },
    ]
}
