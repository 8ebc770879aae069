#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod check;
mod elect;
mod exit;
mod run;
mod status;
mod target;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use dlock_any::LockerUrl;
use dlock_core::LockName;

use crate::exit::Failure;
use crate::target::Source;

/// Distributed locks from the shell: Redis, Redlock, etcd or ZooKeeper, chosen by URL.
#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    about,
    long_about = None,
    after_help = "New deployment? `dlock check` tells whether it is fit for the lock: round trip, \
                  effective TTL, exclusion, queue order, cancelled waits, renewal."
)]
struct Cli {
    /// The locker URL (redis://host:6379, etcd://h1,h2/prefix, zk://h1,h2/root, …; see
    /// dlock-any's README). Passwords in it are never printed.
    #[arg(long, env = "DLOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    /// A tiered configuration (TOML: tiers by URL, routes by name pattern; see dlock-any's
    /// README) instead of --url: each name is locked on the one tier its first matching route
    /// names. Not together with --url / DLOCK_URL.
    #[arg(long, env = "DLOCK_CONFIG", global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Report failures (and `status`) as JSON.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock.
    ///
    /// Waits for the lock (forever unless --wait), runs CMD with DLOCK_TOKEN (the fencing
    /// token) and DLOCK_NAME in its environment, and releases the lock when CMD exits. If the
    /// lease is lost, CMD's process group gets SIGTERM, then SIGKILL after --grace. Exits with
    /// CMD's status (128+N when killed by signal N), or 64 (usage, bad URL), 69 (backend
    /// unavailable), 75 (--wait elapsed), 79 (lock lost), 126/127 (CMD not executable / not
    /// found).
    Run(RunArgs),
    /// Show who holds a lock, without disturbing the holder or its waiters.
    ///
    /// Prints the holder's fencing token, the server entry that holds the lock and what it
    /// stores, at most how long the server keeps it if the holder stops renewing, and how many
    /// wait. Takes no token and writes nothing. Exits 0 when the lock is held, 1 when it is
    /// free, 64 / 69 as `run`.
    Status(StatusArgs),
    /// Run a command while leading an election.
    ///
    /// Campaigns with VALUE (forever unless --wait), runs CMD while leading with DLOCK_TOKEN
    /// (the term) and DLOCK_NAME, and resigns when CMD exits; a lost leadership stops CMD as
    /// `run` does. The same exit codes as `run`.
    Elect(ElectArgs),
    /// Print an election's leader: its term and value (exit 0), or that nobody leads (exit 1).
    Leader(LeaderArgs),
    /// Check whether the deployment is fit for this lock, without disturbing it.
    ///
    /// Measures the round trip and the effective TTL (how long the server keeps a lock against
    /// the lease's deadline), then checks exclusion, fencing tokens, try_acquire and timeouts,
    /// FIFO order (fair backends), cancelled waits, renewal (3 × TTL; over 30 s only with
    /// --long) and inspect, on names under dlock-check/PID-MILLIS/ that it releases and
    /// audits at the end: no fault injected, nothing left behind. Prints a table (--json: one
    /// object). Exits 0 when every check passed or was skipped, 1 when one failed (unfit), 64 /
    /// 69 as `run`.
    Check(CheckArgs),
}

/// `dlock check`'s arguments.
#[derive(Debug, Args)]
struct CheckArgs {
    /// The lease TTL to check (e.g. 10s). Overrides the URL's `ttl=`; default: the URL's, else
    /// the backend's.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,

    /// Also run the long checks: `renewal` holds a lease for 3 × TTL even when that is over
    /// 30 s.
    #[arg(long)]
    long: bool,

    /// How many separate clients (connections, sessions) contend in `exclusion`, `fifo` and
    /// `cancel`.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=16))]
    clients: u8,

    /// How many acquire + release + inspect samples `round_trip` takes at most (it stops
    /// after 5 s once it has 3).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(3..=1000))]
    samples: u16,
}

/// `dlock elect`'s arguments: `run`'s (the name is the election's), and the value.
#[derive(Debug, Args)]
struct ElectArgs {
    /// The value to campaign with (what `dlock leader` and observers see).
    #[arg(long)]
    value: String,

    #[command(flatten)]
    run: RunArgs,
}

/// `dlock leader`'s arguments.
#[derive(Debug, Args)]
struct LeaderArgs {
    /// The election's name.
    name: String,
}

/// `dlock run`'s arguments.
#[derive(Debug, Args)]
struct RunArgs {
    /// The lock's (the election's) name (1..=256 bytes of [A-Za-z0-9._:/-]).
    #[arg(long)]
    name: String,

    /// The lease TTL (e.g. 10s): how long a crashed holder blocks others. Overrides the URL's
    /// `ttl=`; default: the URL's, else the backend's.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,

    /// How long to wait for the lock; default: forever (like flock). `--wait 0` makes one
    /// attempt.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,

    /// After a loss, how long CMD has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    grace: Duration,

    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `dlock status`'s arguments.
#[derive(Debug, Args)]
struct StatusArgs {
    /// The lock's name.
    name: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 10s, 500ms, 1m30s)"))
}

/// The URL from `--url` / `DLOCK_URL`, parsed, with `--ttl` applied.
fn locker_url(url: Option<&str>, ttl: Option<Duration>) -> Result<LockerUrl, Failure> {
    let Some(url) = url else {
        return Err(Failure::usage(
            "no locker URL: give --url or set DLOCK_URL (e.g. redis://127.0.0.1:6379)",
        ));
    };
    let parsed: LockerUrl = url.parse().map_err(|e: dlock_any::UrlError| {
        Failure::usage(e.to_string()).with("part", e.part().to_string())
    })?;
    match ttl {
        Some(ttl) => parsed
            .with_ttl(Some(ttl))
            .map_err(|e| Failure::usage(format!("--ttl: {}", e.message())).with("part", "--ttl")),
        None => Ok(parsed),
    }
}

fn lock_name(name: &str) -> Result<LockName, Failure> {
    LockName::new(name).map_err(|e| Failure::usage(e.to_string()))
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            Failure::new(
                "unavailable",
                exit::UNAVAILABLE,
                format!("cannot start the async runtime: {e}"),
            )
        })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            // clap formats help, version and usage errors itself.
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let json = cli.json;
    let source = Source {
        url: cli.url,
        config: cli.config,
    };
    let result = match cli.command {
        Command::Run(args) => run::main(&source, args),
        Command::Status(args) => status::main(&source, args, json),
        Command::Elect(args) => elect::main(&source, args),
        Command::Leader(args) => elect::leader(&source, args, json),
        Command::Check(args) => check::main(&source, args, json),
    };
    match result {
        Ok(code) => code,
        Err(failure) => failure.report(json),
    }
}
