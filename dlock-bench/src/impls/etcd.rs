//! etcd contenders, each client on its own lease kept alive: the lock floor (the
//! create-if-absent txn and a delete), the read floor, etcd-client's server-side `lock` /
//! `unlock`, and etcd's own election API through etcd-client (`campaign` / `resign`).

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, LockOptions, PutOptions, ResignOptions, Txn, TxnOp,
    TxnOpResponse,
};

use super::{Client, Context, Held, Kind, unique};

/// A lease kept alive by a background task every TTL/3 (as etcd's own Go client does for a
/// `concurrency.Session`), until dropped.
pub struct KeptLease {
    pub id: i64,
    /// The TTL etcd granted.
    pub ttl: Duration,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// A client with its own lease of `ttl` (the same TTL as dlock's leases), granted once before
/// any measurement and kept alive.
pub async fn etcd_client(
    endpoints: &[String],
    ttl: Duration,
) -> Result<(etcd_client::Client, KeptLease), String> {
    let mut c = etcd_client::Client::connect(endpoints, None)
        .await
        .ctx("etcd connect")?;
    let secs = i64::try_from(ttl.as_secs()).unwrap_or(60).max(2);
    let granted = c.lease_grant(secs, None).await.ctx("etcd lease grant")?;
    let id = granted.id();
    let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
    let (mut keeper, mut replies) = c.lease_keep_alive(id).await.ctx("etcd lease keep-alive")?;
    let period = Duration::from_secs(u64::try_from(secs).unwrap_or(2)) / 3;
    let keeper = tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            let sent = keeper.keep_alive().await;
            match (sent, replies.message().await) {
                (Ok(()), Ok(Some(r))) if r.ttl() > 0 => {}
                (sent, reply) => {
                    // The peer's locks go with its lease: say so, the figures are suspect.
                    eprintln!("  etcd lease {id} keep-alive failed: {sent:?} / {reply:?}");
                    return;
                }
            }
        }
    });
    Ok((c, KeptLease { id, ttl, keeper }))
}

/// One etcd client of any contender kind:
/// - `Floor`: a txn (create revision = 0 → put with the lease), then a delete;
/// - `ReadFloor`: one txn that puts the reader's own key (with the lease) under `<name>/read/`
///   and counts the keys under `<name>/write/` (more than 0 is an error: a writer holds or
///   waits), then a delete of the reader's key. No revision guard, no queue order among the
///   readers' keys, no watch;
/// - `Peer`: etcd-client's `lock` / `unlock` on the lease;
/// - `PeerElection`: etcd-client's `campaign` / `resign` on the lease.
///
/// A failed compare, a writer's key and a delete that deleted nothing are errors.
pub struct EtcdClient {
    client: etcd_client::Client,
    lease: KeptLease,
    prefix: String,
    kind: Kind,
}

impl EtcdClient {
    pub async fn new(
        kind: Kind,
        endpoints: &[String],
        prefix: String,
        ttl: Duration,
    ) -> Result<Self, String> {
        let (client, lease) = etcd_client(endpoints, ttl).await?;
        Ok(EtcdClient {
            client,
            lease,
            prefix,
            kind,
        })
    }

    fn floor(&self) -> &'static str {
        if self.kind == Kind::ReadFloor {
            "read floor"
        } else {
            "floor"
        }
    }
}

#[async_trait]
impl Client for EtcdClient {
    async fn acquire(&self, name: &str) -> Result<Held, String> {
        let mut c = self.client.clone();
        let (lease, name) = (self.lease.id, format!("{}{name}", self.prefix));
        let put = |key: &str| TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease)));
        match self.kind {
            Kind::Floor => {
                let when = Compare::create_revision(name.as_str(), CompareOp::Equal, 0);
                let txn = Txn::new().when([when]).and_then([put(&name)]);
                if !c.txn(txn).await.ctx("floor txn")?.succeeded() {
                    return Err(format!("floor txn compare failed: {name} is held"));
                }
                Ok(Box::new(name))
            }
            Kind::ReadFloor => {
                let key = format!("{name}/read/{}", unique());
                let writers = format!("{name}/write/");
                let count = GetOptions::new().with_prefix().with_count_only();
                let txn =
                    Txn::new().and_then([put(&key), TxnOp::get(writers.as_str(), Some(count))]);
                let resp = c.txn(txn).await.ctx("read floor txn")?;
                let writing = resp.op_responses().iter().find_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(g.count()),
                    _ => None,
                });
                match writing {
                    Some(0) => Ok(Box::new(key)),
                    Some(n) => Err(format!("read floor: {n} writer key(s) under {writers}")),
                    None => Err("read floor txn: no count of the writers".to_string()),
                }
            }
            Kind::Peer => {
                let opts = LockOptions::new().with_lease(lease);
                let resp = c.lock(name.as_str(), Some(opts)).await;
                Ok(Box::new(resp.ctx("etcd-client lock")?.key().to_vec()))
            }
            _ => {
                let mut resp = c
                    .campaign(name.as_str(), "bench", lease)
                    .await
                    .ctx("etcd-client campaign")?;
                let leader = resp
                    .take_leader()
                    .ok_or("etcd-client campaign: no leader key")?;
                Ok(Box::new(leader))
            }
        }
    }

    async fn release(&self, held: Held) -> Result<(), String> {
        let mut c = self.client.clone();
        match self.kind {
            Kind::Floor | Kind::ReadFloor => {
                let floor = self.floor();
                let key = held
                    .downcast::<String>()
                    .map_err(|_| format!("{floor} release: not a key"))?;
                let deleted = c.delete(key.as_str(), None).await;
                if deleted.ctx(&format!("{floor} delete"))?.deleted() != 1 {
                    return Err(format!(
                        "{floor} release deleted nothing: {key} was not held"
                    ));
                }
            }
            Kind::Peer => {
                let key = held
                    .downcast::<Vec<u8>>()
                    .map_err(|_| "etcd-client unlock: not a key".to_string())?;
                c.unlock(*key).await.ctx("etcd-client unlock")?;
            }
            _ => {
                let leader = held
                    .downcast::<etcd_client::LeaderKey>()
                    .map_err(|_| "etcd-client resign: not a leader key".to_string())?;
                let opts = ResignOptions::new().with_leader(*leader);
                c.resign(Some(opts)).await.ctx("etcd-client resign")?;
            }
        }
        Ok(())
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.lease.ttl)
    }
}
