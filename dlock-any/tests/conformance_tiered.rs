//! The `tiered` row (module `tiered_row`): the mutex scenarios through a `TieredLocker` over a
//! real Redis (tier `fast`) and a real etcd (tier `strict`) started by the harness. Names
//! starting with `c` or `f` and names under `a/` go to etcd, every other name to Redis, so the
//! scenarios' names (`counter`, `cancel`, `fifo`, `close-*` and `a/b` on etcd; `held`, `busy`,
//! `a`, `ab`, `nested`, `inspect` on Redis) exercise both tiers, and `name_isolation` spans
//! them.
//!
//! Only the mutex scenarios run (`xtask`'s `SUBSET_ROWS`): the router adds no protocol of its
//! own, and each tier's backend runs the whole list in its own rows.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_any::{GUARD_NAME, TieredConfig};
use dlock_conformance::servers::{Cluster, ServerKind};
use dlock_conformance::{ClientOptions, Declared, Slack, TestBackend};
use dlock_core::{Error, FencingStrength, FencingToken, LockName, Locker};
use dlock_etcd::etcd_client::{self, GetOptions};

/// Redis and etcd servers, as one router's two tiers.
struct Tiered {
    redis: Arc<Cluster>,
    etcd: Arc<Cluster>,
}

fn shared(kind: ServerKind) -> Arc<Cluster> {
    Cluster::shared(kind, 1).unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

fn tiered() -> Arc<dyn TestBackend> {
    Arc::new(Tiered {
        redis: shared(ServerKind::Redis),
        etcd: shared(ServerKind::Etcd),
    })
}

/// The router's configuration for one client.
fn config(redis: &Cluster, etcd: &Cluster, namespace: &str, ttl: Duration) -> String {
    let ttl = ttl.as_millis();
    format!(
        r#"
[tiers.fast]
url = "redis://{redis}?ttl={ttl}ms&namespace={namespace}"

[tiers.strict]
url = "etcd://{etcd}?ttl={ttl}ms&namespace={namespace}"

[[routes]]
pattern = "c*"
tier = "strict"

[[routes]]
pattern = "f*"
tier = "strict"

[[routes]]
pattern = "a/*"
tier = "strict"

[[routes]]
pattern = "*"
tier = "fast"
"#,
        redis = redis.addrs()[0],
        etcd = etcd.addrs()[0],
    )
}

fn backend_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::backend(format!("tiered row audit: {what}: {e}"), None)
}

/// The Redis tier's live entries under `namespace`: lock keys with a TTL or none, queue
/// entries whose deadline is ahead. The fence counter, queue deadlines, election records and
/// notification channels outlive their holders by design and do not count.
async fn redis_leftovers(redis: &Cluster, namespace: &str) -> Result<Vec<String>, Error> {
    let client = redis::Client::open(format!("redis://{}", redis.addrs()[0]))
        .map_err(|e| backend_err("redis client", e))?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| backend_err("redis connect", e))?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{namespace}/dlock:*"))
        .query_async(&mut c)
        .await
        .map_err(|e| backend_err("KEYS", e))?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut c)
        .await
        .map_err(|e| backend_err("TIME", e))?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut out = Vec::new();
    for key in keys {
        let by_design = [":fence", ":qt", ":leader", ":changes"];
        if by_design.iter().any(|s| key.ends_with(s)) || key.contains("dlock:notify:") {
            continue;
        }
        if let Some(lock) = key.strip_suffix(":q") {
            let entries: Vec<String> = redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await
                .map_err(|e| backend_err("LRANGE", e))?;
            for entry in entries {
                let deadline: Option<u64> = redis::cmd("HGET")
                    .arg(format!("{lock}:qt"))
                    .arg(&entry)
                    .query_async(&mut c)
                    .await
                    .map_err(|e| backend_err("HGET", e))?;
                if deadline.is_some_and(|d| d > now_ms) {
                    out.push(format!("redis queue {key} {entry}"));
                }
            }
        } else {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .map_err(|e| backend_err("PTTL", e))?;
            if pttl > 0 || pttl == -1 {
                out.push(format!("redis lock {key}"));
            }
        }
    }
    Ok(out)
}

/// The etcd tier's keys under `namespace` (dlock-etcd's default prefix `dlock`).
async fn etcd_leftovers(etcd: &Cluster, namespace: &str) -> Result<Vec<String>, Error> {
    let mut c = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .map_err(|e| backend_err("etcd connect", e))?;
    let resp = c
        .get(
            format!("dlock/{namespace}/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .map_err(|e| backend_err("etcd get", e))?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| format!("etcd {}", String::from_utf8_lossy(kv.key())))
        .collect())
}

#[async_trait]
impl TestBackend for Tiered {
    fn name(&self) -> &str {
        "tiered"
    }

    /// None: no scenario of this row puts a proxy in front of the servers.
    fn node_addrs(&self) -> Vec<std::net::SocketAddr> {
        Vec::new()
    }

    async fn client(&self, opts: ClientOptions) -> Result<Arc<dyn Locker>, Error> {
        let text = config(&self.redis, &self.etcd, &opts.namespace, opts.ttl);
        let router = text.parse::<TieredConfig>()?.connect().await?;
        Ok(router)
    }

    /// Both tiers' entries, except the routers' own drift guard (`dlock-tiers`, one permit
    /// per live client, released by `close` or when the client is dropped): the scenarios
    /// count the entries of their locks, and the guard is not one of them.
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut out = redis_leftovers(&self.redis, namespace).await?;
        out.extend(etcd_leftovers(&self.etcd, namespace).await?);
        out.retain(|k| !k.contains(GUARD_NAME));
        Ok(out)
    }

    /// Not used by this row's scenarios.
    async fn break_holder(
        &self,
        _namespace: &str,
        _name: &LockName,
    ) -> Result<Option<Vec<FencingToken>>, Error> {
        Err(Error::backend(
            "the tiered row breaks no holder (its scenarios need none)",
            None,
        ))
    }

    fn child_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// What the router reports over Redis (fair, slack 250 ms) and etcd (fair, slack 1 s): the
/// weakest of the two.
const TIERED: Declared = Declared {
    fair: true,
    herd_free: true,
    fencing: FencingStrength::Linearizable,
    crash_release_slack: Slack::fixed(Duration::from_millis(1000)),
};

dlock_conformance::conformance_tests!(
    tiered_row,
    tiered(),
    declared = TIERED,
    ttl_scale = 1,
    only = [
        mutual_exclusion => MutualExclusion,
        try_acquire_held => TryAcquireHeld,
        wait_timeout => WaitTimeout,
        release_idempotent => ReleaseIdempotent,
        name_isolation => NameIsolation,
        reentrancy => Reentrancy,
        cancel => Cancel,
        fifo => Fifo,
        close => Close,
        inspect => Inspect,
    ],
);
