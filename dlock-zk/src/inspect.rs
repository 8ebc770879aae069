//! `Locker::inspect` for the mutex: a synced listing of the lock's queue, then the data and
//! stat of the node the grant rule names as the holder.

use dlock_core::{Error, FencingToken, HolderState, LockName, LockState};
use zookeeper_client as zk;

use crate::contend::in_creation_order;
use crate::error::map;
use crate::keys::LOCK_MARKER;
use crate::locker::ZkLocker;
use crate::rule::{Rule, Turn};

/// How many times the queue is listed again when its holder left between the listing and the
/// read of the holder's node.
const HOLDER_READS: usize = 5;

impl ZkLocker {
    /// Who holds the mutex `name` and how many wait, as the server sees it: a `sync` (routed
    /// through the leader, so a grant made through another member shows) pipelined with the
    /// listing of the lock's parent, then one read of the holder's node. The holder is the
    /// node the mutex's grant rule ([`Rule::First`] with `lock-`) grants, exactly as a
    /// contender decides; every other child waits. Its token is the node's `czxid`, as the
    /// lease's was. Nothing is created, deleted or watched.
    ///
    /// # Errors
    /// [`Error::Closed`] after `close`; [`Error::Unavailable`] when the ensemble cannot be
    /// reached or the holder keeps changing between the listing and the read;
    /// [`Error::Backend`] / [`Error::AccessDenied`] when the server refuses.
    pub(crate) async fn inspect_mutex(&self, name: &LockName) -> Result<LockState, Error> {
        let sess = self.session().await?;
        let parent = self.lock_path(name);
        let client = &sess.client;
        let rule = Rule::First(LOCK_MARKER);
        for _ in 0..HOLDER_READS {
            sess.counters.add_requests(2);
            let synced = client.sync(&parent);
            let listed = client.list_children(&parent);
            let (synced, listed) = tokio::join!(synced, listed);
            let children = match synced {
                Ok(()) | Err(zk::Error::NoNode) => listed,
                Err(e) => Err(e),
            };
            let children = match children {
                Ok(c) => c,
                // A name never used (or whose container the server removed): nobody.
                Err(zk::Error::NoNode) => return Ok(LockState::new(None, Some(0))),
                Err(e) => return Err(self.inspect_error("listing the queue", e)),
            };
            // The order contenders use, by czxid past the end of the sequence range.
            let sorted = match in_creation_order(&sess, &parent, rule, children).await {
                Ok(sorted) => sorted,
                Err(e) => return Err(self.inspect_error("ordering the queue", e)),
            };
            let Some(holder) = (0..sorted.len())
                .find(|&i| rule.turn(&sorted, i) == Turn::Granted)
                .and_then(|i| sorted.get(i))
            else {
                return Ok(LockState::new(None, Some(0)));
            };
            let waiting = sorted.len() - 1;
            let entry = format!("{parent}/{holder}");
            sess.counters.add_requests(1);
            match client.get_data(&entry).await {
                Ok((data, stat)) => {
                    // No remaining time: the node lasts as long as its owner's session, and
                    // when that session expires is known only to the ensemble's leader (it
                    // tracks the last packet of every session); a follower or this client
                    // cannot read it.
                    let holder = HolderState::new(
                        u64::try_from(stat.czxid).ok().map(FencingToken),
                        entry,
                        String::from_utf8_lossy(&data),
                        None,
                    );
                    return Ok(LockState::new(Some(holder), Some(waiting)));
                }
                // Released between the listing and the read: never report a holder that is
                // gone; list again.
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.inspect_error("reading the holder's node", e)),
            }
        }
        Err(Error::unavailable(
            format!("{name}: the holder changed {HOLDER_READS} times while it was being read"),
            None,
        ))
    }

    /// A failed read: [`Error::Closed`] when `close` ended the session under it, else mapped.
    fn inspect_error(&self, what: &str, e: zk::Error) -> Error {
        if self.is_closed() {
            return Error::Closed;
        }
        map(&format!("inspect ({what})"), e)
    }
}
