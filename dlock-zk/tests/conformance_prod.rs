//! The timing scenarios against a three-server ZooKeeper ensemble at ZooKeeper's defaults
//! (`tickTime=2000`, session bounds of 2–20 ticks, `forceSync=yes`): `zk_prod` with 10 s
//! leases, `zk_prod_30` (the holder cut from the leader right after a renewal) with 30 s ones.
//!
//! The lab rows run a 100 ms tick, at which a follower reports its clients' touches to the
//! leader every 50 ms: they cannot show a deadline that outlasts the leader's session expiry
//! by up to a whole client silence plus half a tick. These rows can. Their own binary, run
//! beside the others by `cargo xtask test` (they mostly wait on 10–30 s leases).

mod support;

use dlock_conformance::servers::ServerOptions;
use support::backend::{ZK, ZkBackend};

// 5 × the lab TTLs: 10 s leases (5 s for `renewal`).
dlock_conformance::conformance_tests!(
    zk_prod,
    ZkBackend::shared("zk-prod", 3, ServerOptions::zk_production(), false),
    declared = ZK,
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

// 15 × the lab TTL: 30 s leases, where the client's longest silence (its ping delay, 4.5 s,
// plus a tick of 1.5 s) is longest.
// The same shared ensemble under the report name `zk-prod-30`.
dlock_conformance::conformance_tests!(
    zk_prod_30,
    ZkBackend::shared("zk-prod-30", 3, ServerOptions::zk_production(), false),
    declared = ZK,
    ttl_scale = 15,
    only = [leader_partition => LeaderPartition],
);
