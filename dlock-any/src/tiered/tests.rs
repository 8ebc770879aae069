//! The configuration's checks (before any I/O) and the router over `memory:` tiers.

use dlock_core::{AcquireOptions, ErrorKind, LockName, Locker};

use super::{ConfigPart, GUARD_NAME, TieredConfig};

const TWO_TIERS: &str = r#"
[tiers.fast]
url = "redis://:secret@127.0.0.1:6379"

[tiers.strict]
url = "etcd://127.0.0.1:2379/locks"

[[routes]]
pattern = "orders/*"
tier = "strict"

[[routes]]
pattern = "payments/*"
tier = "strict"

[[routes]]
pattern = "*"
tier = "fast"
"#;

fn name(s: &str) -> LockName {
    LockName::new(s).expect("a valid name")
}

/// The error of `text`, which must not parse.
fn refused(text: &str) -> super::ConfigError {
    match text.parse::<TieredConfig>() {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn the_first_matching_route_decides_the_tier() {
    let c: TieredConfig = TWO_TIERS.parse().expect("valid");
    let tier_of = |n: &str| c.route(&name(n)).expect("routed").1.name().to_string();
    assert_eq!(tier_of("orders/42"), "strict");
    assert_eq!(tier_of("payments/7/refund"), "strict");
    assert_eq!(tier_of("cache/x"), "fast");
    assert_eq!(tier_of("orders"), "fast");
    let (route, _) = c.route(&name("orders/42")).expect("routed");
    assert_eq!((route.pattern(), route.line()), ("orders/*", 9));
}

#[test]
fn every_error_names_its_line_and_part() {
    let unknown = TWO_TIERS.replace("tier = \"fast\"", "tier = \"fats\"");
    let e = refused(&unknown);
    assert_eq!((e.part(), e.line()), (ConfigPart::Route, Some(18)), "{e}");
    assert!(
        e.to_string()
            .starts_with("config:18: route: unknown tier `fats`"),
        "{e}"
    );

    let bad_url = TWO_TIERS.replace("etcd://127.0.0.1:2379/locks", "etcd://127.0.0.1:port");
    let e = refused(&bad_url);
    assert_eq!((e.part(), e.line()), (ConfigPart::Url, Some(6)), "{e}");

    let unreachable =
        format!("{TWO_TIERS}\n[[routes]]\npattern = \"orders/eu/*\"\ntier = \"fast\"\n");
    let e = refused(&unreachable);
    assert_eq!((e.part(), e.line()), (ConfigPart::Route, Some(21)), "{e}");
    assert!(e.message().contains("unreachable"), "{e}");

    let twice = TWO_TIERS.replace("payments/*", "orders/*");
    assert_eq!(refused(&twice).line(), Some(13));

    let syntax = TWO_TIERS.replace("pattern = \"*\"", "pattern = *");
    let e = refused(&syntax);
    assert_eq!((e.part(), e.line()), (ConfigPart::Syntax, Some(17)), "{e}");

    let unknown_key = TWO_TIERS.replace(
        "tier = \"strict\"\n\n[[routes]]\npattern = \"payments",
        "tier = \"strict\"\nlevel = \"x\"\n\n[[routes]]\npattern = \"payments",
    );
    let e = refused(&unknown_key);
    assert_eq!((e.part(), e.line()), (ConfigPart::Syntax, Some(11)), "{e}");

    let unused = format!("{TWO_TIERS}\n[tiers.spare]\nurl = \"memory:\"\n");
    let e = refused(&unused);
    assert_eq!((e.part(), e.line()), (ConfigPart::Tier, Some(21)), "{e}");

    let redlock =
        "[tiers.r]\nurl = \"redlock://a,b,c\"\n[[routes]]\npattern = \"*\"\ntier = \"r\"\n";
    let e = refused(redlock);
    assert_eq!((e.part(), e.line()), (ConfigPart::Tier, Some(2)), "{e}");
    let unguarded = redlock.replace("\"\n[[", "\"\nguard = false\n[[");
    assert!(unguarded.parse::<TieredConfig>().is_ok());

    assert_eq!(refused("").part(), ConfigPart::Route);
    let e = refused("[tiers.a]\nurl = 'memory:'\n[[routes]]\npattern = ''\ntier = 'a'\n");
    assert_eq!((e.part(), e.line()), (ConfigPart::Route, Some(4)), "{e}");
    let e = refused("[tiers.'a b']\nurl = 'memory:'\n[[routes]]\npattern = '*'\ntier = 'a b'\n");
    assert_eq!(e.part(), ConfigPart::Tier, "{e}");
}

#[test]
fn errors_become_invalid_option_without_the_password() {
    let bad = TWO_TIERS.replace("6379\"", "6379?ttl=0s\"");
    let e: dlock_core::Error = refused(&bad).into();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(
        matches!(
            e,
            dlock_core::Error::InvalidOption {
                option: "config.url",
                ..
            }
        ),
        "{e}"
    );
    assert!(!e.to_string().contains("secret"), "{e}");
    let c: TieredConfig = TWO_TIERS.parse().expect("valid");
    assert!(!format!("{c:?}").contains("secret"));
}

#[test]
fn a_name_no_route_takes_is_refused_before_any_io() {
    let c: TieredConfig =
        "[tiers.a]\nurl = 'memory:'\n[[routes]]\npattern = 'jobs/*'\ntier = 'a'\n"
            .parse()
            .expect("valid");
    let e = c.route(&name("cache/x")).expect_err("no route");
    assert!(
        matches!(
            e,
            dlock_core::Error::InvalidOption {
                option: "config.route",
                ..
            }
        ),
        "{e}"
    );
    assert!(c.route(&name(GUARD_NAME)).is_err());
}

#[test]
fn the_fingerprint_follows_routing_only() {
    let base: TieredConfig = TWO_TIERS.parse().expect("valid");
    let same = |text: String| {
        let c: TieredConfig = text.parse().expect("valid");
        c.fingerprint() == base.fingerprint() && c.guard_permits() == base.guard_permits()
    };
    // Credentials, TTLs and tier names do not route anything.
    assert!(same(TWO_TIERS.replace(":secret@", ":other@")));
    assert!(same(TWO_TIERS.replace("/locks\"", "/locks?ttl=20s\"")));
    assert!(same(TWO_TIERS.replace("strict", "money")));
    // A pattern, the order, or where a tier points does.
    assert!(!same(TWO_TIERS.replace("payments/*", "refunds/*")));
    assert!(!same(TWO_TIERS.replace("2379/locks", "2379/other")));
    assert!(!same(TWO_TIERS.replace("6379\"", "6379?namespace=b\"")));
    let p = base.guard_permits();
    assert!(
        p > dlock_core::MAX_PERMITS / 2 && p <= dlock_core::MAX_PERMITS,
        "{p}"
    );
}

#[tokio::test]
async fn the_router_sends_each_name_to_its_tier_and_close_closes_all() {
    let text = "[tiers.one]\nurl = 'memory:?namespace=tiered-unit-one'\n\
                [tiers.two]\nurl = 'memory:?namespace=tiered-unit-two'\n\
                [[routes]]\npattern = 'orders/*'\ntier = 'two'\n[[routes]]\npattern = '*'\ntier = 'one'\n";
    let c: TieredConfig = text.parse().expect("valid");
    let router = c.connect().await.expect("connect");
    let one = crate::connect("memory:?namespace=tiered-unit-one")
        .await
        .expect("one");
    let two = crate::connect("memory:?namespace=tiered-unit-two")
        .await
        .expect("two");
    let lease = router
        .acquire(
            &name("orders/42"),
            AcquireOptions::wait(std::time::Duration::from_secs(1)),
        )
        .await
        .expect("granted");
    assert!(
        two.try_acquire(&name("orders/42"))
            .await
            .expect("asks")
            .is_none()
    );
    assert!(
        one.try_acquire(&name("orders/42"))
            .await
            .expect("asks")
            .is_some()
    );
    let cache = router
        .try_acquire(&name("cache/x"))
        .await
        .expect("asks")
        .expect("free");
    assert!(
        one.try_acquire(&name("cache/x"))
            .await
            .expect("asks")
            .is_none()
    );
    assert!(router.capabilities().primitives.semaphore);
    assert!(std::sync::Arc::clone(&router).into_election().is_some());
    drop((lease, cache));
    router.close().await.expect("closed");
    let e = router
        .try_acquire(&name("cache/x"))
        .await
        .expect_err("closed");
    assert_eq!(e.kind(), ErrorKind::Closed);
}

#[tokio::test]
async fn a_router_with_another_configuration_is_refused_while_one_runs() {
    let text = "[tiers.one]\nurl = 'memory:?namespace=tiered-unit-drift'\n\
                [[routes]]\npattern = 'orders/*'\ntier = 'one'\n[[routes]]\npattern = '*'\ntier = 'one'\n";
    let first = text
        .parse::<TieredConfig>()
        .expect("valid")
        .connect()
        .await
        .expect("first");
    let same = text
        .parse::<TieredConfig>()
        .expect("valid")
        .connect()
        .await
        .expect("same");
    let other = text
        .replace("orders/*", "payments/*")
        .parse::<TieredConfig>()
        .expect("valid");
    let e = other.connect().await.expect_err("drift refused");
    assert!(
        matches!(
            e,
            dlock_core::Error::InvalidOption {
                option: "config.fingerprint",
                ..
            }
        ),
        "{e}"
    );
    first.close().await.expect("closed");
    same.close().await.expect("closed");
    let later = other
        .connect()
        .await
        .expect("no router of the old configuration is left");
    later.close().await.expect("closed");
}
