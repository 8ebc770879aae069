//! Work a locker finishes after its caller has moved on: deleting the entry of a dropped lease,
//! withdrawing the queue entry of a cancelled acquire. `close()` waits for it.

use std::future::Future;

use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

/// The background work of one locker. A task spawned here runs on its own, and
/// [`RenewalDriver::close`](crate::backend::RenewalDriver::close) waits for every one of them,
/// so a closed locker has left nothing of a dropped lease or a cancelled acquire at the server
/// (unless a delete failed: the entry then expires at its TTL, as it would have).
///
/// Clones share the same tasks.
#[derive(Clone, Debug, Default)]
pub struct Background {
    tasks: TaskTracker,
}

impl Background {
    /// A set of background tasks, empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `work` on the current tokio runtime, tracked. Outside any runtime nothing runs
    /// and `false` is returned (the caller logs what is left to expire).
    pub fn spawn<F>(&self, work: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match Handle::try_current() {
            Ok(handle) => {
                self.spawn_on(work, &handle);
                true
            }
            Err(_) => false,
        }
    }

    /// Spawns `work` on `runtime`, tracked. On a runtime that is shutting down the task is
    /// dropped without running.
    pub fn spawn_on<F>(&self, work: F, runtime: &Handle)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn_on(work, runtime);
    }

    /// Tasks spawned and not yet finished.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether every task spawned so far has finished.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Waits until every task spawned so far, and any spawned meanwhile, has finished. Meant
    /// for `close()`: a task spawned after this returned is still run, but nobody waits for it.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future stops only the waiting; the tasks go on.
    pub async fn drain(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::Background;

    #[tokio::test]
    async fn drain_waits_for_every_task() {
        let bg = Background::new();
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        assert!(bg.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            d.store(true, Ordering::SeqCst);
        }));
        assert_eq!(bg.len(), 1);
        bg.drain().await;
        assert!(
            done.load(Ordering::SeqCst),
            "drain returned before the task ended"
        );
        assert!(bg.is_empty());
    }

    #[tokio::test]
    async fn clones_share_their_tasks() {
        let bg = Background::new();
        let clone = bg.clone();
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        clone.spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            d.store(true, Ordering::SeqCst);
        });
        bg.drain().await;
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn outside_a_runtime_nothing_is_spawned() {
        assert!(!Background::new().spawn(async {}));
    }
}
