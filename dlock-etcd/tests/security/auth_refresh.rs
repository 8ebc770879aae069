//! Authentication that keeps working: an expired auth token (etcd's `--auth-token-ttl`) is
//! refreshed and the request retried, and such failures are retryable.

use crate::support;

use std::time::Duration;

use crate::backend::AuthUsers;
use dlock_core::Locker;

#[test]
fn expired_auth_token_is_refreshed() {
    let users = AuthUsers::generate();
    let server = crate::auth_etcd(&users);
    support::runtime().block_on(async {
        let ns = support::namespace("auth-refresh");
        // A 9 s TTL: keep-alive rounds every 3 s, so the 2 s token expires between them.
        let locker = support::builder(server.endpoints(), &ns)
            .ttl(Duration::from_secs(9))
            .user(users.user.clone(), users.password.clone())
            .build()
            .await
            .expect("authenticated locker");
        let a = support::name("a");
        let b = support::name("b");
        let first = support::hold(&locker, &a).await;
        // etcd drops a simple token after 2 s without use (checked every second).
        tokio::time::sleep(Duration::from_millis(4500)).await;
        let second = support::hold(&locker, &b).await;
        // Renewal goes on across further expiries (rounds every 3 s; two more rounds).
        tokio::time::sleep(Duration::from_millis(6500)).await;
        first.check().expect("renewed across token expiry");
        second.check().expect("renewed across token expiry");
        let stats = locker.stats();
        assert_eq!(stats.losses, 0, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(4500)).await;
        first
            .release()
            .await
            .expect("release after the token expired");
        second.release().await.expect("release");
        let again = locker
            .try_acquire(&a)
            .await
            .expect("try_acquire")
            .expect("free again");
        again.release().await.expect("release");
    });
}
