//! The etcd mutex (`dlock-etcd`): one session lease per locker kept alive by core's renewal
//! driver, one key per contender under the lock's range, the lowest create revision holds,
//! a waiter watches its predecessor's deletion and re-reads, the fencing token is the key's
//! create revision; and the session's move to a lease granted in a new raft term
//! (`relocate.rs`), the mitigation of etcd's stale-lessor bug (etcd-io/etcd#15247).
//!
//! The cluster is one linearizable store: a store revision, leases (expiry), keys (create
//! revision, lease) and watches. A leader change raises the raft term and restarts every
//! lease's TTL (the new leader's lessor `Promote`, its election timeout abstracted to 0). The
//! stale-lessor bug is modelled as the README's scenario: the leader that granted client 0's
//! session was stopped at time 0 and deposed (client 1's locker started after the election,
//! its lease is of the new term); it resumes `stall` = TTL later and revokes every lease it
//! knew whose expiry passed on its stale lessor. A lease granted after it was deposed is
//! unknown to it: that is what the move relies on.
//!
//! Clients: each starts with its session lease granted at time 0 (`session()` in
//! `grant.rs`) and renewed every TTL/3 by one keep-alive (`renew.rs` `Backend::renew`,
//! `session.rs` `KeepAlive::renew`); the deadline of every lock of the session is the send
//! time of the last acknowledged keep-alive + TTL − drift (`RenewalDriver::deadline_from`,
//! `Session::last_ack_start` at the grant); `lost()` fires a margin (drift + TTL/10) before
//! it; a round that sees a higher raft term spawns the move (`spawn_relocation`) and extends
//! the deadline; while the move holds `moving` for writing, rounds send nothing
//! (`Renewal::Retry`), enqueues and grants wait. A move's lost or unanswered request ends
//! it as the code does (a grant without answer: `Err`, the next round moves again; a key
//! move without answer: the key counts as lost and `switch`; the old lease is revoked only
//! when every key moved, else left to expire, as it may still carry a held key); a leader
//! change or a crash may come between any two of its steps. Messages are reordered (any
//! message in flight may be delivered next), lost and duplicated (a duplicate is a hedged
//! attempt applied twice) within a budget; a holder may crash.
//!
//! Properties: one believer at a time (`now < deadline`); tokens (create revisions)
//! increase in grant order; a fenced resource that keeps the highest token never accepts a
//! write of an earlier grant after a later one's; in the fair configuration (every due step
//! is taken before time passes, nothing lost), a waiter is granted within
//! max(hold, TTL) + slack of its enqueue or of the last leader change, and a crashed holder's
//! lock goes to a waiter within TTL + slack of the crash or of the last leader change (a
//! leader change restarts the TTL of every lease, the crashed holder's too).
//!
//! Where it abstracts the code: time is whole units (TTL = 9, drift 1, margin 1; the
//! server's clock is the clients' — the lease model covers drift and delay against the
//! deadline); at the quick bound every message is delivered within the unit it was sent in
//! (in any order), at the full bound the fair configurations' messages take up to one unit;
//! processes do not pause beyond the time unit (pauses multiplied the state space past any
//! budget; a step that is not due — a request's timeout, a move's failure — may still wait
//! indefinitely); one lock name, one key per client, one acquire per client; the clients are
//! alike, so client 1 enqueues only after client 0 did (symmetry); a client whose session
//! ends stops (the code grants a new session and queues again); a client done with its
//! acquire closes its locker (its session is no longer renewed); the waiter's
//! watch-then-re-read (`wait_turn`: `open_watch` + `recheck`) is one request, registered
//! atomically with the read (the code's polls during etcd's resync period cover a write
//! landing between the two), and a watch event is never lost (a broken stream makes the code
//! re-read); the enqueue's "key existed" re-read is in the same request; a release whose
//! delete is lost is not retried (the code retries in the background; safety does not depend
//! on it); a request is sent again only once nothing of it is in flight; the keys the move
//! takes are the client's key with its create revision as guard when held at the move
//! (the code captures the held keys when the round spawns the move); the
//! listing/reconciliation beside the keep-alive is left out (it only deletes orphans and
//! confirms hand-deleted keys).

use stateright::{Model, Property};

use crate::check::{Bound, Case, Outcome, explore};
use crate::net::{Net, Sent};

/// Clients.
const N: usize = 2;

/// Which code the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The code as it is.
    Today,
    /// A negative control: the renewal rounds keep sending keep-alives to the old lease while
    /// the session moves (no `Renewal::Retry` while `moving` is held for writing), extending
    /// the deadline past the new lease's expiry.
    KeepAliveDuringMove,
    /// A negative control: the move deletes the key and creates it again on the new lease
    /// (instead of a put with `ignore_value` guarded by the old lease), so the key gets a new
    /// create revision: the old key is gone before the new one exists.
    MoveRecreatesKey,
    /// A negative control: no move on a new raft term (the code before the mitigation).
    NoRelocation,
    /// A negative control, the code before this model found it: a move that had no answer
    /// for a held key still revokes the old lease at once, deleting the key while its holder
    /// believes until its next round.
    RevokeAfterLostMove,
}

/// The etcd model's parameters.
#[derive(Debug, Clone)]
pub struct EtcdModel {
    /// The session lease's TTL in units.
    pub ttl: u8,
    /// The longest a message may travel.
    pub max_delay: u8,
    /// Time stops here.
    pub horizon: u8,
    /// Acquires per client.
    pub attempts: u8,
    /// Losses and duplications.
    pub faults_budget: u8,
    /// Leader changes.
    pub leader_changes: u8,
    /// Faults on (loss, duplication, pauses); off: fair scheduling, nothing lost.
    pub faults: bool,
    /// The stale-lessor bug: the deposed leader resumes after this long and revokes.
    pub stale_leader: Option<u8>,
    /// In the fair configuration a holder releases after holding this long.
    pub hold: u8,
    /// A holder may crash (once).
    pub crash: bool,
    /// Processes pause: no step is forced on time (otherwise a due step is urgent).
    pub pauses: bool,
    /// Which code runs.
    pub variant: Variant,
}

/// A message in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    /// When it was sent.
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

/// What a message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// `Etcd::enqueue`: create our key on `lease` unless it exists, read the key below it.
    Enqueue {
        /// The session's current lease.
        lease: u8,
    },
    /// Reply: our key's create revision and whether a key is below it.
    Queued {
        /// Create revision.
        rev: u8,
        /// A predecessor exists.
        behind: bool,
    },
    /// Reply: "lease not found".
    SessionGone,
    /// `wait_turn`: watch the predecessor from now, then `recheck`.
    Wait {
        /// Our key's create revision.
        rev: u8,
    },
    /// Reply to `Wait`: no key below ours.
    Owner {
        /// Our key's create revision.
        rev: u8,
    },
    /// Reply to `Wait`: still behind a key (now watched).
    Behind {
        /// Our key's create revision.
        rev: u8,
    },
    /// Reply to `Wait`: our key is gone.
    KeyGone {
        /// Our key's create revision.
        rev: u8,
    },
    /// A watch event: the watched predecessor was deleted.
    Event {
        /// The waiter's key's create revision.
        rev: u8,
    },
    /// `KeepAlive::renew`: one keep-alive.
    KeepAlive {
        /// The lease.
        lease: u8,
        /// The round's start.
        start: u8,
    },
    /// Reply: extended (TTL > 0), with the raft term of the reply's header.
    Alive {
        /// The round's start.
        start: u8,
        /// Raft term.
        term: u8,
    },
    /// Reply: TTL ≤ 0 / "lease not found".
    Gone {
        /// The round's start.
        start: u8,
    },
    /// `relocate`: "lease grant (new raft term)".
    Grant,
    /// Reply: the new lease and the term it was granted in.
    Granted {
        /// The new lease.
        lease: u8,
        /// Raft term.
        term: u8,
    },
    /// `move_batch` / `move_one`: re-attach our key from `old` to `new`.
    Move {
        /// The old lease.
        old: u8,
        /// The new lease.
        new: u8,
        /// The held key's create revision (`None`: a queue key).
        rev: Option<u8>,
    },
    /// Reply: whether the key is on the new lease.
    Moved {
        /// Moved.
        ok: bool,
    },
    /// `Etcd::revoke` of the old lease after a move.
    Revoke {
        /// The lease.
        lease: u8,
    },
    /// `Backend::release`: `delete_guarded` by create revision.
    Release {
        /// Create revision.
        rev: u8,
    },
    /// A write to the fenced resource.
    Write {
        /// The fencing token.
        token: u8,
        /// The grant's place in grant order.
        seq: u8,
    },
}

/// A lease at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseRec {
    /// Expiry on the server's clock.
    pub expiry: u8,
    /// Not revoked or expired.
    pub alive: bool,
}

/// A key under the lock's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// Create revision.
    pub rev: u8,
    /// Attached lease.
    pub lease: u8,
}

/// The move of the session (`relocate.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reloc {
    /// No move.
    Idle,
    /// `spawn_relocation` ran; the task has not taken `moving` yet.
    Spawned,
    /// `moving` held for writing; the lease grant is out.
    Granting,
    /// The keys' move to `new` (granted in `term`) is out.
    Moving {
        /// The new lease.
        new: u8,
        /// Its term.
        term: u8,
    },
}

/// A client's session (`Session`, `KeepAlive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sess {
    /// The lease the keys are attached to now.
    pub lease: u8,
    /// The term it was granted in.
    pub term: u8,
    /// The deadline of every lock of the session.
    pub deadline: u8,
    /// Start of the round that last extended it.
    pub extended: u8,
    /// Start of the outstanding round.
    pub round: Option<u8>,
    /// Ended (lost or gone).
    pub ended: bool,
    /// The move.
    pub reloc: Reloc,
    /// Our key was lost by a move since it was enqueued (`lost_since`).
    pub key_lost: bool,
}

/// Where a client's acquire is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not acquiring.
    Idle,
    /// The enqueue transaction is out.
    Enqueuing,
    /// Behind a predecessor: `asked` a `Wait` is out; `woke` an event came meanwhile.
    Waiting {
        /// Our key's create revision.
        rev: u8,
        /// A `Wait` is out.
        asked: bool,
        /// An event arrived while it was out.
        woke: bool,
    },
    /// A read showed no key below ours; the grant is next.
    Owner {
        /// Our key's create revision.
        rev: u8,
    },
    /// Granted.
    Holding {
        /// The fencing token.
        rev: u8,
        /// Place in grant order.
        seq: u8,
        /// Wrote to the resource.
        wrote: bool,
        /// When granted.
        since: u8,
    },
    /// Finished (released with no attempts left, or its session ended).
    Done,
    /// Crashed.
    Crashed {
        /// When.
        at: u8,
    },
}

/// A client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its session.
    pub sess: Sess,
    /// Its acquire.
    pub phase: Phase,
    /// Acquires left.
    pub attempts: u8,
    /// When its current acquire started (cleared at the grant).
    pub waiting_since: Option<u8>,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Global time.
    pub now: u8,
    /// Raft term.
    pub term: u8,
    /// Store revision.
    pub rev: u8,
    /// Leases by id.
    pub leases: Vec<LeaseRec>,
    /// Each client's key.
    pub keys: [Option<Key>; N],
    /// Each client's watch: the watched key's (client, create revision).
    pub watches: [Option<(u8, u8)>; N],
    /// The deposed, paused leader: when it was deposed and its lessor's expiries.
    pub stale: Option<(u8, Vec<u8>)>,
    /// Clients.
    pub clients: [Client; N],
    /// Messages in flight (sorted).
    pub net: Net<Msg>,
    /// Losses/duplications left.
    pub faults_left: u8,
    /// Leader changes left.
    pub changes_left: u8,
    /// The last leader change.
    pub last_change: Option<u8>,
    /// Grants so far.
    pub grants: u8,
    /// The last grant's token and holder.
    pub last_grant: Option<(u8, u8)>,
    /// A grant's token was not above the previous one's.
    pub token_regressed: bool,
    /// The resource: highest token accepted and its grant's place.
    pub resource: Option<(u8, u8)>,
    /// The resource accepted a write of an earlier grant after a later one's.
    pub stale_write: bool,
    /// The lock passed from one client to another.
    pub handoff: bool,
    /// A crashed holder's lock was granted again.
    pub regranted: bool,
    /// A held key moved to a lease of a new term.
    pub moved_held: bool,
    /// The stale leader resumed (and revoked what it thought expired) while a holder held.
    pub stale_revoked: bool,
}

/// A step, named after the code it models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Time passes one unit; the server expires leases (their keys are deleted).
    Tick,
    /// A new raft leader: the term rises, every lease's TTL restarts (lessor `Promote`).
    LeaderChange,
    /// The deposed leader (stale-lessor bug) resumes and revokes what its clock says expired.
    StaleLeaderResumes,
    /// `Locker::acquire` → `lock_in` → `enqueue_within`: the enqueue transaction.
    SendAcquire(u8),
    /// `enqueue_within`: no answer, sent again on the same key.
    ResendEnqueue(u8),
    /// `wait_turn`: a watch or re-read failed (`Bounds::transient`), open and read again.
    ResendWait(u8),
    /// `attempt`'s grant: `moving.read()`, `is_live`, `lost_since`, `driver.register`.
    Grant(u8),
    /// The holder writes to the fenced resource with its token.
    Write(u8),
    /// `Lease::release` → `Backend::release` (`delete_guarded`).
    Release(u8),
    /// `Backend::renew`: the renewal round's keep-alive (`KeepAlive::renew`).
    KeepAlive(u8),
    /// The deadline less the loss margin passed: `lost()` fires, the session ends.
    Lost(u8),
    /// `relocate`: `moving.write()`, then "lease grant (new raft term)".
    RelocateBegin(u8),
    /// `relocate`: the grant had no answer (`Err`): the next round moves again.
    RelocateFails(u8),
    /// `move_batch`: no answer, the keys count as lost; `switch`; the old lease is left to
    /// expire (it may still carry the key).
    MoveUnanswered(u8),
    /// The client's process dies.
    Crash(u8),
    /// A message arrives.
    Deliver(Msg),
    /// A message is lost.
    Lose(Msg),
    /// A message is duplicated.
    Duplicate(Msg),
}

impl EtcdModel {
    fn period(&self) -> u8 {
        self.ttl / 3
    }

    fn drift(&self) -> u8 {
        1
    }

    fn margin(&self) -> u8 {
        self.drift() + self.ttl / 10
    }

    /// The slack a handoff takes beyond the lease: the release or expiry, the event, the re-read,
    /// and a move of the waiter's session in between.
    fn slack(&self) -> u8 {
        8 * self.max_delay + 2
    }

    fn wait_bound(&self) -> u8 {
        self.hold.max(self.ttl) + self.slack() + 2
    }

    fn believes(s: &State, i: usize) -> bool {
        let c = &s.clients[i];
        matches!(c.phase, Phase::Holding { .. }) && !c.sess.ended && s.now < c.sess.deadline
    }

    fn write_held(c: &Client) -> bool {
        matches!(c.sess.reloc, Reloc::Granting | Reloc::Moving { .. })
    }

    fn in_flight(s: &State, i: usize, f: impl Fn(&Body) -> bool) -> bool {
        s.net.iter().any(|m| m.client as usize == i && f(&m.body))
    }

    fn round_due(&self, s: &State, i: usize) -> bool {
        let c = &s.clients[i];
        let live = !c.sess.ended
            && !matches!(c.phase, Phase::Done | Phase::Crashed { .. })
            && s.now >= c.sess.extended + self.period();
        let free = c.sess.round.is_none()
            || !Self::in_flight(s, i, |b| {
                matches!(
                    b,
                    Body::KeepAlive { .. } | Body::Alive { .. } | Body::Gone { .. }
                )
            });
        let not_moving = !Self::write_held(c) || self.variant == Variant::KeepAliveDuringMove;
        live && free && not_moving
    }

    fn enqueue_out(s: &State, i: usize) -> bool {
        Self::in_flight(s, i, |b| {
            matches!(
                b,
                Body::Enqueue { .. } | Body::Queued { .. } | Body::SessionGone
            )
        })
    }

    fn reloc_can_begin(s: &State, i: usize) -> bool {
        let c = &s.clients[i];
        c.sess.reloc == Reloc::Spawned
            && c.sess.round.is_none()
            && !c.sess.ended
            && !Self::enqueue_out(s, i)
            && !matches!(c.phase, Phase::Crashed { .. } | Phase::Done)
    }

    /// The steps a fair scheduler must take before time passes.
    fn due(&self, s: &State, i: usize) -> bool {
        let c = &s.clients[i];
        if c.sess.ended || matches!(c.phase, Phase::Done | Phase::Crashed { .. }) {
            return false;
        }
        if s.now + self.margin() >= c.sess.deadline {
            return true;
        }
        if self.round_due(s, i) || Self::reloc_can_begin(s, i) {
            return true;
        }
        match c.phase {
            Phase::Idle => c.attempts > 0 && (i == 0 || s.clients[0].phase != Phase::Idle),
            Phase::Owner { .. } => !Self::write_held(c),
            Phase::Holding { wrote, since, .. } => !wrote || s.now >= since + self.hold,
            _ => false,
        }
    }

    fn send(s: &mut State, i: usize, body: Body) {
        let sent = s.now;
        s.net.send(Msg {
            sent,
            client: i as u8,
            body,
        });
    }

    fn delete_key(s: &mut State, j: usize) {
        if s.keys[j].take().is_none() {
            return;
        }
        s.rev += 1;
        let gone = (j as u8, 0);
        for w in 0..N {
            if let Some((k, _)) = s.watches[w]
                && k == gone.0
            {
                s.watches[w] = None;
                if let Phase::Waiting { rev, .. } = s.clients[w].phase {
                    Self::send(s, w, Body::Event { rev });
                }
            }
        }
    }

    fn revoke(s: &mut State, lease: u8) {
        s.leases[lease as usize].alive = false;
        for j in 0..N {
            if s.keys[j].is_some_and(|k| k.lease == lease) {
                Self::delete_key(s, j);
            }
        }
    }

    /// The newest key created before `rev` (`recheck`'s `with_max_create_revision`).
    fn below(s: &State, rev: u8) -> Option<usize> {
        (0..N)
            .filter(|&j| s.keys[j].is_some_and(|k| k.rev < rev))
            .max_by_key(|&j| s.keys[j].map(|k| k.rev))
    }

    fn server(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        let reply = match m.body {
            Body::Enqueue { lease } => {
                if !s.leases[lease as usize].alive {
                    Body::SessionGone
                } else {
                    let rev = match s.keys[i] {
                        Some(k) => k.rev,
                        None => {
                            s.rev += 1;
                            s.keys[i] = Some(Key { rev: s.rev, lease });
                            s.rev
                        }
                    };
                    Body::Queued {
                        rev,
                        behind: Self::below(s, rev).is_some(),
                    }
                }
            }
            Body::Wait { rev } => {
                if s.keys[i].is_none_or(|k| k.rev != rev) {
                    Body::KeyGone { rev }
                } else {
                    match Self::below(s, rev) {
                        None => Body::Owner { rev },
                        Some(j) => {
                            s.watches[i] = Some((j as u8, s.keys[j].map_or(0, |k| k.rev)));
                            Body::Behind { rev }
                        }
                    }
                }
            }
            Body::KeepAlive { lease, start } => {
                let l = &mut s.leases[lease as usize];
                if l.alive {
                    l.expiry = l.expiry.max(s.now + self.ttl);
                    Body::Alive {
                        start,
                        term: s.term,
                    }
                } else {
                    Body::Gone { start }
                }
            }
            Body::Grant => {
                s.leases.push(LeaseRec {
                    expiry: s.now + self.ttl,
                    alive: true,
                });
                Body::Granted {
                    lease: (s.leases.len() - 1) as u8,
                    term: s.term,
                }
            }
            Body::Move { old, new, rev } => {
                let new_alive = s.leases[new as usize].alive;
                let ok = match s.keys[i] {
                    Some(k) if new_alive && k.lease == old && rev.is_none_or(|r| r == k.rev) => {
                        if self.variant == Variant::MoveRecreatesKey {
                            Self::delete_key(s, i);
                            s.rev += 1;
                            s.keys[i] = Some(Key {
                                rev: s.rev,
                                lease: new,
                            });
                        } else {
                            s.keys[i] = Some(Key {
                                rev: k.rev,
                                lease: new,
                            });
                        }
                        true
                    }
                    Some(k) => k.lease == new && rev.is_none_or(|r| r == k.rev),
                    None => false,
                };
                Body::Moved { ok }
            }
            Body::Revoke { lease } => {
                Self::revoke(s, lease);
                return;
            }
            Body::Release { rev } => {
                if s.keys[i].is_some_and(|k| k.rev == rev) {
                    Self::delete_key(s, i);
                }
                return;
            }
            Body::Write { token, seq } => {
                match s.resource {
                    Some((top, top_seq)) if token < top => {
                        let _ = top_seq;
                    }
                    Some((_, top_seq)) => {
                        if seq < top_seq {
                            s.stale_write = true;
                        }
                        s.resource = Some((token, seq));
                    }
                    None => s.resource = Some((token, seq)),
                }
                return;
            }
            _ => return,
        };
        Self::send(s, i, reply);
    }

    fn end_session(s: &mut State, i: usize) {
        let c = &mut s.clients[i];
        c.sess.ended = true;
        c.phase = Phase::Done;
        c.waiting_since = None;
    }

    fn enqueue(s: &mut State, i: usize) {
        let c = &mut s.clients[i];
        c.phase = Phase::Enqueuing;
        c.sess.key_lost = false;
        let lease = c.sess.lease;
        Self::send(s, i, Body::Enqueue { lease });
    }

    fn switch(&self, s: &mut State, i: usize, new: u8, term: u8, lost: bool) {
        let c = &mut s.clients[i];
        let old = c.sess.lease;
        c.sess.lease = new;
        c.sess.term = term;
        c.sess.reloc = Reloc::Idle;
        c.sess.key_lost |= lost;
        if !lost || self.variant == Variant::RevokeAfterLostMove {
            Self::send(s, i, Body::Revoke { lease: old });
        }
    }

    fn client(&self, s: &mut State, m: &Msg) {
        let i = m.client as usize;
        let c = s.clients[i];
        if c.sess.ended || matches!(c.phase, Phase::Done | Phase::Crashed { .. }) {
            return;
        }
        match (c.phase, m.body) {
            (Phase::Enqueuing, Body::Queued { rev, behind }) => {
                if behind {
                    s.clients[i].phase = Phase::Waiting {
                        rev,
                        asked: true,
                        woke: false,
                    };
                    Self::send(s, i, Body::Wait { rev });
                } else {
                    s.clients[i].phase = Phase::Owner { rev };
                }
            }
            (Phase::Enqueuing, Body::SessionGone) => Self::end_session(s, i),
            (Phase::Waiting { rev, asked, woke }, body) => match body {
                Body::Owner { rev: r } if r == rev && asked => {
                    s.clients[i].phase = Phase::Owner { rev };
                }
                Body::KeyGone { rev: r } if r == rev && asked => Self::enqueue(s, i),
                Body::Behind { rev: r } if r == rev && asked => {
                    if woke {
                        s.clients[i].phase = Phase::Waiting {
                            rev,
                            asked: true,
                            woke: false,
                        };
                        Self::send(s, i, Body::Wait { rev });
                    } else {
                        s.clients[i].phase = Phase::Waiting {
                            rev,
                            asked: false,
                            woke: false,
                        };
                    }
                }
                Body::Event { rev: r } if r == rev => {
                    if asked {
                        s.clients[i].phase = Phase::Waiting {
                            rev,
                            asked: true,
                            woke: true,
                        };
                    } else {
                        s.clients[i].phase = Phase::Waiting {
                            rev,
                            asked: true,
                            woke,
                        };
                        Self::send(s, i, Body::Wait { rev });
                    }
                }
                _ => self.session_reply(s, i, m),
            },
            _ => self.session_reply(s, i, m),
        }
    }

    /// Replies to the session's own requests: keep-alive rounds and the move.
    fn session_reply(&self, s: &mut State, i: usize, m: &Msg) {
        let c = s.clients[i];
        match m.body {
            Body::Alive { start, term } if c.sess.round == Some(start) => {
                s.clients[i].sess.round = None;
                // `cell.extend` refuses once `lost_at` passed: a late reply never resurrects.
                if s.now + self.margin() >= c.sess.deadline {
                    Self::end_session(s, i);
                    return;
                }
                if matches!(c.phase, Phase::Holding { .. }) && c.sess.key_lost {
                    // `lost_since`: the held key was gone when the session moved.
                    let cl = &mut s.clients[i];
                    cl.phase = Phase::Done;
                    cl.sess.ended = true;
                    return;
                }
                let sess = &mut s.clients[i].sess;
                sess.deadline = sess.deadline.max(start + self.ttl - self.drift());
                sess.extended = sess.extended.max(start);
                if term > sess.term
                    && sess.reloc == Reloc::Idle
                    && self.variant != Variant::NoRelocation
                {
                    sess.reloc = Reloc::Spawned;
                }
            }
            Body::Gone { start } if c.sess.round == Some(start) => Self::end_session(s, i),
            Body::Granted { lease, term } if c.sess.reloc == Reloc::Granting => {
                // The keys this locker owns: a queue key (slot taken) or a held one.
                let rev = match c.phase {
                    Phase::Holding { rev, .. } => Some(Some(rev)),
                    Phase::Enqueuing | Phase::Waiting { .. } | Phase::Owner { .. } => Some(None),
                    _ => None,
                };
                match rev {
                    Some(rev) => {
                        s.clients[i].sess.reloc = Reloc::Moving { new: lease, term };
                        let old = c.sess.lease;
                        Self::send(
                            s,
                            i,
                            Body::Move {
                                old,
                                new: lease,
                                rev,
                            },
                        );
                    }
                    None => self.switch(s, i, lease, term, false),
                }
            }
            Body::Moved { ok } => {
                if let Reloc::Moving { new, term } = c.sess.reloc {
                    if ok && matches!(c.phase, Phase::Holding { .. }) {
                        s.moved_held = true;
                    }
                    self.switch(s, i, new, term, !ok);
                }
            }
            _ => {}
        }
    }

    fn grant(&self, s: &mut State, i: usize, rev: u8) {
        let now = if self.faults { 0 } else { s.now };
        if let Some((last, holder)) = s.last_grant {
            if rev <= last {
                s.token_regressed = true;
            }
            if holder as usize != i {
                s.handoff = true;
                if s.clients
                    .iter()
                    .any(|c| matches!(c.phase, Phase::Crashed { .. }))
                {
                    s.regranted = true;
                }
            }
        }
        s.last_grant = Some((rev, i as u8));
        let seq = s.grants;
        s.grants += 1;
        let c = &mut s.clients[i];
        c.waiting_since = None;
        c.phase = Phase::Holding {
            rev,
            seq,
            wrote: false,
            since: now,
        };
    }
}

impl Model for EtcdModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let sess = |i: u8| Sess {
            lease: i,
            term: 1,
            deadline: self.ttl - self.drift(),
            extended: 0,
            round: None,
            ended: false,
            reloc: Reloc::Idle,
            key_lost: false,
        };
        // With the stale-lessor bug, the leader that granted client 0's session (term 1) was
        // stopped at time 0 and deposed; client 1's locker started after the election (its
        // session lease is of term 2, unknown to the stale leader).
        let stale = self.stale_leader.is_some();
        let mut clients: [Client; N] = std::array::from_fn(|i| Client {
            sess: sess(i as u8),
            phase: Phase::Idle,
            attempts: self.attempts,
            waiting_since: None,
        });
        if stale {
            clients[1].sess.term = 2;
        }
        vec![State {
            now: 0,
            term: if stale { 2 } else { 1 },
            rev: 1,
            leases: vec![
                LeaseRec {
                    expiry: self.ttl,
                    alive: true,
                };
                N
            ],
            keys: [None; N],
            watches: [None; N],
            stale: stale.then(|| (0, vec![self.ttl])),
            clients,
            net: Net::default(),
            faults_left: if self.faults { self.faults_budget } else { 0 },
            changes_left: self.leader_changes,
            last_change: None,
            grants: 0,
            last_grant: None,
            token_regressed: false,
            resource: None,
            stale_write: false,
            handoff: false,
            regranted: false,
            moved_held: false,
            stale_revoked: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let overdue = s.net.overdue(s.now, self.max_delay);
        let urgent = !self.pauses && (0..N).any(|i| self.due(s, i));
        if !overdue && !urgent && s.now < self.horizon {
            actions.push(Action::Tick);
        }
        if s.changes_left > 0 {
            actions.push(Action::LeaderChange);
        }
        if let (Some(stall), Some((at, _))) = (self.stale_leader, &s.stale)
            && s.now >= at + stall
        {
            actions.push(Action::StaleLeaderResumes);
        }
        let crashed = s
            .clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Crashed { .. }));
        for i in 0..N {
            let c = &s.clients[i];
            let a = i as u8;
            if c.sess.ended || matches!(c.phase, Phase::Done | Phase::Crashed { .. }) {
                continue;
            }
            if self.round_due(s, i) {
                actions.push(Action::KeepAlive(a));
            }
            if s.now + self.margin() >= c.sess.deadline {
                actions.push(Action::Lost(a));
            }
            if Self::reloc_can_begin(s, i) {
                actions.push(Action::RelocateBegin(a));
            }
            if c.sess.reloc == Reloc::Granting
                && !Self::in_flight(s, i, |b| matches!(b, Body::Grant | Body::Granted { .. }))
            {
                actions.push(Action::RelocateFails(a));
            }
            if matches!(c.sess.reloc, Reloc::Moving { .. })
                && !Self::in_flight(s, i, |b| {
                    matches!(b, Body::Move { .. } | Body::Moved { .. })
                })
            {
                actions.push(Action::MoveUnanswered(a));
            }
            match c.phase {
                // Symmetry: the clients are alike, so client 1 enqueues after client 0 did.
                Phase::Idle
                    if c.attempts > 0
                        && !Self::write_held(c)
                        && (i == 0 || s.clients[0].phase != Phase::Idle) =>
                {
                    actions.push(Action::SendAcquire(a));
                }
                Phase::Enqueuing if !Self::write_held(c) && !Self::enqueue_out(s, i) => {
                    actions.push(Action::ResendEnqueue(a));
                }
                Phase::Waiting { asked: true, .. }
                    if !Self::in_flight(s, i, |b| {
                        matches!(
                            b,
                            Body::Wait { .. }
                                | Body::Owner { .. }
                                | Body::Behind { .. }
                                | Body::KeyGone { .. }
                        )
                    }) =>
                {
                    actions.push(Action::ResendWait(a));
                }
                Phase::Owner { .. } if !Self::write_held(c) => actions.push(Action::Grant(a)),
                Phase::Holding { wrote, since, .. } => {
                    if !wrote {
                        actions.push(Action::Write(a));
                    }
                    if self.pauses || s.now >= since + self.hold {
                        actions.push(Action::Release(a));
                    }
                    if self.crash && !crashed {
                        actions.push(Action::Crash(a));
                    }
                }
                _ => {}
            }
        }
        for m in s.net.distinct() {
            actions.push(Action::Deliver(m.clone()));
            if s.faults_left > 0 && !matches!(m.body, Body::Event { .. }) {
                actions.push(Action::Lose(m.clone()));
                actions.push(Action::Duplicate(m.clone()));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        match action {
            Action::Tick => {
                s.now += 1;
                for l in 0..s.leases.len() {
                    if s.leases[l].alive && s.leases[l].expiry <= s.now {
                        Self::revoke(&mut s, l as u8);
                    }
                }
            }
            Action::LeaderChange => {
                s.changes_left -= 1;
                s.term += 1;
                if !self.faults {
                    s.last_change = Some(s.now);
                }
                let until = s.now + self.ttl;
                for l in s.leases.iter_mut().filter(|l| l.alive) {
                    l.expiry = l.expiry.max(until);
                }
            }
            Action::StaleLeaderResumes => {
                let (_, expiries) = s.stale.take()?;
                s.stale_revoked |= (0..N).any(|i| Self::believes(&s, i));
                for (l, exp) in expiries.into_iter().enumerate() {
                    if s.leases[l].alive && exp <= s.now {
                        Self::revoke(&mut s, l as u8);
                    }
                }
            }
            Action::SendAcquire(i) => {
                let c = &mut s.clients[i as usize];
                c.attempts -= 1;
                c.waiting_since = (!self.faults).then_some(s.now);
                Self::enqueue(&mut s, i as usize);
            }
            Action::ResendEnqueue(i) => Self::enqueue(&mut s, i as usize),
            Action::ResendWait(i) => {
                if let Phase::Waiting { rev, .. } = s.clients[i as usize].phase {
                    Self::send(&mut s, i as usize, Body::Wait { rev });
                }
            }
            Action::Grant(i) => {
                let i = i as usize;
                let c = s.clients[i];
                let Phase::Owner { rev } = c.phase else {
                    return None;
                };
                if s.now + self.margin() >= c.sess.deadline {
                    Self::end_session(&mut s, i);
                } else if c.sess.key_lost {
                    Self::enqueue(&mut s, i);
                } else {
                    self.grant(&mut s, i, rev);
                }
            }
            Action::Write(i) => {
                if let Phase::Holding {
                    rev, seq, wrote, ..
                } = &mut s.clients[i as usize].phase
                {
                    *wrote = true;
                    let body = Body::Write {
                        token: *rev,
                        seq: *seq,
                    };
                    Self::send(&mut s, i as usize, body);
                }
            }
            Action::Release(i) => {
                let i = i as usize;
                if let Phase::Holding { rev, .. } = s.clients[i].phase {
                    Self::send(&mut s, i, Body::Release { rev });
                    let c = &mut s.clients[i];
                    c.phase = if c.attempts > 0 {
                        Phase::Idle
                    } else {
                        Phase::Done
                    };
                }
            }
            Action::KeepAlive(i) => {
                let i = i as usize;
                let start = s.now;
                let c = &mut s.clients[i];
                c.sess.round = Some(start);
                let lease = c.sess.lease;
                Self::send(&mut s, i, Body::KeepAlive { lease, start });
            }
            Action::Lost(i) => Self::end_session(&mut s, i as usize),
            Action::RelocateBegin(i) => {
                s.clients[i as usize].sess.reloc = Reloc::Granting;
                Self::send(&mut s, i as usize, Body::Grant);
            }
            Action::RelocateFails(i) => s.clients[i as usize].sess.reloc = Reloc::Idle,
            Action::MoveUnanswered(i) => {
                if let Reloc::Moving { new, term } = s.clients[i as usize].sess.reloc {
                    self.switch(&mut s, i as usize, new, term, true);
                }
            }
            Action::Crash(i) => {
                let now = s.now;
                let c = &mut s.clients[i as usize];
                c.phase = Phase::Crashed { at: now };
                c.waiting_since = None;
            }
            Action::Deliver(m) => {
                s.net.take(&m)?;
                match m.body {
                    Body::Enqueue { .. }
                    | Body::Wait { .. }
                    | Body::KeepAlive { .. }
                    | Body::Grant
                    | Body::Move { .. }
                    | Body::Revoke { .. }
                    | Body::Release { .. }
                    | Body::Write { .. } => self.server(&mut s, &m),
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
                (0..N).filter(|&i| Self::believes(s, i)).count() <= 1
            }),
            Property::always("tokens increase in grant order", |_, s: &State| {
                !s.token_regressed
            }),
            Property::always("fenced resource refuses stale writes", |_, s: &State| {
                !s.stale_write
            }),
            Property::always("waiter granted within bound", |m: &Self, s: &State| {
                m.faults
                    || s.clients.iter().all(|c| {
                        c.waiting_since.is_none_or(|w| {
                            s.now <= w.max(s.last_change.unwrap_or(0)) + m.wait_bound()
                        })
                    })
            }),
            Property::always(
                "crash released within TTL + slack",
                |m: &Self, s: &State| {
                    let crashed = s.clients.iter().find_map(|c| match c.phase {
                        Phase::Crashed { at } => Some(at),
                        _ => None,
                    });
                    match crashed {
                        Some(at) if !m.faults && !s.regranted => {
                            let waiting = s.clients.iter().any(|c| c.waiting_since.is_some());
                            !waiting
                                || s.now <= at.max(s.last_change.unwrap_or(0)) + m.ttl + m.slack()
                        }
                        _ => true,
                    }
                },
            ),
            Property::sometimes("a handoff", |_, s: &State| s.handoff),
            // Trivially reached where no crash is modelled (the stale-leader configuration).
            Property::sometimes(
                "a crashed holder's lock granted again",
                |m: &Self, s: &State| !m.crash || s.regranted,
            ),
            // Trivially reached where the stale-lessor bug is not modelled.
            Property::sometimes(
                "the stale leader resumed under a holder",
                |m: &Self, s: &State| m.stale_leader.is_none() || s.stale_revoked,
            ),
            Property::sometimes("a held key moved to a new term's lease", |_, s: &State| {
                s.moved_held
            }),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

/// One case's configuration.
#[derive(Clone, Copy)]
struct Config {
    /// Loss and duplication (1 each in all), else nothing is lost.
    faults: bool,
    /// The stale-lessor bug.
    stale: bool,
    /// A holder may crash.
    crash: bool,
    /// How long a holder holds in the fair configuration.
    hold: u8,
    /// At the full bound, messages take up to a unit (fair configurations).
    delay_at_full: bool,
}

fn run(bound: Bound, cfg: Config, variant: Variant) -> Outcome {
    let horizon = match (bound, cfg.faults) {
        (Bound::Quick, true) => 14,
        (Bound::Quick, false) => 14,
        (Bound::Full, true) => 16,
        (Bound::Full, false) => 14,
    };
    let ttl = 9;
    // The full bound lets messages of the fair configurations take a unit, and runs the
    // faulty one longer.
    let (max_delay, faults_budget) = match bound {
        Bound::Quick => (0, u8::from(cfg.faults)),
        Bound::Full if cfg.faults => (0, 1),
        Bound::Full => (u8::from(cfg.delay_at_full), 0),
    };
    let model = EtcdModel {
        ttl,
        max_delay,
        horizon,
        attempts: 1,
        faults_budget,
        leader_changes: u8::from(!cfg.stale),
        faults: cfg.faults,
        stale_leader: cfg.stale.then_some(ttl),
        hold: cfg.hold,
        crash: cfg.crash,
        pauses: false,
        variant,
    };
    let desc = format!(
        "{N} clients × 1 acquire, TTL {ttl}, horizon {horizon}, {}, {}{}{}{}, hold {}",
        if max_delay == 0 {
            "delivered within the unit sent".to_owned()
        } else {
            format!("delay ≤ {max_delay}")
        },
        if cfg.stale { "" } else { "1 leader change" },
        if cfg.crash { ", a crash" } else { "" },
        if cfg.stale {
            "client 0's lease granted by a leader deposed at 0 that resumes at TTL (stale lessor)"
        } else {
            ""
        },
        if cfg.faults {
            format!(", {faults_budget} lost/duplicated")
        } else {
            ", fair, no loss".to_owned()
        },
        cfg.hold
    );
    explore(model, desc)
}

const FAULTS: Config = Config {
    faults: true,
    stale: false,
    crash: true,
    hold: 12,
    delay_at_full: false,
};
const FAIR: Config = Config {
    faults: false,
    stale: false,
    crash: true,
    hold: 4,
    delay_at_full: true,
};
/// The fair configuration for a negative control: its counterexample needs no delay, and
/// delays multiply its state space (38 M states, 5 minutes at the full bound).
const FAIR_CONTROL: Config = Config {
    delay_at_full: false,
    ..FAIR
};
const STALE: Config = Config {
    faults: false,
    stale: true,
    crash: false,
    hold: 10,
    delay_at_full: true,
};

/// The model's name in the table.
const MODEL: &str = "etcd";

/// The etcd model's cases.
pub fn cases() -> Vec<Case> {
    vec![
        Case::holds(MODEL, "today", |b| run(b, FAULTS, Variant::Today)),
        Case::holds(MODEL, "today, fair", |b| run(b, FAIR, Variant::Today)),
        Case::holds(MODEL, "today, stale leader", |b| {
            run(b, STALE, Variant::Today)
        }),
        Case::control(
            MODEL,
            "revoke after a lost move",
            "one believer at a time",
            |b| run(b, FAULTS, Variant::RevokeAfterLostMove),
        ),
        Case::control(MODEL, "no relocation", "one believer at a time", |b| {
            run(b, STALE, Variant::NoRelocation)
        }),
        Case::control(
            MODEL,
            "move re-creates key",
            "one believer at a time",
            |b| run(b, FAIR_CONTROL, Variant::MoveRecreatesKey),
        ),
        Case::control(
            MODEL,
            "keep-alive mid-move",
            "one believer at a time",
            |b| run(b, FAULTS, Variant::KeepAliveDuringMove),
        ),
    ]
}
