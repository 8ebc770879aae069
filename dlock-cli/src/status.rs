//! `dlock status`: what can be known about a lock without disturbing its holder.
//!
//! dlock-core's `Locker` has no read-only inspection (holder, token, remaining TTL, queue):
//! the only way to learn whether a mutex is held is to try to acquire it, which takes a
//! fencing token and, when the lock is free, holds it for a round trip (a waiter or a
//! newcomer could be delayed by it). So `status` does not do that: it connects (which
//! validates the URL and, for ZooKeeper, opens a session), and reports the holder as unknown.

use std::process::ExitCode;

use dlock_core::{FencingStrength, Locker};
use serde_json::{Value, json};

use crate::exit::{self, Failure};
use crate::{StatusArgs, lock_name, locker_url, runtime};

/// Why the holder is not reported (printed and in the JSON).
const UNKNOWN_BECAUSE: &str = "dlock's Locker API has no read-only inspection of a lock's \
     holder, TTL or queue; trying to acquire it would disturb the holder and its waiters";

/// Runs `dlock status`; exits with [`exit::STATUS_UNKNOWN`] after its report.
pub(crate) fn main(url: Option<&str>, args: StatusArgs, json: bool) -> Result<ExitCode, Failure> {
    let url = locker_url(url, None)?;
    let name = lock_name(&args.name)?;
    let shown = url.to_string();
    let rt = runtime()?;
    let locker = rt.block_on(url.connect()).map_err(|e| {
        Failure::from_error(&e)
            .with("name", name.as_str())
            .with("url", shown.clone())
    })?;
    let report = report(&*locker, name.as_str(), &shown, url.scheme().as_str());
    if json {
        println!("{report}");
    } else {
        println!("lock:     {name}");
        println!("url:      {shown}");
        println!("backend:  {}", url.scheme());
        println!("ttl:      {}", humantime::format_duration(locker.ttl()));
        println!(
            "fencing:  {}",
            report["capabilities"]["fencing"].as_str().unwrap_or("?")
        );
        println!("fair:     {}", locker.capabilities().fair);
        println!("held:     unknown ({UNKNOWN_BECAUSE})");
    }
    Ok(ExitCode::from(exit::STATUS_UNKNOWN))
}

fn fencing(f: &FencingStrength) -> String {
    format!("{f:?}").to_lowercase()
}

/// The JSON report.
fn report(locker: &dyn Locker, name: &str, url: &str, scheme: &str) -> Value {
    let caps = locker.capabilities();
    json!({
        "name": name,
        "url": url,
        "backend": scheme,
        "ttl_ms": u64::try_from(locker.ttl().as_millis()).unwrap_or(u64::MAX),
        "capabilities": {
            "fair": caps.fair,
            "herd_free": caps.herd_free,
            "fencing": fencing(&caps.fencing),
            "crash_release_within_ms":
                u64::try_from(caps.crash_release_within.as_millis()).unwrap_or(u64::MAX),
        },
        "held": Value::Null,
        "holder": Value::Null,
        "queue": Value::Null,
        "unknown_because": UNKNOWN_BECAUSE,
    })
}
