//! Private 3-member clusters, one at a time (`support::three_members`): members hung or
//! killed, a stale leader resumed, the session's move to a lease of a new raft term, and the
//! server behaviour behind it (`overlap_trace`, ignored by default).

#[path = "../support/mod.rs"]
mod support;

mod members;
mod overlap_trace;
mod relocate;
mod stale_leader;
