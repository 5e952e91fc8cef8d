//! Session logs: the per-session counter and `read_session`.

use super::{corrupt, DynamoStore};
use crate::item::*;
use eve_core::{RunId, SessionEntry, SessionId, StoreError};

impl DynamoStore {
    /// The session log's next seq (0 when the session has none).
    pub(super) async fn session_next(
        &self,
        session: &SessionId,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .get(sess_pk(session.as_str()), SESS_CTR_SK)
            .await?
            .and_then(|it| get_n(&it, "next")))
    }
}

/// [`JournalStore::read_session`](eve_core::JournalStore::read_session).
pub(super) async fn read_session(
    store: &DynamoStore,
    session: &SessionId,
    from_seq: u64,
    max: usize,
) -> Result<Vec<SessionEntry>, StoreError> {
    if max == 0 {
        return Err(StoreError::InvalidInput(
            "read_session needs max > 0".into(),
        ));
    }
    let spk = sess_pk(session.as_str());
    let mut out = Vec::new();
    let mut start = None;
    let limit = i32::try_from(max.clamp(100, 1000)).unwrap_or(1000);
    loop {
        let (items, next) = store
            .query_page(
                None,
                "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                &[("#pk", "pk"), ("#sk", "sk")],
                vec![
                    (":pk", s(spk.clone())),
                    (":lo", s(log_sk(from_seq))),
                    (":hi", s("LOG#~")),
                ],
                limit,
                start,
            )
            .await?;
        for it in &items {
            if out.len() >= max {
                break;
            }
            let first: u64 = get_n(it, "f").unwrap_or(0);
            let run = RunId::new(format!("session {session}"));
            let body = store
                .read_blob(it, &spk, "")
                .await?
                .map_err(|r| corrupt(&run, first, format!("session log: {r}")))?;
            let entries: Vec<SessionEntry> = serde_json::from_slice(&body)
                .map_err(|e| corrupt(&run, first, format!("undecodable session log: {e}")))?;
            out.extend(entries.into_iter().filter(|e| e.seq >= from_seq));
        }
        if out.len() >= max {
            break;
        }
        match next {
            Some(k) => start = Some(k),
            None => break,
        }
    }
    out.truncate(max);
    Ok(out)
}
