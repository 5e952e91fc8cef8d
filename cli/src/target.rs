//! Where a command acts: on the store itself ([`Target::Local`], for local admin: whoever
//! opens the store acts as admin) or through a server's HTTP API ([`Target::Remote`], chosen by
//! `--url` / `EVE_URL`, a key's scope applies). Both give the same eve-core types, so each
//! command prints the same text and `--json` in either mode.

use crate::remote::{segment, Remote, RemoteError};
use crate::wire::from_api;
use eve_core::{engine::Registry, DeploymentId};
use eve_core::{
    AgentReply, ApiKey, CancelOutcome, Delivered, InputResponse, JournalStore, JournalStoreExt,
    KeyScope, PendingRequest, RequestId, ResetOutcome, Resolution, RunFilter, RunId, RunQuery,
    RunRecord, RunStatus, SessionId, SessionRecord, StoreError, StoredEvent, TerminateOutcome,
    Timestamp,
};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::sync::Arc;

/// Where a command acts.
#[derive(Clone, Debug)]
pub enum Target {
    /// The store, opened directly.
    Local(Arc<dyn JournalStore>),
    /// A server's HTTP API.
    Remote(Remote),
}

/// Why a [`Target`] call failed: the store's error or the server's.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The server refused or could not be reached.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

type Result<T> = std::result::Result<T, TargetError>;

/// `value[field]` read as a `T` of eve-core.
fn field<T: DeserializeOwned>(remote: &Remote, mut value: Value, field: &str) -> Result<T> {
    let v = value.get_mut(field).map(Value::take).unwrap_or(Value::Null);
    read(remote, v, field)
}

/// The most events the runs API returns in one page (its `JOURNAL_PAGE_MAX`).
const REMOTE_PAGE: usize = 10_000;

/// `GET /v1/runs/{run}?from=&limit=`: the run (as JSON), one page of its journal and where
/// the next page starts, if the journal goes on.
async fn journal_page(
    r: &Remote,
    run: &RunId,
    from: u64,
    limit: Option<usize>,
) -> Result<(Value, Vec<StoredEvent>, Option<u64>)> {
    let mut query = vec![("from", from.to_string())];
    if let Some(limit) = limit {
        query.push(("limit", limit.to_string()));
    }
    let mut v = r
        .get(&format!("/v1/runs/{}", segment(run.as_str())), &query)
        .await?;
    let record = v["run"].take();
    let next: Option<u64> = read(r, v["nextSeq"].take(), "nextSeq")?;
    Ok((record, field(r, v, "events")?, next))
}

/// `value` read as a `T` of eve-core (`what` names it in the error).
fn read<T: DeserializeOwned>(remote: &Remote, value: Value, what: &str) -> Result<T> {
    from_api(value).map_err(|e| {
        TargetError::Remote(RemoteError::Unexpected {
            url: remote.url().to_owned(),
            reason: format!("{what}: {e}"),
        })
    })
}

/// Runs per page when [`Target::select_runs`] pages through `GET /v1/runs` (large pages
/// carry no outcomes, which the selection does not need).
const SELECT_PAGE: usize = 1000;

/// What ending a session did: when it ended (the first end's time) and the runs whose
/// cancellation this end requested.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct SessionEnded {
    /// The first end's time.
    pub ended_at: Timestamp,
    /// The runs cancelled (requested) by this end.
    pub cancelled: Vec<RunId>,
}

/// A key record of the API, which never shows the key's hash, given an empty one to be read
/// as an [`ApiKey`] (whose `hash` is never printed either).
fn unhashed(key: &mut Value) {
    if let Some(k) = key.as_object_mut() {
        k.entry("hash").or_insert_with(|| "".into());
    }
}

impl Target {
    /// Runs matching `query` (its session and status; the other fields apply locally only).
    ///
    /// # Errors
    /// The store's or the server's.
    pub async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>> {
        match self {
            Target::Local(s) => Ok(s.list_runs(query).await?),
            Target::Remote(r) => {
                let mut q = Vec::new();
                if let Some(s) = &query.session {
                    q.push(("session", s.to_string()));
                }
                if let Some(s) = query.status {
                    q.push(("status", s.as_str().to_owned()));
                }
                let page = r.get("/v1/runs", &q).await?;
                field(r, page, "runs")
            }
        }
    }

    /// The runs of `query` matching `search` ([`eve_core::search_runs`]): locally the store's
    /// listing narrowed by its attribute index; remotely `GET /v1/runs?query=`, so the server
    /// evaluates the search (and reads the inputs) next to its store.
    ///
    /// # Errors
    /// The store's or the server's (a search the server refuses is its `invalid_query`).
    pub async fn search_runs(
        &self,
        query: &RunQuery,
        search: Option<&eve_core::RunSearch>,
    ) -> Result<Vec<RunRecord>> {
        match (self, search) {
            (_, None) => self.list_runs(query).await,
            (Target::Local(s), Some(search)) => {
                Ok(eve_core::search_runs(&**s, query, Some(search)).await?)
            }
            (Target::Remote(r), Some(search)) => {
                let mut q = vec![("query", search.to_string())];
                if let Some(s) = &query.session {
                    q.push(("session", s.to_string()));
                }
                if let Some(s) = query.status {
                    q.push(("status", s.as_str().to_owned()));
                }
                let page = r.get("/v1/runs", &q).await?;
                field(r, page, "runs")
            }
        }
    }

    /// One run's record.
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn get_run(&self, run: &RunId) -> Result<RunRecord> {
        match self {
            Target::Local(s) => Ok(s.get_run(run).await?),
            Target::Remote(r) => {
                let v = r
                    .get(&format!("/v1/runs/{}", segment(run.as_str())), &[])
                    .await?;
                field(r, v, "run")
            }
        }
    }

    /// A run's whole journal. Over HTTP, webhook tokens come masked (the API never shows them).
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn read_all(&self, run: &RunId) -> Result<Vec<StoredEvent>> {
        self.read_from(run, 0).await
    }

    /// A run's journal from `from_seq` on (over HTTP, page after page of the runs API).
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn read_from(&self, run: &RunId, from_seq: u64) -> Result<Vec<StoredEvent>> {
        match self {
            Target::Local(s) => Ok(s.read_all(run, from_seq).await?),
            Target::Remote(r) => {
                let mut all = Vec::new();
                let mut from = Some(from_seq);
                while let Some(seq) = from {
                    let (_, page, next) = journal_page(r, run, seq, None).await?;
                    all.extend(page);
                    from = next;
                }
                Ok(all)
            }
        }
    }

    /// Up to `limit` events of a run's journal from `from_seq` (fewer at its end): one page
    /// of a journal too long to hold at once. Over HTTP, webhook tokens come masked.
    ///
    /// # Errors
    /// Not found; `from_seq` past the journal's end; the store's or the server's.
    pub async fn read_page(
        &self,
        run: &RunId,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        match self {
            Target::Local(s) => Ok(s.read_range(run, from_seq, limit).await?),
            Target::Remote(r) => {
                let (_, page, _) =
                    journal_page(r, run, from_seq, Some(limit.min(REMOTE_PAGE))).await?;
                Ok(page)
            }
        }
    }

    /// A run and its whole journal, in one read over HTTP.
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn run_and_journal(&self, run: &RunId) -> Result<(RunRecord, Vec<StoredEvent>)> {
        match self {
            Target::Local(s) => Ok((s.get_run(run).await?, s.read_all(run, 0).await?)),
            Target::Remote(r) => {
                let mut v = r
                    .get(&format!("/v1/runs/{}", segment(run.as_str())), &[])
                    .await?;
                let record = read(r, v["run"].take(), "run")?;
                let next: Option<u64> = read(r, v["nextSeq"].take(), "nextSeq")?;
                let mut events: Vec<StoredEvent> = field(r, v, "events")?;
                if let Some(next) = next {
                    events.extend(self.read_from(run, next).await?);
                }
                Ok((record, events))
            }
        }
    }

    /// A session's pending requests, oldest first.
    ///
    /// # Errors
    /// The store's or the server's.
    pub async fn pending_requests(&self, session: &SessionId) -> Result<Vec<PendingRequest>> {
        match self {
            Target::Local(s) => Ok(s.pending_requests(session).await?),
            Target::Remote(r) => {
                let path = format!("/v1/sessions/{}/requests", segment(session.as_str()));
                let v = r.get(&path, &[]).await?;
                field(r, v, "requests")
            }
        }
    }

    /// Answers a request, or reports a subagent call's result (`response.agent`). Over HTTP the
    /// server records the key's name as who answered.
    ///
    /// # Errors
    /// The store's or the server's refusal (already answered, withdrawn, invalid, not found).
    pub async fn answer(
        &self,
        request: &RequestId,
        response: InputResponse,
        now: Timestamp,
    ) -> Result<Delivered> {
        match self {
            Target::Local(s) => Ok(s.answer(request, response, now).await?),
            Target::Remote(r) => {
                let id = segment(request.as_str());
                let (path, body) = match &response.agent {
                    Some(AgentReply::Output(o)) => {
                        (format!("/v1/agents/{id}/result"), json!({ "output": o }))
                    }
                    Some(AgentReply::Error(e)) => {
                        (format!("/v1/agents/{id}/result"), json!({ "error": e }))
                    }
                    None => {
                        let mut body = serde_json::Map::new();
                        if let Some(o) = &response.option_id {
                            body.insert("optionId".into(), o.clone().into());
                        }
                        if let Some(t) = &response.text {
                            body.insert("text".into(), t.clone().into());
                        }
                        (format!("/v1/requests/{id}/answer"), Value::Object(body))
                    }
                };
                let (_, v) = r.post(&path, &[], &body, None).await?;
                Ok(Delivered {
                    run: field(r, v.clone(), "runId")?,
                    seq: field(r, v.clone(), "seq")?,
                    duplicate: field(r, v, "duplicate")?,
                })
            }
        }
    }

    /// Terminates a live run: `Terminated`, or `NotLive` naming how it had ended. Over HTTP
    /// the server records its key's name as `by` (or `by` when it has no keys).
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn terminate(
        &self,
        run: &RunId,
        reason: &str,
        by: &str,
        now: Timestamp,
    ) -> Result<TerminateOutcome> {
        match self {
            Target::Local(s) => Ok(s.terminate(run, reason, by, now).await?),
            Target::Remote(r) => {
                let path = format!("/v1/runs/{}/terminate", segment(run.as_str()));
                let body = json!({ "reason": reason, "by": by });
                match r.post(&path, &[], &body, None).await {
                    Ok((_, v)) => Ok(TerminateOutcome::Terminated {
                        seq: field(r, v, "seq")?,
                    }),
                    Err(RemoteError::Api { code, .. }) if code == "not_live" => {
                        Ok(TerminateOutcome::NotLive {
                            status: self.get_run(run).await?.status,
                        })
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Retries (`to: None`) or resets to `to` an ended run ([`JournalStoreExt::retry`],
    /// [`JournalStoreExt::reset`]), pinning the new run to `deployment`, else (on the store)
    /// to `registry`'s deployment when it has the run's workflow, else to the old run's; over
    /// HTTP the server picks by its own registry the same way.
    ///
    /// # Errors
    /// Not found, not ended, a bad cut; the store's or the server's.
    pub async fn reset(
        &self,
        run: &RunId,
        to: Option<u64>,
        deployment: Option<&DeploymentId>,
        registry: &Registry,
        now: Timestamp,
    ) -> Result<ResetOutcome> {
        match self {
            Target::Local(s) => {
                let deployment = match deployment {
                    Some(d) => d.clone(),
                    None => {
                        let old = s.get_run(run).await?;
                        if registry.get(&old.workflow_id).is_some() {
                            registry.deployment().clone()
                        } else {
                            old.deployment_id
                        }
                    }
                };
                Ok(match to {
                    Some(to) => s.reset(run, to, &deployment, now).await?,
                    None => s.retry(run, &deployment, now).await?,
                })
            }
            Target::Remote(r) => {
                let id = segment(run.as_str());
                let mut body = serde_json::Map::new();
                if let Some(d) = deployment {
                    body.insert("deployment".into(), json!(d));
                }
                let path = match to {
                    Some(to) => {
                        body.insert("to".into(), json!(to));
                        format!("/v1/runs/{id}/reset")
                    }
                    None => format!("/v1/runs/{id}/retry"),
                };
                let (_, v) = r.post(&path, &[], &Value::Object(body), None).await?;
                Ok(ResetOutcome {
                    run: field(r, v.clone(), "run")?,
                    created: field(r, v.clone(), "created")?,
                    from: field(r, v.clone(), "from")?,
                    copied: field(r, v, "copied")?,
                })
            }
        }
    }

    /// Every run `filter` selects (its paging fields ignored) of `session`, oldest first:
    /// the store's listing, or `GET /v1/runs` page by page.
    ///
    /// # Errors
    /// The store's or the server's.
    pub async fn select_runs(
        &self,
        session: Option<&SessionId>,
        filter: &RunFilter,
    ) -> Result<Vec<RunRecord>> {
        let all = RunFilter {
            newest_first: false,
            before: None,
            limit: 0,
            ..filter.clone()
        };
        match self {
            Target::Local(s) => {
                let runs = eve_core::search_runs(
                    &**s,
                    &RunQuery {
                        session: session.cloned(),
                        ..RunQuery::default()
                    },
                    all.query.as_ref(),
                )
                .await?;
                Ok(all.page(runs).map(|p| p.runs).unwrap_or_default())
            }
            Target::Remote(r) => {
                let mut q: Vec<(&str, String)> = vec![("limit", SELECT_PAGE.to_string())];
                if let Some(s) = session {
                    q.push(("session", s.to_string()));
                }
                if let Some(s) = all.status {
                    q.push(("status", s.as_str().to_owned()));
                }
                if let Some(t) = &all.tool {
                    q.push(("tool", t.clone()));
                }
                if let Some(t) = &all.text {
                    q.push(("q", t.clone()));
                }
                if let Some(t) = all.since {
                    q.push(("since", t.0.to_string()));
                }
                if let Some(t) = all.until {
                    q.push(("until", t.0.to_string()));
                }
                if let Some(t) = &all.query {
                    q.push(("query", t.to_string()));
                }
                let mut out = Vec::new();
                let mut before: Option<String> = None;
                loop {
                    let mut q = q.clone();
                    if let Some(b) = &before {
                        q.push(("before", b.clone()));
                    }
                    let mut page = r.get("/v1/runs", &q).await?;
                    let next = page["next"].as_str().map(str::to_owned);
                    let runs: Vec<RunRecord> = field(r, page.take(), "runs")?;
                    out.extend(runs);
                    match next {
                        Some(n) => before = Some(n),
                        None => return Ok(out),
                    }
                }
            }
        }
    }

    /// Requests cancellation of a run.
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn request_cancel(
        &self,
        run: &RunId,
        reason: &str,
        now: Timestamp,
    ) -> Result<CancelOutcome> {
        match self {
            Target::Local(s) => Ok(s.request_cancel(run, reason, now).await?),
            Target::Remote(r) => {
                let path = format!("/v1/runs/{}/cancel", segment(run.as_str()));
                let (_, v) = r
                    .post(&path, &[], &json!({ "reason": reason }), None)
                    .await?;
                match v["outcome"].as_str() {
                    Some("requested") => Ok(CancelOutcome::Requested {
                        seq: field(r, v, "seq")?,
                    }),
                    Some("already_requested") => Ok(CancelOutcome::AlreadyRequested),
                    Some("already_ended") => Ok(CancelOutcome::AlreadyEnded {
                        status: field::<RunStatus>(r, v, "status")?,
                    }),
                    other => Err(TargetError::Remote(RemoteError::Unexpected {
                        url: r.url().to_owned(),
                        reason: format!("a cancel answer with outcome {other:?}"),
                    })),
                }
            }
        }
    }

    /// Resumes or fails a blocked run: the seq written.
    ///
    /// # Errors
    /// Not blocked, not found; the store's or the server's.
    pub async fn resolve_blocked(
        &self,
        run: &RunId,
        resolution: Resolution,
        now: Timestamp,
    ) -> Result<u64> {
        match self {
            Target::Local(s) => Ok(s.resolve_blocked(run, resolution, now).await?),
            Target::Remote(r) => {
                let id = segment(run.as_str());
                let (path, body) = match resolution {
                    Resolution::Resume => (format!("/v1/runs/{id}/resume"), json!({})),
                    Resolution::Fail { error } => {
                        (format!("/v1/runs/{id}/fail"), json!({ "error": error }))
                    }
                    Resolution::Terminate { reason, by } => (
                        format!("/v1/runs/{id}/terminate"),
                        json!({ "reason": reason, "by": by }),
                    ),
                };
                let (_, v) = r.post(&path, &[], &body, None).await?;
                field(r, v, "seq")
            }
        }
    }

    /// A session's record: whether it ended, its queued messages.
    ///
    /// # Errors
    /// The store's or the server's (a store without sessions).
    pub async fn get_session(&self, session: &SessionId) -> Result<SessionRecord> {
        match self {
            Target::Local(s) => Ok(s.get_session(session).await?),
            Target::Remote(r) => {
                let v = r
                    .get(&format!("/v1/sessions/{}", segment(session.as_str())), &[])
                    .await?;
                read(r, v, "session")
            }
        }
    }

    /// Ends a session and requests cancellation of its runs that had not ended, as
    /// `POST /v1/sessions/{id}/end` and `Session::end` do.
    ///
    /// # Errors
    /// The store's or the server's.
    pub async fn end_session(&self, session: &SessionId, now: Timestamp) -> Result<SessionEnded> {
        match self {
            Target::Local(s) => {
                let end = s.end_session(session, now).await?;
                let cancelled = eve_core::engine::cancel_runs(
                    &**s,
                    end.live,
                    eve_core::engine::REASON_SESSION_END,
                    now,
                )
                .await?;
                Ok(SessionEnded {
                    ended_at: end.ended_at,
                    cancelled,
                })
            }
            Target::Remote(r) => {
                let path = format!("/v1/sessions/{}/end", segment(session.as_str()));
                let (_, v) = r.post(&path, &[], &json!({}), None).await?;
                read(r, v, "session end")
            }
        }
    }

    /// Every API key (never their text), oldest first.
    ///
    /// # Errors
    /// The store's or the server's (an admin key is needed).
    pub async fn list_keys(&self) -> Result<Vec<ApiKey>> {
        match self {
            Target::Local(s) => Ok(s.list_keys().await?),
            Target::Remote(r) => {
                let mut v = r.get("/v1/keys", &[]).await?;
                if let Some(keys) = v["keys"].as_array_mut() {
                    keys.iter_mut().for_each(unhashed);
                }
                field(r, v, "keys")
            }
        }
    }

    /// Revokes a key: its record after.
    ///
    /// # Errors
    /// Not found; the store's or the server's.
    pub async fn revoke_key(&self, id: &str, now: Timestamp) -> Result<ApiKey> {
        match self {
            Target::Local(s) => Ok(s.revoke_key(id, now).await?),
            Target::Remote(r) => {
                let path = format!("/v1/keys/{}/revoke", segment(id));
                let (_, mut v) = r.post(&path, &[], &json!({}), None).await?;
                unhashed(&mut v["key"]);
                field(r, v, "key")
            }
        }
    }

    /// Creates a key: its text (shown once) and record. `expires_at` is local only (the API
    /// creates keys that do not expire); the caller refuses it remotely.
    ///
    /// # Errors
    /// The store's or the server's.
    pub async fn create_key(
        &self,
        name: &str,
        scope: KeyScope,
        sessions: Option<Vec<eve_core::SessionId>>,
        expires_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<eve_server::NewKey> {
        match self {
            Target::Local(s) => Ok(eve_server::create_key_limited(
                &**s, name, scope, sessions, expires_at, now,
            )
            .await?),
            Target::Remote(r) => {
                let mut body = json!({ "name": name, "scope": scope.to_string() });
                if let Some(sessions) = &sessions {
                    body["sessions"] = json!(sessions);
                }
                let (_, mut v) = r.post("/v1/keys", &[], &body, None).await?;
                unhashed(&mut v["record"]);
                Ok(eve_server::NewKey {
                    text: field(r, v.clone(), "key")?,
                    record: field(r, v, "record")?,
                })
            }
        }
    }
}
