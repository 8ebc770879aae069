//! Helpers the backend crates' own tests share, so each is written once: the secrets-leak
//! detector and a capture of everything traced in the process.

mod secrets;
mod trace;

pub use secrets::Secrets;
pub use trace::{captured, debug_bytes, hex};
