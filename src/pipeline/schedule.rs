//! `dpflow schedule`: runs pipelines on their cron schedules.
//!
//! * one run at a time per pipeline (a sequential loop per pipeline, and an
//!   advisory lock on `<state dir>/<pipeline>.lock` held for the scheduler's
//!   lifetime, so a second scheduler of the same pipeline refuses to start);
//! * a missed run (the scheduler was down at the last scheduled time) runs
//!   once on start-up;
//! * before each run the ledger must cover the release's cost; otherwise the
//!   pipeline stops (logged; `dpflow schedule --status` exits non-zero);
//! * SIGTERM/SIGINT: no new runs start; a running release finishes first.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::{PipelineError, chain};
use super::run::{RunOptions, RunOutcome};
use super::spec::Pipeline;

/// Persistent state of one scheduled pipeline.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PipelineState {
    /// Pipeline name.
    pub name: String,
    /// The last scheduled time that was run.
    pub last_scheduled: Option<DateTime<Utc>>,
    /// Its release id.
    pub last_release_id: Option<String>,
    /// ok / failed / already-complete.
    pub last_status: Option<String>,
    /// Error of the last failed run.
    pub last_error: Option<String>,
    /// Runs completed by schedulers.
    pub runs: u64,
    /// Why the pipeline stopped, if it did.
    pub stopped: Option<String>,
    /// Next scheduled time.
    pub next: Option<DateTime<Utc>>,
}

fn state_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.state.json"))
}

/// Loads a pipeline's state (default if none).
pub fn load_state(dir: &Path, name: &str) -> PipelineState {
    std::fs::read(state_path(dir, name))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(PipelineState { name: name.into(), ..Default::default() })
}

type Result<T, E = PipelineError> = std::result::Result<T, E>;

fn state_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PipelineError {
    let path = path.to_path_buf();
    move |source| PipelineError::State { action, path, source }
}

fn save_state(dir: &Path, s: &PipelineState) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(state_err("creating the state directory", dir))?;
    let tmp = dir.join(format!(".{}.tmp", s.name));
    let json = serde_json::to_vec_pretty(s).map_err(|source| PipelineError::Json {
        action: "encoding",
        what: format!("the state of pipeline {}", s.name),
        source,
    })?;
    std::fs::write(&tmp, json).map_err(state_err("writing", &tmp))?;
    let path = state_path(dir, &s.name);
    std::fs::rename(&tmp, &path).map_err(state_err("writing", &path))?;
    Ok(())
}

/// A scheduler's claim on one pipeline: an advisory lock (`flock`) on
/// `<state dir>/<pipeline>.lock`, held for the scheduler's lifetime. The lock,
/// not the pid written into the file (for humans), decides: the operating
/// system releases it when the holder exits, however it exits.
pub(crate) struct PipelineLock {
    path: PathBuf,
    // Closing the file releases the lock (after `drop` removed the path).
    _file: std::fs::File,
}

impl PipelineLock {
    /// Takes the lock on `<dir>/<name>.lock`, or fails at once if another
    /// scheduler (or any other process) holds it.
    pub(crate) fn acquire(dir: &Path, name: &str) -> Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        std::fs::create_dir_all(dir).map_err(state_err("creating the state directory", dir))?;
        let path = dir.join(format!("{name}.lock"));
        let opening = || state_err("opening the lock file", &path);
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(opening())?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(PipelineError::Locked { pipeline: name.to_string(), path });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(state_err("locking", &path)(e)),
            }
            // A holder removes the path before it unlocks: if the path no
            // longer names the file locked here, lock the new one instead.
            let held = file.metadata().map_err(opening())?;
            match std::fs::metadata(&path) {
                Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => {}
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(opening()(e)),
            }
            file.set_len(0).and_then(|()| write!(file, "{}", std::process::id())).map_err(opening())?;
            return Ok(Self { path, _file: file });
        }
    }
}

impl Drop for PipelineLock {
    fn drop(&mut self) {
        // Removed while still locked; the lock goes when the file closes.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Scheduler options.
#[derive(Debug, Clone)]
pub struct ScheduleOptions {
    /// Where state and lock files live.
    pub state_dir: PathBuf,
    /// UNSAFE: seeded noise (tests only).
    pub unsafe_seed: Option<u64>,
}

fn cron_of(p: &Pipeline) -> Result<croner::Cron> {
    let s = p.schedule.as_deref().ok_or_else(|| PipelineError::NoSchedule(p.name.clone()))?;
    croner::Cron::from_str(s).map_err(|source| PipelineError::Schedule {
        pipeline: p.name.clone(),
        problem: "bad schedule",
        schedule: s.to_string(),
        source,
    })
}

/// Why the ledger cannot cover the next release, if it cannot.
async fn budget_shortfall(p: &Pipeline) -> Result<Option<String>> {
    let (plans, _) = p.plan().await?;
    let ledger = match crate::privacy::Ledger::open(&p.ledger) {
        Ok(l) => l,
        Err(crate::privacy::LedgerError::Missing(_)) if p.create_ledger.is_some() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut filter = ledger.filter(&p.dataset)?;
    for m in plans.iter().flat_map(|s| &s.mechanisms) {
        if let Err(e) = filter.charge(&m.loss) {
            return Ok(Some(format!("the ledger cannot cover the next release: {e}")));
        }
    }
    Ok(None)
}

async fn run_once(p: &Pipeline, when: DateTime<Utc>, opts: &ScheduleOptions, state: &mut PipelineState) -> Result<()> {
    let local = when.with_timezone(&p.timezone);
    let release_id = format!("{}-{}", p.name, local.format("%Y%m%dT%H%M%S"));
    let ro = RunOptions {
        release_id: Some(release_id.clone()),
        dry_run: false,
        unsafe_seed: opts.unsafe_seed,
        date: Some(when),
    };
    log::info!("{}: starting release {release_id} (scheduled for {when})", p.name);
    let outcome = p.run(&ro, &|m| log::info!("{}: {m}", p.name)).await;
    state.last_scheduled = Some(when);
    state.last_release_id = Some(release_id);
    match outcome {
        Ok(RunOutcome::Completed { .. }) => {
            state.last_status = Some("ok".into());
            state.last_error = None;
            state.runs += 1;
        }
        Ok(RunOutcome::AlreadyComplete { .. }) => state.last_status = Some("already-complete".into()),
        Ok(RunOutcome::DryRun { .. }) => {}
        Err(e) => {
            let e = chain(&e);
            log::error!("{}: run for {when} failed: {e}", p.name);
            state.last_status = Some("failed".into());
            state.last_error = Some(e);
        }
    }
    Ok(())
}

/// The longest single sleep of the scheduler before it reads the wall clock again.
const MAX_SLEEP: std::time::Duration = std::time::Duration::from_secs(60);

/// The next scheduled time: after `now`, and never at or before the last
/// slot already run. After the wall clock jumps back, the slot just run is
/// in the future again; without the second rule it would be run again (its
/// release id would make that rerun "already complete", but the scheduler
/// must not pick it).
fn next_slot(
    cron: &croner::Cron,
    tz: &chrono_tz::Tz,
    now: DateTime<Utc>,
    last: Option<DateTime<Utc>>,
) -> std::result::Result<DateTime<Utc>, croner::errors::CronError> {
    let from = match last {
        Some(l) if l > now => l,
        _ => now,
    };
    Ok(cron.find_next_occurrence(&from.with_timezone(tz), false)?.with_timezone(&Utc))
}

async fn pipeline_loop(
    p: Pipeline,
    opts: ScheduleOptions,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<PipelineState> {
    let cron = cron_of(&p)?;
    let mut state = load_state(&opts.state_dir, &p.name);
    state.name = p.name.clone();
    state.stopped = None;
    // Missed run: the last scheduled time before now was not run.
    let now = Utc::now().with_timezone(&p.timezone);
    if let Some(last) = state.last_scheduled
        && let Ok(prev) = cron.find_previous_occurrence(&now, false)
    {
        let prev = prev.with_timezone(&Utc);
        if prev > last {
            log::info!("{}: missed the run of {prev}; running it now", p.name);
            match budget_shortfall(&p).await? {
                None => run_once(&p, prev, &opts, &mut state).await?,
                Some(why) => {
                    state.stopped = Some(why);
                    save_state(&opts.state_dir, &state)?;
                    return Ok(state);
                }
            }
            save_state(&opts.state_dir, &state)?;
        }
    }
    loop {
        let next_utc = next_slot(&cron, &p.timezone, Utc::now(), state.last_scheduled).map_err(|source| {
            PipelineError::Schedule {
                pipeline: p.name.clone(),
                problem: "no next run for the schedule",
                schedule: p.schedule.clone().unwrap_or_default(),
                source,
            }
        })?;
        state.next = Some(next_utc);
        save_state(&opts.state_dir, &state)?;
        // Sleep in steps of at most a minute and look at the wall clock again:
        // a timer runs on the monotonic clock, so after the wall clock jumps
        // forward (NTP, a resumed VM) one long sleep would start the run late.
        let mut stop = false;
        while !stop && Utc::now() < next_utc {
            let wait = (next_utc - Utc::now()).to_std().unwrap_or_default().min(MAX_SLEEP);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => stop = true,
            }
        }
        if stop {
            log::info!("{}: shutting down", p.name);
            state.next = None;
            save_state(&opts.state_dir, &state)?;
            return Ok(state);
        }
        match budget_shortfall(&p).await? {
            None => {}
            Some(why) => {
                log::error!("{}: stopping: {why}", p.name);
                state.stopped = Some(why);
                state.next = None;
                save_state(&opts.state_dir, &state)?;
                return Ok(state);
            }
        }
        // The release runs to completion even if a shutdown arrives meanwhile.
        run_once(&p, next_utc, &opts, &mut state).await?;
        save_state(&opts.state_dir, &state)?;
        if *shutdown.borrow() {
            return Ok(state);
        }
    }
}

/// Runs the scheduler until SIGTERM/SIGINT or until every pipeline stops.
/// Returns the exit code: 0 after a shutdown, 3 if pipelines stopped.
pub async fn schedule(pipelines: Vec<Pipeline>, opts: ScheduleOptions) -> Result<i32> {
    use futures::StreamExt;
    // Every lock first, so a second scheduler fails before running anything.
    let _locks =
        pipelines.iter().map(|p| PipelineLock::acquire(&opts.state_dir, &p.name)).collect::<Result<Vec<_>>>()?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    // Pipelines run concurrently in this task (no thread hopping: the ledger
    // connection is not Sync); each pipeline's own loop is sequential.
    let mut tasks = futures::stream::FuturesUnordered::new();
    for p in pipelines {
        tasks.push(Box::pin(pipeline_loop(p, opts.clone(), rx.clone())));
    }
    let signals = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
    };
    tokio::pin!(signals);
    let mut stopped = false;
    let mut shut_down = false;
    loop {
        tokio::select! {
            _ = &mut signals, if !shut_down => {
                log::info!("signal received: finishing running releases, starting no new ones");
                let _ = tx.send(true);
                shut_down = true;
            }
            r = tasks.next() => match r {
                None => break,
                Some(Ok(state)) => {
                    if state.stopped.is_some() {
                        stopped = true;
                    }
                }
                Some(Err(e)) => {
                    log::error!("scheduler: {}", chain(&e));
                    stopped = true;
                }
            }
        }
    }
    Ok(if stopped && !shut_down { 3 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_the_clock_jumps_back_the_slot_already_run_is_not_picked_again() {
        use chrono::TimeZone;
        let cron = croner::Cron::from_str("0 2 * * *").unwrap();
        let tz = chrono_tz::UTC;
        let slot = Utc.with_ymd_and_hms(2026, 11, 23, 2, 0, 0).unwrap();
        let next_day = Utc.with_ymd_and_hms(2026, 11, 24, 2, 0, 0).unwrap();
        // Normal: the slot after now.
        assert_eq!(next_slot(&cron, &tz, slot - chrono::Duration::hours(1), None).unwrap(), slot);
        // The 02:00 slot ran; the clock then jumps back to 01:30: not 02:00 again.
        let back = Utc.with_ymd_and_hms(2026, 11, 23, 1, 30, 0).unwrap();
        assert_eq!(next_slot(&cron, &tz, back, Some(slot)).unwrap(), next_day);
        // Without the last slot it would have been picked again (what the rule prevents).
        assert_eq!(next_slot(&cron, &tz, back, None).unwrap(), slot);
        // A forward jump: the next slot after the new now.
        let later = Utc.with_ymd_and_hms(2026, 11, 25, 9, 0, 0).unwrap();
        assert_eq!(
            next_slot(&cron, &tz, later, Some(slot)).unwrap(),
            Utc.with_ymd_and_hms(2026, 11, 26, 2, 0, 0).unwrap()
        );
    }

    #[test]
    fn a_second_lock_fails_while_the_first_is_held_and_succeeds_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let first = PipelineLock::acquire(dir.path(), "p").unwrap();
        let path = dir.path().join("p.lock");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), std::process::id().to_string());
        let err = PipelineLock::acquire(dir.path(), "p").err().expect("the lock is held").to_string();
        assert!(err.contains("another scheduler holds the lock") && err.contains(&path.display().to_string()), "{err}");
        // A stale pid in the file decides nothing: only the lock does.
        let other = PipelineLock::acquire(dir.path(), "q").unwrap();
        drop(first);
        assert!(!path.exists(), "the lock file is removed on drop");
        std::fs::write(&path, "999999999").unwrap();
        let again = PipelineLock::acquire(dir.path(), "p").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), std::process::id().to_string());
        drop((again, other));
    }
}
