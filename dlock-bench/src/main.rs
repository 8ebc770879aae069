//! `dlock-bench`: dlock vs the raw server floor vs peer lock libraries, on the same servers in
//! the same run, interleaved.
//!
//! ```text
//! dlock-bench [--quick] [--backend redis,redlock,etcd,zk] [--workload all|locks|flash-sale]
//!             [--duration SECS] [--json FILE] [--out DIR]
//! dlock-bench --readme FILE [--from RESULTS_JSON]
//! ```
//! Starts the servers through the conformance harness (or uses `DLOCK_*` endpoints), runs every
//! workload for every selected backend and writes `report.md`, `results.json` and
//! `waiters.svg` under `target/dlock-bench/` (or `--out`). See README.md for how to read them.
//! `--readme FILE` runs nothing: it rewrites the generated section of FILE from a run's
//! `results.json` (`--from`, default `<out>/results.json`). The flash-sale workload's client
//! processes are this binary run as `__flash-client` (hidden; see `flash.rs`).

mod flash;
mod guide;
mod http;
mod impls;
#[cfg(test)]
mod impls_tests;
mod machine;
mod plot;
mod probe;
mod readme;
mod report;
mod stats;
mod workloads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, ServerKind};

use impls::{Impl, Kind, Server};
use probe::Probe;
use stats::{Row, Sink};

const BACKENDS: [&str; 4] = ["redis", "redlock", "etcd", "zk"];
/// Backends run only when asked for (`--backend redis-cluster`), and only the held-leases
/// workload: a Redis Cluster of 3 masters (no replicas), the renewal of many leases spread over
/// its masters (one request per master per period).
const OPT_IN: [&str; 1] = ["redis-cluster"];
const WAITERS: [usize; 4] = [1, 8, 32, 64];
/// The standbys in line in the leadership-handover workloads (`election-S`).
const ELECTION_STANDBYS: [usize; 2] = [1, 8];
/// The clients of the read-write workload (`rw-read-N`).
const READERS: usize = 8;
/// The TTL of the crash-failover workload (`election-crash-1`): short, as a failover after a
/// crash takes about a TTL.
const CRASH_TTL: Duration = Duration::from_secs(2);

struct Args {
    quick: bool,
    backends: Vec<String>,
    json: Option<PathBuf>,
    out: PathBuf,
    /// Internal: run only the held-leases workload in this (fresh) process, under this
    /// namespace, and print its rows as JSON.
    child_leases: Option<String>,
    /// Rewrite this README's generated section instead of running.
    readme: Option<PathBuf>,
    /// The rows `--readme` reads (default `<out>/results.json`).
    from: Option<PathBuf>,
    /// Only the flash-sale workload (`--workload flash-sale`), else every workload.
    flash_only: bool,
    /// Every workload but the flash sale (`--workload locks`).
    no_flash: bool,
    /// The length of each flash-sale run (`--duration SECS`).
    duration: Option<Duration>,
    /// The arguments as given, for the report's header.
    shown: String,
}

/// Run sizes: `--quick` proves the harness in well under 3 minutes; the full run measures.
struct Plan {
    unc_rounds: usize,
    unc_per_round: usize,
    cont_rounds: usize,
    cont_secs: Duration,
    queue_rounds: usize,
    many_rounds: usize,
    leases: usize,
    lease_ttl: Duration,
    handover_rounds: usize,
    handovers: usize,
    /// Elections crashed at once per contender.
    crashes: usize,
    rw_rounds: usize,
    rw_secs: Duration,
}

/// The distinct locks of the `locks-N` workload.
const DISTINCT_LOCKS: usize = 1000;
/// Between a leadership handover and the next resignation (on the next of the round's
/// elections).
const HANDOVER_GAP: Duration = Duration::from_millis(20);

impl Plan {
    fn new(quick: bool) -> Plan {
        fn pick<T>(quick: bool, q: T, full: T) -> T {
            if quick { q } else { full }
        }
        let (ms, q) = (Duration::from_millis, quick);
        Plan {
            unc_rounds: pick(q, 2, 6),
            unc_per_round: pick(q, 50, 200),
            cont_rounds: pick(q, 1, 3),
            cont_secs: pick(q, ms(1000), ms(3000)),
            queue_rounds: pick(q, 1, 3),
            many_rounds: pick(q, 1, 3),
            leases: pick(q, 2000, 10_000),
            lease_ttl: pick(q, ms(1500), ms(3000)),
            handover_rounds: pick(q, 1, 2),
            handovers: pick(q, 20, 50),
            crashes: pick(q, 2, 5),
            rw_rounds: pick(q, 1, 2),
            rw_secs: pick(q, ms(500), ms(1500)),
        }
    }
}

fn usage() -> String {
    "usage: dlock-bench [--quick] [--backend redis,redlock,etcd,zk,redis-cluster] [--workload all|locks|flash-sale]\n                   \
     [--duration SECS] [--json FILE] [--out DIR]\n       \
     dlock-bench --readme FILE [--from RESULTS_JSON]"
        .to_string()
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        backends: BACKENDS.iter().map(|s| s.to_string()).collect(),
        json: None,
        out: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/dlock-bench"
        )),
        child_leases: None,
        readme: None,
        from: None,
        flash_only: false,
        no_flash: false,
        duration: None,
        shown: args.iter().map(|a| format!(" {a}")).collect(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or(format!("{flag} needs a value\n{}", usage()))
        };
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--backend" | "--backends" => {
                let v = value(arg)?;
                a.backends = v
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if let Some(bad) = a
                    .backends
                    .iter()
                    .find(|b| !BACKENDS.iter().chain(&OPT_IN).any(|k| k == b))
                {
                    return Err(format!(
                        "unknown backend {bad:?} (one of {},{})",
                        BACKENDS.join(","),
                        OPT_IN.join(",")
                    ));
                }
            }
            "--json" => a.json = Some(PathBuf::from(value(arg)?)),
            "--out" => a.out = PathBuf::from(value(arg)?),
            "--child-leases" => a.child_leases = Some(value(arg)?),
            "--readme" => a.readme = Some(PathBuf::from(value(arg)?)),
            "--from" => a.from = Some(PathBuf::from(value(arg)?)),
            "--workload" => {
                (a.flash_only, a.no_flash) = match value(arg)?.as_str() {
                    "all" => (false, false),
                    "locks" => (false, true),
                    "flash-sale" => (true, false),
                    other => {
                        return Err(format!(
                            "unknown workload {other:?} (all, locks or flash-sale)"
                        ));
                    }
                }
            }
            "--duration" => {
                let v = value(arg)?;
                let secs: u64 = v
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or(format!("--duration takes whole seconds > 0, not {v:?}"))?;
                a.duration = Some(Duration::from_secs(secs));
            }
            "-h" | "--help" => return Err(usage()),
            // `cargo bench` passes --bench; ignore it.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    Ok(a)
}

struct Backend {
    name: &'static str,
    /// floor, dlock, peer.
    impls: Vec<Impl>,
    /// dlock's election and, where one runs here, a peer's (leadership handovers).
    elections: Vec<Impl>,
    /// dlock's read lock, dlock's mutex (exclusive, named `dlock-mutex`) and the read floor
    /// (8 readers).
    rw: Vec<(Impl, bool)>,
    /// dlock's mutex (held leases).
    dlock: Impl,
    probe: Probe,
    cluster: Arc<Cluster>,
}

async fn backend(name: &'static str, run: &str) -> Result<Backend, String> {
    let (server, kind, nodes) = match name {
        "redis-cluster" => (Server::RedisCluster, ServerKind::Redis, 3),
        "redis" => (Server::Redis, ServerKind::Redis, 1),
        "redlock" => (Server::Redlock, ServerKind::Redis, 5),
        "etcd" => (Server::Etcd, ServerKind::Etcd, 1),
        _ => (Server::Zk, ServerKind::Zk, 1),
    };
    let c = if server == Server::RedisCluster {
        let options = dlock_conformance::servers::redis_cluster::options();
        let c = Cluster::shared_with(kind, nodes, &options)
            .map_err(|e| format!("cannot start redis × 3 in cluster mode: {e}"))?;
        dlock_conformance::servers::redis_cluster::form(&c)
            .map_err(|e| format!("cannot form the Redis Cluster: {e}"))?;
        c
    } else {
        Cluster::shared(kind, nodes)
            .map_err(|e| format!("cannot start {} × {nodes}: {e}", kind.as_str()))?
    };
    let at = c.endpoints();
    let ns = format!("{run}/{name}");
    let dlock = |kind| Impl::new(server, kind, at.clone(), ns.clone());
    // Keys under `<ns>/<who>/`; ZooKeeper nodes under `/<ns>-<who>`.
    let other = |kind, who: &str| {
        let prefix = match server {
            Server::Zk => format!("/{ns}-{who}"),
            _ => format!("{ns}/{who}/"),
        };
        Impl::new(server, kind, at.clone(), prefix)
    };
    let probe = match server {
        Server::Etcd => Probe::Etcd(c.addrs()),
        Server::Zk => Probe::Zk(c.addrs()),
        _ => {
            let mut conns = Vec::new();
            for u in &at {
                conns.push(impls::redis_conn(u).await?);
            }
            Probe::Redis(conns)
        }
    };
    let peer = if server == Server::Redlock || server == Server::Redis {
        "rslock"
    } else {
        "peer"
    };
    // The cluster runs only the held-leases workload; Redlock keeps no election and no
    // read-write lock; Redis has no election peer.
    let family = matches!(server, Server::Redis | Server::Etcd | Server::Zk);
    Ok(Backend {
        name,
        impls: if server == Server::RedisCluster {
            Vec::new()
        } else {
            vec![
                other(Kind::Floor, "floor"),
                dlock(Kind::Lock),
                other(Kind::Peer, peer),
            ]
        },
        elections: match server {
            Server::Redis => vec![dlock(Kind::Elect)],
            _ if family => vec![
                dlock(Kind::Elect),
                other(Kind::PeerElection, "peer-election"),
            ],
            _ => Vec::new(),
        },
        rw: if family {
            vec![
                (dlock(Kind::Read), false),
                (
                    Impl {
                        name: report::MUTEX,
                        ..dlock(Kind::Lock)
                    },
                    true,
                ),
                (other(Kind::ReadFloor, "read-floor"), false),
            ]
        } else {
            Vec::new()
        },
        dlock: dlock(Kind::Lock),
        probe,
        cluster: c,
    })
}

async fn run_backend(
    b: &Backend,
    plan: &Plan,
    quick: bool,
    run_ns: &str,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let mut sink = Sink {
        backend: b.name,
        rows,
    };
    let (name, p, probe, e) = (b.name, plan, &b.probe, &b.elections);
    let s = &mut sink;
    if !OPT_IN.contains(&name) {
        let unc = workloads::uncontended(s, &b.impls, p.unc_rounds, p.unc_per_round);
        step(name, "uncontended", unc).await?;
        let cont = workloads::contention(s, &b.impls, 8, p.cont_rounds, p.cont_secs);
        step(name, "8-way contention", cont).await?;
        let waiters = workloads::waiters(s, &b.impls, &WAITERS, p.queue_rounds, probe);
        step(name, "N waiters", waiters).await?;
        if !e.is_empty() {
            let (standbys, gap) = (&ELECTION_STANDBYS, HANDOVER_GAP);
            let handovers =
                workloads::handovers(s, e, standbys, p.handover_rounds, p.handovers, gap, probe);
            step(name, "leadership handovers", handovers).await?;
            let addrs = b.cluster.addrs();
            let crashes = workloads::crash_failovers(s, e, &addrs, p.crashes, CRASH_TTL);
            step(name, "failovers after a crash", crashes).await?;
        }
        if !b.rw.is_empty() {
            let reads = workloads::shared_reads(s, &b.rw, READERS, p.rw_rounds, p.rw_secs, probe);
            step(name, "8 readers", reads).await?;
        }
        let many = workloads::many_locks(s, &b.impls, DISTINCT_LOCKS, p.many_rounds);
        step(name, "distinct locks", many).await?;
    }
    let leases = held_leases_in_child(b, quick, run_ns);
    s.rows.extend(step(name, "held leases", leases).await?);
    Ok(())
}

/// Awaits `work`, then says how long it took.
async fn step<T>(
    backend: &str,
    what: &str,
    work: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let t = Instant::now();
    let out = work.await?;
    eprintln!("[{backend}] {what} done in {:.1?}", t.elapsed());
    Ok(out)
}

/// The held-leases workload runs in a fresh process of this binary (same servers, through the
/// harness's external-endpoint variables), so that its RSS delta is not hidden by memory the
/// earlier workloads freed.
async fn held_leases_in_child(b: &Backend, quick: bool, run_ns: &str) -> Result<Vec<Row>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--backend", b.name, "--child-leases", run_ns]);
    if quick {
        cmd.arg("--quick");
    }
    cmd.envs(b.cluster.external_env());
    cmd.stderr(std::process::Stdio::inherit());
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .map_err(|e| format!("held-leases child: {e}"))?
        .map_err(|e| format!("held-leases child: {e}"))?;
    if !out.status.success() {
        return Err(format!("held-leases child failed ({})", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("held-leases child output: {e}"))
}

/// The child side of [`held_leases_in_child`].
async fn child_leases(args: &Args, run_ns: &str) -> Result<(), String> {
    let plan = Plan::new(args.quick);
    let name = BACKENDS
        .iter()
        .chain(&OPT_IN)
        .find(|b| args.backends.len() == 1 && args.backends[0] == **b)
        .ok_or("--child-leases needs exactly one --backend")?;
    let b = backend(name, run_ns).await?;
    let mut rows = Vec::new();
    let mut sink = Sink {
        backend: b.name,
        rows: &mut rows,
    };
    workloads::held_leases(&mut sink, &b.dlock, plan.leases, plan.lease_ttl, &b.probe).await?;
    println!(
        "{}",
        serde_json::to_string(&rows).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown date".to_string())
}

async fn run(args: Args) -> Result<(), String> {
    if let Some(ns) = &args.child_leases {
        return child_leases(&args, ns).await;
    }
    if let Some(readme) = &args.readme {
        let from = args
            .from
            .clone()
            .unwrap_or_else(|| args.out.join("results.json"));
        readme::write(readme, &from)?;
        println!(
            "{}: performance section rewritten from {}",
            readme.display(),
            from.display()
        );
        return Ok(());
    }
    let plan = Plan::new(args.quick);
    let load = machine::Sampler::start();
    let started = Instant::now();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let run_ns = format!("dlock-bench/r{}-{secs}", std::process::id());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in BACKENDS
        .iter()
        .chain(&OPT_IN)
        .filter(|b| !args.flash_only && args.backends.iter().any(|a| a == *b))
    {
        eprintln!("[{name}] starting");
        let res = match backend(name, &run_ns).await {
            Ok(b) => run_backend(&b, &plan, args.quick, &run_ns, &mut rows).await,
            Err(e) => Err(e),
        };
        if let Err(e) = res {
            eprintln!("[{name}] FAILED: {e}");
            failures.push(format!("{name}: {e}"));
        }
    }
    let flash_plan = flash::FlashPlan::new(args.quick, args.duration, &args.backends);
    if !args.no_flash && !flash_plan.specs.is_empty() {
        eprintln!(
            "[flash-sale] starting: {} contender(s)",
            flash_plan.specs.len()
        );
        failures.extend(flash::run(&flash_plan, &run_ns, &mut rows).await);
    }
    let fsync = std::env::var("DLOCK_SERVER_FSYNC").is_ok_and(|v| v == "1" || v == "true");
    load.finish(
        &mut rows,
        &machine::RunFacts {
            seconds: started.elapsed().as_secs_f64(),
            quick: args.quick,
            fsync,
            started_unix: secs,
        },
    );
    // A run whose rows show a broken lock (or a broken bench) is a failed run, whatever its speed.
    failures.extend(report::run_failures(&rows));
    failures.extend(flash::table::failures(&rows));
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let json = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
    let json_path = args.out.join("results.json");
    std::fs::write(&json_path, &json).map_err(|e| format!("{}: {e}", json_path.display()))?;
    if let Some(p) = &args.json {
        std::fs::write(p, &json).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let svg = args.out.join("waiters.svg");
    plot::write(&rows, &svg)?;
    let mut md = format!(
        "## dlock-bench {} ({})\n\nCommand: `cargo xtask bench{}`; servers: single-node Redis, 5 × Redis, \
         single-node etcd, single-node ZooKeeper (and a 3-master Redis Cluster for `redis-cluster`) on loopback, started by the conformance harness{}; \
         total run time {:.0} s.\n\nMachine: {}.\n\nPeers: {}.\n\nRatios are plain dlock ÷ other for the same metric: below 1 is better for \
         latencies and requests, above 1 is better for throughput (/s).\n\n",
        now_utc(),
        match (args.quick, args.no_flash, args.flash_only) {
            (true, _, _) => "--quick",
            (false, true, _) => "lock workloads",
            (false, _, true) => "flash sale",
            _ => "full run",
        },
        args.shown,
        if fsync {
            " with fsync (DLOCK_SERVER_FSYNC=1)"
        } else {
            " without fsync (set DLOCK_SERVER_FSYNC=1 for fsync)"
        },
        started.elapsed().as_secs_f64(),
        machine::describe(&rows),
        impls::peer_settings(workloads::TTL),
    );
    for name in BACKENDS.iter().chain(&OPT_IN).filter(|b| {
        rows.iter()
            .any(|r| r.backend == **b && !flash::table::is_flash(&r.workload))
    }) {
        md.push_str(&report::markdown(&rows, name, &WAITERS, plan.leases));
        md.push('\n');
    }
    if let Some(flash) = flash::table::markdown(&rows) {
        md.push_str("### flash sale (3 etcd members, 3 ZooKeeper nodes, Redis × 1 and × 5)\n\n");
        md.push_str(&flash);
    }
    for f in &failures {
        md.push_str(&format!("\nFAILED: {f}\n"));
    }
    let md_path = args.out.join("report.md");
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    println!("{md}");
    println!(
        "report: {}\nJSON:   {}\nplot:   {}",
        md_path.display(),
        json_path.display(),
        svg.display()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} failure(s): {}",
            failures.len(),
            failures.join("; ")
        ))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "__flash-client") {
        flash::child_main(&args[1..]);
        return;
    }
    let args = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot build a runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("dlock-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_flags() {
        let a = parse(&s(&[
            "--quick",
            "--backend",
            "etcd,zk",
            "--json",
            "o.json",
            "--out",
            "d",
        ]));
        let a = a.unwrap_or_else(|e| panic!("{e}"));
        assert!(a.quick);
        assert_eq!(a.backends, s(&["etcd", "zk"]));
        assert_eq!(a.json, Some(PathBuf::from("o.json")));
        assert_eq!(a.out, PathBuf::from("d"));
    }

    #[test]
    fn the_cluster_backend_is_opt_in() {
        let all = parse(&s(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(!all.backends.iter().any(|b| b == "redis-cluster"));
        let a = parse(&s(&["--backend", "redis-cluster"])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.backends, s(&["redis-cluster"]));
    }

    #[test]
    fn parses_readme_flags() {
        let a = parse(&s(&["--readme", "R.md", "--from", "r.json"]));
        let a = a.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.readme, Some(PathBuf::from("R.md")));
        assert_eq!(a.from, Some(PathBuf::from("r.json")));
        assert!(parse(&s(&["--readme"])).is_err());
    }

    #[test]
    fn workload_selects_the_flash_sale_or_the_rest() {
        let a = parse(&s(&["--workload", "locks"])).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.no_flash && !a.flash_only);
        let a = parse(&s(&["--workload", "flash-sale"])).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.flash_only && !a.no_flash);
        let a = parse(&s(&["--workload", "all"])).unwrap_or_else(|e| panic!("{e}"));
        assert!(!a.flash_only && !a.no_flash);
        assert!(parse(&s(&["--workload", "flash"])).is_err());
    }

    #[test]
    fn rejects_unknown_backend_and_flags() {
        assert!(parse(&s(&["--backend", "mysql"])).is_err());
        assert!(parse(&s(&["--fast"])).is_err());
        assert!(parse(&s(&["--json"])).is_err());
    }
}
