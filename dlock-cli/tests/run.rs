//! End to end: the built `dlock` binary against a real redis-server started by the
//! conformance harness. Time limits here are safety bounds only (a hung test fails instead of
//! hanging); no test depends on how fast something happens.

mod support;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use support::{addr, dlock, stderr};

/// The documented exit codes (dlock-cli's README).
const USAGE: i32 = 64;
const UNAVAILABLE: i32 = 69;
const TIMEOUT: i32 = 75;
const LOST: i32 = 79;

/// How long any one step may take before the test fails rather than hangs.
const BOUND: Duration = Duration::from_secs(60);

/// A namespace unique to this process and call.
fn namespace() -> String {
    support::namespace("dlock-cli")
}

/// Waits for `child` at most `BOUND`.
fn wait_bounded(child: &mut Child) -> ExitStatus {
    support::wait_bounded(child, BOUND)
}

/// Runs `cmd` to completion within `BOUND`.
fn output(cmd: Command) -> Output {
    support::output(cmd, BOUND)
}

/// A private scratch directory.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(namespace());
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Waits until `path` holds `needle` (within `BOUND`).
fn wait_for_text(path: &Path, needle: &str) {
    let start = Instant::now();
    loop {
        if std::fs::read_to_string(path).is_ok_and(|s| s.contains(needle)) {
            return;
        }
        assert!(
            start.elapsed() < BOUND,
            "{} never held {needle:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `dlock status NAME --json` while NAME is held.
fn status_json(url: &str, name: &str) -> serde_json::Value {
    let o = run_dlock(url, &["status", name, "--json"]);
    assert_eq!(o.status.code(), Some(0), "held: {}", stderr(&o));
    serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("JSON")
}

/// Polls `dlock status` until `n` wait for NAME (within `BOUND`); the last report.
fn until_waiting(url: &str, name: &str, n: u64) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let report = status_json(url, name);
        if report["waiting"] == n {
            return report;
        }
        assert!(start.elapsed() < BOUND, "never {n} waiting: {report}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The harness's Redis with a 2 s TTL, in a fresh namespace.
fn redis_url() -> String {
    format!("redis://{}?ttl=2s&namespace={}", addr(), namespace())
}

/// `dlock ARGS…` against `url`, run to completion within `BOUND`.
fn run_dlock(url: &str, args: &[&str]) -> Output {
    let mut c = dlock(url);
    c.args(args);
    output(c)
}

/// Spawns `dlock ARGS… sh -c SCRIPT` where SCRIPT writes `mark` (shell words) to `marked`,
/// then runs until the file `go` appears.
fn spawn_until_go(url: &str, args: &[&str], mark: &str, marked: &Path, go: &Path) -> Child {
    dlock(url)
        .args(args)
        .args(["sh", "-c"])
        .arg(format!(
            "echo {mark} > {}; while [ ! -e {} ]; do sleep 0.05; done",
            marked.display(),
            go.display()
        ))
        .spawn()
        .expect("spawn dlock")
}

/// The fencing token a command wrote as `$DLOCK_TOKEN.` into `path`; `what` says why the
/// file must be there.
fn token_in(path: &Path, what: &str) -> u64 {
    std::fs::read_to_string(path)
        .expect(what)
        .trim()
        .trim_end_matches('.')
        .parse()
        .expect("a token")
}

/// Sends `signal` to `child`.
fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid")),
        signal,
    )
    .expect("signal dlock");
}

/// Sends one command to the Redis server (RESP) and returns its raw reply.
fn redis_command(addr: SocketAddr, args: &[&str]) -> String {
    dlock_conformance::redis_command(addr, args).expect("redis answers")
}

#[test]
fn guarded_jobs_never_overlap() {
    let url = redis_url();
    let dir = scratch();
    let log = dir.join("marks");
    // Each job writes a start and an end mark, sleeping between them.
    let job = format!(
        "echo \"start $DLOCK_TOKEN\" >> {0}; sleep 0.2; echo \"end $DLOCK_TOKEN\" >> {0}",
        log.display()
    );
    let mut children: Vec<Child> = (0..4)
        .map(|_| {
            dlock(&url)
                .args([
                    "run",
                    "--name",
                    "jobs/nightly",
                    "--wait",
                    "50s",
                    "--",
                    "sh",
                    "-c",
                ])
                .arg(&job)
                .spawn()
                .expect("spawn dlock")
        })
        .collect();
    for c in &mut children {
        let status = wait_bounded(c);
        assert_eq!(status.code(), Some(0), "every job ran and succeeded");
    }
    let marks = std::fs::read_to_string(&log).expect("marks");
    let lines: Vec<&str> = marks.lines().collect();
    assert_eq!(lines.len(), 8, "{marks}");
    let mut last_token = 0u64;
    for pair in lines.chunks(2) {
        let start = pair[0].strip_prefix("start ").expect("a start mark");
        let end = pair[1]
            .strip_prefix("end ")
            .expect("an end mark right after it");
        assert_eq!(start, end, "no other job interleaved: {marks}");
        let token: u64 = start.parse().expect("DLOCK_TOKEN is decimal");
        assert!(token > last_token, "tokens increase: {marks}");
        last_token = token;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wait_elapsing_gives_the_timeout_code() {
    let url = redis_url();
    let dir = scratch();
    let held = dir.join("held");
    let mut holder = dlock(&url)
        .args(["run", "--name", "busy", "--", "sh", "-c"])
        .arg(format!(
            "echo held > {}; while :; do sleep 0.1; done",
            held.display()
        ))
        .spawn()
        .expect("spawn holder");
    wait_for_text(&held, "held");

    let o = run_dlock(
        &url,
        &["run", "--name", "busy", "--wait", "300ms", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(TIMEOUT), "{}", stderr(&o));
    assert!(stderr(&o).contains("busy"), "{}", stderr(&o));

    let o = run_dlock(
        &url,
        &[
            "--json", "run", "--name", "busy", "--wait", "0", "--", "true",
        ],
    );
    assert_eq!(o.status.code(), Some(TIMEOUT), "{}", stderr(&o));
    let report: serde_json::Value =
        serde_json::from_str(stderr(&o).trim()).expect("one JSON object on stderr");
    assert_eq!(report["error"], "timeout");
    assert_eq!(report["exit_code"], TIMEOUT);
    assert_eq!(report["name"], "busy");

    // SIGTERM to dlock goes to the command (whose death by it is the exit status); the lock
    // is released on its exit, so the next run gets it at once.
    signal(&holder, nix::sys::signal::Signal::SIGTERM);
    let status = wait_bounded(&mut holder);
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "killed by the forwarded SIGTERM"
    );
    let o = run_dlock(
        &url,
        &["run", "--name", "busy", "--wait", "0", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(0), "released on exit");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lost_lease_terminates_the_command() {
    let ns = namespace();
    let url = format!("redis://{}?namespace={ns}", addr());
    let dir = scratch();
    let marks = dir.join("marks");
    let mut holder = dlock(&url);
    holder
        .args([
            "--json", "run", "--name", "lost/me", "--ttl", "1s", "--grace", "20s", "--", "sh", "-c",
        ])
        .arg(format!(
            "trap 'echo terminated >> {0}; exit 0' TERM; echo started >> {0}; while :; do sleep 0.1; done",
            marks.display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = holder.spawn().expect("spawn holder");
    wait_for_text(&marks, "started");

    // Delete the lock key behind the holder's back (dlock-redis' key layout:
    // `<namespace>/dlock:{<name>}`): its next renewal finds the key gone.
    let reply = redis_command(addr(), &["DEL", &format!("{ns}/dlock:{{lost/me}}")]);
    assert_eq!(reply, ":1\r\n", "the lock key existed");

    let status = wait_bounded(&mut child);
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert_eq!(status.code(), Some(LOST), "{err}");
    wait_for_text(&marks, "terminated");
    let report: serde_json::Value = serde_json::from_str(
        err.lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .expect("a JSON report"),
    )
    .expect("JSON");
    assert_eq!(report["error"], "lost");
    assert_eq!(report["exit_code"], LOST);
    assert_eq!(report["command_exit"], 0, "the command's trap exited 0");
    assert!(report["token"].as_u64().is_some(), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_command_status_passes_through() {
    let url = redis_url();
    let run = |script: &str| {
        run_dlock(&url, &["run", "--name", "status", "--", "sh", "-c", script])
            .status
            .code()
    };
    assert_eq!(run("exit 0"), Some(0));
    assert_eq!(run("exit 7"), Some(7));
    assert_eq!(run("kill -KILL $$"), Some(128 + 9));
    assert_eq!(
        run("test \"$DLOCK_NAME\" = status && test \"$DLOCK_TOKEN\" -gt 0"),
        Some(0),
        "DLOCK_NAME and DLOCK_TOKEN are set"
    );
    let missing = run_dlock(
        &url,
        &["run", "--name", "status", "--", "/nonexistent/command"],
    );
    assert_eq!(missing.status.code(), Some(127));
}

#[test]
fn bad_urls_are_usage_errors_naming_the_part() {
    for (url, part) in [
        ("redis://127.0.0.1:notaport", "port"),
        ("mysql://127.0.0.1", "scheme"),
        ("redis://127.0.0.1?tll=10s", "query parameter `tll`"),
        ("redis://127.0.0.1?ttl=0s", "value of query parameter `ttl`"),
        ("redis://a,b", "host"),
        ("redis://127.0.0.1/notadb", "path"),
    ] {
        let o = run_dlock(url, &["run", "--name", "x", "--", "true"]);
        assert_eq!(o.status.code(), Some(USAGE), "{url}: {}", stderr(&o));
        assert!(stderr(&o).contains(part), "{url}: {}", stderr(&o));
    }
    let o = run_dlock(
        "redis://u:hunter2@127.0.0.1:1?tll=1s",
        &["--json", "run", "--name", "x", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(USAGE));
    assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(stderr(&o).trim()).expect("JSON");
    assert_eq!(report["part"], "query parameter `tll`");
    // No URL at all, or a bad name.
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env_remove("DLOCK_URL")
        .args(["run", "--name", "x", "--", "true"]);
    assert_eq!(output(c).status.code(), Some(USAGE));
    let o = run_dlock("memory:", &["run", "--name", "a//b", "--", "true"]);
    assert_eq!(o.status.code(), Some(USAGE));
}

#[test]
fn an_unreachable_backend_is_unavailable() {
    // ZooKeeper opens its session when connecting; nothing listens on port 1.
    let o = run_dlock(
        "zk://127.0.0.1:1?ttl=2s",
        &["run", "--name", "x", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(UNAVAILABLE), "{}", stderr(&o));
}

/// `dlock status` on a free lock: exit 1, `held` false, nobody waiting.
#[test]
fn status_of_a_free_lock() {
    let url = redis_url();
    let o = run_dlock(&url, &["status", "some/lock", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let report: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("JSON");
    assert_eq!(report["name"], "some/lock");
    assert_eq!(report["backend"], "redis");
    assert_eq!(report["ttl_ms"], 2000);
    assert_eq!(report["held"], false);
    assert!(report["holder"].is_null(), "{report}");
    assert_eq!(report["waiting"], 0, "{report}");
}

/// `dlock status` while `dlock run` holds the lock and another `dlock run` waits: exit 0, the
/// holder's token is the one its command got as `DLOCK_TOKEN`, the server keeps it at most a
/// TTL, one request waits; the human form says the same; and after both ran it is free again.
#[test]
fn status_shows_the_holder_its_token_and_the_queue() {
    let url = redis_url();
    let dir = scratch();
    let (held, go) = (dir.join("held"), dir.join("go"));
    let mut holder = spawn_until_go(
        &url,
        &["run", "--name", "shown", "--"],
        "\"$DLOCK_TOKEN.\"",
        &held,
        &go,
    );
    wait_for_text(&held, ".");
    let token = token_in(&held, "token file");
    let mut waiter = dlock(&url)
        .args(["run", "--name", "shown", "--", "true"])
        .spawn()
        .expect("spawn waiter");
    let report = until_waiting(&url, "shown", 1);
    assert_eq!(report["held"], true, "{report}");
    assert_eq!(report["holder"]["token"], token, "{report}");
    let left = report["holder"]["expires_within_ms"]
        .as_u64()
        .expect("a TTL");
    assert!(left > 0 && left <= 2000, "{report}");
    assert!(
        report["holder"]["entry"]
            .as_str()
            .is_some_and(|e| e.contains("shown")),
        "{report}"
    );
    let o = run_dlock(&url, &["status", "shown"]);
    let human = String::from_utf8_lossy(&o.stdout);
    assert!(human.contains(&format!("token {token}")), "{human}");
    assert!(human.contains("waiting:  1"), "{human}");
    std::fs::write(&go, "go").expect("let the holder finish");
    assert_eq!(wait_bounded(&mut holder).code(), Some(0));
    assert_eq!(wait_bounded(&mut waiter).code(), Some(0));
    let o = run_dlock(&url, &["status", "shown"]);
    assert_eq!(o.status.code(), Some(1), "free again: {}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_signal_while_waiting_withdraws_the_request() {
    let url = redis_url();
    let dir = scratch();
    let (held, go) = (dir.join("held"), dir.join("go"));
    // The holder runs until the file `go` appears.
    let mut holder = spawn_until_go(&url, &["run", "--name", "queue", "--"], "held", &held, &go);
    wait_for_text(&held, "held");
    // A waiter without --wait queues (fair mode) until the signal.
    let mut waiter = dlock(&url)
        .args(["run", "--name", "queue", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    until_waiting(&url, "queue", 1);
    signal(&waiter, nix::sys::signal::Signal::SIGINT);
    assert_eq!(wait_bounded(&mut waiter).code(), Some(128 + 2));
    // Its queue entry is gone when it has exited: its locker's close withdrew it.
    let left = status_json(&url, "queue");
    assert_eq!(
        left["waiting"], 0,
        "the interrupted waiter is still queued: {left}"
    );
    std::fs::write(&go, "go").expect("let the holder finish");
    assert_eq!(wait_bounded(&mut holder).code(), Some(0));
    // No queue entry of the interrupted waiter is left to be served first: one attempt wins.
    let o = run_dlock(
        &url,
        &["run", "--name", "queue", "--wait", "0", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dlock elect` runs its command while leading, with the term as `DLOCK_TOKEN`; meanwhile
/// `dlock leader` reports that term and the value. A second campaign waits its turn, runs with a
/// higher term once the first command exits (its leadership resigned), and when both are done
/// `dlock leader` says nobody leads (exit 1).
#[test]
fn elect_runs_the_command_while_leading_and_leader_reports_it() {
    let url = redis_url();
    let dir = scratch();
    let (first_token, second_token, go) = (dir.join("t1"), dir.join("t2"), dir.join("go"));
    let mut first = spawn_until_go(
        &url,
        &["elect", "--name", "cron", "--value", "node-a", "--"],
        "\"$DLOCK_TOKEN.\"",
        &first_token,
        &go,
    );
    wait_for_text(&first_token, ".");
    let t1 = token_in(&first_token, "token file");
    let o = run_dlock(&url, &["--json", "leader", "cron"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(report["leader"]["value"], "node-a", "{report}");
    assert_eq!(report["leader"]["term"], t1, "{report}");

    let mut second = dlock(&url)
        .args([
            "elect", "--name", "cron", "--value", "node-b", "--", "sh", "-c",
        ])
        .arg(format!(
            "echo \"$DLOCK_TOKEN.\" > {}",
            second_token.display()
        ))
        .spawn()
        .expect("spawn the second campaign");
    std::fs::write(&go, "go").expect("let the first leader finish");
    assert_eq!(wait_bounded(&mut first).code(), Some(0));
    assert_eq!(wait_bounded(&mut second).code(), Some(0));
    let t2 = token_in(&second_token, "the second leader ran");
    assert!(t2 > t1, "the second term {t2} is not above the first {t1}");
    let o = run_dlock(&url, &["leader", "cron"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}
