//! [`Recorder`]: a transparent [`JournalStore`] wrapper that remembers which step outcomes have
//! landed in the store, so a step closure can tell whether it runs after its own result was
//! recorded (which the engine must never do).

use async_trait::async_trait;
use eve_core::wrap::StoreWrapper;
use eve_core::{Append, Appended, Event, JournalStore, RunId, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What has landed for one step command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Landed {
    /// The highest attempt with a recorded outcome.
    pub attempt: u32,
    /// A final outcome (completed, fatal, or retries exhausted) landed.
    pub settled: bool,
}

/// Passes every call through to the wrapped store and notes each step outcome of a successful
/// append (also one answered as a duplicate, and one whose caller then saw an injected fault:
/// the note is taken below the fault injection).
#[derive(Debug)]
pub struct Recorder {
    inner: Arc<dyn JournalStore>,
    landed: Mutex<HashMap<(RunId, u64), Landed>>,
}

impl Recorder {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn JournalStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            landed: Mutex::new(HashMap::new()),
        })
    }

    /// What has landed for step `cmd` of `run`.
    pub fn landed(&self, run: &RunId, cmd: u64) -> Landed {
        self.landed
            .lock()
            .expect("recorder lock")
            .get(&(run.clone(), cmd))
            .copied()
            .unwrap_or_default()
    }

    fn note(&self, run: &RunId, events: &[Event]) {
        let mut landed = self.landed.lock().expect("recorder lock");
        for e in events {
            let (cmd, attempt, settled) = match e {
                Event::StepCompleted { cmd, attempt, .. } => (*cmd, *attempt, true),
                Event::StepFailed {
                    cmd,
                    attempt,
                    retry_at,
                    ..
                } => (*cmd, *attempt, retry_at.is_none()),
                _ => continue,
            };
            let l = landed.entry((run.clone(), cmd)).or_default();
            l.attempt = l.attempt.max(attempt);
            l.settled |= settled;
        }
    }
}

#[async_trait]
impl StoreWrapper for Recorder {
    fn wrapped(&self) -> &dyn JournalStore {
        &*self.inner
    }

    async fn append(&self, append: Append) -> Result<Appended, StoreError> {
        let run = append.run.clone();
        let events = append.events.clone();
        let r = self.inner.append(append).await;
        if r.is_ok() {
            self.note(&run, &events);
        }
        r
    }
}
