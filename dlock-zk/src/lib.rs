//! dlock backend for zk (in progress).
