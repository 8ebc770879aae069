//! dlock backend for Redis: [`RedisLocker`], a lock on one Redis server with a fair, herd-free
//! queue (the server given by URL, found through Redis Sentinel, or each lock on its slot's
//! master in a Redis Cluster), and [`RedlockLocker`], the Redlock algorithm over N independent
//! Redis nodes.
//!
//! Both implement [`dlock_core::Locker`]: fencing tokens with every grant, automatic renewal of
//! every held lease in one round trip per period (per master, on a cluster), a loss signal that fires before anyone else
//! can be granted the lock, and release on crash after the TTL. [`RedisLocker`] also implements
//! [`dlock_core::Election`], [`dlock_core::RwLocker`] and [`dlock_core::Semaphore`].

mod conn;
mod family_scripts;
mod keys;
mod redlock;
mod scripts;
mod single;
mod wait;

pub use redlock::{MAX_NODES, RedlockLocker, RedlockLockerBuilder};
pub use single::{
    DEFAULT_RETRY_DELAY, DEFAULT_TTL, MAX_CLUSTER_NODES, MAX_SENTINELS, RedisLocker,
    RedisLockerBuilder,
};
