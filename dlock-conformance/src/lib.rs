//! The one scenario list every dlock backend must pass, its checkers, the fault tools and the
//! real-server harness.

mod backend;
pub mod faults;
pub mod servers;

pub use backend::{ClientOptions, TestBackend};
