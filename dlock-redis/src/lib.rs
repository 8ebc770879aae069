#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod conn;
mod family_scripts;
mod inspect;
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
