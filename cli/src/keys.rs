//! `eve keys create|list|revoke`: the API keys that open `eve serve`'s routes, managed on the
//! store directly (no server needed). A key's text is printed once, at creation.

use crate::error::CliError;
use crate::format::utc;
use crate::target::Target;
use clap::Subcommand;
use eve_core::{ApiKey, KeyScope, SessionId, Timestamp};
use std::io::Write;

/// `eve keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key and print it (once: only its hash is stored).
    Create {
        /// What the key is for, e.g. "ci" or "alice's laptop".
        #[arg(long)]
        name: String,
        /// What it may do: read < answer < operate < admin (each includes the ones before).
        #[arg(long, value_parser = parse_scope)]
        scope: KeyScope,
        /// Expire this long after creation, e.g. 30d, 12h (default: never). An expired key
        /// opens nothing (401 saying it expired); create a new one.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        expires_in: Option<std::time::Duration>,
        /// Limit the key to this session (repeat for several; default: every session). Within
        /// its scope, a limited key acts only on these sessions' runs, requests and tasks, and
        /// is refused (403) on routes that name no session, such as the keys routes.
        #[arg(long = "session", value_name = "SESSION")]
        sessions: Vec<String>,
        /// Print the key and its record as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List keys (never their text), oldest first.
    List {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by id: it opens nothing from now on.
    Revoke {
        /// The key's id (the part after `eve_` in its text, as `eve keys list` shows).
        id: String,
    },
}

fn parse_scope(s: &str) -> Result<KeyScope, String> {
    KeyScope::parse(s)
        .ok_or_else(|| format!("unknown scope {s:?}; use read, answer, operate or admin"))
}

/// One key: id, scope, name, and its state and times in UTC (ISO 8601) at `now`.
fn line(k: &ApiKey, now: Timestamp) -> String {
    let state = match (k.revoked_at, k.expires_at) {
        (Some(t), _) => format!("revoked {}", utc(t)),
        (None, Some(t)) if !k.is_active(now) => format!("expired {}", utc(t)),
        (None, _) => "active".into(),
    };
    let expiry = match (k.revoked_at, k.expires_at) {
        (None, Some(t)) if k.is_active(now) => format!(", expires {}", utc(t)),
        _ => String::new(),
    };
    format!(
        "{}  {:<7}  {}  ({state}, created {}{expiry}{})",
        k.id,
        k.scope,
        k.name,
        utc(k.created_at),
        limit(k)
    )
}

/// What a key is limited to, as `, sessions a, b` / `, link for request r` (empty: unlimited).
fn limit(k: &ApiKey) -> String {
    match (&k.request, &k.sessions) {
        (Some(r), _) => format!(", answer link for request {r}"),
        (None, Some(s)) => format!(
            ", sessions {}",
            s.iter()
                .map(SessionId::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (None, None) => String::new(),
    }
}

/// Runs one `eve keys` command on `target` (over HTTP, an admin key is needed).
///
/// # Errors
/// The store's or server's error (a store without keys, an unknown id, a key of too small a
/// scope); [`CliError::Usage`] for `--expires-in` over HTTP (the API makes keys that do not
/// expire).
pub async fn run(
    target: &Target,
    command: &KeysCommand,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match command {
        KeysCommand::Create {
            name,
            scope,
            expires_in,
            sessions,
            json,
        } => {
            // The same limits as a key made over HTTP, refused as a usage error.
            eve_core::check_client_id("--name", name)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let expires_at = expires_in
                .map(|d| {
                    i64::try_from(d.as_millis())
                        .ok()
                        .and_then(|ms| now.millis().checked_add(ms))
                        .filter(|_| !d.is_zero())
                        .map(Timestamp)
                        .ok_or_else(|| {
                            CliError::Usage(format!(
                                "--expires-in {}: give a duration from 1ms to a few centuries, e.g. 30d",
                                humantime::format_duration(d)
                            ))
                        })
                })
                .transpose()?;
            if expires_at.is_some() && matches!(target, Target::Remote(_)) {
                return Err(CliError::Usage(
                    "--expires-in works on the store only (without --url): the HTTP API creates keys that do not expire".into(),
                ));
            }
            for s in sessions {
                eve_core::check_client_id("--session", s)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
            }
            let sessions = (!sessions.is_empty()).then(|| {
                sessions
                    .iter()
                    .map(|s| SessionId::new(s.as_str()))
                    .collect()
            });
            let new = target
                .create_key(name, *scope, sessions, expires_at, now)
                .await
                .map_err(CliError::at("cannot create the key"))?;
            let _ = if *json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({ "key": new.text, "record": new.record })
                )
            } else {
                let expiry = new
                    .record
                    .expires_at
                    .map_or(String::new(), |t| format!(", expires {}", utc(t)));
                let limit = limit(&new.record);
                writeln!(
                    out,
                    "{}\n(key {} with scope {scope}{limit}{expiry}: shown once, store it now; send it as `Authorization: Bearer <key>`)",
                    new.text, new.record.id
                )
            };
        }
        KeysCommand::List { json } => {
            let keys = target
                .list_keys()
                .await
                .map_err(CliError::at("cannot list keys"))?;
            let _ = if *json {
                writeln!(out, "{}", serde_json::json!(keys))
            } else if keys.is_empty() {
                writeln!(
                    out,
                    "no keys; create one with `eve keys create --name NAME --scope admin`"
                )
            } else {
                writeln!(
                    out,
                    "{}",
                    keys.iter()
                        .map(|k| line(k, now))
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            };
        }
        KeysCommand::Revoke { id } => {
            let key = target
                .revoke_key(id, now)
                .await
                .map_err(CliError::at(format!("cannot revoke key {id}")))?;
            let _ = writeln!(out, "{}", line(&key, now));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use eve_core::{JournalStore, MemoryStore};
    use std::sync::Arc;

    #[derive(Debug, Parser)]
    struct Args {
        #[command(subcommand)]
        keys: KeysCommand,
    }

    #[tokio::test]
    async fn create_with_repeated_session_limits_the_key() {
        let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
        let target = Target::Local(store.clone());
        let now = Timestamp(1_000);
        for args in [
            &[
                "eve",
                "create",
                "--name",
                "alice",
                "--scope",
                "answer",
                "--session",
                "s1",
            ][..],
            &[
                "eve",
                "create",
                "--name",
                "bob",
                "--scope",
                "operate",
                "--session",
                "s1",
                "--session",
                "s 2",
            ],
            &["eve", "create", "--name", "ci", "--scope", "read"],
        ] {
            let Args { keys } = Args::try_parse_from(args).expect("parses");
            let mut out = Vec::new();
            run(&target, &keys, now, &mut out).await.expect("created");
        }
        let keys = store.list_keys().await.unwrap();
        let mut limits: Vec<_> = keys
            .iter()
            .map(|k| (k.name.as_str(), k.sessions.clone()))
            .collect();
        limits.sort();
        let ids = |s: &[&str]| Some(s.iter().map(|s| SessionId::new(*s)).collect::<Vec<_>>());
        assert_eq!(
            limits,
            vec![
                ("alice", ids(&["s1"])),
                ("bob", ids(&["s1", "s 2"])),
                ("ci", None)
            ]
        );
        let bob = keys.iter().find(|k| k.name == "bob").unwrap();
        assert!(
            line(bob, now).ends_with(", sessions s1, s 2)"),
            "{}",
            line(bob, now)
        );
        let Args { keys } = Args::try_parse_from([
            "eve",
            "create",
            "--name",
            "x",
            "--scope",
            "read",
            "--session",
            "",
        ])
        .unwrap();
        let err = run(&target, &keys, now, &mut Vec::new()).await.unwrap_err();
        assert!(matches!(err, CliError::Usage(_)), "{err:?}");
    }
}
