//! Leader election: one leader at a time with increasing terms, a new leader once the old
//! one's link dies (never before it knows), and observers that see every change in order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{AcquireOptions, Election, Leader, Leadership};
use tokio::time::Instant;

use super::takeover::{Link, take_over, waiter_budget};
use super::util::{join_all, name};
use super::{Ctx, Verdict, ensure};
use crate::ClientOptions;

/// The skip reason of a backend without an election.
pub(crate) const NO_ELECTION: &str = "the backend has no Election";

/// A new election client with `opts`.
pub(super) async fn election(ctx: &Ctx, opts: ClientOptions) -> Result<Arc<dyn Election>, Verdict> {
    ctx.backend()
        .election(opts)
        .await
        .map_err(|e| Verdict::Fail(format!("cannot build an election client: {e}")))?
        .ok_or_else(|| Verdict::Skip(NO_ELECTION.into()))
}

fn leader(term: u64, value: &str) -> Leader {
    Leader {
        term: dlock_core::FencingToken(term),
        value: value.as_bytes().to_vec(),
    }
}

/// One leadership as its leader saw it.
struct Term {
    who: usize,
    term: u64,
    value: String,
    /// When the campaign returned.
    from: Instant,
    /// When the leader stopped believing: the start of its resignation, or its deadline if
    /// that came first.
    until: Instant,
    /// The server's leader, read by another client while this one led.
    seen: Option<Leader>,
}

/// 4 campaigners × 5 terms each on one name, a short hold per term: no two leaders' beliefs
/// overlap, terms strictly increase in the order leaders took over, and while each led the
/// server recorded exactly its term and value.
pub(crate) async fn election_single_leader(ctx: &Ctx) -> Result<(), Verdict> {
    const CAMPAIGNERS: usize = 4;
    const TERMS_EACH: usize = 5;
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let reader = election(ctx, opts.clone()).await?;
    let lock = name("single-leader")?;
    let terms: Arc<Mutex<Vec<Term>>> = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for who in 0..CAMPAIGNERS {
        let e = election(ctx, opts.clone()).await?;
        let (reader, lock, terms) = (Arc::clone(&reader), lock.clone(), Arc::clone(&terms));
        tasks.push(tokio::spawn(async move {
            for round in 0..TERMS_EACH {
                let value = format!("c{who}-t{round}");
                let l = e
                    .campaign(
                        &lock,
                        value.as_bytes(),
                        AcquireOptions::wait(Duration::from_secs(30)),
                    )
                    .await?;
                let from = Instant::now();
                let seen = reader.leader(&lock).await?;
                let hold = 5 + (who * 7 + round * 3) % 20;
                tokio::time::sleep(Duration::from_millis(hold as u64)).await;
                let until = Instant::now().min(l.deadline());
                let term = l.term().get();
                l.resign().await?;
                terms.lock().unwrap_or_else(|p| p.into_inner()).push(Term {
                    who,
                    term,
                    value,
                    from,
                    until,
                    seen,
                });
            }
            Ok::<(), dlock_core::Error>(())
        }));
    }
    join_all(tasks, "a campaigner").await?;
    let mut terms = std::mem::take(&mut *terms.lock().unwrap_or_else(|p| p.into_inner()));
    ensure!(
        terms.len() == CAMPAIGNERS * TERMS_EACH,
        "{} terms recorded, {} expected",
        terms.len(),
        CAMPAIGNERS * TERMS_EACH
    );
    terms.sort_by_key(|t| t.from);
    ctx.figure("terms", terms.len() as u64);
    for pair in terms.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        ensure!(
            a.until <= b.from,
            "two leaders at once: c{} (term {}) still believed it led {:?} after c{} (term {}) took over",
            a.who,
            a.term,
            a.until.saturating_duration_since(b.from),
            b.who,
            b.term
        );
        ensure!(
            b.term > a.term,
            "terms do not increase: c{} led with term {} after c{} with term {}",
            b.who,
            b.term,
            a.who,
            a.term
        );
    }
    for t in &terms {
        let expected = leader(t.term, &t.value);
        ensure!(
            t.seen.as_ref() == Some(&expected),
            "while c{} led with term {} the server's leader was {:?}",
            t.who,
            t.term,
            t.seen
        );
    }
    Ok(())
}

/// A leader whose link goes silent (or, in process, whose renewal stops) while a follower
/// campaigns: the follower leads within TTL + slack of the cut, never before the old leader's
/// `lost()` fired, with a higher term (see [`take_over`]), and the server then records it as
/// the leader.
pub(crate) async fn election_failover(ctx: &Ctx) -> Result<(), Verdict> {
    let ttl = ctx.ttl();
    let lock = name("failover")?;
    let (link, opts) = Link::start(ctx, ClientOptions::new(ctx.ns(), ttl))?;
    let old = election(ctx, opts).await?;
    let follower = election(ctx, ClientOptions::new(ctx.ns(), ttl)).await?;
    let leading = old
        .campaign(&lock, b"old", AcquireOptions::wait(Duration::from_secs(10)))
        .await?;
    let wait = AcquireOptions::wait(waiter_budget(ctx).await?);
    let (f, l) = (Arc::clone(&follower), lock.clone());
    let campaign = async move { f.campaign(&l, b"new", wait).await };
    let new = take_over(
        ctx,
        &link,
        leading.lease(),
        "the leadership",
        "failover",
        campaign,
        |new: &Leadership| new.term().get(),
    )
    .await?;
    let seen = follower.leader(&lock).await?;
    let expected = leader(new.term().get(), "new");
    ensure!(
        seen.as_ref() == Some(&expected),
        "after the failover the server's leader was {seen:?}, not {expected:?}"
    );
    new.resign().await?;
    drop(leading);
    Ok(())
}

/// An observer follows one name while three campaigners take turns, two of them queued behind
/// the first so that their terms start back to back (in either order on a backend that is not
/// fair), two leaders proclaim a new value and the last proclaims it again: the observer sees
/// exactly the six changes, in order. A proclamation is a change even when it repeats the value
/// (every backend reports it: an application that re-proclaims to signal something is told).
pub(crate) async fn election_observe(ctx: &Ctx) -> Result<(), Verdict> {
    let lock = name("observe")?;
    let opts = ClientOptions::new(ctx.ns(), ctx.ttl());
    let observer = election(ctx, opts.clone()).await?;
    let mut changes = observer.observe(&lock).await?;
    let (c1, c2, c3) = (
        election(ctx, opts.clone()).await?,
        election(ctx, opts.clone()).await?,
        election(ctx, opts).await?,
    );
    let wait = AcquireOptions::wait(Duration::from_secs(30));
    let l1 = c1.campaign(&lock, b"c1-a", wait).await?;
    let queue = |e: Arc<dyn Election>, value: &'static str| {
        let lock = lock.clone();
        tokio::spawn(async move { e.campaign(&lock, value.as_bytes(), wait).await })
    };
    // Queued in this order (FIFO): c2, then c3.
    let w2 = queue(c2, "c2-a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let w3 = queue(c3, "c3-a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    l1.proclaim(b"c1-b").await?;
    let t1 = l1.term().get();
    l1.resign().await?;
    let joined = |e: tokio::task::JoinError| Verdict::Fail(format!("a campaigner panicked: {e}"));
    // Whichever queued campaign leads next (c2 on a fair backend) resigns at once; the other
    // then leads, proclaims and resigns.
    let (second, v2, third, v3) = match futures::future::select(w2, w3).await {
        futures::future::Either::Left((l2, w3)) => (l2.map_err(joined)??, "c2-a", w3, "c3-a"),
        futures::future::Either::Right((l3, w2)) => (l3.map_err(joined)??, "c3-a", w2, "c2-a"),
    };
    let t2 = second.term().get();
    second.resign().await?;
    let third = third.await.map_err(joined)??;
    let t3 = third.term().get();
    third.proclaim(b"last").await?;
    third.proclaim(b"last").await?;
    third.resign().await?;
    let expected = vec![
        leader(t1, "c1-a"),
        leader(t1, "c1-b"),
        leader(t2, v2),
        leader(t3, v3),
        leader(t3, "last"),
        leader(t3, "last"),
    ];
    let mut seen = Vec::new();
    let until = Instant::now() + ctx.ttl() * 2;
    while seen.len() < expected.len() {
        match tokio::time::timeout_at(until, changes.next()).await {
            Ok(Ok(change)) => seen.push(change),
            Ok(Err(e)) => {
                return Err(Verdict::Fail(format!(
                    "the observation failed after {seen:?}: {e}"
                )));
            }
            Err(_) => break,
        }
    }
    ctx.figure("changes_seen", seen.len() as u64);
    ensure!(
        seen == expected,
        "the observer saw {seen:?}; the changes were {expected:?}"
    );
    // Nothing more happened: no change may follow.
    if let Ok(extra) = tokio::time::timeout(Duration::from_millis(200), changes.next()).await {
        return Err(Verdict::Fail(format!(
            "the observer saw a change nobody made: {extra:?}"
        )));
    }
    Ok(())
}
