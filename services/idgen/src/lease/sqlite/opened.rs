//! The lease files this process's SQLite has open, whose they are after a fork, and whether the
//! file at a path is still the one opened.
//!
//! SQLite's Unix layer keeps one record per open file (by device and inode) in the process's
//! memory, with the locks the process holds on it: every connection to the file locks through
//! that record, and only the record's first lock of a kind is asked of the operating system.
//! `fork` copies the record into the child, but not the operating system's locks (a POSIX record
//! lock belongs to the process that took it). A connection the child opens on the same file finds
//! the copied record, believes the process holds SHARED already, and takes no real lock. The
//! parent, closing its last connection (its `close()`, or its pool retiring one), then gets
//! EXCLUSIVE, checkpoints and deletes the `-wal` and `-shm` files the child goes on writing in:
//! the child's renewals land in a WAL no other process sees, and a process started later claims
//! the child's number while the child issues under it. SQLite's rule is "do not carry an open
//! connection across fork"; its record of the file is carried with the memory whether or not a
//! connection is, so a forked child must not open that file at all.
//!
//! So every lease file idgen opens is entered here (its path, and its device and inode once it
//! exists) by the process that opens it, from before its first connection until its pool has
//! closed; a process that finds an entry made under another pid was forked from the opener while
//! the file was open, and [`refuse_inherited`] refuses it the file. The entry of a pool dropped
//! without [`Opened::closed`] stays: its connections close on threads of their own, and nothing
//! says when they are done.
//!
//! The same device and inode tell a running process that the file at its path is not the one it
//! opened any more ([`FileIdentity`]): a copy put in its place, or the file removed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::lease::StoreError;

/// A file's device and inode: which file a path names now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    device: u64,
    inode: u64,
}

impl FileIdentity {
    /// The file at `path` now; `None` if there is none.
    #[cfg(unix)]
    pub fn of(path: &Path) -> std::io::Result<Option<FileIdentity>> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(path) {
            Ok(meta) => Ok(Some(FileIdentity { device: meta.dev(), inode: meta.ino() })),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Elsewhere the path alone names the file (no fork there, and no inode to compare).
    #[cfg(not(unix))]
    pub fn of(path: &Path) -> std::io::Result<Option<FileIdentity>> {
        Ok(path.exists().then_some(FileIdentity { device: 0, inode: 0 }))
    }
}

impl std::fmt::Display for FileIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {} inode {}", self.device, self.inode)
    }
}

struct Entry {
    /// Unique within the process (and its forked children, which copy the counter with it).
    key: u64,
    path: PathBuf,
    identity: Option<FileIdentity>,
    pid: u32,
}

static OPEN: Mutex<(u64, Vec<Entry>)> = Mutex::new((0, Vec::new()));

fn open_files() -> std::sync::MutexGuard<'static, (u64, Vec<Entry>)> {
    OPEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The path as SQLite will resolve it: absolute, its directory's links resolved (the file itself
/// may not exist yet).
pub fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    match (absolute.parent(), absolute.file_name()) {
        (Some(dir), Some(name)) => dir.canonicalize().map_or(absolute.clone(), |dir| dir.join(name)),
        _ => absolute,
    }
}

/// Refuses the file at `path` to a process forked from one that had it open through idgen's
/// SQLite ([`Opened`]): see the module's documentation.
pub fn refuse_inherited(path: &Path) -> Result<(), StoreError> {
    let path = resolved(path);
    let identity = FileIdentity::of(&path).ok().flatten();
    let me = std::process::id();
    let open = open_files();
    let inherited = open
        .1
        .iter()
        .find(|entry| entry.pid != me && (entry.path == path || (identity.is_some() && entry.identity == identity)));
    match inherited {
        None => Ok(()),
        Some(entry) => Err(StoreError::Forked(format!(
            "{} was open in process {} when this process was forked from it: a forked process's SQLite shares no \
             locks with its parent's on that file (it inherits its parent's record of them, not the locks), so the \
             two could each see its lease write succeed. Start the generator in each process after forking and \
             never in the parent before it (a pre-fork server: in its post-fork hook, or on first use in the \
             worker; multiprocessing: the \"spawn\" or \"forkserver\" start method), or take IDs from the fleet \
             through the client",
            path.display(),
            entry.pid
        ))),
    }
}

/// A lease file's place in this process's record of open files: entered before the file's first
/// connection, left only by [`Opened::closed`] once its pool has closed.
#[derive(Debug)]
pub struct Opened {
    key: u64,
}

impl Opened {
    /// Enters `path` (refused first if it is a parent's, [`refuse_inherited`]).
    pub fn enter(path: &Path) -> Result<Opened, StoreError> {
        refuse_inherited(path)?;
        let path = resolved(path);
        let identity = FileIdentity::of(&path).ok().flatten();
        let mut open = open_files();
        open.0 += 1;
        let key = open.0;
        open.1.push(Entry { key, path, identity, pid: std::process::id() });
        Ok(Opened { key })
    }

    /// The file's identity once SQLite has made it.
    pub fn set_identity(&self, identity: FileIdentity) {
        if let Some(entry) = open_files().1.iter_mut().find(|entry| entry.key == self.key) {
            entry.identity = Some(identity);
        }
    }

    /// Nothing of the file was ever opened (its connection failed): the entry goes.
    pub fn closed(self) {
        open_files().1.retain(|entry| entry.key != self.key);
    }

    /// Its pool was closed: the entry goes once no descriptor of this process refers to the file
    /// any more (or another entry of this process still stands for it), waiting up to `within`.
    /// A pool's `close` returns while a connection handed back to it at that moment is still
    /// being closed on its own thread: a fork then would copy SQLite's record of the file. If the
    /// file is still open after `within`, the entry stays (a child is refused the file).
    pub async fn released(self, identity: FileIdentity, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let others = open_files().1.iter().any(|entry| {
                entry.key != self.key && entry.pid == std::process::id() && entry.identity == Some(identity)
            });
            if others || !descriptor_open(identity) {
                open_files().1.retain(|entry| entry.key != self.key);
                return;
            }
            if std::time::Instant::now() >= deadline {
                tracing::warn!(%identity, "a lease file's connections were still open after its pool closed: a process forked from this one is refused it");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// Whether a file descriptor of this process refers to the file `identity` names (SQLite closes
/// the database's own descriptor last). Where `/proc/self/fd` cannot be read, assumed open.
fn descriptor_open(identity: FileIdentity) -> bool {
    let Ok(descriptors) = std::fs::read_dir("/proc/self/fd") else { return true };
    descriptors.flatten().any(|fd| FileIdentity::of(&fd.path()).ok().flatten() == Some(identity))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_opened_here_is_refused_only_to_a_forked_child_until_it_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        let opened = Opened::enter(&path).unwrap();
        std::fs::write(&path, b"").unwrap();
        opened.set_identity(FileIdentity::of(&path).unwrap().unwrap());
        // The same process opens it again (a second table in the file): fine.
        let again = Opened::enter(&path).unwrap();
        again.closed();
        // A forked child sees the parent's entries under the parent's pid.
        // SAFETY: the child only reads this module's state and exits without unwinding.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = match (refuse_inherited(&path), refuse_inherited(&dir.path().join("other.db"))) {
                (Err(StoreError::Forked(why)), Ok(())) if why.contains("forked") => 0,
                _ => 1,
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child was not refused: {status}");
        // By another path to the same file (a link to its directory): the same device and inode.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert_eq!(resolved(&link.join("leases.db")), resolved(&path));
        // Closed: a child may open it.
        opened.closed();
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe { libc::_exit(if refuse_inherited(&path).is_ok() { 0 } else { 1 }) };
        }
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "refused after it was closed");
    }

    #[test]
    fn a_replaced_file_has_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.db");
        assert_eq!(FileIdentity::of(&path).unwrap(), None);
        std::fs::write(&path, b"one").unwrap();
        let first = FileIdentity::of(&path).unwrap().unwrap();
        assert_eq!(FileIdentity::of(&path).unwrap(), Some(first));
        let copy = dir.path().join("copy.db");
        std::fs::write(&copy, b"two").unwrap();
        std::fs::rename(&copy, &path).unwrap();
        assert_ne!(FileIdentity::of(&path).unwrap(), Some(first));
    }
}
