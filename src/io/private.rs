//! Owner-only local files and directories, for what is as private as the
//! input data: the ledger, staging areas, curator-only reports. Files are
//! created with mode 0600 and directories with 0700 from the start (never
//! widened later), so there is no moment when another user can open them.
//! Object stores have no modes: their buckets' policies decide.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use datafusion::execution::context::SessionContext;

use super::{IoError, resolve_url, write_bytes};

/// Mode of owner-only files.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// Mode of owner-only directories.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// The local path of `location`, if it is on the local file system.
pub fn local_path(location: &str) -> Option<PathBuf> {
    let url = resolve_url(location).ok()?;
    (url.scheme() == "file").then(|| url.to_file_path().ok()).flatten()
}

/// Creates `dir` with mode 0700 (its missing parents with the usual mode:
/// they may be published directories), and narrows `dir` to 0700 if it
/// already existed wider (a staging area left by an older version).
pub fn create_private_dir(dir: &Path) -> Result<(), IoError> {
    let err = |source| IoError::CreateDir { dir: dir.display().to_string(), source };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    match std::fs::DirBuilder::new().mode(PRIVATE_DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => return Err(err(e)),
    }
    let mode = std::fs::metadata(dir).map_err(err)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE)).map_err(err)?;
    }
    Ok(())
}

/// Writes `bytes` to a local file with mode 0600: to a new temporary file
/// beside it (created owner-only), then renamed over it, so readers see the
/// old file or the whole new one.
pub fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", rand::random::<u64>()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(PRIVATE_FILE_MODE).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Writes a curator-only output: owner-only when local, else through the
/// object store (whose bucket policy must keep it private).
pub async fn write_private_bytes(ctx: &SessionContext, location: &str, bytes: Vec<u8>) -> Result<(), IoError> {
    match local_path(location) {
        Some(p) => write_private_file(&p, &bytes)
            .map_err(|source| IoError::WritePrivate { path: p.display().to_string(), source }),
        None => write_bytes(ctx, location, bytes).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn private_files_and_directories_are_owner_only_from_the_start() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/b");
        create_private_dir(&dir).unwrap();
        // Only the directory itself: a parent may be a published release directory.
        assert_ne!(mode(&d.path().join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        let f = dir.join("report.json");
        write_private_file(&f, b"{}").unwrap();
        assert_eq!(mode(&f), 0o600);
        assert_eq!(std::fs::read(&f).unwrap(), b"{}");
        // Overwriting keeps the mode, and leaves no temporary file.
        write_private_file(&f, b"[1]").unwrap();
        assert_eq!((mode(&f), std::fs::read(&f).unwrap()), (0o600, b"[1]".to_vec()));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn a_wider_existing_directory_is_narrowed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("staging");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }
}
