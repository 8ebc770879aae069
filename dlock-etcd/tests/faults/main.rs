//! Link faults between one locker and etcd that the conformance scenarios do not make:
//! endpoints down or hung, replies slower than the per-member attempt cap or than three
//! quarters of a round's validity, and enqueue or session-grant replies later than the
//! request timeout.

#[path = "../support/mod.rs"]
mod support;

mod endpoints;
mod late_round;
mod slow_enqueue;
mod slow_replies;
