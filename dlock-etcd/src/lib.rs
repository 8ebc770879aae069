//! dlock backend for etcd (in progress).
