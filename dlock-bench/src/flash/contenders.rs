//! The flash-sale contenders: which lock, on which servers, and where its fencing token comes
//! from (if it has one). The clients run in the child processes (`flash/child.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::servers::ServerKind;
use dlock_core::Lease;

use crate::impls::{Client, Context, Held, Impl, Kind, Server, redis_conn};

/// What a contender is, as far as the child needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// The design documents' own Redis lock: `SET key value NX PX ttl` polled, released by a
    /// compare-and-delete script; no renewal, no token.
    Seed,
    /// The peer library of the server family (rslock, etcd-client `lock`, zookeeper-client).
    Peer,
    /// dlock's mutex.
    Dlock,
}

/// One contender of the flash sale.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// The backend label of its rows (`redis`, `redlock`, `etcd`, `zk`).
    pub backend: &'static str,
    /// The `impl` label of its rows.
    pub imp: &'static str,
    pub server: Server,
    pub lock: Lock,
    /// The servers: kind and number of nodes.
    pub kind: ServerKind,
    pub nodes: usize,
    /// Whether its grants carry a fencing token (else the fenced register cannot judge it).
    pub fenced: bool,
    /// The design documents' quoted row, P99 lock latency and conflict rate.
    pub quoted: (&'static str, &'static str, &'static str),
}

const SETNX: (&str, &str, &str) = ("Redis `SET NX`", "2 ms", "0.01%");
const REDLOCK: (&str, &str, &str) = ("Redlock (5 nodes)", "8 ms", "0.03%");
const ETCD: (&str, &str, &str) = ("etcd lease", "12 ms", "0%");
const ZK: (&str, &str, &str) = ("ZooKeeper", "18 ms", "0%");

/// Every contender, in the order of the seed's table (its row, then dlock on the same servers).
pub const ALL: [Spec; 8] = [
    Spec {
        backend: "redis",
        imp: "seed-setnx",
        server: Server::Redis,
        lock: Lock::Seed,
        kind: ServerKind::Redis,
        nodes: 1,
        fenced: false,
        quoted: SETNX,
    },
    Spec {
        backend: "redis",
        imp: "dlock",
        server: Server::Redis,
        lock: Lock::Dlock,
        kind: ServerKind::Redis,
        nodes: 1,
        fenced: true,
        quoted: SETNX,
    },
    Spec {
        backend: "redlock",
        imp: "rslock",
        server: Server::Redlock,
        lock: Lock::Peer,
        kind: ServerKind::Redis,
        nodes: 5,
        fenced: false,
        quoted: REDLOCK,
    },
    Spec {
        backend: "redlock",
        imp: "dlock",
        server: Server::Redlock,
        lock: Lock::Dlock,
        kind: ServerKind::Redis,
        nodes: 5,
        fenced: true,
        quoted: REDLOCK,
    },
    Spec {
        backend: "etcd",
        imp: "etcd-client",
        server: Server::Etcd,
        lock: Lock::Peer,
        kind: ServerKind::Etcd,
        nodes: 3,
        fenced: true,
        quoted: ETCD,
    },
    Spec {
        backend: "etcd",
        imp: "dlock",
        server: Server::Etcd,
        lock: Lock::Dlock,
        kind: ServerKind::Etcd,
        nodes: 3,
        fenced: true,
        quoted: ETCD,
    },
    Spec {
        backend: "zk",
        imp: "zookeeper-client",
        server: Server::Zk,
        lock: Lock::Peer,
        kind: ServerKind::Zk,
        nodes: 3,
        fenced: true,
        quoted: ZK,
    },
    Spec {
        backend: "zk",
        imp: "dlock",
        server: Server::Zk,
        lock: Lock::Dlock,
        kind: ServerKind::Zk,
        nodes: 3,
        fenced: true,
        quoted: ZK,
    },
];

impl Spec {
    /// The id a child is started with: `<backend>/<impl>`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.backend, self.imp)
    }

    /// The contender with this id.
    pub fn by_id(id: &str) -> Option<Spec> {
        ALL.into_iter().find(|s| s.id() == id)
    }

    /// The key prefix (Redis, etcd), base path (ZooKeeper) or namespace (dlock) under `ns`.
    pub fn prefix(&self, ns: &str) -> String {
        match (self.lock, self.server) {
            (Lock::Dlock, _) => format!("{ns}/{}", self.imp),
            (_, Server::Zk) => format!("/{ns}-{}", self.imp),
            _ => format!("{ns}/{}/", self.imp),
        }
    }
}

/// A client of a contender in a child process: acquire hands back the grant's token, if any.
pub struct FlashLock {
    spec: Spec,
    client: Arc<dyn Client>,
    /// etcd-client's `lock` answers with the key only: its create revision (the token) is read
    /// with one more request.
    etcd: Option<etcd_client::Client>,
}

impl FlashLock {
    /// Connects a new client (its own connections, session or lease).
    ///
    /// # Errors
    /// When the servers cannot be reached.
    pub async fn connect(
        spec: Spec,
        at: &[String],
        prefix: &str,
        ttl: Duration,
    ) -> Result<Self, String> {
        let client: Arc<dyn Client> = match spec.lock {
            Lock::Seed => Arc::new(SeedLock::new(at, prefix, ttl).await?),
            Lock::Peer => {
                Impl::new(spec.server, Kind::Peer, at.to_vec(), prefix.to_string())
                    .client(ttl)
                    .await?
            }
            Lock::Dlock => {
                Impl::new(spec.server, Kind::Lock, at.to_vec(), prefix.to_string())
                    .client(ttl)
                    .await?
            }
        };
        let etcd = if spec.lock == Lock::Peer && spec.server == Server::Etcd {
            Some(
                etcd_client::Client::connect(at, None)
                    .await
                    .ctx("etcd connect")?,
            )
        } else {
            None
        };
        Ok(FlashLock { spec, client, etcd })
    }

    /// Takes `name`, waiting as long as it takes; the grant and its token.
    ///
    /// # Errors
    /// When the lock's client fails.
    pub async fn acquire(&self, name: &str) -> Result<Held, String> {
        self.client.acquire(name).await
    }

    /// The fencing token of a grant (`None`: the contender has none).
    ///
    /// # Errors
    /// When etcd cannot be asked for the key's create revision.
    pub async fn token(&self, held: &Held) -> Result<Option<u64>, String> {
        if !self.spec.fenced {
            return Ok(None);
        }
        if let Some(lease) = held.downcast_ref::<Lease>() {
            return Ok(Some(lease.token().get()));
        }
        if let (Some(etcd), Some(key)) = (&self.etcd, held.downcast_ref::<Vec<u8>>()) {
            let got = etcd
                .clone()
                .get(key.as_slice(), None)
                .await
                .ctx("etcd get")?;
            let rev = got.kvs().first().map(|kv| kv.create_revision());
            return rev
                .and_then(|r| u64::try_from(r).ok())
                .map(Some)
                .ok_or("etcd-client lock key vanished".to_string());
        }
        if let Some(path) = held.downcast_ref::<String>() {
            return Ok(Some(sequence_of(path)?));
        }
        Err(format!("{}: no token in its grant", self.spec.id()))
    }

    /// Releases a grant.
    ///
    /// # Errors
    /// When the release fails (a lease lost meanwhile, an expired session).
    pub async fn release(&self, held: Held) -> Result<(), String> {
        self.client.release(held).await
    }
}

/// The sequence number ZooKeeper appended to a sequential node's name: it increases with every
/// child created under the parent, so it is a fencing token per name.
fn sequence_of(path: &str) -> Result<u64, String> {
    let digits = path.len() - path.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    path[path.len() - digits..]
        .parse()
        .map_err(|_| format!("no sequence number in {path}"))
}

/// The seed's lock: `SET key value NX PX ttl` with a value of its own per grant, polled every
/// 0–10 ms (rslock's delay here) while refused; released by a compare-and-delete script. No
/// renewal: a holder past its TTL has lost it without knowing.
struct SeedLock {
    conn: redis::aio::MultiplexedConnection,
    script: redis::Script,
    prefix: String,
    ttl_ms: u64,
}

const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

impl SeedLock {
    async fn new(at: &[String], prefix: &str, ttl: Duration) -> Result<Self, String> {
        let url = at.first().ok_or("no Redis node")?;
        Ok(SeedLock {
            conn: redis_conn(url).await?,
            script: redis::Script::new(COMPARE_AND_DELETE),
            prefix: prefix.to_string(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        })
    }
}

#[async_trait]
impl Client for SeedLock {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let key = format!("{}{name}", self.prefix);
        let value = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = self.conn.clone();
        loop {
            let set = redis::cmd("SET")
                .arg(&key)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(self.ttl_ms)
                .clone();
            let got: Option<String> = set.query_async(&mut conn).await.ctx("seed SET NX")?;
            if got.is_some() {
                return Ok(Box::new((key, value)));
            }
            tokio::time::sleep(Duration::from_micros(super::child::random(10_000))).await;
        }
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let (key, value) = *held
            .downcast::<(String, String)>()
            .map_err(|_| "seed release: not a key".to_string())?;
        let mut call = self.script.key(&key);
        call.arg(&value);
        let deleted: i64 = call
            .invoke_async(&mut self.conn.clone())
            .await
            .ctx("seed release")?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("seed release deleted nothing: {key} had expired"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_one_contender_each() {
        for s in ALL {
            assert_eq!(Spec::by_id(&s.id()).map(|f| f.imp), Some(s.imp));
        }
        assert!(Spec::by_id("redis/nope").is_none());
    }

    #[test]
    fn zookeeper_sequences_are_tokens() {
        assert_eq!(sequence_of("/a/_c_x-lock-0000000042"), Ok(42));
        assert!(sequence_of("/a/lock-").is_err());
    }
}
