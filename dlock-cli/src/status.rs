//! `dlock status`: who holds a lock, until when at most, and how many wait — read without
//! disturbing the holder or its waiters (`Locker::inspect` takes no token and writes nothing).

use std::process::ExitCode;
use std::time::Duration;

use dlock_core::{FencingStrength, LockState, Locker};
use serde_json::{Value, json};

use crate::exit::{self, Failure};
use crate::target::Source;
use crate::{StatusArgs, lock_name, runtime};

/// Runs `dlock status`: exits 0 when the lock is held, [`exit::NOT_HELD`] when it is free.
///
/// Under a tiered configuration it connects only the name's tier (no drift guard: it reads
/// only) and says which tier and why (the route that took the name).
pub(crate) fn main(source: &Source, args: StatusArgs, json: bool) -> Result<ExitCode, Failure> {
    let target = source.target(None)?;
    let name = lock_name(&args.name)?;
    let routed = target
        .route(&name)
        .map_err(|f| f.with("name", name.as_str()))?;
    let url = routed.url;
    let tier = routed.tier.map(|(tier, route)| Tiered {
        tier,
        pattern: route.pattern().to_string(),
        line: route.line(),
        config: target.shown(),
    });
    let shown = url.to_string();
    let rt = runtime()?;
    let failed = |e: &dlock_core::Error| {
        Failure::from_error(e)
            .with("name", name.as_str())
            .with("url", shown.clone())
    };
    let (locker, state) = rt.block_on(async {
        let locker = url.connect().await.map_err(|e| failed(&e))?;
        let state = locker.inspect(&name).await.map_err(|e| failed(&e));
        // Ends the session (ZooKeeper, etcd) now rather than at its timeout.
        let _ = locker.close().await;
        state.map(|s| (locker, s))
    })?;
    let mut report = report(
        &*locker,
        name.as_str(),
        &shown,
        url.scheme().as_str(),
        &state,
    );
    if let (Some(t), Some(obj)) = (&tier, report.as_object_mut()) {
        obj.insert("tier".into(), json!(t.tier));
        obj.insert(
            "route".into(),
            json!({ "pattern": t.pattern, "line": t.line, "config": t.config }),
        );
    }
    if json {
        println!("{report}");
    } else {
        if let Some(t) = &tier {
            println!(
                "tier:     {} (route `{}`, {} line {})",
                t.tier, t.pattern, t.config, t.line
            );
        }
        print_human(
            &*locker,
            name.as_str(),
            &shown,
            url.scheme().as_str(),
            &state,
        );
    }
    Ok(if state.is_held() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::NOT_HELD)
    })
}

/// The tier a name was routed to, and the route that took it.
struct Tiered {
    tier: String,
    pattern: String,
    line: usize,
    config: String,
}

fn print_human(locker: &dyn Locker, name: &str, url: &str, scheme: &str, state: &LockState) {
    println!("lock:     {name}");
    println!("url:      {url}");
    println!("backend:  {scheme}");
    println!("ttl:      {}", humantime::format_duration(locker.ttl()));
    println!("fencing:  {}", fencing(&locker.capabilities().fencing));
    match &state.holder {
        None => println!("held:     no"),
        Some(h) => {
            let token = h.token.map_or("not recorded".into(), |t| t.to_string());
            println!("held:     yes, token {token}");
            let left = h.expires_within.map_or_else(
                || "unknown (held for as long as the holder's session lives)".into(),
                |d| humantime::format_duration(millis(d)).to_string(),
            );
            println!("expires:  within {left} unless renewed");
            println!("entry:    {}", h.entry);
            if !h.value.is_empty() {
                println!("value:    {}", h.value);
            }
        }
    }
    match state.waiting {
        Some(n) => println!("waiting:  {n}"),
        None => println!("waiting:  not counted (this backend keeps no queue)"),
    }
}

/// `d` rounded down to whole milliseconds (for display).
fn millis(d: Duration) -> Duration {
    Duration::from_millis(ms(d))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn fencing(f: &FencingStrength) -> String {
    format!("{f:?}").to_lowercase()
}

/// The JSON report.
fn report(locker: &dyn Locker, name: &str, url: &str, scheme: &str, state: &LockState) -> Value {
    let caps = locker.capabilities();
    let holder = state.holder.as_ref().map_or(Value::Null, |h| {
        json!({
            "token": h.token.map(|t| t.get()),
            "entry": h.entry,
            "value": h.value,
            "expires_within_ms": h.expires_within.map(ms),
        })
    });
    json!({
        "name": name,
        "url": url,
        "backend": scheme,
        "ttl_ms": ms(locker.ttl()),
        "capabilities": {
            "fair": caps.fair,
            "herd_free": caps.herd_free,
            "fencing": fencing(&caps.fencing),
            "crash_release_within_ms": ms(caps.crash_release_within),
        },
        "held": state.is_held(),
        "holder": holder,
        "waiting": state.waiting,
    })
}
