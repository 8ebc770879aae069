//! Granting the session lease: one etcd lease per locker, kept alive by the renewal driver.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dlock_core::{Error, FencingToken, LockName, LossReason};
use tokio::time::Instant;

use crate::error;
use crate::locker::EtcdLocker;
use crate::renew::Entry;
use crate::session::{KeepAlive, Session};

impl EtcdLocker {
    /// Returns the live session, granting a new lease when there is none or the last one
    /// ended.
    pub(crate) async fn session(&self, deadline: Option<Instant>) -> Result<Arc<Session>, Error> {
        let inner = &self.inner;
        // Another task may be granting the session: wait for it, but not past our deadline.
        let mut current = match deadline {
            None => inner.session.lock().await,
            Some(d) => match tokio::time::timeout_at(d, inner.session.lock()).await {
                Ok(guard) => guard,
                Err(_) => {
                    return Err(Error::unavailable(
                        "the session lease grant in progress did not finish within the wait",
                        None,
                    ));
                }
            },
        };
        if let Some(s) = current.as_ref()
            && s.is_live()
        {
            return Ok(Arc::clone(s));
        }
        if let Some(old) = current.take() {
            let id = old.id();
            tracing::info!(
                lease = format_args!("{id:x}"),
                "session lease ended; granting a new one"
            );
            inner.driver.lose_where(
                &LossReason::SessionEnded(format!("etcd lease {id:x} ended")),
                |e| e.session_id() == id,
            );
        }
        let start = Instant::now();
        let ttl_secs = inner.cfg.ttl_secs;
        let granted = inner
            .etcd
            .call("lease grant", deadline, |c| {
                let mut leases = c.lease_client();
                async move { leases.grant(ttl_secs, None).await }
            })
            .await?;
        if granted.ttl() < inner.cfg.ttl_secs {
            return Err(error::unexpected(
                "lease grant",
                format!(
                    "asked a {} s lease, got {} s",
                    inner.cfg.ttl_secs,
                    granted.ttl()
                ),
            ));
        }
        if granted.ttl() > inner.cfg.ttl_secs {
            tracing::info!(
                asked_s = inner.cfg.ttl_secs,
                granted_s = granted.ttl(),
                "etcd raised the lease TTL to its minimum; deadlines count the TTL asked of etcd (the builder's, rounded up to whole seconds)"
            );
        }
        inner
            .granted_ttl_secs
            .store(granted.ttl().unsigned_abs(), Ordering::Relaxed);
        let id = granted.id();
        // The raft term the lease was granted in: a later term moves the session to a new
        // lease (see relocate.rs).
        let term = granted.header().map_or(0, |h| h.raft_term());
        let ka = Arc::new(KeepAlive::new(id, term, ttl_secs, inner.etcd.clone()));
        // The sentinel: an internal lease that keeps the session renewed while we only wait.
        let sentinel_name =
            LockName::new("session").map_err(|e| error::unexpected("session", e))?;
        let sentinel = inner.driver.register(
            sentinel_name,
            FencingToken(0),
            start,
            Entry::Session(Arc::clone(&ka)),
        );
        let session = Arc::new(Session::new(ka, sentinel, inner.cfg.ttl));
        let ended = session.ended();
        let driver = inner.driver.clone();
        tokio::spawn(async move {
            let reason = ended.await;
            if reason != LossReason::Released {
                driver.lose_where(&reason, |e| e.session_id() == id);
            }
        });
        tracing::debug!(
            lease = format_args!("{id:x}"),
            ttl_s = inner.cfg.ttl_secs,
            "session lease granted"
        );
        *current = Some(Arc::clone(&session));
        Ok(session)
    }
}
