//! The workloads. Every one runs its contenders interleaved (round r runs them in a rotated
//! order), so that machine load drifts hit all of them alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::impls::{Client, Held, Impl};
use crate::probe::Probe;
use crate::stats::{Rows, Sink, rss_bytes};

/// TTL of the leases in every workload but the renewal one.
pub const TTL: Duration = Duration::from_secs(10);

/// How long the end of a contended round may take before its tasks are aborted.
const DRAIN: Duration = Duration::from_secs(15);

fn order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

async fn clients(imp: &Impl, n: usize, ttl: Duration) -> Result<Vec<Arc<dyn Client>>, String> {
    let made = futures::future::join_all((0..n).map(|_| imp.client(ttl))).await;
    made.into_iter().collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Requests counted by the servers (the probe) and by dlock's clients; `None` where not known.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    server: Option<u64>,
    client: Option<u64>,
}

impl Counts {
    /// The start of a sum over rounds.
    const ZERO: Counts = Counts {
        server: Some(0),
        client: Some(0),
    };

    /// The counts now.
    async fn read(probe: &Probe, clients: &[Arc<dyn Client>]) -> Counts {
        let client = clients.iter().map(|c| c.stats().map(|s| s.requests)).sum();
        Counts {
            server: probe.count().await,
            client,
        }
    }

    /// What was counted since `before`.
    fn since(self, before: Counts) -> Counts {
        let diff = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a.saturating_sub(b));
        Counts {
            server: diff(self.server, before.server),
            client: diff(self.client, before.client),
        }
    }

    /// The sum of two rounds' counts (unknown if either is).
    fn add(&mut self, other: Counts) {
        let sum = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a + b);
        self.server = sum(self.server, other.server);
        self.client = sum(self.client, other.client);
    }

    /// The rows `<server metric>_per_<what>` and `client_requests_per_<what>`: the counts
    /// divided by `n`.
    fn rows(self, out: &mut Rows<'_>, probe: &Probe, what: &str, n: f64) {
        if let Some(s) = self.server {
            out.add(
                &probe.metric(&format!("per_{what}")),
                s as f64 / n,
                "requests",
            );
        }
        if let Some(c) = self.client {
            out.add(
                &format!("client_requests_per_{what}"),
                c as f64 / n,
                "requests",
            );
        }
    }
}

/// What one contender's rounds of a workload measured, summed over the rounds.
#[derive(Default)]
struct Tally {
    /// The rounds' measured time (the timed workloads).
    elapsed: Duration,
    /// Grants per client (contention), or in all (one entry: shared reads).
    grants: Vec<u64>,
    /// Grants to another client than the last one (true handoffs).
    switches: u64,
    /// Handoffs, handovers, or acquire + release pairs.
    times: Vec<Duration>,
    /// Waits for a grant (contention).
    waits: Vec<Duration>,
    /// The first handoff of each queue round, and the later ones.
    firsts: Vec<Duration>,
    later: Vec<Duration>,
    max_holders: u64,
    violations: u64,
    errors: u64,
    requests: Counts,
}

impl Tally {
    /// Adds the figures of one more round.
    fn add(&mut self, round: Tally) {
        self.elapsed += round.elapsed;
        if self.grants.len() < round.grants.len() {
            self.grants.resize(round.grants.len(), 0);
        }
        for (g, n) in self.grants.iter_mut().zip(&round.grants) {
            *g += n;
        }
        self.switches += round.switches;
        self.times.extend(round.times);
        self.waits.extend(round.waits);
        self.firsts.extend(round.firsts);
        self.later.extend(round.later);
        self.max_holders = self.max_holders.max(round.max_holders);
        self.violations += round.violations;
        self.errors += round.errors;
        self.requests.add(round.requests);
    }
}

/// `rounds` rounds of each of `n` contenders, round r in rotated order: `round(i, r)` is
/// contender i's round r. The tallies summed per contender.
async fn interleaved<F: Future<Output = Result<Tally, String>>>(
    n: usize,
    rounds: usize,
    round: impl Fn(usize, usize) -> F,
) -> Result<Vec<Tally>, String> {
    let mut sums: Vec<Tally> = (0..n)
        .map(|_| Tally {
            requests: Counts::ZERO,
            ..Tally::default()
        })
        .collect();
    for r in 0..rounds {
        for i in order(n, r) {
            sums[i].add(round(i, r).await?);
        }
    }
    Ok(sums)
}

/// Uncontended acquire + release by one client, `per_round` pairs per contender per round.
pub async fn uncontended(
    sink: &mut Sink<'_>,
    impls: &[Impl],
    rounds: usize,
    per_round: usize,
) -> Result<(), String> {
    let mut cs = Vec::new();
    for i in impls {
        cs.push(i.client(TTL).await?);
    }
    let mut samples = vec![Vec::new(); impls.len()];
    for r in 0..rounds {
        for i in order(impls.len(), r) {
            for _ in 0..per_round {
                let t = Instant::now();
                let h = cs[i].acquire("uncontended").await?;
                cs[i].release(h).await?;
                samples[i].push(t.elapsed());
            }
        }
    }
    for (imp, samples) in impls.iter().zip(&mut samples) {
        let busy = samples.iter().sum::<Duration>().as_secs_f64();
        let mut out = sink.to("uncontended", imp.name);
        out.add("ops_per_s", samples.len() as f64 / busy, "1/s");
        out.percentiles("latency", samples);
    }
    Ok(())
}

/// What the workers of a timed round share.
#[derive(Default)]
struct Round {
    stop: AtomicBool,
    /// Whether a client holds the lock (contention).
    held: AtomicBool,
    /// Clients between a grant and their release (shared reads), and the most at once.
    holders: AtomicU64,
    max_holders: AtomicU64,
    /// Grants per client.
    grants: Vec<AtomicU64>,
    violations: AtomicU64,
    errors: AtomicU64,
    /// Contention: handoffs, waits and switches, the client granted last, and when its
    /// release started.
    track: Mutex<(Tally, Option<usize>, Option<Instant>)>,
}

impl Round {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A timed round's hook after a grant: (round, client, when it asked).
type Granted = Arc<dyn Fn(&Round, usize, Instant) + Send + Sync>;
/// A timed round's hook after a release: (round, when it asked, whether the release
/// succeeded); `Some(sample)` counts a grant and records the sample in the round's times.
type Released = Arc<dyn Fn(&Round, Instant, bool) -> Option<Duration> + Send + Sync>;

/// `workers` new clients loop acquire → `granted` → release → `released` on `name` for
/// `secs`, with no hold time. A failed acquire or release counts as an error (printed; the
/// worker goes on). The requests are counted when `probe` is given.
async fn timed_round(
    imp: &Impl,
    (workers, secs, name): (usize, Duration, String),
    probe: Option<&Probe>,
    granted: Granted,
    released: Released,
) -> Result<Tally, String> {
    let cs = clients(imp, workers, TTL).await?;
    let round = Arc::new(Round {
        grants: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        ..Round::default()
    });
    let before = match probe {
        Some(p) => Counts::read(p, &cs).await,
        None => Counts::default(),
    };
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (w, c) in cs.iter().enumerate() {
        let (c, r, name) = (Arc::clone(c), Arc::clone(&round), name.clone());
        let (granted, released) = (Arc::clone(&granted), Arc::clone(&released));
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            while !r.stopped() {
                let asked = Instant::now();
                let h = match c.acquire(&name).await {
                    Ok(h) => h,
                    Err(e) => {
                        Round::count(&r.errors);
                        eprintln!("  acquire failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                granted(&r, w, asked);
                let ok = c.release(h).await.map_err(|e| {
                    Round::count(&r.errors);
                    eprintln!("  release failed: {e}");
                });
                if let Some(sample) = released(&r, asked, ok.is_ok()) {
                    Round::count(&r.grants[w]);
                    times.push(sample);
                }
            }
            times
        }));
    }
    tokio::time::sleep(secs).await;
    round.stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let requests = match probe {
        Some(p) => Counts::read(p, &cs).await.since(before),
        None => Counts::default(),
    };
    let times = match tokio::time::timeout(DRAIN, futures::future::join_all(&mut tasks)).await {
        Ok(done) => done.into_iter().collect::<Result<Vec<_>, _>>(),
        Err(_) => {
            let name = imp.name;
            eprintln!("  {name}: workers still waiting {DRAIN:?} after the end; aborted");
            tasks.iter().for_each(JoinHandle::abort);
            Ok(Vec::new())
        }
    };
    let mut t = std::mem::take(&mut lock(&round.track).0);
    t.times
        .extend(times.map_err(|e| format!("worker task: {e}"))?.concat());
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    t.grants = round.grants.iter().map(load).collect();
    t.elapsed = elapsed;
    t.max_holders = load(&round.max_holders);
    t.violations = load(&round.violations);
    t.errors = load(&round.errors);
    t.requests = requests;
    Ok(t)
}

/// `workers` clients loop acquire → release on one lock for `secs`: a grant while another
/// client holds it is a violation; a grant to another client than the last one is a true
/// handoff, timed from the start of the last release.
async fn contention_round(
    imp: &Impl,
    workers: usize,
    secs: Duration,
    name: String,
) -> Result<Tally, String> {
    let granted: Granted = Arc::new(|r: &Round, w, asked| {
        let granted = Instant::now();
        if r.held.swap(true, Ordering::SeqCst) {
            Round::count(&r.violations);
        }
        if !r.stopped() {
            Round::count(&r.grants[w]);
            let (t, last, release_start) = &mut *lock(&r.track);
            t.waits.push(granted - asked);
            if *last != Some(w)
                && let Some(rs) = release_start
            {
                t.times.push(granted.saturating_duration_since(*rs));
                t.switches += 1;
            }
            *last = Some(w);
        }
        lock(&r.track).2 = Some(Instant::now());
        r.held.store(false, Ordering::SeqCst);
    });
    let released: Released = Arc::new(|_: &Round, _, _| None);
    timed_round(imp, (workers, secs, name), None, granted, released).await
}

/// 8-way (or `workers`-way) contention, `rounds` interleaved rounds of `secs` per contender.
pub async fn contention(
    sink: &mut Sink<'_>,
    impls: &[Impl],
    workers: usize,
    rounds: usize,
    secs: Duration,
) -> Result<(), String> {
    let impls: Vec<&Impl> = impls.iter().filter(|i| i.contends()).collect();
    let mut acc = interleaved(impls.len(), rounds, |i, r| {
        contention_round(impls[i], workers, secs, format!("contended-{r}"))
    })
    .await?;
    let wl = format!("contention-{workers}");
    for (imp, a) in impls.iter().zip(&mut acc) {
        let mut out = sink.to(&wl, imp.name);
        let secs = a.elapsed.as_secs_f64();
        let grants: u64 = a.grants.iter().sum();
        out.add("handoffs_per_s", a.switches as f64 / secs, "1/s");
        out.add("acquisitions_per_s", grants as f64 / secs, "1/s");
        let min = a.grants.iter().copied().min().unwrap_or(0) as f64;
        let max = a.grants.iter().copied().max().unwrap_or(0) as f64;
        out.add("client_grants_min", min, "grants");
        out.add("client_grants_max", max, "grants");
        let fairness = if max > 0.0 { min / max } else { 0.0 };
        out.add("fairness_min_over_max", fairness, "ratio");
        out.percentiles("handoff", &mut a.times);
        out.percentiles("wait", &mut a.waits);
        out.add("exclusion_violations", a.violations as f64, "count");
        out.add("errors", a.errors as f64, "count");
    }
    Ok(())
}

/// One holder, `n` waiters queued behind it; the holder releases, each waiter releases as soon
/// as it is granted. Measures each handoff and the requests the whole chain cost.
async fn queue_round(imp: &Impl, n: usize, name: String, probe: &Probe) -> Result<Tally, String> {
    let cs = clients(imp, n + 1, TTL).await?;
    let holder = Arc::clone(&cs[0]);
    let h = holder.acquire(&name).await?;
    let last_release = Arc::new(Mutex::new(Instant::now()));
    let handoffs = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let held = Arc::new(AtomicBool::new(true));
    let violations = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicBool::new(false));
    // The last waiter granted holds on until the counters are read: the window covers the
    // holder's release, N grants and N - 1 releases, i.e. exactly N handoffs.
    let granted_count = Arc::new(AtomicU64::new(0));
    let last_granted = Arc::new(tokio::sync::Notify::new());
    let counted = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for c in cs.iter().skip(1) {
        let (c, last_release, handoffs, held, violations, go, name) = (
            Arc::clone(c),
            Arc::clone(&last_release),
            Arc::clone(&handoffs),
            Arc::clone(&held),
            Arc::clone(&violations),
            Arc::clone(&go),
            name.clone(),
        );
        let (granted_count, last_granted, counted) = (
            Arc::clone(&granted_count),
            Arc::clone(&last_granted),
            Arc::clone(&counted),
        );
        tasks.push(tokio::spawn(async move {
            let h = c.acquire(&name).await?;
            let granted = Instant::now();
            if held.swap(true, Ordering::SeqCst) || !go.load(Ordering::SeqCst) {
                violations.fetch_add(1, Ordering::Relaxed);
            }
            {
                let mut lr = lock(&last_release);
                lock(&handoffs).push(granted.saturating_duration_since(*lr));
                *lr = Instant::now();
            }
            if granted_count.fetch_add(1, Ordering::SeqCst) + 1 == n as u64 {
                let wait = counted.notified();
                last_granted.notify_one();
                wait.await;
            }
            held.store(false, Ordering::SeqCst);
            c.release(h).await
        }));
    }
    // Let every waiter queue up (they spin for the peers that have no queue).
    tokio::time::sleep(Duration::from_millis(300 + 10 * n as u64)).await;
    let before = Counts::read(probe, &cs).await;
    go.store(true, Ordering::SeqCst);
    *lock(&last_release) = Instant::now();
    held.store(false, Ordering::SeqCst);
    holder.release(h).await?;
    let requests =
        match tokio::time::timeout(Duration::from_secs(60), last_granted.notified()).await {
            Ok(()) => Counts::read(probe, &cs).await.since(before),
            Err(_) => Counts::default(),
        };
    counted.notify_one();
    let all = futures::future::join_all(tasks.iter_mut());
    match tokio::time::timeout(Duration::from_secs(60), all).await {
        Ok(results) => {
            for r in results {
                r.map_err(|e| format!("waiter task: {e}"))??;
            }
        }
        Err(_) => {
            for t in &tasks {
                t.abort();
            }
            return Err(format!("{}: {n} waiters not all served in 60 s", imp.name));
        }
    }
    let times = std::mem::take(&mut *lock(&handoffs));
    // The first handoff of a round follows 300 ms of idleness; the later ones follow a
    // handoff at once. Split, they tell a cold path from a slow one.
    let (firsts, later) = match times.split_first() {
        Some((first, rest)) => (vec![*first], rest.to_vec()),
        None => (Vec::new(), Vec::new()),
    };
    Ok(Tally {
        times,
        firsts,
        later,
        requests,
        violations: violations.load(Ordering::Relaxed),
        ..Tally::default()
    })
}

/// N waiters behind a holder, for every N in `ns`, `rounds` interleaved rounds.
pub async fn waiters(
    sink: &mut Sink<'_>,
    impls: &[Impl],
    ns: &[usize],
    rounds: usize,
    probe: &Probe,
) -> Result<(), String> {
    let impls: Vec<&Impl> = impls.iter().filter(|i| i.contends()).collect();
    for &n in ns {
        let wl = format!("waiters-{n}");
        let acc = interleaved(impls.len(), rounds, |i, r| {
            queue_round(impls[i], n, format!("queue-{n}-{r}"), probe)
        })
        .await?;
        for (imp, mut a) in impls.iter().zip(acc) {
            let mut out = sink.to(&wl, imp.name);
            let count = a.times.len() as f64;
            let mean = a.times.iter().sum::<Duration>().as_secs_f64() * 1e6 / count;
            out.add("handoff_mean", mean, "us");
            out.percentiles("handoff", &mut a.times);
            if n > 1 {
                out.percentiles("handoff_first", &mut a.firsts);
                out.percentiles("handoff_later", &mut a.later);
            }
            a.requests.rows(&mut out, probe, "handoff", count);
            out.add("exclusion_violations", a.violations as f64, "count");
        }
    }
    Ok(())
}

/// `count` distinct locks on one client: acquire all (concurrently), then release all.
pub async fn many_locks(
    sink: &mut Sink<'_>,
    impls: &[Impl],
    count: usize,
    rounds: usize,
) -> Result<(), String> {
    let mut cs = Vec::new();
    for i in impls {
        cs.push(i.client(TTL).await?);
    }
    let names: Vec<String> = (0..count).map(|k| format!("many-{k}")).collect();
    let mut acq = vec![Duration::ZERO; impls.len()];
    let mut rel = vec![Duration::ZERO; impls.len()];
    // Round 0 is a warm-up (parents created on first use are not measured).
    for r in 0..=rounds {
        for i in order(impls.len(), r) {
            let c = &cs[i];
            let t0 = Instant::now();
            let held = futures::future::join_all(names.iter().map(|n| c.acquire(n))).await;
            let t1 = Instant::now();
            let held: Vec<_> = held.into_iter().collect::<Result<_, _>>()?;
            let released = futures::future::join_all(held.into_iter().map(|h| c.release(h))).await;
            let t2 = Instant::now();
            released.into_iter().collect::<Result<Vec<()>, _>>()?;
            if r > 0 {
                acq[i] += t1 - t0;
                rel[i] += t2 - t1;
            }
        }
    }
    let wl = format!("locks-{count}");
    let total = (count * rounds) as f64;
    for (i, imp) in impls.iter().enumerate() {
        let mut out = sink.to(&wl, imp.name);
        let pairs = total / (acq[i] + rel[i]).as_secs_f64();
        out.add("pairs_per_s", pairs, "1/s");
        out.add("acquire_ops_per_s", total / acq[i].as_secs_f64(), "1/s");
        out.add("release_ops_per_s", total / rel[i].as_secs_f64(), "1/s");
    }
    Ok(())
}

/// A campaign in flight: which client, what it got, when it returned.
type Campaign = tokio::task::JoinHandle<(usize, Result<Held, String>, Instant)>;

fn campaign(c: &Arc<dyn Client>, who: usize, name: &str) -> Campaign {
    let (c, name) = (Arc::clone(c), name.to_string());
    tokio::spawn(async move {
        let got = c.acquire(&name).await;
        (who, got, Instant::now())
    })
}

/// How long a standby has been in line, at least, when its leader resigns. etcd arms a
/// waiting campaign's watch (created at the revision it read, so "unsynced") only at its next
/// sync of unsynced watchers, every 100 ms: a resignation within 100 ms of a campaign's start
/// reaches it up to 100 ms late (etcd-client measured 77–90 ms handovers when its standby had
/// queued 10 ms before). A failover's standby has usually waited far longer.
const IN_LINE: Duration = Duration::from_millis(200);

/// One election of a handover round: its clients, who leads, the campaigns in line.
struct Elected {
    clients: Vec<Arc<dyn Client>>,
    name: String,
    leader: usize,
    held: Option<Held>,
    line: futures::stream::FuturesUnordered<Campaign>,
}

/// `standbys + 1` clients on each of k elections: one leads, the others campaign (queued in
/// line). `count` times, on the elections in turn: the leader resigns (the handover starts),
/// the first campaign in line returns (it ends), and the old leader campaigns again at the back
/// of the line; `gap` later the next election's leader resigns. k is the number of elections
/// that lets every standby wait at least [`IN_LINE`] in line before its turn.
async fn handover_round(
    imp: &Impl,
    standbys: usize,
    count: usize,
    gap: Duration,
    name: String,
    probe: &Probe,
) -> Result<Tally, String> {
    let per_turn = gap.max(Duration::from_millis(1)) * u32::try_from(standbys).unwrap_or(1);
    let k = usize::try_from(IN_LINE.as_nanos().div_ceil(per_turn.as_nanos().max(1)))
        .unwrap_or(1)
        .clamp(1, count.max(1));
    let mut elections = Vec::with_capacity(k);
    for e in 0..k {
        let cs = clients(imp, standbys + 1, TTL).await?;
        let name = format!("{name}-{e}");
        let held = cs[0].acquire(&name).await?;
        let line = (1..=standbys).map(|w| campaign(&cs[w], w, &name)).collect();
        elections.push(Elected {
            clients: cs,
            name,
            leader: 0,
            held: Some(held),
            line,
        });
    }
    let all: Vec<Arc<dyn Client>> = elections
        .iter()
        .flat_map(|e| e.clients.iter().cloned())
        .collect();
    // Let every standby get in line first.
    tokio::time::sleep(Duration::from_millis(300 + 10 * standbys as u64)).await;
    let before = Counts::read(probe, &all).await;
    let mut out = Tally::default();
    for turn in 0..count {
        let e = &mut elections[turn % k];
        // Nobody else may lead while the leader has not resigned.
        while let Some(Some(early)) = futures::FutureExt::now_or_never(e.line.next()) {
            let (w, got, _) = early.map_err(|err| format!("campaign task: {err}"))?;
            out.violations += 1;
            e.clients[w].release(got?).await?;
            e.line.push(campaign(&e.clients[w], w, &e.name));
        }
        let held = e.held.take().ok_or("an election without a leader")?;
        let resigned = Instant::now();
        e.clients[e.leader].release(held).await?;
        let next = tokio::time::timeout(Duration::from_secs(60), e.line.next())
            .await
            .map_err(|_| format!("{}: no new leader 60 s after a resignation", imp.name))?
            .ok_or("no campaign in line")?;
        let (w, got, at) = next.map_err(|err| format!("campaign task: {err}"))?;
        e.held = Some(got?);
        out.times.push(at.saturating_duration_since(resigned));
        e.line
            .push(campaign(&e.clients[e.leader], e.leader, &e.name));
        e.leader = w;
        tokio::time::sleep(gap).await;
    }
    out.requests = Counts::read(probe, &all).await.since(before);
    for e in &mut elections {
        if let Some(held) = e.held.take() {
            e.clients[e.leader].release(held).await?;
        }
        // Dropping a campaign withdraws it (every contender's is cancel-safe).
        for c in &e.line {
            c.abort();
        }
    }
    Ok(out)
}

/// Leadership handovers after a resignation with S standbys in line, for every S in
/// `standbys`: `rounds` interleaved rounds of `count` handovers per contender (workload
/// `election-S`).
pub async fn handovers(
    sink: &mut Sink<'_>,
    impls: &[Impl],
    standbys: &[usize],
    rounds: usize,
    count: usize,
    gap: Duration,
    probe: &Probe,
) -> Result<(), String> {
    for &s in standbys {
        let wl = format!("election-{s}");
        let mut acc = interleaved(impls.len(), rounds, |i, r| {
            let name = format!("election-{s}-{r}");
            handover_round(&impls[i], s, count, gap, name, probe)
        })
        .await?;
        for (imp, a) in impls.iter().zip(&mut acc) {
            let mut out = sink.to(&wl, imp.name);
            let n = a.times.len() as f64;
            let total = a.times.iter().sum::<Duration>().as_secs_f64();
            out.add("handovers_per_s", n / total, "1/s");
            out.add("handover_mean", total * 1e6 / n, "us");
            out.percentiles("handover", &mut a.times);
            a.requests.rows(&mut out, probe, "handover", n);
            out.add("exclusion_violations", a.violations as f64, "count");
        }
    }
    Ok(())
}

/// Failovers after a crash, `names` at once per contender (one round, contenders in turn):
/// on each of `names` elections a leader, connected through a proxy in front of the servers
/// (`upstream`, one per node), leads and a standby (connected directly) campaigns; then every
/// proxy blackholes at once (the leaders' sessions and leases are abandoned, as by a crash or a
/// partition: nothing is released) and each standby's campaign returning ends its failover.
/// Bounded by the TTL (`ttl` asked; the rows give the TTL granted and failover ÷ TTL).
pub async fn crash_failovers(
    sink: &mut Sink<'_>,
    impls: &[Impl],
    upstream: &[std::net::SocketAddr],
    names: usize,
    ttl: Duration,
) -> Result<(), String> {
    let wl = "election-crash-1";
    for imp in impls {
        let proxies = upstream
            .iter()
            .map(|a| dlock_conformance::faults::Proxy::start(*a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("cannot start a proxy: {e}"))?;
        let addrs: Vec<_> = proxies.iter().map(|p| p.addr()).collect();
        let leaders = clients(&imp.through(&addrs), names, ttl).await?;
        let standbys = clients(imp, names, ttl).await?;
        let lock_names: Vec<String> = (0..names).map(|k| format!("crash-{k}")).collect();
        let mut leading = Vec::new();
        for (c, n) in leaders.iter().zip(&lock_names) {
            leading.push(c.acquire(n).await?);
        }
        let mut line: Vec<Campaign> = standbys
            .iter()
            .zip(&lock_names)
            .enumerate()
            .map(|(k, (c, n))| campaign(c, k, n))
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Nobody may lead before the crash.
        let violations = line.iter().filter(|c| c.is_finished()).count();
        let crashed = Instant::now();
        for p in &proxies {
            p.set(dlock_conformance::faults::Mode::Blackhole);
        }
        let mut times = Vec::new();
        let limit = ttl * 3 + Duration::from_secs(10);
        for c in &mut line {
            let (k, got, at) = tokio::time::timeout(limit, c)
                .await
                .map_err(|_| format!("{}: no failover {limit:?} after a crash", imp.name))?
                .map_err(|e| format!("campaign task: {e}"))?;
            standbys[k].release(got?).await?;
            times.push(at.saturating_duration_since(crashed));
        }
        let granted = leaders.first().and_then(|c| c.ttl());
        // The crashed leaders go first (an etcd-client lease keeper must not see its link
        // reset), then their proxies.
        drop(leading);
        drop(leaders);
        drop(proxies);
        let mut out = sink.to(wl, imp.name);
        if let Some(t) = granted {
            out.add("leader_ttl", t.as_secs_f64() * 1e6, "us");
            times.sort_unstable();
            let p50 = crate::stats::percentile(&times, 0.5);
            out.add(
                "failover_over_ttl",
                p50.as_secs_f64() / t.as_secs_f64(),
                "ratio",
            );
        }
        out.percentiles("failover", &mut times);
        out.add("exclusion_violations", violations as f64, "count");
    }
    Ok(())
}

/// `workers` clients loop acquire → release on one name for `secs` (no hold time). Where
/// `exclusive`, two clients between a grant and the start of its release is a violation (as in
/// the contention workload); otherwise the most clients between a grant and the end of its
/// release are counted (readers sharing: a grant while another reader's release is under way
/// or not yet started). A successful pair is a grant, timed from the acquire's start.
async fn shared_round(
    imp: &Impl,
    workers: usize,
    secs: Duration,
    exclusive: bool,
    name: String,
    probe: &Probe,
) -> Result<Tally, String> {
    let granted: Granted = Arc::new(move |r: &Round, _, _| {
        let now = r.holders.fetch_add(1, Ordering::SeqCst) + 1;
        r.max_holders.fetch_max(now, Ordering::Relaxed);
        if exclusive {
            if now > 1 {
                Round::count(&r.violations);
            }
            r.holders.fetch_sub(1, Ordering::SeqCst);
        }
    });
    let released: Released = Arc::new(move |r: &Round, asked: Instant, ok| {
        if !exclusive {
            r.holders.fetch_sub(1, Ordering::SeqCst);
        }
        (ok && !r.stopped()).then(|| asked.elapsed())
    });
    let shape = (workers, secs, name);
    timed_round(imp, shape, Some(probe), granted, released).await
}

/// `workers` clients taking one name over and over, `rounds` interleaved rounds of `secs` per
/// contender (workload `rw-read-N`): `(contender, exclusive)` pairs, e.g. dlock's read lock,
/// its mutex (exclusive) and the read floor. Acquisitions per second, the acquire + release
/// pair's latency, the most holders seen at once and the requests per acquisition.
pub async fn shared_reads(
    sink: &mut Sink<'_>,
    impls: &[(Impl, bool)],
    workers: usize,
    rounds: usize,
    secs: Duration,
    probe: &Probe,
) -> Result<(), String> {
    let wl = format!("rw-read-{workers}");
    let mut acc = interleaved(impls.len(), rounds, |i, r| {
        let (imp, exclusive) = &impls[i];
        shared_round(imp, workers, secs, *exclusive, format!("{wl}-{r}"), probe)
    })
    .await?;
    for ((imp, exclusive), a) in impls.iter().zip(&mut acc) {
        let mut out = sink.to(&wl, imp.name);
        let grants = a.grants.iter().sum::<u64>() as f64;
        let rate = grants / a.elapsed.as_secs_f64();
        out.add("acquisitions_per_s", rate, "1/s");
        out.percentiles("latency", &mut a.times);
        if !*exclusive {
            out.add("holders_max", a.max_holders as f64, "holders");
        }
        a.requests.rows(&mut out, probe, "acquisition", grants);
        if *exclusive {
            out.add("exclusion_violations", a.violations as f64, "count");
        }
        out.add("errors", a.errors as f64, "count");
    }
    Ok(())
}

/// The TTL a renewal driver counts with, from a lease's validity (`ttl − drift(ttl)`, where
/// drift = ttl/100 + 2 ms): the driver renews every third of it. A validity measured from
/// before the acquire began is at most the acquire's latency long, which errs towards a window
/// of slightly more than whole periods (k or k + 1 rounds, never k − 1).
fn driver_ttl(validity: Duration) -> Duration {
    (validity + Duration::from_millis(2)).mul_f64(100.0 / 99.0)
}

/// How many renewal periods the held-leases window spans.
const LEASE_PERIODS: u32 = 6;

/// `count` leases held on one dlock locker: renewal rounds and requests per renewal period
/// over a window of 6 periods, and resident memory per lease. The period is a third of the TTL
/// the renewal driver counts with, found from a lease's validity (the warm-up lease's deadline
/// less the instant its acquire began, see [`driver_ttl`]): the TTL the server granted (etcd
/// rounds up to whole seconds, ZooKeeper negotiates the session timeout), on ZooKeeper less a
/// server-tick margin (its leases are valid for about 70 % of the session timeout and renewed
/// that much more often). A period taken from the TTL asked for, or from the session timeout,
/// would misjudge the rounds per period by the ratio of the two.
pub async fn held_leases(
    sink: &mut Sink<'_>,
    dlock: &Impl,
    count: usize,
    ttl: Duration,
    probe: &Probe,
) -> Result<(), String> {
    let locker = dlock.locker(ttl).await?;
    let warm = dlock_core::LockName::new("warm-up").map_err(|e| e.to_string())?;
    let began = tokio::time::Instant::now();
    let lease = locker
        .acquire(&warm, dlock_core::AcquireOptions::forever())
        .await
        .map_err(|e| e.to_string())?;
    // At most the acquire's own latency above the validity the driver counts from the
    // request's start.
    let validity = lease.deadline().saturating_duration_since(began);
    lease.release().await.map_err(|e| e.to_string())?;
    let names = (0..count)
        .map(|k| dlock_core::LockName::new(format!("lease-{k}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let granted = locker.ttl();
    let period = driver_ttl(validity) / 3;
    if period.is_zero() {
        return Err(format!("the warm-up lease had no validity ({validity:?})"));
    }
    let window = period * LEASE_PERIODS;
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let leases: Vec<_> = futures::stream::iter(names.iter())
        .map(|n| locker.acquire(n, dlock_core::AcquireOptions::forever()))
        .buffer_unordered(256)
        .collect()
        .await;
    let acquire_time = t0.elapsed();
    let leases = leases
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("acquire of {count} leases: {e}"))?;
    let rss1 = rss_bytes();
    // Let the first renewals of the freshly acquired leases pass: each is due a period after
    // its own grant, so the last ones come a period after the acquiring ended, and their
    // rounds (a few, while grants keep arriving) settle into one cadence after that.
    tokio::time::sleep(period * 2).await;
    let (s0, p0) = (locker.stats(), probe.count().await);
    let w0 = Instant::now();
    tokio::time::sleep(window).await;
    // The window as it was (a sleep overshoots on a loaded machine), in periods.
    let periods = w0.elapsed().as_secs_f64() / period.as_secs_f64();
    let (s1, p1) = (locker.stats(), probe.count().await);
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    let released: Vec<_> = futures::stream::iter(leases)
        .map(|l| l.release())
        .buffer_unordered(256)
        .collect()
        .await;
    let release_errors = released.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = released.iter().find(|r| r.is_err()) {
        eprintln!("  {release_errors} of {count} releases failed; first: {e}");
    }
    let wl = format!("leases-{count}");
    let mut out = sink.to(&wl, "dlock");
    out.add("lease_ttl_granted", granted.as_secs_f64() * 1e6, "us");
    out.add("lease_validity", validity.as_secs_f64() * 1e6, "us");
    let acquire_ops = count as f64 / acquire_time.as_secs_f64();
    out.add("acquire_ops_per_s", acquire_ops, "1/s");
    let rounds = (s1.renewals - s0.renewals) as f64 / periods;
    out.add("renewal_rounds_per_period", rounds, "rounds");
    let requests = (s1.requests - s0.requests) as f64 / periods;
    out.add("client_requests_per_period", requests, "requests");
    if let (Some(a), Some(b)) = (p1, p0) {
        let server = a.saturating_sub(b) as f64 / periods;
        out.add(&probe.metric("per_period"), server, "requests");
    }
    if let (Some(a), Some(b)) = (rss1, rss0) {
        let per_lease = a.saturating_sub(b) as f64 / count as f64;
        out.add("rss_per_lease", per_lease, "bytes");
    }
    out.add("leases_lost", lost as f64, "count");
    out.add("release_errors", release_errors as f64, "count");
    Ok(())
}
