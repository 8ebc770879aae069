//! The one scenario list every dlock backend must pass (in progress).

mod backend;

pub use backend::{ClientOptions, TestBackend};
