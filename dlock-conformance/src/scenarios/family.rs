//! The read-write lock and the semaphore: writers alone and readers together, a writer not
//! starved by readers, never more permits held than the semaphore has, and a permit freed
//! after its holder's link dies, never before the holder knows.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, ErrorKind, Lease, RwLocker, Semaphore};
use tokio::time::Instant;

use super::takeover::{Link, take_over, waiter_budget};
use super::util::{join_all, name};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;

/// The skip reason of a backend without a read-write lock.
pub(crate) const NO_RW: &str = "the backend has no RwLocker";
/// The skip reason of a backend without a semaphore.
pub(crate) const NO_SEMAPHORE: &str = "the backend has no Semaphore";

pub(super) async fn rw(ctx: &Ctx, opts: ClientOptions) -> Result<Arc<dyn RwLocker>, Verdict> {
    ctx.backend()
        .rw(opts)
        .await
        .map_err(|e| Verdict::Fail(format!("cannot build a read-write client: {e}")))?
        .ok_or_else(|| Verdict::Skip(NO_RW.into()))
}

pub(super) async fn semaphore(
    ctx: &Ctx,
    opts: ClientOptions,
) -> Result<Arc<dyn Semaphore>, Verdict> {
    ctx.backend()
        .semaphore(opts)
        .await
        .map_err(|e| Verdict::Fail(format!("cannot build a semaphore client: {e}")))?
        .ok_or_else(|| Verdict::Skip(NO_SEMAPHORE.into()))
}

/// One read or write lease as its holder saw it.
struct Hold {
    who: usize,
    write: bool,
    token: u64,
    /// When the lease was granted.
    from: Instant,
    /// When the holder stopped believing: the start of its release, or its deadline.
    until: Instant,
}

/// Two readers hold together and a writer then waits; after that, 6 clients × 8 leases each
/// on one name, a third of them writes: no write lease overlaps any other lease, and a
/// writer's token is above every lease that ended before it began and below every lease
/// that began after it ended. (How many readers overlap in the churn is a figure: it depends
/// on timing.)
pub(crate) async fn rw_exclusion(ctx: &Ctx) -> Result<(), Verdict> {
    const CLIENTS: usize = 6;
    const LEASES_EACH: usize = 8;
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let lock = name("rw")?;
    // First, deterministically: two readers hold together, and a writer is not let in.
    {
        let (a, b, w) = (
            rw(ctx, opts.clone()).await?,
            rw(ctx, opts.clone()).await?,
            rw(ctx, opts.clone()).await?,
        );
        let wait = AcquireOptions::wait(Duration::from_secs(10));
        let ra = a.read(&lock, wait).await?;
        let rb = match b.read(&lock, wait).await {
            Ok(r) => r,
            Err(e) => {
                return Err(Verdict::Fail(format!(
                    "readers never held together: a second reader was not granted while one held ({e})"
                )));
            }
        };
        let readers_only = ctx.leftovers().await?;
        let intruder = w
            .write(&lock, AcquireOptions::wait(Duration::from_secs(1)))
            .await;
        // Not granted: the wait ended (with a request still unanswered on a slow server, a
        // bounded wait may end `Unavailable`); what the server holds is judged while the
        // readers still hold.
        let judged = match &intruder {
            Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable) => {
                judge_extra_at_server(ctx, &readers_only, "the writer", "two readers", e).await
            }
            _ => Ok(()),
        };
        ra.release().await?;
        rb.release().await?;
        judged?;
        match intruder {
            Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable) => {}
            Err(e) => return Err(Verdict::Fail(format!("the writer failed: {e}"))),
            Ok(lease) => {
                let _ = lease.release().await;
                return Err(Verdict::Fail(
                    "a writer was granted while two readers held: held together with a reader"
                        .into(),
                ));
            }
        }
    }
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let c = rw(ctx, opts.clone()).await?;
        let (lock, holds) = (lock.clone(), Arc::clone(&holds));
        tasks.push(tokio::spawn(async move {
            for round in 0..LEASES_EACH {
                let write = (who + round) % 3 == 0;
                let wait = AcquireOptions::wait(Duration::from_secs(30));
                let lease = if write {
                    c.write(&lock, wait).await?
                } else {
                    c.read(&lock, wait).await?
                };
                let from = Instant::now();
                let hold = 10 + (who * 7 + round * 3) % 20;
                tokio::time::sleep(Duration::from_millis(hold as u64)).await;
                let until = Instant::now().min(lease.deadline());
                let token = lease.token().get();
                lease.release().await?;
                holds.lock().unwrap_or_else(|p| p.into_inner()).push(Hold {
                    who,
                    write,
                    token,
                    from,
                    until,
                });
            }
            Ok::<(), dlock_core::Error>(())
        }));
    }
    join_all(tasks, "a client").await?;
    let holds = std::mem::take(&mut *holds.lock().unwrap_or_else(|p| p.into_inner()));
    ensure!(
        holds.len() == CLIENTS * LEASES_EACH,
        "{} leases recorded, {} expected",
        holds.len(),
        CLIENTS * LEASES_EACH
    );
    let overlaps = |a: &Hold, b: &Hold| a.from < b.until && b.from < a.until;
    for w in holds.iter().filter(|h| h.write) {
        for o in holds.iter().filter(|o| !std::ptr::eq(*o, w)) {
            ensure!(
                !overlaps(w, o),
                "a writer (client {}, token {}) held together with a {} (client {}, token {})",
                w.who,
                w.token,
                if o.write { "writer" } else { "reader" },
                o.who,
                o.token
            );
            if o.until <= w.from {
                ensure!(
                    o.token < w.token,
                    "a writer's token {} is not above the token {} of a lease that ended before it began",
                    w.token,
                    o.token
                );
            }
            if o.from >= w.until {
                ensure!(
                    o.token > w.token,
                    "a lease that began after a writer ended has token {}, not above the writer's {}",
                    o.token,
                    w.token
                );
            }
        }
    }
    // The most readers that held at one instant (at some reader's grant).
    let readers: Vec<&Hold> = holds.iter().filter(|h| !h.write).collect();
    let together = readers
        .iter()
        .map(|r| {
            readers
                .iter()
                .filter(|o| o.from <= r.from && r.from < o.until)
                .count()
        })
        .max()
        .unwrap_or(0);
    ctx.figure("leases", holds.len() as u64);
    ctx.figure("readers_together_max", together as u64);
    Ok(())
}

/// Three readers keep the name read-held without a gap (each re-reads as soon as it
/// released, their holds overlapping); a writer then asks: it is granted within a few holds
/// (FIFO across modes), not starved while readers keep coming.
pub(crate) async fn rw_writer_not_starved(ctx: &Ctx) -> Result<(), Verdict> {
    const READERS: usize = 3;
    const HOLD: Duration = Duration::from_millis(60);
    let bound = ctx.ttl() + Duration::from_secs(1);
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let lock = name("not-starved")?;
    let writer = rw(ctx, opts.clone()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..READERS {
        let c = rw(ctx, opts.clone()).await?;
        let (lock, stop, reads) = (lock.clone(), Arc::clone(&stop), Arc::clone(&reads));
        tasks.push(tokio::spawn(async move {
            // Staggered, so that some reader always holds.
            tokio::time::sleep(HOLD / 3 * i as u32).await;
            while !stop.load(Ordering::Relaxed) {
                let lease = c
                    .read(&lock, AcquireOptions::wait(Duration::from_secs(30)))
                    .await?;
                reads.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(HOLD).await;
                lease.release().await?;
            }
            Ok::<(), dlock_core::Error>(())
        }));
    }
    tokio::time::sleep(HOLD * 4).await;
    let asked = Instant::now();
    let got = writer.write(&lock, AcquireOptions::wait(bound)).await;
    let waited = asked.elapsed();
    let reads_during = reads.load(Ordering::Relaxed);
    let write = match got {
        Ok(lease) => Some(lease),
        Err(e) if e.kind() == ErrorKind::Timeout => None,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            return Err(Verdict::Fail(format!("the writer failed: {e}")));
        }
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(lease) = write {
        lease.release().await?;
    }
    join_all(tasks, "a reader").await?;
    ctx.figure_ms("writer_wait_ms", waited);
    ctx.figure("reads", reads_during as u64);
    ensure!(
        waited < bound,
        "the writer was starved: not granted in {waited:?} while readers kept reading ({reads_during} reads)"
    );
    Ok(())
}

/// 3 permits held at once on a semaphore of 3 and a fourth acquire kept waiting; then 8
/// clients × 6 permits each: never more than 3 held at once (how many were is a figure: it
/// depends on timing); an acquire that asks for another count while permits are held fails
/// with `InvalidInput` instead of changing it.
pub(crate) async fn semaphore_bound(ctx: &Ctx) -> Result<(), Verdict> {
    const PERMITS: u32 = 3;
    const CLIENTS: usize = 8;
    const EACH: usize = 6;
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let lock = name("semaphore")?;
    // First, deterministically: N holders at once, and an N + 1st is not let in.
    {
        let wait = AcquireOptions::wait(Duration::from_secs(10));
        let mut permits = Vec::new();
        for _ in 0..PERMITS {
            let c = semaphore(ctx, opts.clone()).await?;
            match c.acquire_permit(&lock, PERMITS, wait).await {
                Ok(p) => permits.push(p),
                Err(e) => {
                    return Err(Verdict::Fail(format!(
                        "never more than {} of {PERMITS} permits held at once: the next acquire failed ({e})",
                        permits.len()
                    )));
                }
            }
        }
        let extra = semaphore(ctx, opts.clone()).await?;
        let holders_only = ctx.leftovers().await?;
        let intruder = extra
            .acquire_permit(&lock, PERMITS, AcquireOptions::wait(Duration::from_secs(1)))
            .await;
        // Not granted: the wait ended (with a request still unanswered on a slow server, a
        // bounded wait may end `Unavailable`); what the server holds is judged while the
        // permits are still held.
        let judged = match &intruder {
            Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable) => {
                let holders = format!("the {PERMITS} permit holders");
                judge_extra_at_server(ctx, &holders_only, "the extra acquire", &holders, e).await
            }
            _ => Ok(()),
        };
        for p in permits {
            p.release().await?;
        }
        judged?;
        match intruder {
            Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable) => {}
            Err(e) => return Err(Verdict::Fail(format!("the extra acquire failed: {e}"))),
            Ok(p) => {
                let _ = p.release().await;
                return Err(Verdict::Fail(format!(
                    "{} permits held at once on a semaphore of {PERMITS}: an extra acquire was granted while {PERMITS} were held",
                    PERMITS + 1
                )));
            }
        }
    }
    let held = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let c = semaphore(ctx, opts.clone()).await?;
        let (lock, held, most) = (lock.clone(), Arc::clone(&held), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            for round in 0..EACH {
                let permit = c
                    .acquire_permit(
                        &lock,
                        PERMITS,
                        AcquireOptions::wait(Duration::from_secs(30)),
                    )
                    .await?;
                let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let hold = 10 + (who * 7 + round * 3) % 20;
                tokio::time::sleep(Duration::from_millis(hold as u64)).await;
                held.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<(), dlock_core::Error>(())
        }));
    }
    join_all(tasks, "a client").await?;
    let most = most.load(Ordering::SeqCst);
    ctx.figure("held_together_max", most as u64);
    ensure!(
        most <= PERMITS as usize,
        "{most} permits held at once on a semaphore of {PERMITS}"
    );
    // Every holder agrees on the count.
    let a = semaphore(ctx, opts.clone()).await?;
    let b = semaphore(ctx, opts).await?;
    let permit = a
        .acquire_permit(
            &lock,
            PERMITS,
            AcquireOptions::wait(Duration::from_secs(10)),
        )
        .await?;
    let other = b
        .acquire_permit(
            &lock,
            PERMITS + 1,
            AcquireOptions::wait(Duration::from_secs(2)),
        )
        .await;
    permit.release().await?;
    match other {
        Err(e) if e.kind() == ErrorKind::InvalidInput => Ok(()),
        Err(e) => Err(Verdict::Fail(format!(
            "an acquire with {} permits on a semaphore of {PERMITS} failed with {e}, not InvalidInput",
            PERMITS + 1
        ))),
        Ok(p) => {
            let _ = p.release().await;
            Err(Verdict::Fail(format!(
                "an acquire with {} permits on a semaphore of {PERMITS} in use was granted",
                PERMITS + 1
            )))
        }
    }
}

/// A semaphore of one permit: its holder's link goes silent (or, in process, its renewal
/// stops) while another client waits: the waiter gets the permit within TTL + slack, never
/// before the holder's `lost()` fired, with a higher token (see [`take_over`]).
pub(crate) async fn semaphore_crash_release(ctx: &Ctx) -> Result<(), Verdict> {
    let ttl = ctx.ttl();
    let lock = name("semaphore-crash")?;
    let (link, opts) = Link::start(ctx, ClientOptions::new(ctx.ns(), ttl))?;
    let holder = semaphore(ctx, opts).await?;
    let waiter = semaphore(ctx, ClientOptions::new(ctx.ns(), ttl)).await?;
    let permit = holder
        .acquire_permit(&lock, 1, AcquireOptions::wait(Duration::from_secs(10)))
        .await?;
    let wait = AcquireOptions::wait(waiter_budget(ctx).await?);
    let l = lock.clone();
    let acquire = async move { waiter.acquire_permit(&l, 1, wait).await };
    let taken = take_over(
        ctx,
        &link,
        &permit,
        "the only permit",
        "release",
        acquire,
        lease_token,
    )
    .await?;
    taken.release().await?;
    drop(permit);
    Ok(())
}

/// A writer cut off while a reader waits, then a reader cut off while a writer waits: each
/// waiter is granted within TTL + slack of the cut, never before the cut-off holder's `lost()`
/// fired, with a higher token (see [`take_over`]).
pub(crate) async fn rw_lost_before_stolen(ctx: &Ctx) -> Result<(), Verdict> {
    let ttl = ctx.ttl();
    let lock = name("rw-lost")?;
    let waiter = rw(ctx, ClientOptions::new(ctx.ns(), ttl)).await?;
    for (held_write, what, key) in [
        (true, "the read lease", "writer_cut"),
        (false, "the write lease", "reader_cut"),
    ] {
        let (link, opts) = Link::start(ctx, ClientOptions::new(ctx.ns(), ttl))?;
        let holder = rw(ctx, opts).await?;
        let ten = AcquireOptions::wait(Duration::from_secs(10));
        let held = if held_write {
            holder.write(&lock, ten).await?
        } else {
            holder.read(&lock, ten).await?
        };
        let wait = AcquireOptions::wait(waiter_budget(ctx).await?);
        let (w, l) = (Arc::clone(&waiter), lock.clone());
        let request = async move {
            if held_write {
                w.read(&l, wait).await
            } else {
                w.write(&l, wait).await
            }
        };
        let taken = take_over(ctx, &link, &held, what, key, request, lease_token).await?;
        taken.release().await?;
        drop(held);
    }
    Ok(())
}

fn lease_token(lease: &Lease) -> u64 {
    lease.token().get()
}

/// How long an extra request that ended without a grant may keep entries at the server
/// (withdrawing a timed-out request is a delete the locker may finish in the background).
fn withdraw_bound(ctx: &Ctx) -> Duration {
    ctx.ttl() * 2
}

/// Judged at the server: the extra request `what` of a primitive held by `holders` ended
/// without a grant (`Timeout`, or `Unavailable` when the reply was lost), so the server must
/// hold no more than before it: within [`withdraw_bound`] the namespace's entries must be back
/// to `before` (read while only the holders held; compared as multisets, an entry gone since
/// is fine). An entry the extra request keeps there may be a grant its client was never told
/// of: more than `holders` holding at once. Call it while the holders still hold.
async fn judge_extra_at_server(
    ctx: &Ctx,
    before: &[String],
    what: &str,
    holders: &str,
    answer: &dlock_core::Error,
) -> Result<(), Verdict> {
    let began = Instant::now();
    loop {
        let now = ctx.leftovers().await?;
        let extra = minus(&now, before);
        if extra.is_empty() {
            ctx.figure_ms("extra_withdrawn_ms", began.elapsed());
            return Ok(());
        }
        if began.elapsed() >= withdraw_bound(ctx) {
            return Err(Verdict::Fail(format!(
                "{what} answered {:?} ({answer}), but the server still keeps entries of it \
                 {:?} later while {holders} hold: {extra:?} (with the holders alone: \
                 {before:?}); more than {holders} may hold at once",
                answer.kind(),
                withdraw_bound(ctx)
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one request of a family primitive holds.
enum Held {
    Lease(dlock_core::Lease),
    Leader(dlock_core::Leadership),
}

impl Held {
    async fn release(self) -> Result<(), dlock_core::Error> {
        match self {
            Held::Lease(l) => l.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

/// One client of a family primitive.
#[derive(Clone)]
enum Client {
    Rw(Arc<dyn dlock_core::RwLocker>),
    Election(Arc<dyn dlock_core::Election>),
    Semaphore(Arc<dyn dlock_core::Semaphore>),
}

/// A client's request for `lock` in one primitive (a campaign, a write lease, a read lease
/// behind a writer, the only permit).
#[derive(Clone)]
struct Request {
    client: Client,
    lock: dlock_core::LockName,
    read: bool,
}

impl Request {
    async fn send(self) -> Result<Held, dlock_core::Error> {
        let (lock, wait) = (&self.lock, AcquireOptions::forever());
        Ok(match self.client {
            Client::Rw(c) if self.read => Held::Lease(c.read(lock, wait).await?),
            Client::Rw(c) => Held::Lease(c.write(lock, wait).await?),
            Client::Election(c) => Held::Leader(c.campaign(lock, b"v", wait).await?),
            Client::Semaphore(c) => Held::Lease(c.acquire_permit(lock, 1, wait).await?),
        })
    }
}

/// Three clients' requests of primitive `kind`, or `None` when the backend lacks it.
async fn requests(
    ctx: &Ctx,
    kind: &str,
    lock: &dlock_core::LockName,
) -> Result<Option<Vec<Request>>, Verdict> {
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let failed = |e: dlock_core::Error| Verdict::Fail(format!("cannot build a {kind} client: {e}"));
    let mut out = Vec::new();
    for i in 0..3 {
        let backend = ctx.backend();
        let client = match kind {
            "read" | "write" => backend
                .rw(opts.clone())
                .await
                .map_err(failed)?
                .map(Client::Rw),
            "election" => (backend.election(opts.clone()).await)
                .map_err(failed)?
                .map(Client::Election),
            _ => (backend.semaphore(opts.clone()).await)
                .map_err(failed)?
                .map(Client::Semaphore),
        };
        let Some(client) = client else {
            return Ok(None);
        };
        // The first client of the read case writes, so that the two readers behind it wait.
        let read = kind == "read" && i > 0;
        out.push(Request {
            client,
            lock: lock.clone(),
            read,
        });
    }
    Ok(Some(out))
}

/// How many times `e` is in `v`.
fn count(v: &[String], e: &str) -> usize {
    v.iter().filter(|x| *x == e).count()
}

/// `a` less `b`, as multisets.
fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut out = a.to_vec();
    for e in b {
        if let Some(i) = out.iter().position(|x| x == e) {
            out.remove(i);
        }
    }
    out
}

/// For each family primitive the backend has (a campaign, a write lease, a semaphore's only
/// permit; which ones it has must match its `Capabilities::primitives`): a request dropped while queued behind a holder leaves nothing behind within
/// 500 ms, and the request queued after it is granted within TTL/2 of the holder's release.
pub(crate) async fn family_cancel(ctx: &Ctx) -> Result<(), Verdict> {
    let mut ran = Vec::new();
    let declared = ctx.capabilities().await?.primitives;
    for (kind, claimed) in [
        ("election", declared.election),
        ("write", declared.read_write),
        ("read", declared.read_write),
        ("permit", declared.semaphore),
    ] {
        let lock = name(&format!("cancel-{kind}"))?;
        let reqs = requests(ctx, kind, &lock).await?;
        ensure!(
            reqs.is_some() == claimed,
            "{kind}: Capabilities::primitives says {claimed}, but the backend {} it",
            if reqs.is_some() { "has" } else { "lacks" }
        );
        let Some(reqs) = reqs else {
            continue;
        };
        ran.push(kind);
        let held = reqs[0].clone().send().await?;
        let alone = ctx.leftovers().await?;
        let b = tokio::spawn(reqs[1].clone().send());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let with_b = ctx.leftovers().await?;
        let c = tokio::spawn(reqs[2].clone().send());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let with_both = ctx.leftovers().await?;
        b.abort();
        ensure!(
            b.await.is_err_and(|e| e.is_cancelled()),
            "{kind}: the cancelled request completed"
        );
        // B's entries: what appeared when it queued. Each must be gone (as many times as it
        // appeared), whatever C's own entries do meanwhile (a semaphore's guard moves on).
        let b_entries = minus(&with_b, &alone);
        let expected = minus(&with_both, &b_entries);
        let began = Instant::now();
        loop {
            let now = ctx.leftovers().await?;
            let left: Vec<&String> = b_entries
                .iter()
                .filter(|e| count(&now, e) > count(&expected, e))
                .collect();
            if left.is_empty() {
                break;
            }
            if began.elapsed() > Duration::from_millis(500) {
                return Err(Verdict::Fail(format!(
                    "{kind}: a cancelled request left entries behind: {left:?} (holder only {alone:?}, with both waiters {with_both:?}, after cancelling {now:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released = Instant::now();
        held.release().await?;
        let bound = ctx.ttl() / 2;
        let granted = match tokio::time::timeout(ctx.ttl() * 2, c).await {
            Ok(Ok(Ok(h))) => h,
            Ok(Ok(Err(e))) => {
                return Err(Verdict::Fail(format!(
                    "{kind}: the next request failed: {e}"
                )));
            }
            Ok(Err(e)) => {
                return Err(Verdict::Fail(format!(
                    "{kind}: the next request panicked: {e}"
                )));
            }
            Err(_) => {
                return Err(Verdict::Fail(format!(
                    "{kind}: the request behind a cancelled one was not granted in 2 × TTL"
                )));
            }
        };
        let handoff = released.elapsed();
        granted.release().await?;
        ctx.figure_ms(&format!("{kind}_handoff_ms"), handoff);
        ensure!(
            handoff < bound,
            "{kind}: the request behind a cancelled one was granted {handoff:?} after the release, not within TTL/2"
        );
    }
    if ran.is_empty() {
        return Err(Verdict::Skip(
            "the backend has no Election, RwLocker or Semaphore".into(),
        ));
    }
    ctx.figure("primitives", ran.join(","));
    Ok(())
}
