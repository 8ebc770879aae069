//! How the suite talks to one backend topology. Each backend crate implements [`TestBackend`]
//! in its `tests/conformance.rs` and hands it to [`conformance_tests!`](crate::conformance_tests).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Capabilities, Election, Error, FencingStrength, FencingToken, LockName, Locker, RwLocker,
    Semaphore,
};

use crate::servers::{Cluster, ServerKind};

/// Options for one test client.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Namespace (key prefix / chroot) the client works in; unique per scenario and run.
    pub namespace: String,
    /// Lease TTL of the client's locker.
    pub ttl: Duration,
    /// When set, the client must reach every server node through these addresses instead of
    /// the nodes' own (index i = node i): a fault proxy sits there.
    pub via: Option<Vec<std::net::SocketAddr>>,
    /// When set, the client's per-request timeout (backends that have one apply it; the slow
    /// reply scenarios delay replies past it).
    pub request_timeout: Option<Duration>,
}

impl ClientOptions {
    /// Options for `namespace` with `ttl`, connecting directly.
    pub fn new(namespace: impl Into<String>, ttl: Duration) -> Self {
        ClientOptions {
            namespace: namespace.into(),
            ttl,
            via: None,
            request_timeout: None,
        }
    }

    /// Use this per-request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Connect through the given proxy addresses (one per node).
    pub fn via(mut self, addrs: Vec<std::net::SocketAddr>) -> Self {
        self.via = Some(addrs);
        self
    }
}

/// The capabilities an enrolment declares it must have: the fixed table in its
/// `tests/conformance.rs`, handed to [`conformance_tests!`](crate::conformance_tests). Every
/// scenario first checks that a client reports exactly these, so a skip gated on a capability
/// is decided by this committed table, not by the backend's own `capabilities()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// [`Capabilities::fair`].
    pub fair: bool,
    /// [`Capabilities::herd_free`].
    pub herd_free: bool,
    /// [`Capabilities::fencing`].
    pub fencing: FencingStrength,
    /// How long after its TTL a crashed holder's lock may still be held: the crash-release
    /// and takeover scenarios judge by this committed figure, never by the backend's own
    /// [`Capabilities::crash_release_slack`] (which must agree with it).
    pub crash_release_slack: Slack,
}

/// A crash-release slack: `fixed` plus `ttl_num / ttl_den` of the TTL (a ZooKeeper session
/// expires on the next tick boundary, and the tick is up to half the timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slack {
    /// The fixed part.
    pub fixed: Duration,
    /// The TTL fraction's numerator.
    pub ttl_num: u32,
    /// The TTL fraction's denominator (never 0).
    pub ttl_den: u32,
}

impl Slack {
    /// A fixed slack.
    pub const fn fixed(fixed: Duration) -> Slack {
        Slack {
            fixed,
            ttl_num: 0,
            ttl_den: 1,
        }
    }

    /// `num / den` of the TTL plus `fixed`.
    pub const fn ttl_fraction_plus(num: u32, den: u32, fixed: Duration) -> Slack {
        Slack {
            fixed,
            ttl_num: num,
            ttl_den: if den == 0 { 1 } else { den },
        }
    }

    /// The slack at `ttl`.
    pub fn at(&self, ttl: Duration) -> Duration {
        self.fixed + ttl * self.ttl_num / self.ttl_den.max(1)
    }
}

impl Declared {
    /// How `caps` of a locker built for `ttl` differ from the declaration (empty when they
    /// match): the flags, the slack, and the crash-release TTL, which must be `ttl` itself or
    /// `ttl` rounded up to whole seconds (etcd's leases), never more.
    pub fn mismatches_at(&self, caps: &Capabilities, ttl: Duration) -> Vec<String> {
        let mut out = self.mismatches(caps);
        let slack = self.crash_release_slack.at(ttl);
        if caps.crash_release_slack != slack {
            out.push(format!(
                "crash_release_slack = {:?} (declared {slack:?} at a TTL of {ttl:?})",
                caps.crash_release_slack
            ));
        }
        let whole = Duration::from_secs(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0));
        let within = caps.crash_release_within;
        if within < ttl || within > whole.max(ttl) {
            out.push(format!(
                "crash_release_within = {within:?} for a TTL of {ttl:?} (at most {whole:?})"
            ));
        }
        out
    }

    /// How `caps` differ from the declared flags (fair, herd-free, fencing; empty when they
    /// match).
    pub fn mismatches(&self, caps: &Capabilities) -> Vec<String> {
        let mut out = Vec::new();
        if caps.fair != self.fair {
            out.push(format!("fair = {} (declared {})", caps.fair, self.fair));
        }
        if caps.herd_free != self.herd_free {
            out.push(format!(
                "herd_free = {} (declared {})",
                caps.herd_free, self.herd_free
            ));
        }
        if caps.fencing != self.fencing {
            out.push(format!(
                "fencing = {:?} (declared {:?})",
                caps.fencing, self.fencing
            ));
        }
        out
    }
}

/// When the server will expire the current holder's entry, as read at the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerExpiry {
    /// The entry expires between `remaining` and `remaining + resolution` after the read
    /// returned (etcd reports whole seconds: resolution 1 s; Redis `PTTL`: 1 ms).
    Remaining {
        /// The remaining time the server reported.
        remaining: Duration,
        /// How much later than `remaining` the real expiry may be.
        resolution: Duration,
    },
    /// The entry never expires by itself (no TTL set): a defect for a lease.
    Never,
    /// Nobody holds the lock at the server.
    NoHolder,
    /// The backend cannot read it; the reason is allowlisted as a skipped part.
    Unreadable(String),
}

/// One backend topology under test (e.g. "redis", "redlock", "etcd-cluster", "memory").
#[async_trait]
pub trait TestBackend: Send + Sync + 'static {
    /// The row name in the report.
    fn name(&self) -> &str;

    /// The server nodes' addresses (for proxies), in node order. Empty for in-process backends.
    fn node_addrs(&self) -> Vec<std::net::SocketAddr>;

    /// A new, independent client (own connection / session).
    ///
    /// # Errors
    /// Whatever building the locker returns.
    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error>;

    /// A new, independent client's [`Election`] ([`TestBackend::client`]'s
    /// [`Locker::into_election`]), or `Ok(None)` when the backend has no election: the
    /// election scenarios then skip, saying so.
    ///
    /// # Errors
    /// Whatever building the client returns.
    async fn election(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Election>>, Error> {
        Ok(self.client(opts).await?.into_election())
    }

    /// A new, independent client's [`RwLocker`], or `Ok(None)` when the backend has no
    /// read-write lock: the read-write scenarios then skip, saying so.
    ///
    /// # Errors
    /// Whatever building the client returns.
    async fn rw(&self, opts: ClientOptions) -> Result<Option<Arc<dyn RwLocker>>, Error> {
        Ok(self.client(opts).await?.into_rw_locker())
    }

    /// A new, independent client's [`Semaphore`], or `Ok(None)` when the backend has no
    /// semaphore: the semaphore scenarios then skip, saying so.
    ///
    /// # Errors
    /// Whatever building the client returns.
    async fn semaphore(&self, opts: ClientOptions) -> Result<Option<Arc<dyn Semaphore>>, Error> {
        Ok(self.client(opts).await?.into_semaphore())
    }

    /// Everything the backend keeps at the server under `namespace` right now (keys, nodes,
    /// queue entries, leases holding locks), for leak audits. Expired entries do not count.
    ///
    /// # Errors
    /// The backend's error when the server cannot be read.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error>;

    /// Breaks the current holder of `name` from the server side (delete its key or node, revoke
    /// its lease), as an operator or a server fault would. Returns the fencing tokens of the
    /// grants it broke — every grant whose entry it deleted on any node (on Redlock one deleted
    /// key can cost a holder its majority) — read in the same step as the break, a grant whose
    /// reply has not reached its client yet included: the history checkers attribute the break
    /// to exactly those holds. Empty when the backend cannot tell; the checkers then attribute
    /// it by timing. `None` when nobody held the lock (nothing was broken).
    ///
    /// # Errors
    /// The backend's error.
    async fn break_holder(
        &self,
        namespace: &str,
        name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error>;

    /// Breaks only the current holder's entry of `name` at the server (delete its key or
    /// node), leaving anything it shares with the holder's other leases alone (an etcd session
    /// lease carries every lock of its locker: revoking it would break them all). By default
    /// [`break_holder`](TestBackend::break_holder). `false` when nobody held the lock.
    ///
    /// # Errors
    /// The backend's error.
    async fn break_entry(&self, namespace: &str, name: &LockName) -> Result<bool, Error> {
        Ok(self.break_holder(namespace, name).await?.is_some())
    }

    /// Environment variables that make a child process (the crash-test holder) reach the same
    /// servers through the `external` provider.
    fn child_env(&self) -> Vec<(String, String)>;

    /// The servers' captured output, printed when a scenario fails. Empty by default.
    fn logs(&self) -> String {
        String::new()
    }

    /// The server kind and node count this backend runs on (`(Redis, 5)` for Redlock,
    /// `(Etcd, 3)` for an etcd cluster). `None` (the default) for in-process backends; the
    /// server-node fault scenarios skip with a printed reason then.
    fn topology(&self) -> Option<(ServerKind, usize)> {
        None
    }

    /// The same backend over another cluster of the same [`topology`](TestBackend::topology):
    /// a private one the server-node fault scenarios kill and pause nodes of (never the shared
    /// one). `None` (the default): those scenarios skip with a printed reason.
    fn on_cluster(&self, cluster: Arc<Cluster>) -> Option<Arc<dyn TestBackend>> {
        let _ = cluster;
        None
    }

    /// Requests the servers have received so far, summed over the nodes (Redis
    /// `INFO commandstats` calls, etcd gRPC requests handled from `/metrics`, ZooKeeper `mntr`
    /// packets received), read with blocking I/O. Includes every other client's traffic to the
    /// same servers. By default it is read from the nodes of [`topology`](TestBackend::topology)
    /// at [`node_addrs`](TestBackend::node_addrs); `None` when the backend has no topology or
    /// a node does not answer.
    fn server_requests(&self) -> Option<u64> {
        let (kind, _) = self.topology()?;
        crate::servers::stats::requests(kind, &self.node_addrs())
    }

    /// When the server expires the current holder of `name` under `namespace` (Redis `PTTL`
    /// of the lock key, etcd `LeaseTimeToLive` of the holder's lease; for Redlock the moment a
    /// majority of nodes is free). [`ServerExpiry::Unreadable`] by default: the scenarios then
    /// run only their client-side checks and report the skipped part.
    ///
    /// # Errors
    /// The backend's error when the server cannot be read.
    async fn server_expiry(&self, namespace: &str, name: &LockName) -> Result<ServerExpiry, Error> {
        let _ = (namespace, name);
        Ok(ServerExpiry::Unreadable(
            "the backend does not read the holder's expiry at the server (TestBackend::server_expiry)".into(),
        ))
    }

    /// Whether the servers keep held locks across a restart of every node (`true` by default:
    /// etcd and ZooKeeper keep their data dirs). A Redis without persistence returns `false`:
    /// a restart then counts as a forced break of every held lease.
    fn restart_keeps_locks(&self) -> bool {
        true
    }

    /// Wake signals the servers have sent so far, summed over the nodes: Redis `PUBLISH`
    /// calls, etcd watch events sent, ZooKeeper watch notifications. Read with blocking I/O.
    ///
    /// # Errors
    /// Why it cannot be read (the default: the backend does not count them).
    fn wake_signals(&self) -> Result<u64, String> {
        Err(
            "the backend does not count wake signals at the server (TestBackend::wake_signals)"
                .into(),
        )
    }
}

/// Sends `request` to `addr` over a plain TCP connection and reads the reply until the server
/// closes it (or 2 s pass): for the servers' text stats (`INFO` + `QUIT`, HTTP/1.0 `/metrics`,
/// ZooKeeper `mntr`). `None` when the server does not answer.
pub fn read_text(addr: std::net::SocketAddr, request: &[u8]) -> Option<String> {
    crate::servers::Transport::Plain.read_text(addr, request)
}

/// Sends one command to the plain Redis server at `addr` (RESP, any bytes in the arguments),
/// then `QUIT`, and returns the command's raw reply (`QUIT`'s `+OK` removed; see
/// [`read_text`]). `None` when the server does not answer.
pub fn redis_command(addr: std::net::SocketAddr, args: &[&str]) -> Option<String> {
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    request.push_str("*1\r\n$4\r\nQUIT\r\n");
    let replies = read_text(addr, request.as_bytes())?;
    Some(match replies.strip_suffix("+OK\r\n") {
        Some(reply) => reply.to_owned(),
        None => replies,
    })
}

/// The sum of every line `<prefix><labels or space> <number>` in `text` (Prometheus samples,
/// `mntr` and `INFO` lines); `None` when no line matches.
pub fn sum_samples(text: &str, prefix: &str) -> Option<u64> {
    let mut total = 0f64;
    let mut seen = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        if let Some(v) = rest
            .rsplit([' ', '\t'])
            .next()
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            total += v;
            seen = true;
        }
    }
    seen.then_some(total as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(slack: Slack) -> Declared {
        Declared {
            fair: true,
            herd_free: true,
            fencing: FencingStrength::Linearizable,
            crash_release_slack: slack,
        }
    }

    /// A backend that raises its own slack, or reports a crash-release TTL beyond the
    /// scenario's (rounded up to a whole second at most), no longer matches its enrolment:
    /// every scenario of the row fails before it runs, so the bounds cannot be loosened in
    /// backend code alone.
    #[test]
    fn the_crash_bounds_come_from_the_declaration() {
        let ms = Duration::from_millis;
        let zk = declared(Slack::ttl_fraction_plus(1, 2, ms(300)));
        let caps = |within, slack| {
            Capabilities::new(within)
                .with_fair_queue(true, true)
                .with_fencing(FencingStrength::Linearizable)
                .with_crash_release_slack(slack)
        };
        assert!(
            zk.mismatches_at(&caps(ms(2000), ms(1300)), ms(2000))
                .is_empty()
        );
        assert_eq!(
            zk.mismatches_at(&caps(ms(2000), ms(1301)), ms(2000)).len(),
            1
        );
        let etcd = declared(Slack::fixed(ms(1000)));
        // etcd rounds 1.5 s up to 2 s: allowed; 3 s is not.
        assert!(
            etcd.mismatches_at(&caps(ms(2000), ms(1000)), ms(1500))
                .is_empty()
        );
        assert_eq!(
            etcd.mismatches_at(&caps(ms(3000), ms(1000)), ms(1500))
                .len(),
            1
        );
        // Shorter than asked is a mismatch too.
        assert_eq!(
            etcd.mismatches_at(&caps(ms(1000), ms(1000)), ms(1500))
                .len(),
            1
        );
        assert_eq!(Slack::fixed(ms(250)).at(ms(10_000)), ms(250));
        assert_eq!(zk.crash_release_slack.at(ms(10_000)), ms(5300));
    }
}
