//! Unit tests: every URL shape and every bad-URL error.

use std::sync::Arc;
use std::time::Duration;

use crate::{LockerUrl, Scheme, UrlError, UrlPart};

fn ok(s: &str) -> LockerUrl {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} must parse, got: {e}"))
}

fn bad(s: &str) -> UrlError {
    match s.parse::<LockerUrl>() {
        Ok(u) => panic!("{s:?} must be rejected, parsed as {u}"),
        Err(e) => e,
    }
}

/// The error of connecting to `url`, which must fail.
async fn connect_err(url: &str) -> dlock_core::Error {
    match crate::connect(url).await {
        Ok(_) => panic!("{url:?} must fail"),
        Err(e) => e,
    }
}

fn hosts(u: &LockerUrl) -> Vec<String> {
    u.hosts().iter().map(ToString::to_string).collect()
}

fn value(name: &str) -> UrlPart {
    UrlPart::Value(name.into())
}

fn param(name: &str) -> UrlPart {
    UrlPart::Parameter(name.into())
}

// ---- every URL shape ----

#[test]
fn redis_single() {
    let u = ok("redis://127.0.0.1:6380");
    assert_eq!(u.scheme(), Scheme::Redis);
    assert_eq!(hosts(&u), ["127.0.0.1:6380"]);
    assert_eq!((u.user(), u.has_password(), u.path()), (None, false, None));
    let u = ok("REDIS://Cache.Example.com/3?ttl=10s&namespace=billing/eu");
    assert_eq!(hosts(&u), ["cache.example.com:6379"]);
    assert_eq!(u.path(), Some("3"));
    assert_eq!(u.ttl(), Some(Duration::from_secs(10)));
    assert_eq!(u.namespace(), Some("billing/eu"));
    assert_eq!(
        u.to_string(),
        "redis://cache.example.com:6379/3?ttl=10s&namespace=billing%2Feu"
    );
    let u = ok("redis://app:p%40ss@[::1]:7000/");
    assert_eq!(hosts(&u), ["[::1]:7000"]);
    assert_eq!(u.user(), Some("app"));
    assert_eq!(u.password(), Some("p@ss"));
    assert_eq!(u.path(), None);
    assert_eq!(u.to_string(), "redis://app:***@[::1]:7000");
    let u = ok("redis://:secret@h");
    assert_eq!((u.user(), u.password()), (None, Some("secret")));
    assert_eq!(u.to_string(), "redis://:***@h:6379");
}

#[test]
fn rediss_with_tls_files() {
    let u = ok("rediss://h:6390?ca=/etc/ca.pem&cert=/etc/c.pem&key=/etc/k.pem");
    assert_eq!(u.scheme(), Scheme::Redis);
    assert!(u.is_tls());
    assert_eq!(
        u.tls.ca.as_deref(),
        Some(std::path::Path::new("/etc/ca.pem"))
    );
    assert!(u.tls.cert.is_some() && u.tls.key.is_some());
    assert_eq!(
        u.to_string(),
        "redis+tls://h:6390?ca=/etc/ca.pem&cert=/etc/c.pem&key=/etc/k.pem"
    );
    assert_eq!(ok(&u.to_string()), u, "`rediss://` is `redis+tls://`");
    // `ca` is optional: the system's roots.
    assert!(ok("rediss://h").tls.ca.is_none());
}

#[test]
fn every_network_scheme_comes_over_tls() {
    for (url, scheme) in [
        ("redis+tls://h", Scheme::Redis),
        (
            "redis+sentinel+tls://s1,s2/mymaster?ca=ca.pem",
            Scheme::RedisSentinel,
        ),
        (
            "redis+cluster+tls://n1,n2?ca=ca.pem&cert=c.pem&key=k.pem",
            Scheme::RedisCluster,
        ),
        ("REDLOCK+TLS://n1,n2,n3?ca=ca.pem", Scheme::Redlock),
        ("etcd+tls://e1", Scheme::Etcd),
        ("zk+tls://z1?ca=ca.pem", Scheme::Zk),
    ] {
        let u = ok(url);
        assert_eq!(u.scheme(), scheme, "{url}");
        assert!(u.is_tls(), "{url}");
        assert!(u.to_string().contains("+tls://"), "{u}");
        assert_eq!(ok(&u.to_string()), u, "{url} round trips");
    }
    assert!(!ok("redlock://n1,n2,n3").is_tls());
    // TLS files only over TLS; `memory:` has no TLS.
    assert_eq!(
        bad("redlock://n1?ca=ca.pem").part(),
        &UrlPart::Parameter("ca".into())
    );
    assert_eq!(bad("memory+tls:").part(), &UrlPart::Scheme);
}

#[test]
fn redis_sentinel() {
    let u = ok("redis+sentinel://u:pw@s1,s2:26380/mymaster?sentinel_password=spw");
    assert_eq!(u.scheme(), Scheme::RedisSentinel);
    assert_eq!(hosts(&u), ["s1:26379", "s2:26380"]);
    assert_eq!(u.path(), Some("mymaster"));
    assert_eq!(u.sentinel_password.as_deref(), Some("spw"));
    assert_eq!(
        u.to_string(),
        "redis+sentinel://u:***@s1:26379,s2:26380/mymaster?sentinel_password=***"
    );
}

#[test]
fn redis_cluster_and_redlock() {
    let u = ok("redis+cluster://n1:7000,n2:7001,n3");
    assert_eq!(u.scheme(), Scheme::RedisCluster);
    assert_eq!(hosts(&u), ["n1:7000", "n2:7001", "n3:6379"]);
    let u = ok("redlock://r1:6379,r2:6379,r3:6379?ttl=2s");
    assert_eq!(u.scheme(), Scheme::Redlock);
    assert_eq!(u.hosts().len(), 3);
    assert_eq!(u.ttl(), Some(Duration::from_secs(2)));
}

#[test]
fn etcd_shapes() {
    let u = ok("etcd://e1:2379,e2:2379/myapp/locks");
    assert_eq!(u.scheme(), Scheme::Etcd);
    assert_eq!(u.path(), Some("myapp/locks"));
    let u = ok("etcd://e1//locks");
    assert_eq!(u.path(), Some("/locks"));
    assert_eq!(u.to_string(), "etcd://e1:2379//locks");
    let u = ok("etcd://root:pw@e1");
    assert_eq!((u.user(), u.password()), (Some("root"), Some("pw")));
    let u = ok("etcd+tls://e1?ca=ca.pem&cert=c.pem&key=k.pem&ttl=5s");
    assert_eq!((u.scheme(), u.is_tls()), (Scheme::Etcd, true));
    assert!(u.tls.ca.is_some());
    assert_eq!(u.ttl(), Some(Duration::from_secs(5)));
    // TLS files are optional for etcd (system roots).
    ok("etcd+tls://e1");
}

#[test]
fn zk_shapes() {
    let u = ok("zk://z1:2181,z2:2182/my-app/locks?namespace=tests");
    assert_eq!(u.scheme(), Scheme::Zk);
    assert_eq!(hosts(&u), ["z1:2181", "z2:2182"]);
    assert_eq!(u.path(), Some("my-app/locks"));
    assert_eq!(u.namespace(), Some("tests"));
    let u = ok("zk://alice:pw@z1");
    assert_eq!(u.to_string(), "zk://alice:***@z1:2181");
    let u = ok("zk+tls://z1?ca=ca.pem");
    assert_eq!((u.scheme(), u.is_tls()), (Scheme::Zk, true));
}

#[test]
fn memory_shapes() {
    for s in ["memory:", "memory://", "memory:/", "MEMORY:"] {
        let u = ok(s);
        assert_eq!(u.scheme(), Scheme::Memory);
        assert!(u.hosts().is_empty());
        assert_eq!(u.to_string(), "memory:");
    }
    let u = ok("memory:?ttl=1m30s&namespace=demo");
    assert_eq!(u.ttl(), Some(Duration::from_secs(90)));
    assert_eq!(u.to_string(), "memory:?ttl=1m30s&namespace=demo");
}

#[test]
fn display_round_trips() {
    for s in [
        "redis://h:6379/2?ttl=10s",
        "redis+cluster://a:1,b:2",
        "etcd://e:2379//locks?namespace=x",
        "zk://z:2181/a/b",
        "memory:?ttl=500ms",
        "memory:?ttl=1s500ms",
        "memory:?ttl=1h2m3s",
    ] {
        let u = ok(s);
        assert_eq!(u.to_string(), s);
        assert_eq!(ok(&u.to_string()), u);
    }
}

#[test]
fn passwords_never_shown() {
    for s in [
        "redis://u:hunter2@h",
        "redlock://u:hunter2@a,b,c",
        "etcd://u:hunter2@e",
        "zk://u:hunter2@z",
        "redis+sentinel://s/m?sentinel_password=hunter2",
    ] {
        let u = ok(s);
        assert!(!u.to_string().contains("hunter2"), "{u}");
        assert!(!format!("{u:?}").contains("hunter2"), "{u:?}");
    }
    // Nor in errors.
    let e = bad("etcd://u:hun%zzter2@e");
    assert_eq!(e.part(), &UrlPart::Credentials);
    assert!(!e.to_string().contains("hun"), "{e}");
}

#[test]
fn with_ttl_overrides_and_checks() {
    let u = ok("redis://h?ttl=10s");
    let u = u.with_ttl(Some(Duration::from_secs(3))).expect("in range");
    assert_eq!(u.ttl(), Some(Duration::from_secs(3)));
    let e = u.with_ttl(Some(Duration::ZERO)).expect_err("zero");
    assert_eq!(e.part(), &value("ttl"));
}

// ---- every bad-URL error ----

#[test]
fn bad_scheme() {
    for s in [
        "",
        "localhost:6379x",
        "http://h",
        "redis",
        "postgres://h/db",
    ] {
        assert_eq!(bad(s).part(), &UrlPart::Scheme, "{s:?}");
    }
    let e = bad("mysql://h");
    assert!(e.to_string().contains("unknown scheme"), "{e}");
    assert!(e.to_string().contains("etcd[+tls]://"), "{e}");
}

#[test]
fn bad_host() {
    for s in [
        "redis:h",             // no `//`
        "redis://",            // no host
        "redis://u:p@",        // only credentials
        "redis://a,b",         // one host only
        "redlock://a,,b",      // empty host
        "redlock://a,b,",      // trailing comma
        "redlock://a:1,a:1",   // duplicate
        "redlock://a,a:6379",  // duplicate after the default port
        "etcd://e_1,bad host", // space
        "zk://[::1",           // unclosed bracket
        "zk://[not-v6]:2181",  // not IPv6
        "zk://[::1]2181",      // no colon after ]
        "etcd://:2379",        // empty host name
        "memory://somewhere",  // memory has no host
    ] {
        assert_eq!(bad(s).part(), &UrlPart::Host, "{s:?}");
    }
    assert!(bad("redis://a,b").to_string().contains("redlock://"));
}

#[test]
fn bad_port() {
    for s in [
        "redis://h:",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:x1",
        "redis://h:+1",
        "etcd://e1:2379,e2:port",
        "zk://[::1]:99999",
    ] {
        assert_eq!(bad(s).part(), &UrlPart::Port, "{s:?}");
    }
    assert!(bad("etcd://e1,e2:port").to_string().contains("e2"));
}

#[test]
fn bad_path() {
    for s in [
        "redis://h/zero",            // not a db number
        "redis://h/1/2",             // not a db number
        "redis+sentinel://s1,s2",    // master name required
        "redis+sentinel://s1/",      // master name required
        "redis+sentinel://s1/a b",   // whitespace (raw)
        "redis+sentinel://s1/a%20b", // whitespace (encoded)
        "redis+cluster://n1/0",      // no path
        "redlock://a,b,c/x",         // no path
        "etcd://e/a//b",             // empty segment
        "etcd://e/locks/",           // trailing slash
        "etcd://e/a b",              // bad character
        "zk://z/a//b",               // empty segment
        "zk://z/a/../b",             // dot segment
        "zk://z/zookeeper/x",        // reserved
        "zk://z/a$b",                // bad character
        "memory:/x",                 // memory has no path
        "redis://h/%zz",             // malformed escape
        "redis://h/1#frag",          // fragment
    ] {
        assert_eq!(bad(s).part(), &UrlPart::Path, "{s:?}");
    }
}

#[test]
fn bad_credentials() {
    for s in [
        "redis://alice@h", // a user without a password
        "etcd://alice@e",  // etcd needs both
        "etcd://:pw@e",    // etcd needs both
        "zk://:pw@z",      // zk digest needs both
        "zk://alice@z",
        "redis://%zz:pw@h", // malformed escape in the user
        "zk://a%3Ab:pw@z",  // a digest user holding ':'
    ] {
        assert_eq!(bad(s).part(), &UrlPart::Credentials, "{s:?}");
    }
}

#[test]
fn bad_parameter_names() {
    for (s, name) in [
        ("redis://h?tll=10s", "tll"),
        ("redis://h?ca=x", "ca"), // TLS files only with TLS schemes
        ("etcd://e?cert=c&key=k", "cert"),
        ("redlock://a,b,c?sentinel_password=x", "sentinel_password"),
        ("memory:?ca=x", "ca"),
        ("redis://h?ttl=1s&ttl=2s", "ttl"), // twice
        ("rediss://h?cert=c.pem", "key"),   // partner missing
        ("etcd+tls://e?key=k.pem", "cert"),
        ("zk+tls://z", "ca"), // zk TLS needs the CA
        ("zk+tls://z?cert=c&key=k", "ca"),
    ] {
        assert_eq!(bad(s).part(), &param(name), "{s:?}");
    }
    let e = bad("redis://h?tll=10s");
    assert!(e.to_string().contains("ttl, namespace"), "{e}");
}

#[test]
fn bad_parameter_values() {
    for (s, name) in [
        ("redis://h?ttl=", "ttl"),
        ("redis://h?ttl", "ttl"),
        ("redis://h?ttl=10", "ttl"), // no unit
        ("redis://h?ttl=ten seconds", "ttl"),
        ("redis://h?ttl=0s", "ttl"), // below MIN_TTL
        ("redis://h?ttl=99ms", "ttl"),
        ("redis://h?ttl=25h", "ttl"), // above MAX_TTL
        ("etcd://e?namespace=/a", "namespace"),
        ("etcd://e?namespace=a/", "namespace"),
        ("zk://z?namespace=a//b", "namespace"),
        ("zk://z?namespace=a/../b", "namespace"),
        ("memory:?namespace=a:b", "namespace"),
        ("memory:?namespace=%ff", "namespace"), // not UTF-8
        ("rediss://h?ca=", "ca"),
    ] {
        assert_eq!(bad(s).part(), &value(name), "{s:?}");
    }
    let e = bad("redis://h?ttl=0s");
    assert!(e.to_string().contains("minimum"), "{e}");
    // A malformed sentinel password is named without being quoted.
    let e = bad("redis+sentinel://s/m?sentinel_password=abc%g");
    assert_eq!(e.part(), &value("sentinel_password"));
    assert!(!e.to_string().contains("abc"), "{e}");
}

#[test]
fn errors_become_invalid_option_naming_the_part() {
    let core: dlock_core::Error = bad("redis://h:99999").into();
    match core {
        dlock_core::Error::InvalidOption { option, reason } => {
            assert_eq!(option, "url.port");
            assert!(reason.starts_with("port: "), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let core: dlock_core::Error = bad("redis://h?tll=1s").into();
    assert!(core.to_string().contains("query parameter `tll`"), "{core}");
}

#[tokio::test]
async fn connect_rejects_before_io() {
    // Nothing listens on port 1: any I/O would fail as Unavailable instead.
    for s in [
        "redis://127.0.0.1:1?ttl=0s",
        "zk://127.0.0.1:1/a//b",
        "bogus://x",
    ] {
        let err = connect_err(s).await;
        assert_eq!(
            err.kind(),
            dlock_core::ErrorKind::InvalidInput,
            "{s:?}: {err}"
        );
    }
    // A TLS file that does not exist names its parameter.
    let err = connect_err("rediss://127.0.0.1:1?ca=/nonexistent/ca.pem").await;
    assert!(err.to_string().contains("`ca`"), "{err}");
}

#[tokio::test]
async fn memory_lockers_share_a_server_per_namespace() {
    use dlock_core::LockName;
    let name = LockName::new("unit/shared").expect("name");
    let a = crate::connect("memory:?namespace=unit-a").await.expect("a");
    let b = crate::connect("memory:?namespace=unit-a").await.expect("b");
    let c = crate::connect("memory:?namespace=unit-c").await.expect("c");
    let lease = a.try_acquire(&name).await.expect("try").expect("free");
    assert!(b.try_acquire(&name).await.expect("try").is_none());
    let other = c
        .try_acquire(&name)
        .await
        .expect("try")
        .expect("own server");
    lease.release().await.expect("release");
    other.release().await.expect("release");
    assert_eq!(
        crate::connect("memory:?ttl=2s").await.expect("ttl").ttl(),
        Duration::from_secs(2)
    );
}

#[tokio::test]
async fn family_handles_by_url() {
    let locker = crate::connect("memory:?namespace=unit-family")
        .await
        .expect("memory");
    assert!(Arc::clone(&locker).into_election().is_some());
    assert!(Arc::clone(&locker).into_rw_locker().is_some());
    assert!(locker.into_semaphore().is_some());
    let redlock = crate::connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .await
        .expect("redlock connects lazily");
    assert!(Arc::clone(&redlock).into_election().is_none(), "mutex only");
    assert!(Arc::clone(&redlock).into_rw_locker().is_none());
    assert!(redlock.into_semaphore().is_none());
}
