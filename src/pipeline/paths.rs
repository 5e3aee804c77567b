//! Where a release writes, and the checks that keep it there.
//!
//! A pipeline's `output` and `staging` are templates (`{date}`,
//! `{release_id}`, `{name}`); the part before the first placeholder is the
//! *root* the operator chose. Everything a release writes stays below its
//! root: the name is letters, digits, `-` and `_`; release ids and step
//! output names are checked when the pipeline loads or the run starts
//! (`spec::release_id_problem`, `output_name_problem`); and on the local file
//! system no symbolic link below the root is followed, because a link could
//! point anywhere (another release's directory, `/etc`). Local staging areas
//! are owner-only (0700): they hold outputs before they are published.

use std::path::PathBuf;

use super::error::PipelineError;
use crate::io::private::{create_private_dir, local_path};

/// The fixed part of an output or staging template: up to the last `/`
/// before its first placeholder (the whole template if it has none).
pub fn template_root(template: &str) -> &str {
    match template.find('{') {
        None => template.trim_end_matches('/'),
        Some(i) => template[..i].rfind('/').map_or("", |j| &template[..j]),
    }
}

/// Refuses `location` if, on the local file system, a component of it below
/// `root` (the root itself excluded) is a symbolic link. Components that do
/// not exist yet are fine: dpflow creates them as directories.
pub fn refuse_links_below(root: &str, location: &str) -> Result<(), PipelineError> {
    let (Some(root), Some(path)) = (local_path(root), local_path(location)) else { return Ok(()) };
    let Ok(rest) = path.strip_prefix(&root) else {
        return Err(PipelineError::OutsideRoot { path: location.to_string(), root: root.display().to_string() });
    };
    let mut at: PathBuf = root.clone();
    for c in rest.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(PipelineError::SymlinkInRoot {
                    path: at.display().to_string(),
                    root: root.display().to_string(),
                });
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Makes a local staging area owner-only (0700) before anything is staged in
/// it; a staging area in an object store is left to its bucket policy.
pub fn prepare_staging(staging: &str) -> Result<(), PipelineError> {
    if let Some(p) = local_path(staging) {
        create_private_dir(&p)?;
    }
    Ok(())
}

/// Readies a curator-only output before any data is read: its local
/// directory exists (created with the usual mode) and the path is not a
/// directory, so writing it after the read cannot fail for those reasons.
pub fn prepare_private_output(location: &str) -> Result<(), PipelineError> {
    let Some(p) = local_path(location) else { return Ok(()) };
    let err = |source| crate::io::IoError::WritePrivate { path: p.display().to_string(), source };
    if p.is_dir() {
        return Err(err(std::io::Error::other("it is a directory")).into());
    }
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    Ok(())
}

/// Refuses a staged output name that could leave the release root (the
/// names come back from the staged step records at publish time, so they
/// are checked again there, for object stores too).
pub fn check_output_name(name: &str) -> Result<(), PipelineError> {
    match super::spec::output_name_problem(name) {
        None => Ok(()),
        Some(why) => {
            Err(PipelineError::OutsideRoot { path: format!("{name:?} ({why})"), root: "the release output".into() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_the_template_before_its_first_placeholder() {
        assert_eq!(template_root("/srv/releases/adult/{date}"), "/srv/releases/adult");
        assert_eq!(template_root("s3://b/r/{name}/{date}"), "s3://b/r");
        assert_eq!(template_root("/srv/out/"), "/srv/out");
        assert_eq!(template_root("/srv/out/x-{date}"), "/srv/out");
        assert_eq!(template_root("{date}"), "");
    }

    #[test]
    fn a_link_below_the_root_is_refused_and_the_root_itself_may_be_one() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir_all(real.join("2026-01-01")).unwrap();
        let root_link = d.path().join("root");
        std::os::unix::fs::symlink(&real, &root_link).unwrap();
        let root = root_link.display().to_string();
        // The operator's root may be a link; below it nothing is.
        refuse_links_below(&root, &format!("{root}/2026-01-01/counts.csv")).unwrap();
        refuse_links_below(&root, &format!("{root}/not-yet/counts.csv")).unwrap();
        std::os::unix::fs::symlink("/etc", real.join("2026-01-02")).unwrap();
        let e = refuse_links_below(&root, &format!("{root}/2026-01-02/passwd")).unwrap_err().to_string();
        assert!(e.contains("symbolic link") && e.contains("2026-01-02"), "{e}");
        // A file that is itself a link is refused too (it would be overwritten through it).
        std::os::unix::fs::symlink("/etc/hostname", real.join("2026-01-01/counts.csv")).unwrap();
        assert!(refuse_links_below(&root, &format!("{root}/2026-01-01/counts.csv")).is_err());
        // Object stores have no links.
        refuse_links_below("s3://b/r", "s3://b/r/x/y.csv").unwrap();
    }
}
