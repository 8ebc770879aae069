//! Builder options: every refused option fails before any I/O, `validate` agrees with `build`,
//! a build outside a runtime is an error, and a locker can start from the application's own
//! `redis::Client`.

use std::time::{Duration, Instant};

use dlock_core::{Error, ErrorKind, Locker};
use dlock_redis::RedisLocker;

use super::{builder, granted, name, url};

/// Asserts that `validate` and `build` of the same options (`what`) both refuse them as
/// `InvalidInput`; returns how long `build` took.
async fn refused<T: std::fmt::Debug>(
    what: &str,
    validate: Result<(), Error>,
    build: impl Future<Output = Result<T, Error>>,
) -> Duration {
    let e = validate.expect_err(what);
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "validate, {what}: {e}");
    let began = Instant::now();
    let e = build.await.expect_err(what);
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "build, {what}: {e}");
    began.elapsed()
}

/// Every option a builder refuses, refused by `validate` (no runtime, no I/O) and by `build`
/// before any I/O (nothing listens at the addresses): one URL, Sentinel, Cluster, TLS and
/// Redlock options. TTLs and waits out of range are the `bad_input` scenario's on every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_fail_before_any_io() {
    use dlock_redis::RedlockLocker;
    let u = "redis://127.0.0.1:1";
    let b = RedisLocker::builder;
    let s = || ["127.0.0.1:26379", "127.0.0.1:26380"].map(String::from);
    let pem = || b"not PEM".to_vec();
    let redis = [
        ("no URL", b()),
        ("not a redis URL", b().url("http://x")),
        ("zero TTL", b().url(u).ttl(Duration::ZERO)),
        ("hash tag in the prefix", b().url(u).prefix("a{b}")),
        ("empty namespace segment", b().url(u).namespace("a//b")),
        (
            "request timeout above the TTL",
            b().url(u)
                .ttl(Duration::from_secs(1))
                .request_timeout(Duration::from_secs(5)),
        ),
        ("zero retry delay", b().url(u).retry_delay(Duration::ZERO)),
        ("#insecure", b().url("rediss://127.0.0.1:1/#insecure")),
        (
            "roots with redis://",
            b().url(u).tls_root_certificates(pem()),
        ),
        (
            "roots not PEM",
            b().url("rediss://127.0.0.1:1").tls_root_certificates(pem()),
        ),
        (
            "no replica",
            b().url(u).wait_for_replicas(0, Duration::from_millis(300)),
        ),
        ("TLS flag with a URL", b().url(u).tls(true)),
        (
            "master password with a URL",
            b().url(u).master_password("pw"),
        ),
        ("URL and sentinels", b().url(u).sentinels(s(), "m")),
        ("no sentinel", b().sentinels(Vec::<String>::new(), "m")),
        ("sentinel without port", b().sentinels(["127.0.0.1"], "m")),
        ("sentinel port 0", b().sentinels(["127.0.0.1:0"], "m")),
        ("sentinel not an address", b().sentinels(["a b:1"], "m")),
        (
            "sentinel twice",
            b().sentinels([s()[0].clone(), s()[0].clone()], "m"),
        ),
        ("empty master name", b().sentinels(s(), "")),
        ("master name with a space", b().sentinels(s(), "my master")),
        (
            "sentinel roots not PEM",
            b().sentinels(s(), "m").tls_root_certificates(pem()),
        ),
        ("no cluster node", b().cluster(Vec::<String>::new())),
        (
            "URL and cluster",
            b().url(u).cluster(["redis://127.0.0.1:2"]),
        ),
        (
            "cluster node twice",
            b().cluster(["redis://127.0.0.1:2", "redis://127.0.0.1:2"]),
        ),
        ("unix cluster node", b().cluster(["unix:///tmp/r.sock"])),
        (
            "mixed schemes",
            b().cluster(["redis://127.0.0.1:2", "rediss://127.0.0.1:3"]),
        ),
        (
            "mixed credentials",
            b().cluster(["redis://a:b@127.0.0.1:2", "redis://127.0.0.1:3"]),
        ),
        (
            "address map without port",
            b().cluster(["redis://127.0.0.1:2"])
                .cluster_address_map("127.0.0.1", "127.0.0.1:5"),
        ),
        (
            "address mapped twice",
            b().cluster(["redis://127.0.0.1:2"])
                .cluster_address_map("127.0.0.1:2", "127.0.0.1:5")
                .cluster_address_map("127.0.0.1:2", "127.0.0.1:6"),
        ),
        (
            "address map without cluster",
            b().url(u).cluster_address_map("127.0.0.1:2", "127.0.0.1:5"),
        ),
        (
            "cluster waiting for replicas",
            b().cluster(["redis://127.0.0.1:2"])
                .wait_for_replicas(1, Duration::from_secs(1)),
        ),
        (
            "master password with a cluster",
            b().cluster(["redis://127.0.0.1:2"]).master_password("x"),
        ),
    ];
    for (what, builder) in redis {
        let took = refused(what, builder.validate(), builder.build()).await;
        assert!(took < Duration::from_millis(100), "{what}: I/O?");
    }
    let r = RedlockLocker::builder;
    let nodes = [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ];
    let redlock = [
        ("no node", r()),
        ("no nodes", r().nodes(Vec::<String>::new())),
        ("node twice", r().nodes([u, u])),
        (
            "zero node timeout",
            r().nodes(nodes).node_timeout(Duration::ZERO),
        ),
        (
            "#insecure node",
            r().nodes([nodes[0], "rediss://127.0.0.1:2/#insecure", nodes[2]]),
        ),
    ];
    for (what, builder) in redlock {
        refused(what, builder.validate(), builder.build()).await;
    }
    // Good options build without I/O although nothing listens there; IPv6 and host names are
    // sentinel addresses; a cluster locker's Debug names its seeds but not the password.
    r().nodes(nodes).validate().expect("valid Redlock options");
    b().url(u).build().await.expect("builds without I/O");
    b().sentinels(["[::1]:26379", "sentinel-1.example:26379"], "m")
        .build()
        .await
        .expect("IPv6 and host names are addresses");
    let l = b()
        .cluster([
            "redis://u:s3cr3t@127.0.0.1:1",
            "redis://u:s3cr3t@127.0.0.1:2",
        ])
        .cluster_address_map("127.0.0.1:1", "localhost:7001")
        .build()
        .await
        .expect("valid cluster options build without I/O");
    let shown = format!("{l:?}");
    assert!(shown.contains("127.0.0.1:1"), "{shown}");
    assert!(!shown.contains("s3cr3t"), "the password leaked: {shown}");
}

#[test]
fn building_outside_a_runtime_is_an_error_not_a_panic() {
    let r = futures::executor::block_on(RedisLocker::builder().url("redis://127.0.0.1:1").build());
    assert_eq!(r.expect_err("no runtime").kind(), ErrorKind::InvalidInput);
}

/// A locker built from the application's own `redis::Client` locks against that server like
/// one built from the URL (the same name excludes across the two), and `client` with a second
/// way to reach a server is a typed error before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_from_an_existing_client() {
    let client = redis::Client::open(url()).expect("client");
    let ns = format!("from-client-{}", std::process::id());
    let mine = RedisLocker::builder()
        .client(client.clone())
        .namespace(&ns)
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("locker from a client");
    let theirs = builder(&url(), &ns, Duration::from_secs(2))
        .build()
        .await
        .expect("locker from the URL");
    let lock = name("shared");
    let held = granted(&mine, &lock, Duration::from_secs(5), "granted").await;
    assert!(
        theirs
            .try_acquire(&lock)
            .await
            .expect("reachable")
            .is_none(),
        "the URL's locker sees the client's locker's hold"
    );
    let state = theirs.inspect(&lock).await.expect("inspect");
    assert_eq!(state.holder.and_then(|h| h.token), Some(held.token()));
    held.release().await.expect("release");
    let next = theirs.try_acquire(&lock).await.expect("reachable");
    assert!(next.is_some(), "free after the release");
    for conflicting in [
        RedisLocker::builder().client(client.clone()).url(url()),
        RedisLocker::builder()
            .client(client.clone())
            .cluster([url()]),
        RedisLocker::builder()
            .client(client.clone())
            .tls_root_certificates(b"-----BEGIN CERTIFICATE-----".to_vec()),
    ] {
        let err = conflicting.validate().expect_err("two ways to one server");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}
