//! What a backend crate needs beyond the user API: the shared renewal driver and the
//! contract it renews through, the request counters behind [`Stats`](crate::Stats), the
//! clock-drift and loss-margin rules every lease deadline follows, the builder options every
//! backend shares ([`common_builder_options!`](crate::common_builder_options) over
//! [`CommonOptions`](crate::CommonOptions)), the TLS checks and refusal alerts ([`tls`], with
//! the `tls` feature), and [`Proclaim`], a backend's write of a leader's value.
//!
//! The user traits ([`Locker`](crate::Locker) and the family) are implemented once in
//! this crate over [`LockBackend`] and its siblings, with the closed check and every input
//! check, so a backend writes neither.
//!
//! Users of a backend never need these. They are less stable than the crate root: they
//! change when a backend needs something new of the shared machinery.

pub use crate::background::Background;
pub use crate::common_builder_options;
pub use crate::contract::{ElectionBackend, LockBackend, RwBackend, SemaphoreBackend};
pub use crate::election::{Proclaim, leadership};
pub use crate::options::{drift, loss_margin, validate_ttl};
pub use crate::renewal::{RenewBackend, Renewal, RenewalDriver};
pub use crate::stats::Counters;
#[cfg(feature = "tls")]
pub mod tls;
