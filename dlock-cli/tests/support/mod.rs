//! What the `dlock` end-to-end tests share: the harness's Redis, unique namespaces, and
//! running the built binary to completion within a bound (a hung `dlock` fails its test
//! instead of hanging it).

// Each test file is a crate of its own and uses part of this.
#![allow(dead_code)]

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dlock_conformance::servers::{Cluster, ServerKind};

/// The harness's shared single-node Redis.
pub fn redis() -> Arc<Cluster> {
    Cluster::shared(ServerKind::Redis, 1)
        .unwrap_or_else(|e| dlock_conformance::harness_unavailable(e))
}

/// Its address.
pub fn addr() -> SocketAddr {
    redis().addrs()[0]
}

/// A namespace unique to this process and call, so tests never share keys.
pub fn namespace(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The built `dlock` with `DLOCK_URL` set and no stdin.
pub fn dlock(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env("DLOCK_URL", url).stdin(Stdio::null());
    c
}

/// Waits for `child` at most `bound`, then kills it and fails.
pub fn wait_bounded(child: &mut Child, bound: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            panic!("dlock did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` to completion within `bound`, capturing its output.
pub fn output(mut cmd: Command, bound: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock");
    let status = wait_bounded(&mut child, bound);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut stdout)
        .expect("read stdout");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_end(&mut stderr)
        .expect("read stderr");
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Its standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
