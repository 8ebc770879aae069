//! Compatibility with etcd's own recipes: `etcdctl lock` and `etcdctl elect` against dlock,
//! and the key layout of the read-write lock and the semaphore.

#[path = "../support/mod.rs"]
mod support;

mod election;
mod etcdctl_lock;
mod family;
