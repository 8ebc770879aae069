//! One client per etcd member, so that a request can be moved off a member that hangs.
//!
//! etcd-client balances over all endpoints and cannot be told to avoid one: a member that is
//! frozen (SIGSTOP, a stuck disk) keeps its TCP connection open and answers nothing, and a
//! retry may land on it again. The locker's own requests therefore go to one member at a time:
//! the preferred one, until an attempt on it fails or is cut by the attempt cap; then the next.

use std::sync::atomic::{AtomicUsize, Ordering};

use etcd_client::{Client, ConnectOptions};
use tokio::sync::OnceCell;

/// The members' clients, each connected on first use.
/// How a locker built from the application's client names its one "member" in logs and
/// `Debug` output.
pub(crate) const APPLICATION_CLIENT: &str = "(the application's etcd client)";

pub(crate) struct Members {
    endpoints: Vec<String>,
    opts: ConnectOptions,
    clients: Vec<OnceCell<Client>>,
    preferred: AtomicUsize,
}

impl Members {
    /// Clients for `endpoints` (none connected yet), starting at a random member so that
    /// lockers spread over the cluster.
    pub(crate) fn new(endpoints: &[String], opts: ConnectOptions) -> Self {
        let n = endpoints.len().max(1);
        Members {
            endpoints: endpoints.to_vec(),
            opts,
            clients: endpoints.iter().map(|_| OnceCell::new()).collect(),
            preferred: AtomicUsize::new(rand::random_range(0..n)),
        }
    }

    /// The application's own client as the one "member": requests go where that client sends
    /// them (its own balancing over its endpoints), with no hedging onto another member.
    pub(crate) fn from_client(client: Client) -> Self {
        Members {
            endpoints: vec![APPLICATION_CLIENT.to_owned()],
            opts: ConnectOptions::new(),
            clients: vec![OnceCell::new_with(Some(client))],
            preferred: AtomicUsize::new(0),
        }
    }

    /// How many members there are.
    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The member to use now.
    pub(crate) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.len().max(1)
    }

    /// The client of member `i`, connecting (and authenticating) on first use.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled connect leaves the member unconnected; the next call retries.
    pub(crate) async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let (Some(cell), Some(endpoint)) = (self.clients.get(i), self.endpoints.get(i)) else {
            return Err(etcd_client::Error::InvalidArgs(format!("no member {i}")));
        };
        cell.get_or_try_init(|| Client::connect([endpoint.as_str()], Some(self.opts.clone())))
            .await
            .cloned()
    }

    /// Member `i` failed or hung: prefer the next one (unless another task moved on already).
    pub(crate) fn skip(&self, i: usize) {
        let n = self.len().max(1);
        if self
            .preferred
            .compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::debug!(member = %self.endpoints.get(i).map_or("?", String::as_str), "moving to the next etcd member");
        }
    }
}
