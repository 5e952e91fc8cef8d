//! Named profiles: a server's URL and key under a name, so `eve --profile prod runs list` needs
//! neither flag. The file is `$EVE_CONFIG`, else `$XDG_CONFIG_HOME/eve/profiles.toml`, else
//! `~/.config/eve/profiles.toml`:
//!
//! ```toml
//! [profiles.prod]
//! url = "http://eve.internal:8787"
//! key = "eve_…"            # optional; keep the file private (chmod 600)
//! ```
//!
//! `--url` / `EVE_URL` and `--key` / `EVE_KEY` override the profile's values.

use crate::error::CliError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The environment variable naming the profiles file.
pub const CONFIG_ENV: &str = "EVE_CONFIG";

/// One profile: where the server is and which key to send.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The server's base URL, e.g. `http://127.0.0.1:8787`.
    pub url: String,
    /// The API key sent as `Authorization: Bearer`.
    #[serde(default)]
    pub key: Option<String>,
}

/// The profiles file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

/// Where the profiles file is: `$EVE_CONFIG`, else under `$XDG_CONFIG_HOME` or `~/.config`.
pub fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("eve").join("profiles.toml"))
}

/// The profile `name` of the file at `path`.
///
/// # Errors
/// [`CliError::Usage`] naming the file: it cannot be read, is not such TOML, or has no profile
/// of that name (the ones it has are listed).
pub fn load(path: &Path, name: &str) -> Result<Profile, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::Usage(format!(
            "--profile {name}: cannot read the profiles file {} ({e}); create it with [profiles.{name}] url = \"http://…\" key = \"eve_…\", or set {CONFIG_ENV}",
            path.display()
        ))
    })?;
    let file: File = toml::from_str(&text).map_err(|e| {
        let why = e
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        CliError::Usage(format!(
            "the profiles file {} is not valid: {why}",
            path.display()
        ))
    })?;
    let names: Vec<&str> = file.profiles.keys().map(String::as_str).collect();
    let known = if names.is_empty() {
        "it has none".to_owned()
    } else {
        format!("it has {}", names.join(", "))
    };
    file.profiles.get(name).cloned().ok_or_else(|| {
        CliError::Usage(format!(
            "no profile {name:?} in {}; {known}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_profile_and_names_the_others_when_one_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiles.toml");
        std::fs::write(
            &path,
            "[profiles.prod]\nurl = \"http://h:1\"\nkey = \"eve_k\"\n[profiles.dev]\nurl = \"http://d:2\"\n",
        )
        .unwrap();
        assert_eq!(
            load(&path, "prod").unwrap(),
            Profile {
                url: "http://h:1".into(),
                key: Some("eve_k".into())
            }
        );
        assert_eq!(load(&path, "dev").unwrap().key, None);
        let err = load(&path, "stage").unwrap_err().to_string();
        assert!(
            err.contains("no profile \"stage\"") && err.contains("dev, prod"),
            "{err}"
        );
        std::fs::write(&path, "[profiles.prod]\nurl = 1\n").unwrap();
        let err = load(&path, "prod").unwrap_err().to_string();
        assert!(err.contains("is not valid") && !err.contains('\n'), "{err}");
        let err = load(&dir.path().join("none.toml"), "prod")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read the profiles file"), "{err}");
    }
}
