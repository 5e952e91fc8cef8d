//! Where the engine gets the time from: workers, sessions and hosts read a [`Clock`]; stores
//! never read one (every `now` is an argument), so tests run on a [`ManualClock`].

use super::BoxFuture;
use crate::time::Timestamp;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where workers get the time from. Stores never read a clock: every `now` comes from here.
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
    /// Completes once [`Clock::now`] is at or past `at`.
    fn sleep_until(&self, at: Timestamp) -> BoxFuture<()>;
}

/// The wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn sleep_until(&self, at: Timestamp) -> BoxFuture<()> {
        let d = at.since(Timestamp::now());
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock that moves only when told: sleeps and retry backoffs cost no wall-clock time in
/// tests.
#[derive(Debug)]
pub struct ManualClock {
    now: watch::Sender<Timestamp>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(Self {
            now: watch::Sender::new(start),
        })
    }

    /// Moves the clock forward by `d`, waking every sleeper that is due.
    pub fn advance(&self, d: Duration) {
        self.now.send_modify(|t| *t = t.plus(d));
    }

    /// Sets the clock to `t` (never backwards).
    pub fn set(&self, t: Timestamp) {
        self.now.send_modify(|cur| *cur = (*cur).max(t));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.borrow()
    }

    fn sleep_until(&self, at: Timestamp) -> BoxFuture<()> {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|t| *t >= at).await;
        })
    }
}
