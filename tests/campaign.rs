//! Randomized release campaign with injected faults (issue #23).
//!
//! Random pipelines (steps, budgets, sources, release ids that repeat so
//! that reruns happen) run against one ledger while faults are injected:
//! SIGKILL at a random moment, the S3 server (SeaweedFS on loopback) killed
//! mid-read or mid-write, a disk that fills (the process's file-size limit,
//! so every write past it fails with EFBIG), and a corrupt ledger page (on a
//! copy of the ledger). After every run the invariants dpflow promises
//! (docs/RELIABILITY.md) are checked:
//!
//! 1. the ledger never overspends: committed + failed + reserved ≤ total;
//! 2. no published output without its committed charge: every manifest names
//!    a committed charge of its release;
//! 3. published files match their manifest's SHA-256 and size;
//! 4. reruns never double-spend: at most one charge per release id is
//!    committed or reserved;
//! 5. every charge left `reserved` can be settled by `dpflow budget resolve`
//!    (checked at the end, on every open reservation).
//!
//! `DPFLOW_CAMPAIGN_RELEASES` sets the number of runs (default 40, what CI
//! runs); `DPFLOW_CAMPAIGN_SEED` the seed; `DPFLOW_CAMPAIGN_OUT` a file for
//! the JSON summary. The committed figures come from
//! `DPFLOW_CAMPAIGN_RELEASES=1000 cargo test --test campaign -- --nocapture`.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpflow::privacy::{ChargeStatus, Ledger};
use rand::rngs::SmallRng as Prng;
use rand::{RngExt, SeedableRng};
use sha2::Digest;

mod common;
use common::Weed;

/// The dataset's total ε per campaign run: small enough that the campaign
/// exhausts it (a completed release costs about 0.55 and about a third of the runs complete), so the
/// no-overspend invariant is tested at the limit, not far from it.
const EPSILON_PER_RUN: f64 = 0.1;

#[derive(Default, Debug, serde::Serialize)]
struct Tally {
    runs: usize,
    completed: usize,
    already_complete: usize,
    failed_cleanly: usize,
    refused_for_budget: usize,
    sigkills: usize,
    s3_faults: usize,
    disk_full: usize,
    corrupt_ledger: usize,
    s3_pipelines: usize,
    manifests_checked: usize,
    files_checked: usize,
    resolved_at_end: usize,
    seconds: f64,
}

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// The data (a CSV file; the campaign also uploads it to S3).
fn world(dir: &Path) {
    common::small_table(dir, 300);
}

/// A random pipeline: 1–3 steps with random budgets, a CSV or S3 source,
/// local or S3 outputs.
fn pipeline(rng: &mut Prng, dir: &Path, ledger: &Path, s3: bool, name: &str) -> (PathBuf, bool) {
    let queries = [
        "SELECT g, dp_count(*) AS n FROM campaign GROUP BY g",
        "SELECT k, dp_sum(x, 0, 49) AS s FROM campaign GROUP BY k",
        "SELECT dp_avg(x, 0, 49) AS m, dp_count(*) AS n FROM campaign",
        "SELECT g, dp_quantile(x, 0.5, 0, 49) AS q FROM campaign GROUP BY g",
    ];
    let use_s3 = s3 && rng.random_bool(0.5);
    let source = if use_s3 && rng.random_bool(0.5) { "s3://dpflow/campaign/data.csv" } else { "data.csv" };
    let output = if use_s3 { "s3://dpflow/releases/{name}/{release_id}" } else { "out/{name}/{release_id}" };
    let mut steps = Vec::new();
    let mut total = 0.0;
    for i in 0..rng.random_range(1..=3) {
        let eps = (rng.random_range(5..=50) as f64) / 100.0;
        total += eps;
        if rng.random_bool(0.7) {
            let q = queries[rng.random_range(0..queries.len())];
            steps
                .push(format!("  - sql: {{name: s{i}, query: \"{q}\", budget: {{epsilon: {eps}}}, output: s{i}.csv}}"));
        } else {
            let mech = ["independent", "mst"][rng.random_range(0..2)];
            steps.push(format!(
                "  - synthesize: {{name: s{i}, mechanism: {mech}, budget: {{epsilon: {eps}, delta: 1.0e-6}}, iters: 30, output: s{i}.parquet, model_output: m{i}.json}}"
            ));
        }
    }
    let yaml = format!(
        "name: {name}\nledger: {}\ndataset: {{name: campaign, sources: [\"{source}\"], format: csv, domain: domain.yaml}}\nbudget: {{epsilon: {}, delta: 1.0e-6}}\noutput: \"{output}\"\nsteps:\n{}\n",
        ledger.display(),
        total + 0.01,
        steps.join("\n")
    );
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(&p, yaml).unwrap();
    (p, use_s3)
}

enum Fault {
    None,
    Kill(Duration),
    S3(Duration),
    DiskFull(u64),
    CorruptLedger,
}

/// Reads a published file (local path or s3:// URL) through dpflow's own I/O.
fn read_published(rt: &tokio::runtime::Runtime, url: &str) -> Option<Vec<u8>> {
    rt.block_on(async {
        let ctx = dpflow::io::session_context();
        dpflow::io::read_bytes(&ctx, url).await.ok()
    })
}

/// Every invariant of the module doc that can be checked after one run.
fn check_invariants(
    rt: &tokio::runtime::Runtime,
    total: f64,
    ledger: &Path,
    out_root: &Path,
    s3: bool,
    manifests: &[String],
    tally: &mut Tally,
) -> Result<(), String> {
    let l = Ledger::open(ledger).map_err(|e| format!("ledger unreadable: {e}"))?;
    let history = l.history(Some("campaign")).map_err(|e| e.to_string())?;
    let spent: f64 = history
        .iter()
        .filter(|c| matches!(c.status, ChargeStatus::Committed | ChargeStatus::Failed | ChargeStatus::Reserved))
        .map(|c| c.cost)
        .sum();
    // Costs are in the dataset budget's unit (its ε for an (ε, δ) total; the
    // ledger composes δ with it), and the total is the unit's total.
    if spent > total + 1e-9 {
        return Err(format!("overspent: {spent} > {total}"));
    }
    let status = l.status("campaign").map_err(|e| e.to_string())?;
    if status.remaining < -1e-9 || (status.spent + status.remaining - total).abs() > 1e-6 {
        return Err(format!(
            "the ledger's own position is wrong: spent {} remaining {}",
            status.spent, status.remaining
        ));
    }
    if (status.spent - spent).abs() > 1e-6 {
        return Err(format!("the ledger's spent {} is not the sum of its charges {spent}", status.spent));
    }
    let mut live: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &history {
        if matches!(c.status, ChargeStatus::Committed | ChargeStatus::Reserved) {
            *live.entry(c.release_id.as_str()).or_default() += 1;
        }
    }
    if let Some((id, n)) = live.iter().find(|(_, n)| **n > 1) {
        return Err(format!("release {id} holds {n} live charges (double spend)"));
    }
    // Local outputs: any published file (outside the staging area) belongs to
    // a release with a committed charge, manifest or not (publishing runs
    // after the commit, the manifest last).
    let committed: HashSet<&str> =
        history.iter().filter(|c| c.status == ChargeStatus::Committed).map(|c| c.release_id.as_str()).collect();
    for pipeline in std::fs::read_dir(out_root).into_iter().flatten().flatten() {
        for release in std::fs::read_dir(pipeline.path()).into_iter().flatten().flatten() {
            let id = release.file_name().to_string_lossy().to_string();
            let published =
                std::fs::read_dir(release.path()).into_iter().flatten().flatten().any(|f| f.file_name() != "_staging");
            // A staging area left by a crash is owner-only.
            for st in std::fs::read_dir(release.path().join("_staging")).into_iter().flatten().flatten() {
                use std::os::unix::fs::PermissionsExt;
                let m = st.metadata().map(|m| m.permissions().mode() & 0o777).unwrap_or(0o700);
                if m != 0o700 {
                    return Err(format!("staging area {} has mode {m:o}, not 0700", st.path().display()));
                }
            }
            if published && !committed.contains(id.as_str()) {
                return Err(format!("{} holds published files without a committed charge", release.path().display()));
            }
        }
    }
    // The same for S3 outputs: every object below releases/{pipeline}/{release}/
    // outside the staging area belongs to a committed release.
    if s3 {
        let objects = rt.block_on(async {
            use futures::TryStreamExt;
            let ctx = dpflow::io::session_context();
            let url = url::Url::parse("s3://dpflow/releases/").unwrap();
            dpflow::io::register_stores_for(&ctx, &url).unwrap();
            let store = dpflow::io::store_for(&ctx, &url).unwrap();
            let prefix = object_store::path::Path::from("releases");
            store.list(Some(&prefix)).map_ok(|m| m.location.to_string()).try_collect::<Vec<_>>().await
        });
        let objects = objects.map_err(|e| format!("listing S3 releases: {e}"))?;
        for o in objects {
            let parts: Vec<&str> = o.split('/').collect();
            if parts.len() >= 4 && parts[3] != "_staging" && !committed.contains(parts[2]) {
                return Err(format!("s3://dpflow/{o} is published without a committed charge"));
            }
        }
    }
    for m in manifests {
        let Some(bytes) = read_published(rt, m) else { continue };
        tally.manifests_checked += 1;
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("{m}: bad manifest: {e}"))?;
        let id = v["ledger_charge"].as_i64().ok_or(format!("{m}: no ledger_charge"))?;
        let c = l.charge(id).map_err(|e| format!("{m}: charge {id}: {e}"))?;
        if c.status != ChargeStatus::Committed || Some(c.release_id.as_str()) != v["release_id"].as_str() {
            return Err(format!("{m}: published with charge {id} in status {:?} of {}", c.status, c.release_id));
        }
        for o in v["outputs"].as_array().ok_or(format!("{m}: no outputs"))? {
            let url = o["url"].as_str().unwrap_or_default();
            let got = read_published(rt, url).ok_or(format!("{m}: output {url} missing"))?;
            tally.files_checked += 1;
            if hex::encode(sha2::Sha256::digest(&got)) != o["sha256"].as_str().unwrap_or_default()
                || got.len() as u64 != o["bytes"].as_u64().unwrap_or(u64::MAX)
            {
                return Err(format!("{m}: {url} does not match its SHA-256 or size"));
            }
        }
    }
    Ok(())
}

#[test]
fn randomized_releases_with_faults_keep_every_invariant() {
    let runs = env_usize("DPFLOW_CAMPAIGN_RELEASES", 40);
    let seed = env_usize("DPFLOW_CAMPAIGN_SEED", 23) as u64;
    let mut rng = Prng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    world(d);
    let ledger = d.join("ledger.sqlite");
    let total = EPSILON_PER_RUN * runs as f64;
    let init = Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .args(["budget", "--ledger", ledger.to_str().unwrap(), "init", "--dataset", "campaign", "--epsilon"])
        .arg(total.to_string())
        .args(["--delta", &format!("{}", 1e-6 * runs as f64)])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let mut weed = Weed::start();
    let s3_env = weed.as_ref().map(|w| w.env()).unwrap_or_default();
    if let Some(w) = &weed {
        let up = w
            .curl()
            .args(["-sS", "-f", "-X", "PUT", "--data-binary"])
            .arg(format!("@{}", d.join("data.csv").display()))
            .arg(format!("http://127.0.0.1:{}/dpflow/campaign/data.csv", w.s3))
            .output()
            .unwrap();
        assert!(up.status.success());
        // This process reads published S3 files through dpflow::io.
        for (k, v) in &s3_env {
            // SAFETY: set before any other thread of this test binary reads the environment.
            unsafe { std::env::set_var(k, v) };
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut tally = Tally::default();
    let mut manifests: HashSet<String> = HashSet::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut pipelines: BTreeMap<String, (PathBuf, bool)> = BTreeMap::new();
    let started = Instant::now();
    for run in 0..runs {
        let name = format!("p{}", rng.random_range(0..6));
        // Release ids are per dataset: each pipeline has its own, and they repeat (reruns).
        let release = format!("{name}-r{}", rng.random_range(0..(runs / 10).max(3)));
        // Each pipeline is drawn once: reruns of a release id are true reruns.
        let (p, uses_s3) = pipelines
            .entry(name.clone())
            .or_insert_with(|| pipeline(&mut rng, d, &ledger, weed.is_some(), &name))
            .clone();
        tally.s3_pipelines += usize::from(uses_s3);
        let fault = match rng.random_range(0..100) {
            0..=34 => Fault::None,
            35..=64 => Fault::Kill(Duration::from_millis(rng.random_range(1..120))),
            65..=84 if uses_s3 => Fault::S3(Duration::from_millis(rng.random_range(1..120))),
            // File-size limits from 1 KiB to 1 MiB (log-uniform): the ledger's WAL,
            // staged outputs or published files run out of room.
            65..=90 => Fault::DiskFull(2f64.powf(rng.random_range(10.0..20.0)) as u64),
            _ => Fault::CorruptLedger,
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dpflow"));
        cmd.current_dir(d).args(["run", p.to_str().unwrap(), "--release-id", &release]);
        cmd.envs(s3_env.iter().map(|(k, v)| (*k, v.as_str()))).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut corrupt_copy = None;
        match &fault {
            Fault::DiskFull(limit) => {
                tally.disk_full += 1;
                let limit = *limit;
                // SAFETY: only async-signal-safe calls between fork and exec.
                unsafe {
                    cmd.pre_exec(move || {
                        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                        let r = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                        if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            Fault::CorruptLedger => {
                tally.corrupt_ledger += 1;
                // A copy of the ledger with one page overwritten: the run must
                // refuse it (and publish nothing); the real ledger is untouched.
                let copy = d.join("corrupt.sqlite");
                std::fs::copy(&ledger, &copy).unwrap();
                let mut bytes = std::fs::read(&copy).unwrap();
                let pages = (bytes.len() / 4096).max(2);
                let page = rng.random_range(1..pages);
                for b in bytes.iter_mut().skip(page * 4096).take(4096) {
                    *b = rng.random();
                }
                std::fs::write(&copy, bytes).unwrap();
                let text = std::fs::read_to_string(&p)
                    .unwrap()
                    .replace(&format!("ledger: {}", ledger.display()), &format!("ledger: {}", copy.display()));
                let cp = d.join("corrupt.yaml");
                std::fs::write(&cp, text.replace(&format!("name: {name}"), "name: corrupt")).unwrap();
                cmd = Command::new(env!("CARGO_BIN_EXE_dpflow"));
                cmd.current_dir(d).args(["run", cp.to_str().unwrap(), "--release-id", &release]);
                cmd.envs(s3_env.iter().map(|(k, v)| (*k, v.as_str()))).stdout(Stdio::piped()).stderr(Stdio::piped());
                corrupt_copy = Some(copy);
            }
            _ => {}
        }
        let mut child = cmd.spawn().unwrap();
        let t0 = Instant::now();
        let mut injected = false;
        let outcome = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            match &fault {
                Fault::Kill(at) if !injected && t0.elapsed() >= *at => {
                    child.kill().unwrap();
                    injected = true;
                    tally.sigkills += 1;
                }
                Fault::S3(at) if !injected && t0.elapsed() >= *at => {
                    weed.as_mut().expect("S3 faults only with S3").stop();
                    injected = true;
                    tally.s3_faults += 1;
                }
                _ => {}
            }
            assert!(t0.elapsed() < Duration::from_secs(300), "run {run} hung");
            std::thread::sleep(Duration::from_millis(5));
        };
        if matches!(fault, Fault::S3(_)) {
            if !injected {
                tally.s3_faults += 1; // the run ended first; the outage hits the next one's start
                weed.as_mut().unwrap().stop();
            }
            weed.as_mut().unwrap().restart();
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("internal error"), "run {run}: a panic: {stderr}");
        tally.runs += 1;
        if outcome.is_some_and(|s| s.success()) {
            if stdout.contains("already complete") {
                tally.already_complete += 1;
            } else {
                tally.completed += 1;
            }
            assert!(corrupt_copy.is_none(), "run {run}: a corrupt ledger was accepted: {stdout}");
        } else if !injected || !matches!(fault, Fault::Kill(_)) {
            tally.failed_cleanly += 1;
            assert!(!stderr.trim().is_empty(), "run {run}: failed without a message");
            tally.refused_for_budget += usize::from(stderr.contains("budget exceeded"));
            let first = stderr.lines().find(|l| l.starts_with("error")).unwrap_or("").to_string();
            // Group messages by their shape (paths and numbers vary).
            let shape: String = first.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).take(90).collect();
            *reasons.entry(shape).or_default() += 1;
        }
        let base = if uses_s3 { format!("s3://dpflow/releases/{name}") } else { format!("{}/out/{name}", d.display()) };
        if corrupt_copy.is_none() {
            manifests.insert(format!("{base}/{release}/manifest.json"));
        } else {
            // Nothing may be published under the corrupt ledger's pipeline.
            let cbase = if uses_s3 {
                "s3://dpflow/releases/corrupt".to_string()
            } else {
                format!("{}/out/corrupt", d.display())
            };
            let m = format!("{cbase}/{release}/manifest.json");
            assert!(read_published(&rt, &m).is_none(), "run {run}: published with a corrupt ledger");
            assert!(
                std::fs::read_dir(d.join("out/corrupt")).map_or(true, |mut r| r.next().is_none()),
                "run {run}: files written under a corrupt ledger"
            );
        }
        let all: Vec<String> = manifests.iter().cloned().collect();
        // Only this run's manifest can have changed: check it every run, all of them every 50 runs.
        let now: Vec<String> = if run % 50 == 49 { all } else { vec![format!("{base}/{release}/manifest.json")] };
        if let Err(e) = check_invariants(&rt, total, &ledger, &d.join("out"), weed.is_some(), &now, &mut tally) {
            panic!("run {run} ({}): invariant violated: {e}\nstdout: {stdout}\nstderr: {stderr}", p.display());
        }
    }
    // Every open reservation can be settled by the operator's command.
    let l = Ledger::open(&ledger).unwrap();
    for c in l.history(Some("campaign")).unwrap().into_iter().filter(|c| c.status == ChargeStatus::Reserved) {
        let r = Command::new(env!("CARGO_BIN_EXE_dpflow"))
            .args([
                "budget",
                "--ledger",
                ledger.to_str().unwrap(),
                "resolve",
                "--charge",
                &c.id.to_string(),
                "--as",
                "failed",
            ])
            .output()
            .unwrap();
        assert!(r.status.success(), "charge {} could not be resolved: {}", c.id, String::from_utf8_lossy(&r.stderr));
        tally.resolved_at_end += 1;
    }
    let all: Vec<String> = manifests.iter().cloned().collect();
    check_invariants(&rt, total, &ledger, &d.join("out"), weed.is_some(), &all, &mut tally).unwrap();
    tally.seconds = started.elapsed().as_secs_f64();
    let summary = serde_json::to_string_pretty(&tally).unwrap();
    eprintln!("campaign (seed {seed}): {summary}");
    for (why, n) in &reasons {
        eprintln!("  {n:>5} × {why}");
    }
    if let Ok(f) = std::env::var("DPFLOW_CAMPAIGN_OUT") {
        std::fs::write(f, summary).unwrap();
    }
    assert!(tally.completed > 0, "no release ever completed");
    if runs >= 40 {
        assert!(tally.refused_for_budget > 0, "the campaign never reached the budget's limit");
    }
}

/// 8 `dpflow run` and 8 `dpflow sql` processes at once on one ledger and one
/// dataset, with random budgets, until the dataset's budget runs out: the
/// ledger never overspends, every answered query and every completed release
/// has exactly one committed charge, and nothing is left reserved.
#[test]
fn concurrent_runs_and_queries_never_overspend_one_ledger() {
    let per_process = env_usize("DPFLOW_CONCURRENCY_PER_PROCESS", 15);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    world(&d);
    let ledger = d.join("ledger.sqlite");
    let total = 70.0;
    let init = Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .args(["budget", "--ledger", ledger.to_str().unwrap(), "init", "--dataset", "campaign", "--epsilon"])
        .arg(total.to_string())
        .args(["--delta", "0.5"])
        .output()
        .unwrap();
    assert!(init.status.success());
    std::fs::write(
        d.join("catalog.yaml"),
        format!("ledger: {}\ntables:\n  campaign: {{location: data.csv, domain: domain.yaml}}\n", ledger.display()),
    )
    .unwrap();
    let mut handles = Vec::new();
    for w in 0..16u64 {
        let d = d.clone();
        let ledger = ledger.clone();
        handles.push(std::thread::spawn(move || {
            let mut rng = Prng::seed_from_u64(1000 + w);
            let mut answered = Vec::new();
            for i in 0..per_process {
                let eps = (rng.random_range(5..=60) as f64) / 100.0;
                if w < 8 {
                    let name = format!("c{w}");
                    let p = d.join(format!("{name}.yaml"));
                    std::fs::write(
                        &p,
                        format!(
                            "name: {name}\nledger: {}\ndataset: {{name: campaign, sources: [data.csv], domain: domain.yaml}}\nbudget: {{epsilon: {eps}}}\noutput: out/{{name}}/{{release_id}}\nsteps:\n  - sql: {{name: n, query: \"SELECT g, dp_count(*) AS n FROM campaign GROUP BY g\", budget: {{epsilon: {eps}}}, output: n.csv}}\n",
                            ledger.display()
                        ),
                    )
                    .unwrap();
                    let id = format!("{name}-{i}");
                    let out = Command::new(env!("CARGO_BIN_EXE_dpflow"))
                        .current_dir(&d)
                        .args(["run", p.to_str().unwrap(), "--release-id", &id])
                        .output()
                        .unwrap();
                    if out.status.success() {
                        answered.push(id);
                    } else {
                        let e = String::from_utf8_lossy(&out.stderr);
                        assert!(
                            e.contains("budget exceeded") && !e.contains("internal error") && !e.contains("after reading"),
                            "run {id} failed for another reason than the budget: {e}"
                        );
                    }
                } else {
                    let out = Command::new(env!("CARGO_BIN_EXE_dpflow"))
                        .current_dir(&d)
                        .args(["sql", "--catalog", "catalog.yaml", "-e"])
                        .arg(format!("SELECT dp_count(*, epsilon => {eps}) AS n FROM campaign"))
                        .output()
                        .unwrap();
                    if out.status.success() {
                        answered.push(format!("sql-{w}-{i}"));
                    } else {
                        let e = String::from_utf8_lossy(&out.stderr);
                        assert!(
                            e.contains("budget exceeded") && !e.contains("internal error") && !e.contains("after reading"),
                            "query failed for another reason than the budget: {e}"
                        );
                    }
                }
            }
            answered
        }));
    }
    let answered: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let l = Ledger::open(&ledger).unwrap();
    let history = l.history(Some("campaign")).unwrap();
    let committed = history.iter().filter(|c| c.status == ChargeStatus::Committed).count();
    let spent: f64 = history.iter().filter(|c| c.status != ChargeStatus::Released).map(|c| c.cost).sum();
    eprintln!(
        "concurrency: {} attempts, {} answered, {} charges committed, spent {spent:.3} of {total}",
        16 * per_process,
        answered.len(),
        committed
    );
    assert!(spent <= total + 1e-9, "overspent: {spent} > {total}");
    assert_eq!(committed, answered.len(), "every answer has exactly one committed charge");
    assert!(history.iter().all(|c| c.status != ChargeStatus::Reserved), "a reservation was left open");
    // Pipelines: one manifest per completed release, each naming its charge.
    for id in answered.iter().filter(|a| !a.starts_with("sql-")) {
        let name = id.split('-').next().unwrap();
        let m = d.join(format!("out/{name}/{id}/manifest.json"));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
        let c = l.charge(v["ledger_charge"].as_i64().unwrap()).unwrap();
        assert_eq!((c.status, c.release_id.as_str()), (ChargeStatus::Committed, id.as_str()));
    }
    assert!(total - spent < 0.6, "the budget was not exhausted: the test did not reach the limit");
}
