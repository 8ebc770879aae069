//! End to end with a tiered configuration: the built `dlock` against the harness's real
//! Redis (tier `fast`) and etcd (tier `strict`). `dlock run --config` locks `orders/42` on
//! etcd and `cache/x` on Redis: shown by `dlock status --config` (tier and route) and by
//! `dlock status --url` on each backend directly, run while the lock is held. Time limits are
//! safety bounds only.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use dlock_conformance::servers::{Cluster, ServerKind};
use serde_json::Value;
use support::stderr;

const USAGE: i32 = 64;
const BOUND: Duration = Duration::from_secs(60);

fn etcd() -> std::sync::Arc<Cluster> {
    Cluster::shared(ServerKind::Etcd, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

/// A scratch directory with `dlock.toml`: `orders/*` and `payments/*` on etcd, the rest on
/// Redis, in a namespace of its own; and the two backends' URLs.
struct Setup {
    dir: PathBuf,
    config: PathBuf,
    redis_url: String,
    etcd_url: String,
}

fn setup(routes: &str) -> Setup {
    let ns = support::namespace("dlock-cli-tiered");
    let dir = std::env::temp_dir().join(&ns);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let redis_url = format!("redis://{}?namespace={ns}", support::addr());
    let etcd_url = format!("etcd://{}?namespace={ns}", etcd().addrs()[0]);
    let text = format!(
        "[tiers.fast]\nurl = \"{redis_url}\"\n\n[tiers.strict]\nurl = \"{etcd_url}\"\n\n{routes}"
    );
    let config = dir.join("dlock.toml");
    std::fs::write(&config, text).expect("write config");
    Setup {
        dir,
        config,
        redis_url,
        etcd_url,
    }
}

const ROUTES: &str = "[[routes]]\npattern = \"orders/*\"\ntier = \"strict\"\n\n\
                      [[routes]]\npattern = \"payments/*\"\ntier = \"strict\"\n\n\
                      [[routes]]\npattern = \"*\"\ntier = \"fast\"\n";

/// The built `dlock` with `DLOCK_CONFIG` (and no `DLOCK_URL`).
fn dlock(s: &Setup) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env_remove("DLOCK_URL")
        .env("DLOCK_CONFIG", &s.config)
        .stdin(std::process::Stdio::null());
    c
}

fn output(c: Command) -> Output {
    support::output(c, BOUND)
}

/// `dlock run --config FILE --name NAME -- sh -c …` whose command, while the lock is held,
/// records `dlock status NAME --json` through the configuration and the exit codes of
/// `dlock status --url` on Redis and on etcd directly. Returns (routed status, Redis code,
/// etcd code).
fn run_and_look(s: &Setup, name: &str) -> (Value, i32, i32) {
    let script = r#"
        "$DLOCK" status "$NAME" --json > "$DIR/routed.json"
        env -u DLOCK_CONFIG "$DLOCK" status --url "$REDIS" "$NAME" > /dev/null; echo $? > "$DIR/redis.rc"
        env -u DLOCK_CONFIG "$DLOCK" status --url "$ETCD" "$NAME" > /dev/null; echo $? > "$DIR/etcd.rc"
    "#;
    let mut c = dlock(s);
    c.args(["run", "--config"])
        .arg(&s.config)
        .args(["--name", name, "--wait", "20s", "--", "sh", "-c", script])
        .env("DLOCK", env!("CARGO_BIN_EXE_dlock"))
        .env("NAME", name)
        .env("DIR", &s.dir)
        .env("REDIS", &s.redis_url)
        .env("ETCD", &s.etcd_url);
    let o = output(c);
    assert_eq!(o.status.code(), Some(0), "dlock run: {}", stderr(&o));
    let read = |f: &str| std::fs::read_to_string(s.dir.join(f)).expect("the command wrote it");
    let routed: Value = serde_json::from_str(&read("routed.json")).expect("status --json");
    let code = |f: &str| read(f).trim().parse::<i32>().expect("an exit code");
    (routed, code("redis.rc"), code("etcd.rc"))
}

#[test]
fn run_locks_each_name_on_its_tier_and_status_says_which_and_why() {
    let s = setup(ROUTES);

    let (routed, redis, etcd) = run_and_look(&s, "orders/42");
    assert_eq!(routed["tier"], "strict", "{routed}");
    assert_eq!(routed["route"]["pattern"], "orders/*", "{routed}");
    assert_eq!(routed["route"]["line"], 8, "{routed}");
    assert_eq!(
        (routed["backend"].as_str(), routed["held"].as_bool()),
        (Some("etcd"), Some(true))
    );
    // Held on etcd (status exits 0), free on Redis (1).
    assert_eq!((redis, etcd), (1, 0));

    let (routed, redis, etcd) = run_and_look(&s, "cache/x");
    assert_eq!(routed["tier"], "fast", "{routed}");
    assert_eq!(routed["route"]["pattern"], "*", "{routed}");
    assert_eq!(
        (routed["backend"].as_str(), routed["held"].as_bool()),
        (Some("redis"), Some(true))
    );
    assert_eq!((redis, etcd), (0, 1));

    // After the runs, status through the configuration finds both free (exit 1) and names the
    // tier in its human output.
    let mut c = dlock(&s);
    c.args(["status", "orders/42"]);
    let o = output(c);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("tier:     strict (route `orders/*`"), "{out}");
}

#[test]
fn config_errors_are_usage_errors_before_any_io() {
    // No catch-all: a name no route takes is refused, naming the patterns.
    let s = setup(
        "[[routes]]\npattern = \"orders/*\"\ntier = \"strict\"\n\n[[routes]]\npattern = \"cache/*\"\ntier = \"fast\"\n",
    );
    let mut c = dlock(&s);
    c.args(["run", "--name", "jobs/1", "--", "true"]);
    let o = output(c);
    assert_eq!(o.status.code(), Some(USAGE), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no route takes the name `jobs/1`"),
        "{}",
        stderr(&o)
    );

    let mut c = dlock(&s);
    c.args(["status", "jobs/1"]);
    let o = output(c);
    assert_eq!(o.status.code(), Some(USAGE), "{}", stderr(&o));

    // --url and --config together.
    let mut c = dlock(&s);
    c.args(["status", "--url", &s.redis_url, "cache/x"]);
    let o = output(c);
    assert_eq!(o.status.code(), Some(USAGE), "{}", stderr(&o));
    assert!(stderr(&o).contains("not both"), "{}", stderr(&o));

    // An unknown tier names its line.
    std::fs::write(
        &s.config,
        "[tiers.fast]\nurl = \"memory:\"\n[[routes]]\npattern = \"*\"\ntier = \"fats\"\n",
    )
    .expect("write");
    let mut c = dlock(&s);
    c.args(["status", "cache/x"]);
    let o = output(c);
    assert_eq!(o.status.code(), Some(USAGE), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(":5: route: unknown tier `fats`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_differently_configured_dlock_is_refused_while_one_runs_and_runs_after_it() {
    let s = setup(ROUTES);
    let other = s.dir.join("other.toml");
    let text = std::fs::read_to_string(&s.config).expect("read config");
    std::fs::write(&other, text.replace("payments/*", "refunds/*")).expect("write");
    let started = s.dir.join("started");
    let mut holder = dlock(&s);
    holder
        .args(["run", "--name", "orders/1", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 30", started.display()))
        .stdout(std::process::Stdio::null());
    let mut holder = holder.spawn().expect("spawn the holder");
    let since = std::time::Instant::now();
    while !started.exists() {
        assert!(
            since.elapsed() < BOUND,
            "the holder never started its command"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let drifted = || {
        let mut c = dlock(&s);
        c.env("DLOCK_CONFIG", &other)
            .args(["run", "--name", "orders/1", "--wait", "0s", "--", "true"]);
        output(c)
    };
    let o = drifted();
    assert_eq!(o.status.code(), Some(USAGE), "{}", stderr(&o));
    assert!(stderr(&o).contains("config.fingerprint"), "{}", stderr(&o));
    // SIGTERM to the holder: its command ends, it releases and closes, taking its guard along.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(holder.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the holder");
    support::wait_bounded(&mut holder, BOUND);
    let o = drifted();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
