//! One opener at a time for a SQLite file. Opening a fresh file switches it to WAL and creates
//! its tables; several processes doing that at the same moment deadlock on SQLite's locks, and
//! SQLite answers one of them `database is locked` at once, without waiting out its busy timeout
//! (a reader asking for the write lock while another waits for it is refused rather than
//! deadlocked). So every idgen process opening a SQLite file (the lease file, the registry's,
//! the public-ID service's) first takes an exclusive `flock` on `<file>.open-lock` beside it,
//! waiting for it up to a configurable time, and holds it until the file is set up. A running
//! process's own reads and writes don't take it: those wait on SQLite's busy timeout.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long an opener waits for the others by default.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Held while a SQLite file is opened and set up; dropping it lets the next opener in.
#[derive(Debug)]
pub struct OpenLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenLockError {
    #[error("cannot use the open lock {}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error(
        "{} is being opened by another process ({holder}, holding {}) and was not free within {} ms: \
         if that process is stuck, stop it; or raise the open timeout",
        db.display(),
        path.display(),
        waited.as_millis()
    )]
    TimedOut { db: PathBuf, path: PathBuf, holder: String, waited: Duration },
}

/// `<db>.open-lock`.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".open-lock");
    db.with_file_name(name)
}

/// Waits (polling, a few ms apart) up to `within` for the open lock of `db`, then writes our
/// pid into it so that a waiter that gives up can say who held it.
pub async fn lock_for_open(db: &Path, within: Duration) -> Result<OpenLock, OpenLockError> {
    let path = lock_path(db);
    let io = |error| OpenLockError::Io { path: path.clone(), error };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < within => {
                let pause = 2 + rand::random::<u64>() % 8;
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "pid unknown".to_owned(),
                    pid => format!("pid {pid}"),
                };
                return Err(OpenLockError::TimedOut { db: db.to_owned(), path, holder, waited: started.elapsed() });
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
        }
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    write!(file, "{}", std::process::id()).map_err(io)?;
    Ok(OpenLock { _file: file })
}

/// The file of a `sqlite:` database URL (`sqlite://path?mode=rwc`, `sqlite:path`); `None` for
/// an in-memory database or another scheme.
pub fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" || query.split('&').any(|pair| pair == "mode=memory") {
        return None;
    }
    Some(PathBuf::from(path))
}

/// [`lock_for_open`] for the file of a database URL, if it is a SQLite file.
pub async fn lock_for_open_url(url: &str, within: Duration) -> Result<Option<OpenLock>, OpenLockError> {
    match sqlite_file(url) {
        Some(file) => lock_for_open(&file, within).await.map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_file_of_a_sqlite_url() {
        use super::sqlite_file;
        assert_eq!(sqlite_file("sqlite:///var/lib/idgen/r.db?mode=rwc"), Some("/var/lib/idgen/r.db".into()));
        assert_eq!(sqlite_file("sqlite://.idgen/registry.db"), Some(".idgen/registry.db".into()));
        assert_eq!(sqlite_file("sqlite:r.db"), Some("r.db".into()));
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("sqlite://x.db?mode=memory"), None);
        assert_eq!(sqlite_file("postgres://db/ids"), None);
    }

    use super::*;

    #[tokio::test]
    async fn a_second_opener_waits_and_then_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("leases.db");
        let held = lock_for_open(&db, Duration::from_secs(1)).await.unwrap();
        assert_eq!(lock_path(&db), dir.path().join("leases.db.open-lock"));
        let error = lock_for_open(&db, Duration::from_millis(50)).await.unwrap_err().to_string();
        assert!(error.contains(&format!("pid {}", std::process::id())), "{error}");
        assert!(error.contains("leases.db.open-lock"), "{error}");
        drop(held);
        lock_for_open(&db, Duration::from_millis(50)).await.expect("free once the holder is done");
    }
}
