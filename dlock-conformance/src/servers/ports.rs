//! Port reservations for local servers, so that a killed node can always be restarted on its
//! own ports, however many test processes and threads start servers at once.
//!
//! A port found by binding port 0 and releasing it lies in the kernel's ephemeral range, where
//! the next port-0 bind or outgoing connection of *any* process may get it — between choosing
//! and binding, and while a killed node is down ("bind: address already in use" on restart).
//! So:
//! - **Outside the ephemeral range.** Ports come from `[FLOOR, 65536)` minus the range in
//!   `/proc/sys/net/ipv4/ip_local_port_range`: no port-0 bind and no outgoing connection is
//!   ever given one.
//! - **One owner process per block.** The ports are split into blocks of [`BLOCK`]; a process
//!   owns a block while it holds an exclusive `flock` on `<tmp>/dlock-ports/<first port>.lock`
//!   (the kernel drops it when the process dies, however it dies). The search starts at a
//!   block derived from the pid, so processes rarely even contend for the same lock.
//! - **Held for the cluster's life.** Within a process a port stays reserved from its
//!   cluster's start until the cluster is dropped (restarts reuse it); ports are handed out
//!   round robin, so a freed port is reused last.
//! - Each port is bound once before it is handed out, so a port another program listens on
//!   (or holds as a connection's local port) is skipped.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use super::HarnessError;

/// The lowest port handed out (below are the ports people configure services on).
const FLOOR: u32 = 16384;
/// Ports per block (one process owns a block at a time).
pub(crate) const BLOCK: u32 = 64;
/// Where the kernel keeps the ephemeral range.
const EPHEMERAL: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Linux's default ephemeral range, used when the file cannot be read.
const DEFAULT_EPHEMERAL: (u32, u32) = (32768, 60999);

struct Pool {
    /// First ports of the blocks this process may use, in search order.
    candidates: Vec<u32>,
    /// Blocks owned, with the locked file that proves it.
    owned: Vec<(u32, File)>,
    /// Ports reserved by live clusters of this process.
    in_use: HashSet<u16>,
    /// Round-robin position over the owned ports.
    cursor: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn pool() -> MutexGuard<'static, Option<Pool>> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The kernel's ephemeral port range (inclusive).
pub(crate) fn ephemeral_range() -> (u32, u32) {
    std::fs::read_to_string(EPHEMERAL)
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u32>);
            match (it.next(), it.next()) {
                (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
                _ => None,
            }
        })
        .unwrap_or(DEFAULT_EPHEMERAL)
}

/// First ports of every block wholly outside the ephemeral range, rotated to start at a block
/// derived from this process's pid.
fn candidates() -> Vec<u32> {
    let (lo, hi) = ephemeral_range();
    let mut blocks: Vec<u32> = (FLOOR..=65536 - BLOCK)
        .step_by(BLOCK as usize)
        .filter(|&start| start + BLOCK - 1 < lo || start > hi)
        .collect();
    if !blocks.is_empty() {
        let first = std::process::id() as usize % blocks.len();
        blocks.rotate_left(first);
    }
    blocks
}

fn lock_dir() -> Result<PathBuf, HarnessError> {
    let dir = std::env::temp_dir().join("dlock-ports");
    std::fs::create_dir_all(&dir).map_err(|e| {
        HarnessError::Io(format!(
            "port reservation: cannot create {}: {e}",
            dir.display()
        ))
    })?;
    // Shared by every user's test processes; best effort (only the owner may change it).
    let _ = std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
    Ok(dir)
}

/// Takes the lock of the block at `start` when no other process holds it.
fn try_claim(dir: &std::path::Path, start: u32) -> Result<Option<File>, HarnessError> {
    let path = dir.join(format!("{start}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            HarnessError::Io(format!(
                "port reservation: cannot open {}: {e}",
                path.display()
            ))
        })?;
    Ok(flock_nonblocking(&file).then_some(file))
}

/// An exclusive, non-blocking `flock` on `file` (`File::try_lock` is newer than the MSRV).
#[allow(unsafe_code)]
fn flock_nonblocking(file: &File) -> bool {
    // SAFETY: flock on a descriptor `file` owns for the whole call; no memory is passed.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl Pool {
    fn new() -> Pool {
        Pool {
            candidates: candidates(),
            owned: Vec::new(),
            in_use: HashSet::new(),
            cursor: 0,
        }
    }

    /// Claims one more block; an error when every candidate block is owned by some process.
    fn claim(&mut self) -> Result<(), HarnessError> {
        let dir = lock_dir()?;
        for &start in &self.candidates {
            if self.owned.iter().any(|(s, _)| *s == start) {
                continue;
            }
            if let Some(file) = try_claim(&dir, start)? {
                tracing::debug!(start, len = BLOCK, "claimed a block of ports");
                self.owned.push((start, file));
                return Ok(());
            }
        }
        let (lo, hi) = ephemeral_range();
        Err(HarnessError::Io(format!(
            "port reservation: all {} blocks of {BLOCK} ports in {FLOOR}..65535 outside the \
             ephemeral range {lo}-{hi} are owned by other processes (locks in {})",
            self.candidates.len(),
            dir.display()
        )))
    }

    /// The next free, bindable port among the owned blocks, round robin; `None` after a full
    /// pass found none.
    fn next_free(&mut self, taken: &[u16]) -> Option<u16> {
        let total = self.owned.len() * BLOCK as usize;
        for k in 0..total {
            let idx = (self.cursor + k) % total;
            let port = self.owned[idx / BLOCK as usize].0 + (idx % BLOCK as usize) as u32;
            let Ok(port) = u16::try_from(port) else {
                continue;
            };
            if self.in_use.contains(&port) || taken.contains(&port) || !bindable(port) {
                continue;
            }
            self.cursor = idx + 1;
            return Some(port);
        }
        None
    }
}

/// Whether a server could listen on `127.0.0.1:port` now (bound once, with `SO_REUSEADDR`
/// as the servers do, and released).
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Ports reserved for one cluster; released (for this process to hand out again) on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    ports: Vec<u16>,
}

impl Reservation {
    /// The reserved ports, in the order asked for.
    pub(crate) fn ports(&self) -> &[u16] {
        &self.ports
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(pool) = pool().as_mut() {
            for p in &self.ports {
                pool.in_use.remove(p);
            }
        }
    }
}

/// Reserves `n` distinct ports that no other process using this harness, no port-0 bind and
/// no outgoing connection will take while the reservation lives.
///
/// # Errors
/// [`HarnessError::Io`] when no block can be claimed (the lock dir is unusable, or every block
/// is owned by other processes).
pub(crate) fn reserve(n: usize) -> Result<Reservation, HarnessError> {
    let mut guard = pool();
    let pool = guard.get_or_insert_with(Pool::new);
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        match pool.next_free(&ports) {
            Some(p) => ports.push(p),
            None => pool.claim()?,
        }
    }
    pool.in_use.extend(ports.iter().copied());
    Ok(Reservation { ports })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_distinct_outside_the_ephemeral_range_and_reused_last() {
        let (lo, hi) = ephemeral_range();
        let a = reserve(5).expect("reserve");
        let b = reserve(5).expect("reserve");
        let mut all: Vec<u16> = a.ports().iter().chain(b.ports()).copied().collect();
        for &p in &all {
            assert!(
                u32::from(p) < lo || u32::from(p) > hi,
                "port {p} is in the ephemeral range {lo}-{hi}"
            );
        }
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10, "two live reservations share a port");
        let freed = a.ports().to_vec();
        drop(a);
        let c = reserve(5).expect("reserve");
        assert!(
            c.ports().iter().all(|p| !freed.contains(p)),
            "a just-freed port was handed out before the unused ones"
        );
    }

    #[test]
    fn a_block_has_one_owner_at_a_time() {
        // flock belongs to an open file description: a second open of the same lock file
        // stands for another process.
        let dir = lock_dir().expect("lock dir");
        let start = candidates()
            .into_iter()
            .find_map(|s| try_claim(&dir, s).expect("open").map(|f| (s, f)));
        let (start, first) = start.expect("some block is free");
        assert!(
            try_claim(&dir, start).expect("open").is_none(),
            "block {start} was claimed twice"
        );
        drop(first);
        assert!(
            try_claim(&dir, start).expect("open").is_some(),
            "block {start} stayed locked after its owner let go"
        );
    }

    #[test]
    fn more_ports_than_a_block_claims_more_blocks() {
        let big = reserve(BLOCK as usize + 3).expect("reserve");
        let mut ports = big.ports().to_vec();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), BLOCK as usize + 3);
    }
}
