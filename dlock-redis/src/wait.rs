//! An acquire's wait: when it began and when it ends; request budgets and sleeps are cut to
//! its end (shared by the single-node and the Redlock acquire loops).

use std::time::Duration;

use dlock_core::Error;
use tokio::time::Instant;

/// The bounds of one acquire's wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    began: Instant,
    /// `None`: the wait has no bound.
    deadline: Option<Instant>,
}

impl Wait {
    /// A wait of `wait` from now (`None`: unbounded).
    pub(crate) fn start(wait: Option<Duration>) -> Self {
        let began = Instant::now();
        Wait {
            began,
            deadline: wait.map(|w| began + w),
        }
    }

    /// One request's budget: `timeout`, cut to what is left of the wait.
    pub(crate) fn budget(&self, timeout: Duration) -> Duration {
        match self.deadline {
            Some(d) => timeout.min(d.saturating_duration_since(Instant::now())),
            None => timeout,
        }
    }

    /// When a sleep of `sleep` from now ends: never after the wait's end.
    pub(crate) fn wake_at(&self, sleep: Duration) -> Instant {
        let wake_at = Instant::now() + sleep;
        self.deadline.map_or(wake_at, |d| wake_at.min(d))
    }

    /// Whether the wait's end has come.
    pub(crate) fn is_over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The timeout error: how long the acquire waited.
    pub(crate) fn timeout(&self) -> Error {
        Error::Timeout {
            waited: self.began.elapsed(),
        }
    }
}

/// The outcome of an acquire with a zero wait (one attempt): its grant, or a timeout.
pub(crate) fn at_once<T>(granted: Option<T>) -> Result<T, Error> {
    granted.ok_or(Error::Timeout {
        waited: Duration::ZERO,
    })
}
