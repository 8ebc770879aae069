#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod acquire;
mod builder;
mod conn;
mod election;
mod error;
mod family_scripts;
mod inspect;
mod keys;
mod locker;
mod redlock;
mod renew;
mod rw;
mod scripts;
mod semaphore;
mod tls;
mod wait;

pub use builder::{
    DEFAULT_RETRY_DELAY, DEFAULT_TTL, MAX_CLUSTER_NODES, MAX_SENTINELS, RedisLockerBuilder,
};
pub use locker::RedisLocker;
pub use redlock::{MAX_NODES, RedlockLocker, RedlockLockerBuilder};
