#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod acquire;
mod builder;
mod conn;
mod election;
mod enqueue;
mod error;
mod grant;
mod inspect;
mod keys;
mod locker;
mod queue;
mod reconcile;
mod relocate;
mod renew;
mod rw;
mod semaphore;
mod session;
mod slots;
#[cfg(feature = "tls")]
mod tls;
mod wait;
mod watch;

pub use builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT, DEFAULT_TTL,
    EtcdLockerBuilder,
};
pub use locker::EtcdLocker;

/// The etcd client library this crate is built on, re-exported for TLS options and for
/// fenced writes in your own transactions.
pub use etcd_client;
