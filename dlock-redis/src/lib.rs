//! dlock backend for redis (in progress).
