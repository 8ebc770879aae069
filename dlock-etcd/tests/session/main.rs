//! The session lease behind every lock of a locker: its loss, reconciliation with the keys it
//! owns, releases at once sharing transactions, a waiter whose lease was revoked, the TTL etcd grants, keep-alive pings, a locker on
//! the application's client, and compaction during a wait.

#[path = "../support/mod.rs"]
mod support;

mod batched_release;
mod compaction;
mod effective_ttl;
mod from_client;
mod keepalive_pings;
mod lease;
mod reconcile;
mod revoked_waiter;
