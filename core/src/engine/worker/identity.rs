//! Worker identity: the stable default id (`{host}/{deployment}`, an ordinal per store in a
//! process) that lets a restarted process take its predecessor's runs back.

use super::*;

/// Ordinals of the default-id workers alive in this process, per (store, deployment).
pub(super) static ORDINALS: Mutex<Vec<(String, String, u32)>> = Mutex::new(Vec::new());

/// Takes the smallest free ordinal (1, 2, …) of `(store, deployment)` in this process.
pub(super) fn take_ordinal(store: &str, deployment: &str) -> u32 {
    let mut taken = ORDINALS.lock().unwrap_or_else(|e| e.into_inner());
    let n = (1..)
        .find(|n| {
            !taken
                .iter()
                .any(|(s, d, m)| s == store && d == deployment && m == n)
        })
        .expect("some ordinal is free");
    taken.push((store.to_owned(), deployment.to_owned(), n));
    n
}

/// The host's name: `/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `localhost`.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The id a worker gets when [`WorkerConfig::id`] is `None`: `{host}/{deployment}` for the
/// `ordinal`-th such worker of one store in this process (1 for the first), with `/{ordinal}`
/// appended from the second on. Stable across restarts of the process, so a restarted
/// process fences its dead predecessor and claims its runs at once.
pub fn default_worker_id(deployment: &str, ordinal: u32) -> WorkerId {
    let host = host_name();
    if ordinal <= 1 {
        WorkerId::new(format!("{host}/{deployment}"))
    } else {
        WorkerId::new(format!("{host}/{deployment}/{ordinal}"))
    }
}

/// The default-id ordinal a worker holds (see [`take_ordinal`]), given back when dropped.
pub(super) struct Ordinal(pub(super) Option<(String, String, u32)>);

impl Drop for Ordinal {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            let mut taken = ORDINALS.lock().unwrap_or_else(|e| e.into_inner());
            taken.retain(|t| t != &o);
        }
    }
}
