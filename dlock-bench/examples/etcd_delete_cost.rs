//! What one delete costs the etcd server, three ways, for issue 15's `locks-1000` bound: 1,000
//! keys (each on one lease, as lock keys are) are created concurrently, then deleted
//! concurrently by a revision-guarded txn (dlock's release), a txn without a compare, or a
//! plain `DeleteRange` (the floor's and etcd-client's unlock). Three rounds of each, interleaved.
//!
//! ```sh
//! DLOCK_ETCD_ENDPOINTS=http://127.0.0.1:2379 cargo run --release -p dlock-bench --example etcd_delete_cost
//! ```
//!
//! Writes only under `dlock-bench-probe/`, and deletes what it wrote.

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

const KEYS: usize = 1000;
const ROUNDS: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Delete {
    /// `Txn(create_revision == rev → delete)`: dlock's release.
    Guarded,
    /// `Txn(→ delete)`: the txn without its compare.
    TxnOnly,
    /// `DeleteRange`: the floor's release.
    Plain,
}

fn key(i: usize) -> String {
    format!("dlock-bench-probe/{i}")
}

async fn create_all(c: &Client, lease: i64) -> Result<Vec<i64>, etcd_client::Error> {
    let puts = (0..KEYS).map(|i| {
        let mut kv = c.kv_client();
        async move {
            let k = key(i);
            let txn = Txn::new()
                .when([Compare::create_revision(k.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    k.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let resp = kv.txn(txn).await?;
            Ok(resp.header().map_or(0, |h| h.revision()))
        }
    });
    futures::future::join_all(puts).await.into_iter().collect()
}

async fn delete_all(c: &Client, how: Delete, revs: &[i64]) -> Result<(), etcd_client::Error> {
    let deletes = revs.iter().enumerate().map(|(i, &rev)| {
        let mut kv = c.kv_client();
        async move {
            let k = key(i);
            match how {
                Delete::Guarded => {
                    let txn = Txn::new()
                        .when([Compare::create_revision(k.as_str(), CompareOp::Equal, rev)])
                        .and_then([TxnOp::delete(k.as_str(), None)]);
                    kv.txn(txn).await.map(drop)
                }
                Delete::TxnOnly => {
                    let txn = Txn::new().and_then([TxnOp::delete(k.as_str(), None)]);
                    kv.txn(txn).await.map(drop)
                }
                Delete::Plain => kv.delete(k, None).await.map(drop),
            }
        }
    });
    futures::future::join_all(deletes)
        .await
        .into_iter()
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), etcd_client::Error> {
    let endpoints = std::env::var("DLOCK_ETCD_ENDPOINTS")
        .unwrap_or_else(|_| "http://127.0.0.1:2379".to_string());
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let c = Client::connect(endpoints, None).await?;
    let lease = c.lease_client().grant(60, None).await?.id();
    let kinds = [Delete::Guarded, Delete::TxnOnly, Delete::Plain];
    let mut spent = [Duration::ZERO; 3];
    // A warm-up round, not counted.
    for round in 0..=ROUNDS {
        for (k, how) in kinds.iter().enumerate() {
            let revs = create_all(&c, lease).await?;
            let t = Instant::now();
            delete_all(&c, *how, &revs).await?;
            if round > 0 {
                spent[k] += t.elapsed();
            }
        }
    }
    c.lease_client().revoke(lease).await?;
    let per_s = |d: Duration| (KEYS * ROUNDS) as f64 / d.as_secs_f64();
    for (how, d) in kinds.iter().zip(spent) {
        println!("{how:?}: {:.0} deletes/s", per_s(d));
    }
    println!("guarded / plain: {:.2}", per_s(spent[0]) / per_s(spent[2]));
    Ok(())
}
