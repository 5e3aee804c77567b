//! Names of files below a root: a relative name that cannot leave its root
//! whatever the store (release outputs, and what a release report reads).

/// Why `name` (a path relative to some root) could leave the root or be
/// reinterpreted by a store, if it could.
pub fn relative_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 255 {
        return Some("give a file name of 1 to 255 characters, relative to the release's output");
    }
    if name.starts_with('/') {
        return Some("an output is relative to the release's output location, not absolute");
    }
    for seg in name.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Some("`..`, `.` and empty segments are not allowed: an output stays below its release root");
        }
        if !seg.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '=')) {
            return Some("use letters, digits, '.', '-', '_', '=' and '/' between directories");
        }
    }
    None
}
