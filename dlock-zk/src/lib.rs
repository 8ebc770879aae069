#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod batches;
mod config;
mod contend;
mod errors;
mod locker;
mod paths;
mod payload;
mod reads;
mod session;

pub use config::{DEFAULT_ROOT, DEFAULT_TTL, ZkAcl, ZkLockerBuilder};
pub use locker::ZkLocker;
