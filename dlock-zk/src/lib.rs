#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod batches;
mod builder;
mod contend;
mod election;
mod error;
mod inspect;
mod keys;
mod locker;
mod model;
mod observe;
mod payload;
mod reads;
mod record;
mod renew;
mod rule;
mod rw;
mod semaphore;
mod session;
mod stall;
mod tls;

pub use builder::{DEFAULT_PREFIX, DEFAULT_TTL, ZkAcl, ZkLockerBuilder};
pub use locker::ZkLocker;
