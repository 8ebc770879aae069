//! Endpoints down or hung: a typed, retryable error within the wait (or the request timeout),
//! never a hang.

use crate::support;

use std::net::TcpListener;
use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, Locker};
use tokio::time::Instant;

/// Scheduling slack on a loaded test machine: the bound is "within the wait", never a hang.
const SLACK: Duration = Duration::from_millis(800);

/// An address where nothing listens.
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

/// An address that accepts connections and never answers (a hung server).
fn hung_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
    });
    format!("http://{addr}")
}

#[test]
fn endpoints_down_or_hung_give_unavailable_within_the_wait() {
    support::runtime().block_on(async {
        for endpoint in [closed_port(), hung_server()] {
            let locker = support::builder(vec![endpoint.clone()], "dlock-test/down")
                .request_timeout(Duration::from_secs(1))
                .build()
                .await
                .expect("building connects lazily");
            let name = support::name("a");

            let wait = Duration::from_millis(600);
            let t = Instant::now();
            let err = locker
                .acquire(&name, AcquireOptions::wait(wait))
                .await
                .expect_err("no server");
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{endpoint}: {err}");
            assert!(
                t.elapsed() <= wait + SLACK,
                "{endpoint}: took {:?}",
                t.elapsed()
            );

            // Without a wait, the request timeout bounds it.
            let t = Instant::now();
            let err = locker
                .acquire(&name, AcquireOptions::forever())
                .await
                .expect_err("no server");
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{endpoint}: {err}");
            assert!(
                t.elapsed() <= Duration::from_secs(1) + SLACK,
                "{endpoint}: took {:?}",
                t.elapsed()
            );

            let err = locker.try_acquire(&name).await.expect_err("no server");
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{endpoint}: {err}");
            assert!(err.is_retryable());
        }
    });
}
