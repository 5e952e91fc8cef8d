//! The process lock of a worker id (contract clause 11): an exclusive `flock` on a file beside
//! the database, `<db>.worker-<hash of the id>.lock`, which the OS frees when the process dies,
//! however it dies, so a restart after a crash gets it at once. The file holds the id and its
//! holder (pid, host, since when), which a refused process reports; the holder deletes it when
//! it lets go.

#[cfg(not(unix))]
use eve_core::worker_lock::lock_in_process;
use eve_core::worker_lock::this_process;
use eve_core::{StoreError, Timestamp, WorkerId, WorkerLock};
use std::path::{Path, PathBuf};

/// Takes the lock of `worker` for the database file `db` (where `flock` is missing, within
/// this process only).
pub(crate) fn lock_worker(
    db: &Path,
    store_id: &str,
    worker: &WorkerId,
) -> Result<WorkerLock, StoreError> {
    eve_core::store::check_worker_id(worker)?;
    #[cfg(unix)]
    {
        let _ = store_id;
        lock_file(lock_path(db, worker), worker)
    }
    #[cfg(not(unix))]
    {
        let _ = db;
        lock_in_process(store_id, worker)
    }
}

/// `<db>.worker-<16 hex digits>.lock`: the id hashed (FNV-1a, stable across builds), since an
/// id may hold any character.
fn lock_path(db: &Path, worker: &WorkerId) -> PathBuf {
    let hash = worker
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let mut name = db.as_os_str().to_owned();
    name.push(format!(".worker-{hash:016x}.lock"));
    PathBuf::from(name)
}

/// An exclusive lock on a lock file; dropping it deletes the file, then closes it (which
/// unlocks).
#[cfg(unix)]
struct FileLock {
    path: PathBuf,
    _file: std::fs::File,
}

#[cfg(unix)]
impl Drop for FileLock {
    fn drop(&mut self) {
        // Deleted while still locked: a process that opened it meanwhile finds, once it has
        // the lock, that the path names another file (or none) and starts again.
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(unix)]
fn lock_file(path: PathBuf, worker: &WorkerId) -> Result<WorkerLock, StoreError> {
    use rustix::fs::{flock, FlockOperation};
    use std::io::{Read, Write};
    use std::os::unix::fs::MetadataExt;
    let io = |what: &str, e: std::io::Error| StoreError::Other {
        backend: crate::error::BACKEND,
        source: format!("{what} the worker lock file {}: {e}", path.display()).into(),
    };
    loop {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("cannot open", e))?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = text
                    .lines()
                    .nth(1)
                    .filter(|l| !l.is_empty())
                    .unwrap_or("a process that is just starting")
                    .to_owned();
                return Err(StoreError::WorkerIdInUse {
                    worker: worker.to_string(),
                    holder: format!("{holder}; lock file {}", path.display()),
                });
            }
            Err(e) => return Err(io("cannot lock", e.into())),
        }
        let mine = file.metadata().map_err(|e| io("cannot read", e))?;
        let same = std::fs::metadata(&path)
            .is_ok_and(|now| now.ino() == mine.ino() && now.dev() == mine.dev());
        if !same {
            // The holder let go and deleted the file after we opened it.
            continue;
        }
        let holder = this_process(Timestamp::now());
        file.set_len(0)
            .and_then(|()| file.write_all(format!("{worker}\n{holder}\n").as_bytes()))
            .map_err(|e| io("cannot write", e))?;
        return Ok(WorkerLock::new(
            worker.clone(),
            holder,
            FileLock { path, _file: file },
        ));
    }
}
