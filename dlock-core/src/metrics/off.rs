//! The metrics calls without the `metrics` feature: empty and inline, the same signatures as
//! `emit.rs`.

use std::time::Duration;

use super::End;
use crate::{Counters, Error, LockName};

/// An acquire in progress (nothing without the feature).
pub(crate) struct Wait;

impl Wait {
    #[inline(always)]
    pub(crate) fn start(_counters: Option<&Counters>, _name: &LockName) -> Wait {
        Wait
    }

    #[inline(always)]
    pub(crate) fn done<T>(self, _result: &Result<T, Error>) {}
}

#[inline(always)]
pub(crate) fn granted(_counters: &Counters, _name: &LockName) {}

#[inline(always)]
pub(crate) fn ended(_counters: &Counters, _name: &LockName, _held: Duration, _how: End<'_>) {}

#[inline(always)]
pub(crate) fn released_unended(_counters: &Counters) {}

#[inline(always)]
pub(crate) fn round_settled(_counters: &Counters, _latency: Duration) {}

#[inline(always)]
pub(crate) fn round_failed(_counters: &Counters, _n: u64) {}
