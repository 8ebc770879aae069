#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod check;
pub mod etcd;
pub mod lease;
pub mod net;
pub mod redis;
pub mod redlock;
pub mod zk;

pub use check::{Bound, Case, Expect, Outcome, Verdict};

/// Every case of every model: the code as it is (`today`) and the negative controls.
pub fn cases() -> Vec<Case> {
    [
        lease::cases(),
        redis::cases(),
        redlock::cases(),
        etcd::cases(),
        zk::cases(),
    ]
    .concat()
}
