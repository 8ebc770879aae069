#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod batches;
mod config;
mod contend;
mod election;
mod errors;
mod inspect;
mod locker;
mod model;
mod observe;
mod paths;
mod payload;
mod reads;
mod record;
mod rule;
mod rw;
mod semaphore;
mod session;
mod tls;

pub use config::{DEFAULT_ROOT, DEFAULT_TTL, ZkAcl, ZkLockerBuilder};
pub use locker::ZkLocker;
