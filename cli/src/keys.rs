//! `eve keys create|list|revoke`: the API keys that open `eve serve`'s routes, managed on the
//! store directly (no server needed). A key's text is printed once, at creation.

use crate::error::CliError;
use clap::Subcommand;
use eve_core::{ApiKey, JournalStore, KeyScope, Timestamp};
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

fn line(k: &ApiKey) -> String {
    let state = match k.revoked_at {
        Some(t) => format!("revoked at {}", t.millis()),
        None => "active".into(),
    };
    format!(
        "{}  {:<7}  {}  ({state}, created at {})",
        k.id,
        k.scope,
        k.name,
        k.created_at.millis()
    )
}

/// Runs one `eve keys` command on `store`.
///
/// # Errors
/// The store's error (a store without keys, an unknown id).
pub async fn run(
    store: &dyn JournalStore,
    command: &KeysCommand,
    now: Timestamp,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match command {
        KeysCommand::Create { name, scope, json } => {
            // The same limits as a key made over HTTP, refused as a usage error.
            eve_core::check_client_id("--name", name)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let new = eve_server::create_key(store, name, *scope, now)
                .await
                .map_err(CliError::store("cannot create the key"))?;
            let _ = if *json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({ "key": new.text, "record": new.record })
                )
            } else {
                writeln!(
                    out,
                    "{}\n(key {} with scope {scope}: shown once, store it now; send it as `Authorization: Bearer <key>`)",
                    new.text, new.record.id
                )
            };
        }
        KeysCommand::List { json } => {
            let keys = store
                .list_keys()
                .await
                .map_err(CliError::store("cannot list keys"))?;
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
                    keys.iter().map(line).collect::<Vec<_>>().join("\n")
                )
            };
        }
        KeysCommand::Revoke { id } => {
            let key = store
                .revoke_key(id, now)
                .await
                .map_err(CliError::store(format!("cannot revoke key {id}")))?;
            let _ = writeln!(out, "{}", line(&key));
        }
    }
    Ok(())
}
