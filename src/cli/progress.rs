//! Progress on stderr for commands that can run longer than a few seconds.
//!
//! indicatif draws only when stderr is a terminal, so piped or logged runs
//! stay quiet. Messages after a protected read are static or come from
//! post-processing (docs/PRIVACY.md §1): never a value, count or row number
//! of the data.

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner with the elapsed time and `msg`, ticking on its own.
pub(super) fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} [{elapsed}] {msg}").expect("template"));
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb.set_message(msg.to_string());
    pb
}
