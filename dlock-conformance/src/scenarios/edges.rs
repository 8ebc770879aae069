//! The family primitives' edges, for every backend that has them: bad permit counts and
//! election values refused with a typed error before any I/O, a permit count that disagrees
//! with the semaphore's refused without disturbing it, a reader queued behind a waiting
//! writer, a fresh name with no leader, and a leader whose entry was deleted unable to
//! proclaim.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    AcquireOptions, Election, Error, ErrorKind, Lease, MAX_PERMITS, MAX_VALUE_LEN, RwLocker,
    Semaphore,
};
use tokio::task::JoinHandle;

use super::election::election;
use super::family::{rw, semaphore};
use super::util::{name, via_proxies, within};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;
use crate::faults::Mode;

/// How long a refused input may take: it is refused before any I/O, and the links are
/// blackholed, so anything that waits on the network takes a request timeout or hangs.
const REFUSED_WITHIN: Duration = Duration::from_secs(1);
/// How long a request that must wait is watched before it is taken to be waiting.
const STILL_WAITING: Duration = Duration::from_millis(300);

/// The skip reason of a backend with none of the family primitives.
pub(crate) const NO_FAMILY: &str = "the backend has no Election, RwLocker or Semaphore";

/// The family's edges (see the module docs); a part whose primitive the backend lacks is not
/// run, and a backend with none of them skips. (A primitive declared but missing makes the
/// client helpers skip, and an unlisted skip fails.)
pub(crate) async fn family_edges(ctx: &Ctx) -> Result<(), Verdict> {
    let declared = ctx.capabilities().await?.primitives;
    if !(declared.semaphore || declared.read_write || declared.election) {
        return Err(Verdict::Skip(NO_FAMILY.into()));
    }
    refused_before_io(ctx, declared.semaphore, declared.election).await?;
    let opts = || ClientOptions::new(ctx.ns(), ctx.ttl());
    let mut ran = Vec::new();
    if declared.semaphore {
        let clients = [
            semaphore(ctx, opts()).await?,
            semaphore(ctx, opts()).await?,
            semaphore(ctx, opts()).await?,
        ];
        permit_counts(ctx, &clients).await?;
        ran.push("permits");
    }
    if declared.read_write {
        let clients = [
            rw(ctx, opts()).await?,
            rw(ctx, opts()).await?,
            rw(ctx, opts()).await?,
        ];
        reader_behind_writer(ctx, &clients).await?;
        ran.push("read_write");
    }
    if declared.election {
        let client = election(ctx, opts()).await?;
        fresh_leader(ctx, &*client).await?;
        ran.push("election");
    }
    ctx.figure("parts", ran.join(","));
    Ok(())
}

fn wait(ctx: &Ctx) -> AcquireOptions {
    AcquireOptions::wait(ctx.ttl() * 2)
}

/// `result` is an invalid-input error, else the failure names `what`.
fn invalid<T>(what: &str, result: Result<T, Error>) -> Result<(), Verdict> {
    match result {
        Err(e) => ensure!(
            e.kind() == ErrorKind::InvalidInput,
            "{what} gave {e}, not an invalid-input error"
        ),
        Ok(_) => {
            return Err(Verdict::Fail(format!("{what} was accepted")));
        }
    }
    Ok(())
}

/// Bad input through links that pass nothing: zero permits, more than [`MAX_PERMITS`], and an
/// election value longer than [`MAX_VALUE_LEN`] (campaigned, or proclaimed by a leader) are
/// each refused as invalid input within [`REFUSED_WITHIN`] (a client that asked the server
/// first would hang or time out).
async fn refused_before_io(ctx: &Ctx, semaphores: bool, elections: bool) -> Result<(), Verdict> {
    let (proxies, opts) = via_proxies(
        &ctx.backend().node_addrs(),
        ClientOptions::new(ctx.ns(), ctx.ttl()),
    )?;
    let lock = name("edges-input")?;
    let sem = if semaphores {
        Some(semaphore(ctx, opts.clone()).await?)
    } else {
        None
    };
    let elect = if elections {
        Some(election(ctx, opts).await?)
    } else {
        None
    };
    // A leader through the same links, to proclaim a value too long once they are cut.
    let leading = match &elect {
        Some(e) => Some(
            e.campaign(&name("edges-input-leader")?, b"ok", wait(ctx))
                .await?,
        ),
        None => None,
    };
    proxies.iter().for_each(|p| p.set(Mode::Blackhole));
    let long = vec![b'x'; MAX_VALUE_LEN + 1];
    let mut checks: Vec<(String, Result<(), Error>)> = Vec::new();
    if let Some(s) = &sem {
        for permits in [0, MAX_PERMITS + 1] {
            let got = within(REFUSED_WITHIN, s.acquire_permit(&lock, permits, wait(ctx))).await;
            checks.push((
                format!("a semaphore of {permits} permits"),
                got.map_or(Ok(()), |r| r.map(drop)),
            ));
            if got_hung(&checks) {
                break;
            }
        }
    }
    if let Some(e) = &elect {
        let got = within(REFUSED_WITHIN, e.campaign(&lock, &long, wait(ctx))).await;
        checks.push((
            format!("a campaign value of {} bytes", long.len()),
            got.map_or(Ok(()), |r| r.map(drop)),
        ));
    }
    if let Some(l) = &leading {
        let got = within(REFUSED_WITHIN, l.proclaim(&long)).await;
        checks.push((
            format!("a proclaimed value of {} bytes", long.len()),
            got.unwrap_or(Ok(())),
        ));
    }
    proxies.iter().for_each(|p| p.set(Mode::Pass));
    if let Some(l) = leading {
        l.resign().await?;
    }
    for (what, result) in checks {
        if result.is_ok() {
            return Err(Verdict::Fail(format!(
                "{what} was not refused within {REFUSED_WITHIN:?} through a link that passes nothing: the client asked the server (or accepted it)"
            )));
        }
        invalid(&what, result)?;
    }
    Ok(())
}

/// Whether the last check timed out (recorded as `Ok`): the rest would hang as well.
fn got_hung(checks: &[(String, Result<(), Error>)]) -> bool {
    checks.last().is_some_and(|(_, r)| r.is_ok())
}

/// A permit count other than the semaphore's is invalid input: at once while the semaphore is
/// held, and, while a waiter queues for it, at once or when the wrong count reaches the head
/// of the queue. The refusals leave nothing at the server and disturb neither the waiter
/// (granted when the permit is released, with a higher token) nor a correct count.
async fn permit_counts(ctx: &Ctx, [a, b, c]: &[Arc<dyn Semaphore>; 3]) -> Result<(), Verdict> {
    let pool = name("edges-pool")?;
    let one = name("edges-one")?;
    let held = a.acquire_permit(&pool, 2, wait(ctx)).await?;
    invalid(
        "3 permits of a semaphore held with 2",
        b.acquire_permit(&pool, 3, wait(ctx)).await,
    )?;
    let only = a.acquire_permit(&one, 1, wait(ctx)).await?;
    let waiter: JoinHandle<Result<Lease, Error>> = {
        let (b, one, opts) = (Arc::clone(b), one.clone(), wait(ctx));
        tokio::spawn(async move { b.acquire_permit(&one, 1, opts).await })
    };
    tokio::time::sleep(STILL_WAITING).await;
    ensure!(
        !waiter.is_finished(),
        "a second permit of a semaphore of 1 was granted (or failed) while the first was held"
    );
    // The wrong count may be refused at once, or once it reaches the head of the queue (a
    // backend that checks counts under a guard the waiter holds): either way, refused, and
    // the waiter ahead of it is served.
    let wrong: JoinHandle<Result<Lease, Error>> = {
        let (c, one, opts) = (Arc::clone(c), one.clone(), wait(ctx));
        tokio::spawn(async move { c.acquire_permit(&one, 2, opts).await })
    };
    tokio::time::sleep(STILL_WAITING).await;
    let first = only.token();
    only.release().await?;
    let next = match within(ctx.ttl() * 2, waiter).await {
        Some(Ok(Ok(lease))) => lease,
        Some(Ok(Err(e))) => {
            return Err(Verdict::Fail(format!(
                "the waiter behind a refused count failed: {e}"
            )));
        }
        _ => {
            return Err(Verdict::Fail(
                "the waiter behind a refused count was not granted within 2 × TTL".into(),
            ));
        }
    };
    ensure!(
        next.token() > first,
        "the next permit's token {} is not above the released one's {}",
        next.token(),
        first
    );
    match within(ctx.ttl() * 2, wrong).await {
        Some(Ok(result)) => invalid(
            "2 permits of a semaphore of 1 that was held and awaited",
            result,
        )?,
        Some(Err(e)) => return Err(Verdict::Fail(format!("the wrong count's task: {e}"))),
        None => {
            return Err(Verdict::Fail(
                "2 permits of a semaphore of 1 were neither refused nor granted within 2 × TTL of the waiter's grant".into(),
            ));
        }
    }
    let second = c.acquire_permit(&pool, 2, wait(ctx)).await.map_err(|e| {
        Verdict::Fail(format!(
            "the second of 2 permits was refused after a wrong count's refusal: {e}"
        ))
    })?;
    for lease in [next, second, held] {
        lease.release().await?;
    }
    // Counts both lower and higher than the semaphore's are refused; once nobody holds or
    // waits, a new count is the semaphore's.
    let held = a.acquire_permit(&pool, 3, wait(ctx)).await?;
    for other in [1, 2, 4] {
        invalid(
            &format!("{other} permits of a semaphore held with 3"),
            b.acquire_permit(&pool, other, wait(ctx)).await,
        )?;
    }
    held.release().await?;
    let fresh = b.acquire_permit(&pool, 5, wait(ctx)).await.map_err(|e| {
        Verdict::Fail(format!(
            "a new count on a semaphore nobody holds any more was refused: {e}"
        ))
    })?;
    fresh.release().await?;
    nothing_left(ctx, "the semaphores").await
}

/// A reader that comes while a writer waits behind a reader queues behind that writer (FIFO
/// across modes): it is not granted until the writer has been and gone.
async fn reader_behind_writer(
    ctx: &Ctx,
    [first, writer, second]: &[Arc<dyn RwLocker>; 3],
) -> Result<(), Verdict> {
    let lock = name("edges-rw")?;
    let read = first.read(&lock, wait(ctx)).await?;
    let write: JoinHandle<Result<Lease, Error>> = {
        let (w, lock, opts) = (Arc::clone(writer), lock.clone(), wait(ctx));
        tokio::spawn(async move { w.write(&lock, opts).await })
    };
    tokio::time::sleep(STILL_WAITING).await;
    ensure!(
        !write.is_finished(),
        "a writer was granted (or failed) while a reader held"
    );
    let late: JoinHandle<Result<Lease, Error>> = {
        let (r, lock, opts) = (
            Arc::clone(second),
            lock.clone(),
            AcquireOptions::wait(ctx.ttl() * 4),
        );
        tokio::spawn(async move { r.read(&lock, opts).await })
    };
    tokio::time::sleep(STILL_WAITING).await;
    ensure!(
        !late.is_finished(),
        "a reader that came after a waiting writer was let in ahead of it"
    );
    read.release().await?;
    let w = match within(ctx.ttl() * 2, write).await {
        Some(Ok(Ok(lease))) => lease,
        Some(Ok(Err(e))) => return Err(Verdict::Fail(format!("the writer failed: {e}"))),
        _ => {
            return Err(Verdict::Fail(
                "the writer was not granted within 2 × TTL of the reader's release".into(),
            ));
        }
    };
    tokio::time::sleep(STILL_WAITING).await;
    ensure!(
        !late.is_finished(),
        "the late reader was granted while the writer held"
    );
    w.release().await?;
    match within(ctx.ttl() * 2, late).await {
        Some(Ok(Ok(lease))) => lease.release().await?,
        Some(Ok(Err(e))) => return Err(Verdict::Fail(format!("the late reader failed: {e}"))),
        _ => {
            return Err(Verdict::Fail(
                "the late reader was not granted within 2 × TTL of the writer's release".into(),
            ));
        }
    }
    nothing_left(ctx, "the read-write lock").await
}

/// A fresh name has no leader; a proclamation too long is invalid input and changes nothing
/// (the leader's term and value stay); after resigning, nobody leads.
async fn fresh_leader(ctx: &Ctx, e: &dyn Election) -> Result<(), Verdict> {
    let lock = name("edges-leader")?;
    ensure!(
        e.leader(&lock).await?.is_none(),
        "a fresh name has a leader"
    );
    let leading = e.campaign(&lock, b"first", wait(ctx)).await?;
    invalid(
        &format!("a proclamation of {} bytes", MAX_VALUE_LEN + 1),
        leading.proclaim(&vec![b'x'; MAX_VALUE_LEN + 1]).await,
    )?;
    let now = e.leader(&lock).await?;
    ensure!(
        now.as_ref()
            .is_some_and(|l| l.term == leading.term() && l.value == b"first"),
        "after a refused proclamation the leader is {now:?}, not term {} with its first value",
        leading.term()
    );
    leading.resign().await?;
    let after = e.leader(&lock).await?;
    ensure!(after.is_none(), "after resigning, {after:?} leads");
    broken_leader(ctx, e).await?;
    nothing_left(ctx, "the election").await
}

/// A leader whose entry was deleted at the server cannot proclaim: the write is guarded by
/// its own entry, so it fails as lost, and nobody is recorded leading with that value.
async fn broken_leader(ctx: &Ctx, e: &dyn Election) -> Result<(), Verdict> {
    let lock = name("edges-broken-leader")?;
    let leading = e.campaign(&lock, b"before", wait(ctx)).await?;
    ensure!(
        ctx.backend().break_entry(ctx.ns(), &lock).await?,
        "the leader's entry was not found to break"
    );
    let proclaimed = leading.proclaim(b"after").await;
    ensure!(
        matches!(&proclaimed, Err(e) if e.kind() == ErrorKind::Lost),
        "a proclamation after the leader's entry was deleted gave {proclaimed:?}, not lost"
    );
    let now = e.leader(&lock).await?;
    ensure!(
        now.as_ref().is_none_or(|l| l.value != b"after"),
        "the refused proclamation is recorded: {now:?}"
    );
    drop(leading);
    Ok(())
}

/// Nothing of the namespace is left at the server within a second (releases may finish
/// asynchronously).
async fn nothing_left(ctx: &Ctx, what: &str) -> Result<(), Verdict> {
    let began = tokio::time::Instant::now();
    loop {
        let left = ctx.leftovers().await?;
        if left.is_empty() {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(1) {
            return Err(Verdict::Fail(format!(
                "{what}: entries left behind after every release: {left:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
