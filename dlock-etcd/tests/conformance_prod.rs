//! The timing scenarios against a three-member etcd cluster at etcd's defaults (heartbeat
//! 100 ms, election timeout 1000 ms, fsync on): `etcd_prod`, with 10 s leases.
//!
//! The lab rows run heartbeat 50 ms / election 500 ms without fsync: elections there are
//! twice as quick and writes cheaper than where users run etcd. Its own binary, run beside the
//! others by `cargo xtask test` (it mostly waits on 10 s leases).

#[path = "support/backend.rs"]
mod backend;

use backend::{ETCD, backend};
use dlock_conformance::servers::ServerOptions;

// 5 × the lab TTLs: 10 s leases (5 s for `renewal`).
dlock_conformance::conformance_tests!(
    etcd_prod,
    backend(3, "etcd-prod", ServerOptions::etcd_production()),
    declared = ETCD,
    ttl_scale = 5,
    only = [
        leader_partition => LeaderPartition,
        follower_hold => FollowerHold,
        one_way_delay => OneWayDelay,
        loss_trials => LossTrials,
        lost_before_stolen => LostBeforeStolen,
        handoff_lost_before_stolen => HandoffLostBeforeStolen,
        renewal => Renewal,
        short_blip => ShortBlip,
        paused_holder => PausedHolder,
        crash_release => CrashRelease,
    ],
);
