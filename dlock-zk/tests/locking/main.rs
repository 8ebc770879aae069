//! The ZooKeeper locker against real servers, where the conformance scenarios cannot look:
//! Curator's node layouts and payloads, protected create, session expiry, the election's
//! observer, sequence order past a cversion wrap, and real Curator peers. One binary of
//! modules, on the shared server (`sequences` also starts servers of its own).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use dlock_core::AcquireOptions;

/// The lockers' TTL (`curator` uses longer ones).
const TTL: Duration = Duration::from_secs(2);

/// A wait that must end in a grant (`locks` waits 5 s).
fn wait() -> AcquireOptions {
    AcquireOptions::wait(Duration::from_secs(10))
}

mod curator;
mod election;
mod family;
mod locks;
mod sequences;
