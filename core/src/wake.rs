//! In-process wake-up signals that stores hand out so that workers and waiters sleep until
//! something happened instead of polling: [`WakeSignal`] for idle workers, [`WatchHub`] for one
//! session's log or one run's deliveries. Only hints: a receiver that wakes re-reads the store,
//! and every user keeps a slow fallback poll for writes a backend cannot see (on DynamoDB
//! every write; on SQLite another process's write that coincides with one of this process's).

use crate::error::StoreError;
use crate::ids::{RunId, SessionId};
use crate::store::{JournalStore, RunRecord};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The in-process wake-up signal a store hands out through
/// [`JournalStore::wakeups`]. Cheap to clone; clones share the
/// signal.
#[derive(Clone, Debug)]
pub struct WakeSignal(Arc<watch::Sender<u64>>);

impl Default for WakeSignal {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl WakeSignal {
    /// Wakes every subscriber.
    pub fn wake(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A new subscriber.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// What a [`JournalStore::watch`] receiver is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WatchKey {
    /// The session's log grew (a call settled, a request was opened or withdrawn, progress, a
    /// task ended): what `Session::wait_settled`, `follow` and the SSE channel wait for.
    Session(SessionId),
    /// An external delivery reached the run (an answer, a hook payload, a cancel request, a
    /// resumed block): what the worker holding the run waits for while its steps run. The
    /// worker's own appends do not fire it.
    Run(RunId),
}

impl WatchKey {
    /// The key as one string (`s:<session>` or `r:<run>`), as backends send it over the wire
    /// (a Postgres NOTIFY payload).
    pub fn encode(&self) -> String {
        match self {
            WatchKey::Session(s) => format!("s:{s}"),
            WatchKey::Run(r) => format!("r:{r}"),
        }
    }

    /// Parses [`WatchKey::encode`].
    pub fn decode(s: &str) -> Option<Self> {
        if let Some(id) = s.strip_prefix("s:") {
            Some(WatchKey::Session(SessionId::new(id)))
        } else {
            s.strip_prefix("r:").map(|id| WatchKey::Run(RunId::new(id)))
        }
    }
}

/// Keyed wake-up signals: one `watch` channel per [`WatchKey`] that somebody waits on, created on
/// first subscription and dropped once its last receiver is gone. Waking a key nobody watches
/// costs one map lookup. Cheap to clone; clones share the signals.
#[derive(Clone, Debug, Default)]
pub struct WatchHub {
    inner: Arc<Mutex<HubState>>,
}

#[derive(Debug, Default)]
struct HubState {
    keys: HashMap<WatchKey, watch::Sender<u64>>,
    /// Size of `keys` after the last sweep of unwatched keys.
    swept_at: usize,
}

impl WatchHub {
    /// A receiver whose value changes at every [`WatchHub::wake`] of `key` (and at every
    /// [`WatchHub::wake_all`]) after this call.
    pub fn subscribe(&self, key: &WatchKey) -> watch::Receiver<u64> {
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if st.keys.len() > 2 * st.swept_at.max(32) {
            st.keys.retain(|_, tx| tx.receiver_count() > 0);
            st.swept_at = st.keys.len();
        }
        st.keys
            .entry(key.clone())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Wakes the receivers of `key`, if any.
    pub fn wake(&self, key: &WatchKey) {
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = st.keys.get(key) {
            if tx.receiver_count() == 0 {
                st.keys.remove(key);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Wakes every receiver of every key (after a listener reconnect, when wake-ups may have
    /// been missed).
    pub fn wake_all(&self) {
        let st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for tx in st.keys.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Waits for one [`WatchKey`] of a store: woken by the store's notification, or by a poll
/// interval when the store has none or may have missed a write. Whoever waits re-reads the
/// store after [`Waiter::wait`]; a wake-up is never the data itself.
#[derive(Debug)]
pub struct Waiter {
    rx: Option<watch::Receiver<u64>>,
    poll: Duration,
}

impl Waiter {
    /// Watches `key` in `store`: polls every `fallback` when the store notifies, every `poll`
    /// when it cannot.
    pub async fn new(
        store: &dyn JournalStore,
        key: &WatchKey,
        fallback: Duration,
        poll: Duration,
    ) -> Self {
        let rx = store.watch(key).await;
        let poll = if rx.is_some() { fallback } else { poll };
        Self { rx, poll }
    }

    /// Whether the store notifies this waiter (else it only polls).
    pub fn notified(&self) -> bool {
        self.rx.is_some()
    }

    /// Completes at the key's next notification (or one that came since the last wait) or
    /// after the poll interval, whichever is first. Cancel safe.
    pub async fn wait(&mut self) {
        let poll = tokio::time::sleep(self.poll);
        match self.rx.as_mut() {
            Some(rx) => {
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // The store was dropped: only the poll is left.
                            self.rx = None;
                        }
                    }
                    _ = poll => {}
                }
            }
            None => poll.await,
        }
    }
}

/// `run` once it has ended, or as it stands when `wait` is up (`None`: no limit). Woken by the
/// store when the run's session log grows (its end writes there), with a slow poll as
/// fallback: no store call per tick.
///
/// # Errors
/// As [`JournalStore::get_run`].
pub async fn until_ended(
    store: &dyn JournalStore,
    mut run: RunRecord,
    wait: Option<Duration>,
) -> Result<RunRecord, StoreError> {
    let key = WatchKey::Session(run.session_id.clone());
    let mut watch = Waiter::new(
        store,
        &key,
        Duration::from_secs(2),
        Duration::from_millis(200),
    )
    .await;
    let until = wait.map(|w| tokio::time::Instant::now() + w);
    while !run.status.is_terminal() {
        match until {
            Some(until) => {
                if tokio::time::timeout_at(until, watch.wait()).await.is_err() {
                    break;
                }
            }
            None => watch.wait().await,
        }
        run = store.get_run(&run.run_id).await?;
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_only_its_key_and_forgets_unwatched_keys() {
        let hub = WatchHub::default();
        let a = WatchKey::Session(SessionId::new("a"));
        let b = WatchKey::Run(RunId::new("b"));
        let mut ra = hub.subscribe(&a);
        let rb = hub.subscribe(&b);
        hub.wake(&a);
        assert!(ra.has_changed().unwrap());
        assert!(!rb.has_changed().unwrap());
        ra.borrow_and_update();
        hub.wake_all();
        assert!(ra.has_changed().unwrap() && rb.has_changed().unwrap());
        drop(rb);
        hub.wake(&b);
        assert!(!hub.inner.lock().unwrap().keys.contains_key(&b));
        assert_eq!(WatchKey::decode(&a.encode()), Some(a.clone()));
        assert_eq!(WatchKey::decode(&b.encode()), Some(b));
        assert_eq!(WatchKey::decode("x:1"), None);
    }
}
