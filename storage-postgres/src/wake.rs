//! LISTEN/NOTIFY: the payloads writers send, the listener connection and its dispatch to idle
//! workers ([`Wakeups`]) and watchers ([`WatchHub`]) (see the crate docs, "Wake-ups").

use crate::error::{map_err, BACKEND};
use crate::{Db, PostgresStore};
use eve_core::{DeploymentId, StoreError, WatchHub, WatchKey};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgConnection;
use std::time::Duration;
use tokio::sync::watch;

/// A subscription to wake-ups (see the crate docs, "Wake-ups"). Each subscriber sees every
/// wake-up after it subscribed, coalesced.
#[derive(Debug)]
pub struct Wakeups {
    pub(crate) rx: watch::Receiver<u64>,
}

impl Wakeups {
    /// Waits for the next wake-up: a run of this schema became claimable, or the listener
    /// reconnected (poll everything).
    ///
    /// # Errors
    /// `Unavailable` when the store was dropped.
    pub async fn notified(&mut self) -> Result<(), StoreError> {
        self.rx
            .changed()
            .await
            .map_err(|_| StoreError::Unavailable {
                backend: BACKEND,
                message: "the store's wake-up listener stopped (the store was dropped)".into(),
            })
    }
}

/// The dedicated LISTEN connection's task and the idle-worker signal it feeds.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) workers: watch::Sender<u64>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl PostgresStore {
    /// Subscribes to wake-ups for idle workers. The first call opens the dedicated listener
    /// connection and returns once `LISTEN` is in place, so any run made claimable after this
    /// returns wakes the subscription.
    ///
    /// # Errors
    /// `Unavailable` when the listener cannot connect.
    pub async fn subscribe(&self) -> Result<Wakeups, StoreError> {
        Ok(Wakeups {
            rx: self.listener().await?.workers.subscribe(),
        })
    }

    /// The listener, opened (and `LISTEN` in place) on first use.
    pub(crate) async fn listener(&self) -> Result<&Listener, StoreError> {
        let db = self.inner.db.clone();
        let hub = self.inner.hub.clone();
        self.inner
            .listener
            .get_or_try_init(|| async move {
                let opts = db.pool.connect_options().as_ref().clone();
                let lpool = PgPoolOptions::new()
                    .max_connections(1)
                    .max_lifetime(None)
                    .idle_timeout(None)
                    .connect_lazy_with(opts);
                let mut listener = sqlx::postgres::PgListener::connect_with(&lpool)
                    .await
                    .map_err(map_err)?;
                listener.listen(&db.channel).await.map_err(map_err)?;
                let (workers, _) = watch::channel(0u64);
                let task = tokio::spawn(listen_loop(listener, workers.clone(), hub));
                Ok::<_, StoreError>(Listener { workers, task })
            })
            .await
    }
}

pub(crate) async fn listen_loop(
    mut listener: sqlx::postgres::PgListener,
    workers: watch::Sender<u64>,
    hub: WatchHub,
) {
    let wake_workers = || workers.send_modify(|n| *n = n.wrapping_add(1));
    // Notifications sent while the connection was down are lost: every subscriber and watcher
    // re-reads the store.
    let wake_all = || {
        wake_workers();
        hub.wake_all();
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => {
                backoff = Duration::from_millis(50);
                match Wake::parse(n.payload()) {
                    Wake::Workers => wake_workers(),
                    Wake::Key(key) => hub.wake(&key),
                    Wake::All => wake_all(),
                }
            }
            // The connection was lost and re-established (LISTEN re-issued).
            Ok(None) => wake_all(),
            Err(e) => {
                tracing::warn!(error = %e, "eve postgres listener: reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                wake_all();
            }
        }
    }
}

/// NOTIFY payloads must be shorter than this (a Postgres limit).
const MAX_PAYLOAD: usize = 8000;

/// The payload that wakes everything: sent instead of a key too long for a NOTIFY payload.
const WAKE_ALL: &str = "*";

/// What a NOTIFY payload on the store's channel wakes.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// `d:<deployment>`: idle workers (a run may have become claimable).
    Workers,
    /// `s:<session>` or `r:<run>`: the watchers of that [`WatchKey`].
    Key(WatchKey),
    /// [`WAKE_ALL`], or a payload this version does not know: everyone.
    All,
}

impl Wake {
    fn parse(payload: &str) -> Self {
        if payload.starts_with("d:") {
            Wake::Workers
        } else {
            WatchKey::decode(payload).map_or(Wake::All, Wake::Key)
        }
    }
}

/// `payload`, or [`WAKE_ALL`] when it is too long for a NOTIFY (ids are unbounded). The
/// server-side functions apply the same rule (`eve_payload`, migration 5).
fn fit(payload: String) -> String {
    if payload.len() < MAX_PAYLOAD {
        payload
    } else {
        WAKE_ALL.to_owned()
    }
}

/// The NOTIFY payload that wakes idle workers of `deployment`.
pub(crate) fn deployment_payload(deployment: &DeploymentId) -> String {
    fit(format!("d:{deployment}"))
}

impl Db {
    /// Wakes idle workers of `deployment` when the caller's transaction commits.
    pub(crate) async fn notify(
        &self,
        conn: &mut PgConnection,
        deployment: &DeploymentId,
    ) -> Result<(), StoreError> {
        self.notify_all(conn, &[deployment_payload(deployment)])
            .await
    }

    /// Sends NOTIFYs with `payloads` on the schema's channel (delivered at commit).
    pub(crate) async fn notify_all(
        &self,
        conn: &mut PgConnection,
        payloads: &[String],
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS u(p)")
            .bind(&self.channel)
            .bind(payloads)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::{RunId, SessionId};

    #[test]
    fn payloads_dispatch_unambiguously() {
        let run = WatchKey::Run(RunId::new("d:x"));
        let session = WatchKey::Session(SessionId::new("r:y"));
        let dep = DeploymentId::new("s:z");
        assert_eq!(Wake::parse(&fit(run.encode())), Wake::Key(run));
        assert_eq!(Wake::parse(&fit(session.encode())), Wake::Key(session));
        assert_eq!(Wake::parse(&deployment_payload(&dep)), Wake::Workers);
        // An older version's bare deployment id, and ids too long for a NOTIFY: everyone.
        assert_eq!(Wake::parse("my-deployment"), Wake::All);
        let long = WatchKey::Session(SessionId::new("x".repeat(MAX_PAYLOAD)));
        assert_eq!(fit(long.encode()), WAKE_ALL);
        assert_eq!(Wake::parse(WAKE_ALL), Wake::All);
    }
}
