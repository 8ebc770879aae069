//! ZooKeeper-specific failures the conformance scenarios do not make: sessions expiring,
//! reconnecting or failing to open, a follower killed under a held lock, the whole ensemble
//! down, a member with a lower `maxSessionTimeout`, and a stall of the whole process. One binary of modules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

mod sessions;
mod stall;
mod timeouts;
