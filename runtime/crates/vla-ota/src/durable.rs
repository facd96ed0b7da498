//! Durable, atomic file system steps: fsync of files and directories, write-then-rename,
//! symlink swap, free space.
//!
//! `rename` is atomic but not durable until the directory holding the name is fsynced, so
//! every step that changes a name here ends with an fsync of its parent. Each step
//! boundary calls `step` with a stable name; the store forwards these to its step hook,
//! which the fault-injection tests use to stop the process exactly there.

use crate::error::OtaError;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Called at each step boundary with the step's name.
pub type StepFn<'a> = &'a mut dyn FnMut(&str);

/// Opens a regular file for reading without following a final symbolic link.
pub fn open_no_follow(path: &Path) -> Result<File, OtaError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| OtaError::io("opening", path, e))
}

pub fn fsync_file(file: &File, path: &Path) -> Result<(), OtaError> {
    file.sync_all()
        .map_err(|e| OtaError::io("fsync of", path, e))
}

pub fn fsync_dir(dir: &Path) -> Result<(), OtaError> {
    let handle = File::open(dir).map_err(|e| OtaError::io("opening directory", dir, e))?;
    handle
        .sync_all()
        .map_err(|e| OtaError::io("fsync of directory", dir, e))
}

/// The owner (uid, gid) that files created under `home` should be given: `home`'s owner
/// when this process is root and `home` belongs to someone else, else `None`. OTA
/// commands run as root (from a RAUC handler, say) then leave files the daemon's user can
/// replace and delete; for everyone else nothing changes.
pub fn owner_for(home: &Path) -> Result<Option<(u32, u32)>, OtaError> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let meta =
        std::fs::metadata(home).map_err(|e| OtaError::io("reading the owner of", home, e))?;
    Ok((meta.uid() != 0).then(|| (meta.uid(), meta.gid())))
}

/// Gives `path` (not followed if a symbolic link) the owner [`owner_for`] chose.
pub fn give(path: &Path, owner: Option<(u32, u32)>) -> Result<(), OtaError> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(|e| OtaError::io("changing the owner of", path, e)),
        None => Ok(()),
    }
}

/// [`give`] `path` the owner [`owner_for`] chooses for `home`.
pub fn adopt(path: &Path, home: &Path) -> Result<(), OtaError> {
    give(path, owner_for(home)?)
}

/// The directory holding `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

fn file_label(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Replaces `path` with `bytes` so that a crash at any moment leaves either the old or
/// the new content: temporary file, fsync, rename over `path`, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8], step: StepFn<'_>) -> Result<(), OtaError> {
    let label = file_label(path);
    let dir = parent_of(path);
    let temp = dir.join(format!(".{label}.tmp-{}", std::process::id()));
    step(&format!("write {label}: before temp write"));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&temp)
        .map_err(|e| OtaError::io("creating", &temp, e))?;
    file.write_all(bytes)
        .map_err(|e| OtaError::io("writing", &temp, e))?;
    adopt(&temp, &dir)?;
    step(&format!("write {label}: before fsync"));
    fsync_file(&file, &temp)?;
    drop(file);
    step(&format!("write {label}: before rename"));
    std::fs::rename(&temp, path).map_err(|e| OtaError::io("renaming into place", path, e))?;
    step(&format!("write {label}: before directory fsync"));
    fsync_dir(&dir)?;
    step(&format!("write {label}: done"));
    Ok(())
}

/// Points the symbolic link `link` at `target` atomically: a temporary link renamed over
/// `link` (readers see the old or the new target, never no link), then a directory fsync.
pub fn replace_symlink(link: &Path, target: &Path, step: StepFn<'_>) -> Result<(), OtaError> {
    let label = file_label(link);
    let dir = parent_of(link);
    let temp = dir.join(format!(".{label}.tmp-{}", std::process::id()));
    step(&format!("link {label}: before temp link"));
    match std::fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(OtaError::io("removing stale", &temp, e)),
    }
    std::os::unix::fs::symlink(target, &temp)
        .map_err(|e| OtaError::io("creating symbolic link", &temp, e))?;
    adopt(&temp, &dir)?;
    step(&format!("link {label}: before rename"));
    std::fs::rename(&temp, link).map_err(|e| OtaError::io("renaming link into place", link, e))?;
    step(&format!("link {label}: before directory fsync"));
    fsync_dir(&dir)?;
    step(&format!("link {label}: done"));
    Ok(())
}

/// Removes the symbolic link `link` if present, durably.
pub fn remove_symlink(link: &Path, step: StepFn<'_>) -> Result<(), OtaError> {
    let label = file_label(link);
    match std::fs::symlink_metadata(link) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OtaError::io("reading", link, e)),
        Ok(m) if !m.file_type().is_symlink() => {
            return Err(OtaError::io(
                "removing",
                link,
                std::io::Error::other("expected a symbolic link, found something else"),
            ))
        }
        Ok(_) => {}
    }
    step(&format!("unlink {label}: before unlink"));
    std::fs::remove_file(link).map_err(|e| OtaError::io("removing link", link, e))?;
    step(&format!("unlink {label}: before directory fsync"));
    fsync_dir(&parent_of(link))?;
    Ok(())
}

/// The target of symbolic link `link`, `None` if there is no such link.
pub fn read_link(link: &Path) -> Result<Option<PathBuf>, OtaError> {
    match std::fs::read_link(link) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(OtaError::io("reading link", link, e)),
    }
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let stats = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    #[allow(clippy::useless_conversion)] // the field types differ between libcs
    let (available, fragment) = (u64::from(stats.blocks_available()), stats.fragment_size());
    #[allow(clippy::useless_conversion)]
    Ok(available.saturating_mul(u64::from(fragment)))
}

/// Block size of the file system holding `dir`, for rounding file sizes up.
pub fn block_size(dir: &Path) -> u64 {
    #[allow(clippy::useless_conversion)]
    nix::sys::statvfs::statvfs(dir)
        .map(|s| u64::from(s.fragment_size()).max(512))
        .unwrap_or(4096)
}
