//! No server outlives the test process that started it: not at a normal exit (atexit), not when
//! the test process is SIGKILLed (PR_SET_PDEATHSIG).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, ServerKind};

const HELPER: &str = "DLOCK_TEARDOWN_HELPER";

/// Alive and not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// In a child process: starts a shared Redis, prints its pid, then exits or sleeps.
#[test]
#[ignore = "helper process for the teardown tests"]
fn __hold_servers() {
    let Ok(mode) = std::env::var(HELPER) else {
        return;
    };
    let cluster = Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e));
    println!(
        "SERVER_PID {}",
        cluster.node(0).pid().expect("a local node has a pid")
    );
    if mode == "sleep" {
        std::thread::sleep(Duration::from_secs(120));
    }
}

/// Runs the helper; returns the child and the server pid it reported (None: skipped).
fn helper(mode: &str) -> Option<(std::process::Child, u32)> {
    if std::env::var_os("DLOCK_REDIS_URLS").is_some() {
        println!("skip: external servers are not started by the harness");
        return None;
    }
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "__hold_servers",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the helper");
    let out = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(out).lines();
    for line in lines.by_ref() {
        let line = line.expect("helper output");
        if line.contains("skip") || line.contains("not installed") {
            let _ = child.kill();
            let _ = child.wait();
            println!("skip: {line}");
            return None;
        }
        if let Some(pid) = line.split("SERVER_PID ").nth(1) {
            let pid = pid.trim().parse().expect("a pid");
            // Keep draining, so the helper never dies of a closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return Some((child, pid));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the helper exited without reporting a server pid");
}

fn gone_within(pid: u32, bound: Duration) -> bool {
    let until = Instant::now() + bound;
    while Instant::now() < until {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn servers_die_when_the_test_process_exits() {
    let Some((mut child, server)) = helper("exit") else {
        return;
    };
    let status = child.wait().expect("helper exit");
    assert!(status.success(), "helper failed: {status}");
    assert!(
        gone_within(server, Duration::from_secs(5)),
        "redis pid {server} outlived its test process"
    );
}

#[test]
fn servers_die_when_the_test_process_is_killed() {
    let Some((mut child, server)) = helper("sleep") else {
        return;
    };
    assert!(
        running(server),
        "the server is not running while its test process lives"
    );
    child.kill().expect("SIGKILL the helper");
    let _ = child.wait();
    assert!(
        gone_within(server, Duration::from_secs(5)),
        "redis pid {server} outlived its SIGKILLed test process"
    );
}
