//! What a lock node holds: a small text payload naming its holder, which operators' tools (and
//! Curator-side tools, which show a lock node's data as text) can display.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use dlock_core::{AcquireOptions, Lease, LockName, Locker};
use dlock_zk::ZkLocker;
use support::{contenders, locker, namespace, raw, shared};

const TTL: Duration = Duration::from_secs(2);

/// The `key=value` fields of a payload, in order.
fn fields(data: &str) -> Vec<(&str, &str)> {
    data.split(' ').filter_map(|f| f.split_once('=')).collect()
}

/// `l` takes `name` (free): its lease, its node's full path, and what the node stores, read
/// with a plain client.
async fn hold(connect: &str, l: &ZkLocker, name: &LockName) -> (Lease, String, Vec<u8>) {
    let parent = l.lock_path(name);
    let lease = l
        .acquire(name, AcquireOptions::wait(Duration::from_secs(5)))
        .await
        .unwrap();
    let z = raw(connect).await;
    let kids = contenders(&z, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let node = format!("{parent}/{}", kids[0]);
    let (data, _) = z.get_data(&node).await.unwrap();
    (lease, node, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_node_names_host_pid_and_locker() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("payload");
    let l = locker(connect, &ns, TTL).await;
    let name = LockName::new("who").unwrap();
    let (lease, _, data) = hold(connect, &l, &name).await;
    let text = String::from_utf8(data).expect("the payload is text");
    let f = fields(&text);
    let keys: Vec<&str> = f.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["host", "pid", "locker"], "payload {text:?}");
    assert!(!f[0].1.is_empty(), "no host in {text:?}");
    assert_eq!(f[1].1, std::process::id().to_string(), "payload {text:?}");
    assert_eq!(f[2].1, l.locker_id(), "payload {text:?}");
    lease.release().await.unwrap();
}

/// `inspect` shows the holder's node (its full path) and what it stores, read from the server
/// by another locker: what the conformance scenario cannot see (it checks only the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_node_and_its_payload() {
    let Some(c) = shared(1) else { return };
    let connect = &c.endpoints()[0];
    let ns = namespace("payload-inspect");
    let (l, eye) = (
        locker(connect, &ns, TTL).await,
        locker(connect, &ns, TTL).await,
    );
    let name = LockName::new("shown").unwrap();
    let (lease, node, data) = hold(connect, &l, &name).await;
    let state = eye.inspect(&name).await.unwrap();
    let holder = state.holder.expect("a holder");
    assert_eq!(holder.entry, node);
    assert_eq!(holder.value.as_bytes(), data.as_slice());
    assert!(holder.value.ends_with(&format!("locker={}", l.locker_id())));
    assert_eq!(holder.token, Some(lease.token()));
    assert_eq!(holder.expires_within, None);
    assert_eq!(state.waiting, Some(0));
    lease.release().await.unwrap();
}
