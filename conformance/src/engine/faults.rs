//! [`Faults`]: a fault-injecting [`JournalStore`] wrapper for one worker (like
//! `eve_core::testing::FaultyStore`, which it mirrors), that also tells at which call the
//! fault fired.

use async_trait::async_trait;
use eve_core::wrap::{Call, StoreWrapper, OUTSIDE_FAULTS};
use eve_core::{JournalStore, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a [`Faults`] does to the calls it wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    /// Pass every call through.
    #[default]
    None,
    /// Calls `n + 1` on fail with `Unavailable` without reaching the store (the process died).
    CrashAfter(u64),
    /// Call `n + 1` reaches the store and then answers `Unavailable`; later calls pass.
    AmbiguousAt(u64),
    /// Call `n + 1` reaches the store and answers `Unavailable`; every later call fails.
    AmbiguousThenCrash(u64),
}

/// A [`JournalStore`] wrapper injecting one [`Fault`] and counting calls.
#[derive(Debug)]
pub struct Faults {
    inner: Arc<dyn JournalStore>,
    calls: AtomicU64,
    fault: Mutex<Fault>,
    log: Mutex<Vec<&'static str>>,
    fired: AtomicBool,
    fired_at: AtomicU64,
    dead: AtomicBool,
}

impl Faults {
    /// Wraps `inner`, passing calls through until [`Faults::arm`].
    pub fn new(inner: Arc<dyn JournalStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: AtomicU64::new(0),
            fault: Mutex::new(Fault::None),
            log: Mutex::new(Vec::new()),
            fired: AtomicBool::new(false),
            fired_at: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        })
    }

    /// Sets the fault and starts counting calls from zero.
    pub fn arm(&self, fault: Fault) {
        *self.fault.lock().expect("fault lock") = fault;
        self.calls.store(0, Ordering::SeqCst);
        self.log.lock().expect("log lock").clear();
    }

    fn fault(&self) -> Fault {
        *self.fault.lock().expect("fault lock")
    }

    /// Calls made (including failed ones).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Whether the fault fired.
    pub fn tripped(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// The name of the call the fault fired at.
    pub fn fired_at(&self) -> Option<&'static str> {
        let k = self.fired_at.load(Ordering::SeqCst);
        self.log
            .lock()
            .expect("log lock")
            .get(usize::try_from(k).ok()?)
            .copied()
    }

    fn unavailable(what: &str) -> StoreError {
        StoreError::Unavailable {
            backend: "faulty",
            message: format!("injected fault on {what}"),
        }
    }

    fn fire(&self, n: u64) {
        self.fired_at.store(n, Ordering::SeqCst);
        self.fired.store(true, Ordering::SeqCst);
    }

    async fn call<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.log.lock().expect("log lock").push(what);
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::unavailable(what));
        }
        let (ambiguous, die) = match self.fault() {
            Fault::CrashAfter(k) if n >= k => {
                self.fire(n);
                self.dead.store(true, Ordering::SeqCst);
                return Err(Self::unavailable(what));
            }
            Fault::AmbiguousAt(k) if n == k => {
                self.fire(n);
                (true, false)
            }
            Fault::AmbiguousThenCrash(k) if n >= k => {
                self.fire(n);
                (true, true)
            }
            _ => (false, false),
        };
        let r = f.await;
        if die {
            self.dead.store(true, Ordering::SeqCst);
        }
        if ambiguous {
            return Err(Self::unavailable(what));
        }
        r
    }
}

#[async_trait]
impl StoreWrapper for Faults {
    fn wrapped(&self) -> &dyn JournalStore {
        &*self.inner
    }

    fn around<'a, T: Send + 'a>(&'a self, method: &'static str, call: Call<'a, T>) -> Call<'a, T> {
        if OUTSIDE_FAULTS.contains(&method) {
            return call;
        }
        Box::pin(self.call(method, call))
    }
}
