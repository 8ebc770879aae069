//! `dlock check`: is this deployment fit for this lock? Non-destructive checks through the
//! public `Locker` API against the user's own servers, every name under a prefix of its own
//! (`dlock-check/<pid>-<millis>/…`), everything released and every locker closed at the end.

mod contend;
mod ctx;
mod report;
mod single;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_any::{LockerUrl, Scheme};
use dlock_core::Locker;

use self::ctx::Ctx;
use self::report::{Header, Report, Row};
use crate::exit::{self, Failure};
use crate::run::{Signals, signal_code};
use crate::target::{Source, Target};
use crate::{CheckArgs, runtime};

/// A check: its name and what runs it.
type CheckFn =
    for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = Result<Row, String>> + Send + 'a>>;

/// The checks in the order they run. The first two measure the deployment; when either fails
/// the others are not run (a lease that cannot be kept would only fail them for that reason).
const CHECKS: [(&str, CheckFn); 9] = [
    ("round_trip", |c| Box::pin(single::round_trip(c))),
    ("effective_ttl", |c| Box::pin(single::effective_ttl(c))),
    ("inspect", |c| Box::pin(single::inspect(c))),
    ("try_acquire_held", |c| {
        Box::pin(single::try_acquire_held(c))
    }),
    ("wait_timeout", |c| Box::pin(single::wait_timeout(c))),
    ("exclusion", |c| Box::pin(contend::exclusion(c))),
    ("fifo", |c| Box::pin(contend::fifo(c))),
    ("cancel", |c| Box::pin(contend::cancel(c))),
    ("renewal", |c| Box::pin(single::renewal(c))),
];

/// How many of [`CHECKS`] measure the deployment (and gate the rest).
const MEASURING: usize = 2;

/// Runs `dlock check`: exit 0 when every check passed or was skipped, [`exit::UNFIT`] when
/// one failed, [`exit::UNAVAILABLE`] when the servers cannot be reached at all.
///
/// Under a tiered configuration it checks every tier in turn, as `--url` would each tier's
/// URL (the router adds no protocol of its own), printing one report per tier (`--json`: one
/// object per line, each with its `tier`), and exits with the worst tier's code.
pub(crate) fn main(source: &Source, args: CheckArgs, json: bool) -> Result<ExitCode, Failure> {
    let tiers: Vec<(Option<String>, LockerUrl)> = match source.target(args.ttl)? {
        Target::Url(url) => vec![(None, url)],
        Target::Tiered { config, .. } => config
            .tiers()
            .iter()
            .map(|t| (Some(t.name().to_string()), t.url().clone()))
            .collect(),
    };
    let rt = runtime()?;
    let mut worst = 0u8;
    for (tier, url) in tiers {
        let shown = url.to_string();
        if let Some(tier) = &tier
            && !json
        {
            println!("== tier {tier}: {shown}");
        }
        let code = rt
            .block_on(check(&url, &shown, tier.as_deref(), &args, json))
            .map_err(|f| {
                let f = f.with("url", shown.clone());
                match &tier {
                    Some(t) => f.with("tier", t.as_str()),
                    None => f,
                }
            })?;
        match code {
            Verdict::Fit => {}
            Verdict::Unfit => worst = worst.max(exit::UNFIT),
            Verdict::Interrupted(code) => return Ok(code),
        }
    }
    Ok(ExitCode::from(worst))
}

/// How one check run ended.
enum Verdict {
    Fit,
    Unfit,
    /// A signal interrupted it: exit with this code at once.
    Interrupted(ExitCode),
}

/// `dlock-check/<pid>-<unix millis>`: unique to this run.
fn prefix() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("dlock-check/{}-{millis}", std::process::id())
}

/// How much earlier than the truth a server's remaining TTL may read.
fn expiry_rounding(scheme: Scheme) -> Duration {
    match scheme {
        // etcd leases count whole seconds.
        Scheme::Etcd => Duration::from_secs(1),
        // Redis PTTL and the others: whole milliseconds.
        _ => Duration::from_millis(2),
    }
}

/// The longest one check may run before it fails as hung.
fn check_bound(ttl: Duration) -> Duration {
    Duration::from_secs(20) + ttl * 7
}

async fn check(
    url: &LockerUrl,
    shown: &str,
    tier: Option<&str>,
    args: &CheckArgs,
    json: bool,
) -> Result<Verdict, Failure> {
    let mut signals = Signals::new()?;
    let connect = async {
        let main = url.connect().await?;
        let mut clients = Vec::new();
        for _ in 0..args.clients {
            match url.connect().await {
                Ok(c) => clients.push(c),
                Err(e) => {
                    close_all(&main, &clients).await;
                    return Err(e);
                }
            }
        }
        Ok((main, clients))
    };
    let (main, clients) = tokio::select! {
        r = connect => r.map_err(|e| Failure::from_error(&e))?,
        sig = signals.recv() => return Ok(Verdict::Interrupted(signal_code(sig))),
    };
    let ctx = Ctx::new(
        main,
        clients,
        prefix(),
        expiry_rounding(url.scheme()),
        args.long,
        usize::from(args.samples),
    );
    let mut rows = Vec::new();
    let interrupted = tokio::select! {
        () = run_checks(&ctx, &mut rows) => None,
        sig = signals.recv() => Some(sig),
    };
    // Closing ends every lease still held (a check interrupted or timed out) and deletes its
    // entry, and waits for the releases and withdrawals of the leases and requests a check cut
    // short dropped; the audit then looks with a fresh locker.
    close_all(&ctx.main, &ctx.clients).await;
    if let Some(sig) = interrupted {
        return Ok(Verdict::Interrupted(signal_code(sig)));
    }
    rows.push(audit(url, &ctx).await);
    let header = Header {
        url: shown,
        backend: url.scheme().as_str(),
        ttl: ctx.ttl,
        caps: &ctx.caps,
        prefix: &ctx.prefix,
        clients: ctx.clients.len(),
    };
    let report = Report {
        header,
        rows: &rows,
    };
    if json {
        let mut out = report.json();
        if let (Some(t), Some(obj)) = (tier, out.as_object_mut()) {
            obj.insert("tier".into(), t.into());
        }
        println!("{out}");
    } else {
        print!("{}", report.human());
    }
    Ok(if report.fit() {
        Verdict::Fit
    } else {
        Verdict::Unfit
    })
}

/// Runs [`CHECKS`] in order, each within [`check_bound`], pushing a row for each.
async fn run_checks(ctx: &Ctx, rows: &mut Vec<Row>) {
    let bound = check_bound(ctx.ttl);
    for (i, &(name, run)) in CHECKS.iter().enumerate() {
        if i >= MEASURING
            && let Some(failed) = rows.iter().find(|r| r.is_fail())
        {
            rows.push(Row::skip(
                name,
                format!(
                    "not run: {} failed (the lease is not usable here)",
                    failed.name
                ),
            ));
            continue;
        }
        let row = match tokio::time::timeout(bound, run(ctx)).await {
            Ok(Ok(row)) => row,
            Ok(Err(reason)) => Row::fail(name, reason),
            Err(_) => Row::fail(
                name,
                format!(
                    "did not finish within {}",
                    humantime::format_duration(bound)
                ),
            ),
        };
        rows.push(row);
    }
}

/// Closes every locker (errors only mean an entry expires at its TTL; the audit reports it).
async fn close_all(main: &Arc<dyn Locker>, clients: &[Arc<dyn Locker>]) {
    for c in clients {
        let _ = c.close().await;
    }
    let _ = main.close().await;
}

/// `cleanup`: after every locker closed, a fresh locker sees every name used free and nobody
/// queued. Fails on a name left held or queued; skipped when the names cannot be read (a
/// deployment that failed the other checks the same way).
async fn audit(url: &LockerUrl, ctx: &Ctx) -> Row {
    let names = ctx.names();
    let row = Row::pass("cleanup").figure("names", names.len());
    let auditor = match url.connect().await {
        Ok(l) => l,
        Err(e) => return Row::skip("cleanup", format!("cannot connect for the audit: {e}")),
    };
    let (mut left, mut unread) = (Vec::new(), Vec::new());
    for name in &names {
        match auditor.inspect(name).await {
            Ok(s) if s.holder.is_none() && s.waiting.unwrap_or(0) == 0 => {}
            Ok(s) => left.push(format!(
                "{name} ({})",
                s.holder.map_or_else(
                    || "queued requests".into(),
                    |h| format!("held: {}", h.entry)
                )
            )),
            Err(e) => unread.push(format!("{name} ({e})")),
        }
    }
    let _ = auditor.close().await;
    let row = row.figure("unread", unread.len());
    match (left.is_empty(), unread.is_empty()) {
        (true, true) => row,
        (true, false) => Row {
            status: report::Status::Skip,
            reason: format!("cannot read: {}", unread.join(", ")),
            ..row
        },
        (false, _) => {
            let mut reason = format!("left behind: {}", left.join(", "));
            if !unread.is_empty() {
                reason.push_str(&format!("; cannot read: {}", unread.join(", ")));
            }
            row.failed(reason)
        }
    }
}
