//! Release pipeline tests (issue #9): validation errors, crash safety under
//! SIGKILL, idempotency, the scheduler, and S3 (SeaweedFS on loopback).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpflow::privacy::{ChargeStatus, Ledger};

use crate::common;
use common::{Weed, free_port};

fn dpflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dpflow"))
}

/// Data, domain and a pipeline writing to `out`.
fn world(dir: &Path, ledger_eps: f64, schedule: Option<&str>, extra_steps: &str) -> PathBuf {
    common::small_table(dir, 400);
    let sched = schedule.map(|s| format!("schedule: \"{s}\"")).unwrap_or_default();
    let p = [
        "name: small".to_string(),
        sched,
        "ledger: ledger.sqlite".into(),
        "create_ledger_if_missing:".into(),
        format!("  small: {{epsilon: {ledger_eps}, delta: 1.0e-6}}"),
        "dataset: {name: small, sources: [data.csv], domain: domain.yaml}".into(),
        "budget: {epsilon: 0.3, delta: 1.0e-6}".into(),
        "output: out/{release_id}".into(),
        "steps:".into(),
        "  - sql: {name: counts, query: \"SELECT g, dp_count(*) AS n FROM small GROUP BY g\", budget: {epsilon: 0.1}, output: counts.csv}".into(),
        "  - synthesize: {name: syn, mechanism: mst, budget: {epsilon: 0.2, delta: 1.0e-6}, iters: 50, output: syn.parquet, model_output: model.json}".into(),
        extra_steps.to_string(),
    ]
    .join("\n");
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, p).unwrap();
    path
}

fn published_files(out: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(out) {
        for e in rd.flatten() {
            if e.file_name() != "_staging" {
                v.push(e.path());
            }
        }
    }
    v
}

#[test]
fn validation_errors_name_file_line_and_key_and_spend_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(world(dir.path(), 1.0, None, "")).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (good.replace("name: small\n", "name: small\ncolour: blue\n"), "colour"),
        (good.replace("budget: {epsilon: 0.3, delta: 1.0e-6}", "budget: {epsilon: lots}"), "budget"),
        (good.replace("domain: domain.yaml", "domain: nope.yaml"), "dataset.domain"),
        (good.replace("sources: [data.csv]", "sources: [\"ftp://x/data.csv\"]"), "dataset.sources[0]"),
        (good.replace("name: small\n", "name: small\nschedule: \"every day\"\n"), "schedule"),
        (good.replace("name: small\n", "name: small\ntimezone: Mars/Olympus\n"), "timezone"),
        (good.replace("ledger: ledger.sqlite\n", ""), "ledger"),
        (good.replace("mechanism: mst", "mechanism: magic"), "magic"),
        (good.replace("name: syn,", "name: counts,"), "duplicate step name"),
        (
            good.replace(
                "SELECT g, dp_count(*) AS n FROM small GROUP BY g",
                "SELECT g, dp_count(*, delta => 1) FROM small",
            ),
            "sql.query",
        ),
        (good.replace("budget: {epsilon: 0.2, delta: 1.0e-6}", "budget: {epsilon: 0.2}"), "synthesize.budget"),
        (good.replace("sources: [data.csv]", "sources: []"), "dataset.sources"),
        // Outputs stay below the release root whatever their names say.
        (good.replace("output: counts.csv", "output: ../../escape.csv"), "sql.output"),
        (good.replace("model_output: model.json", "model_output: /etc/model.json"), "synthesize.model_output"),
        (good.replace("output: syn.parquet", "output: \"a/./b.parquet\""), "synthesize.output"),
        (good.replace("output: counts.csv", "output: manifest.json"), "dpflow's own"),
        (good.replace("output: counts.csv", "output: _steps.json"), "dpflow's own"),
        (good.replace("model_output: model.json", "model_output: counts.csv"), "clashes"),
        (good.replace("output: syn.parquet", "output: counts.csv/syn.parquet"), "clashes"),
        (
            good.replace("budget: {epsilon: 0.3, delta: 1.0e-6}\n", "budget: {epsilon: 0.05, delta: 1.0e-6}\n"),
            "cost more than the release budget",
        ),
    ];
    assert!(cases.len() >= 10);
    for (i, (yaml, want)) in cases.into_iter().enumerate() {
        let f = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        let out = dpflow().args(["validate", f.to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} accepted");
        assert!(err.contains(&format!("bad{i}.yaml")), "case {i}: error must name the file: {err}");
        assert!(err.contains(want), "case {i}: expected {want:?} in: {err}");
        let run = dpflow().args(["run", f.to_str().unwrap()]).output().unwrap();
        assert!(!run.status.success(), "case {i}: run accepted");
    }
    assert!(!dir.path().join("ledger.sqlite").exists(), "nothing may be spent (or even created) by invalid pipelines");
    // Budget larger than the ledger's: refused before any data is read, nothing spent.
    let p = world(dir.path(), 0.2, None, "");
    let out = dpflow().args(["run", p.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("budget exceeded"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    assert!(l.history(None).unwrap().is_empty());
    assert!(published_files(&dir.path().join("out")).is_empty());
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

#[test]
fn releases_stay_below_their_root_and_private_files_are_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = world(
        dir.path(),
        10.0,
        None,
        "  - evaluate: {name: quality, synthetic: syn, workload: all-2way, private_output: private/quality.json}",
    );
    let yaml = std::fs::read_to_string(&p)
        .unwrap()
        .replace("output: out/{release_id}", "output: out/{release_id}\nstaging: stage/{release_id}");
    std::fs::write(&p, yaml).unwrap();
    let run = |id: &str| dpflow().args(["run", p.to_str().unwrap(), "--release-id", id]).output().unwrap();
    let charges = || match Ledger::open(dir.path().join("ledger.sqlite")) {
        Ok(l) => l.history(None).unwrap().len(),
        Err(_) => 0,
    };
    // Release ids are one safe path segment: refused before anything is charged.
    for bad in ["../../escape", "a/b", "..", "", "x\\y", "/abs"] {
        let out = run(bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("release id"), "{bad:?}: {err}");
    }
    assert_eq!(charges(), 0);
    assert!(!dir.path().join("escape").exists());
    // A symbolic link below the output root is never written through, and
    // refusing it charges nothing.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("out/linked")).unwrap();
    let out = run("linked");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("symbolic link"), "{err}");
    assert_eq!(charges(), 0);
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing written through the link");
    // A good release: the ledger, the staging area and the curator-only report are owner-only.
    let out = run("good");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&dir.path().join("ledger.sqlite")), 0o600);
    // Only the staging area itself is owner-only (checked while it exists by
    // tests/campaign.rs); its parents, like the published release, are not.
    assert_eq!(mode(&dir.path().join("stage")), mode(&dir.path().join("out")));
    assert_eq!(mode(&dir.path().join("out/good")), mode(&dir.path().join("out")));
    assert_eq!(mode(&dir.path().join("private/quality.json")), 0o600);
    assert!(dir.path().join("out/good/manifest.json").exists());
    assert_eq!(charges(), 1);
}

#[test]
fn sigkill_at_random_points_never_breaks_ledger_and_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let p = world(dir.path(), 100.0, None, "");
    // Reference run to learn the duration.
    let t = Instant::now();
    let ok = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "ref"]).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let full = t.elapsed().as_millis() as u64;
    let mut seed = 0x1234_5678u64;
    let mut kills_before_commit = 0;
    for i in 0..20 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = (seed >> 33) % (full + full / 5 + 1);
        let id = format!("r{i}");
        let mut child = dpflow()
            .args(["run", p.to_str().unwrap(), "--release-id", &id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let ledger = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
        let charge = ledger.charge_for_release("small", &id).unwrap();
        let out = dir.path().join("out").join(&id);
        let manifest = out.join("manifest.json");
        match charge.as_ref().map(|c| c.status) {
            Some(ChargeStatus::Committed) => {} // complete, or published partially and finishable
            other => {
                kills_before_commit += 1;
                assert!(!manifest.exists(), "{id}: a manifest without a committed charge");
                assert!(
                    published_files(&out).is_empty(),
                    "{id}: outputs published without a committed charge ({other:?})"
                );
            }
        }
        if manifest.exists() {
            assert_eq!(charge.unwrap().status, ChargeStatus::Committed);
        }
        // Rerun with the same id: completes, never spends twice.
        let again = dpflow().args(["run", p.to_str().unwrap(), "--release-id", &id]).output().unwrap();
        assert!(again.status.success(), "{id}: {}", String::from_utf8_lossy(&again.stderr));
        assert!(manifest.exists());
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        for o in m["outputs"].as_array().unwrap() {
            let path = o["url"].as_str().unwrap().trim_start_matches("file://").to_string();
            let bytes = std::fs::read(&path).unwrap_or_else(|_| panic!("{id}: missing published {path}"));
            assert_eq!(bytes.len() as u64, o["bytes"].as_u64().unwrap());
        }
        let h: Vec<_> = ledger.history(Some("small")).unwrap().into_iter().filter(|c| c.release_id == id).collect();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].status, ChargeStatus::Committed);
    }
    // Exactly one charge per release, each committed, total = 21 × cost.
    let ledger = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    let h = ledger.history(Some("small")).unwrap();
    assert_eq!(h.len(), 21);
    assert!(h.iter().all(|c| c.status == ChargeStatus::Committed));
    let s = ledger.status("small").unwrap();
    let per = h[0].cost;
    assert!((s.spent - h.iter().map(|c| c.cost).sum::<f64>()).abs() < 1e-9 && per > 0.0);
    eprintln!("{kills_before_commit}/20 kills landed before the ledger commit");
}

#[test]
fn scheduler_runs_on_time_without_overlap_and_stops_when_budget_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    // Each release costs 0.3 + the synthesizer's share; a 1.0 budget pays for 2 or 3.
    let p = world(dir.path(), 1.0, Some("* * * * * *"), "");
    let state = dir.path().join("state");
    let start = chrono::Utc::now();
    let child = dpflow()
        .args(["schedule", p.to_str().unwrap(), "--state-dir", state.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_with_timeout(child, Duration::from_secs(120));
    assert_eq!(out.0, Some(3), "the scheduler must stop with status 3 when the budget runs out: {}", out.1);
    let st = dpflow()
        .args(["schedule", p.to_str().unwrap(), "--state-dir", state.to_str().unwrap(), "--status"])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&st.stdout).contains("cannot cover"));
    // Releases: distinct seconds, each started at or after its scheduled second, never overlapping.
    let mut runs: Vec<(String, chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> = Vec::new();
    for e in std::fs::read_dir(dir.path().join("out")).unwrap().flatten() {
        let m = e.path().join("manifest.json");
        if !m.exists() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(m).unwrap()).unwrap();
        let s = chrono::DateTime::parse_from_rfc3339(v["started_at"].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc);
        let f = chrono::DateTime::parse_from_rfc3339(v["finished_at"].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc);
        runs.push((v["release_id"].as_str().unwrap().to_string(), s, f));
    }
    runs.sort_by_key(|r| r.1);
    assert!(runs.len() >= 2, "{runs:?}");
    for w in runs.windows(2) {
        assert!(w[1].1 >= w[0].2, "runs overlap: {w:?}");
    }
    for (id, s, _) in &runs {
        let ts =
            chrono::NaiveDateTime::parse_from_str(id.trim_start_matches("small-"), "%Y%m%dT%H%M%S").unwrap().and_utc();
        assert!(*s >= ts && *s - ts < chrono::Duration::seconds(5), "{id} started at {s}");
        assert!(ts >= start - chrono::Duration::seconds(1));
    }
    let ledger = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    assert!(ledger.status("small").unwrap().spent <= 1.0 + 1e-9);
    assert!(!state.join("small.lock").exists());
}

#[test]
fn scheduler_shuts_down_gracefully_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let p = world(dir.path(), 100.0, Some("*/2 * * * * *"), "");
    let state = dir.path().join("state");
    let child = dpflow()
        .args(["schedule", p.to_str().unwrap(), "--state-dir", state.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(4500));
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = wait_with_timeout(child, Duration::from_secs(60));
    assert_eq!(out.0, Some(0), "graceful shutdown exits 0");
    assert!(!state.join("small.lock").exists(), "no lock left behind");
    // Every started release completed (manifest) — none half-done.
    let ledger = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    for c in ledger.history(Some("small")).unwrap() {
        assert_eq!(c.status, ChargeStatus::Committed, "{}", c.release_id);
    }
}

/// The scheduler's claim is an OS file lock (flock), not a pid file: a second
/// scheduler process is refused while the first lives, and a scheduler killed
/// with SIGKILL (which leaves its lock file and pid behind) blocks nobody.
#[test]
fn two_scheduler_processes_never_run_one_pipeline_and_a_killed_one_blocks_nobody() {
    let dir = tempfile::tempdir().unwrap();
    // Once a year: the schedulers only wait.
    let p = world(dir.path(), 100.0, Some("0 0 3 1 1 *"), "");
    let state = dir.path().join("state");
    let start = || {
        dpflow()
            .args(["schedule", p.to_str().unwrap(), "--state-dir", state.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let lock = state.join("small.lock");
    let wait_for_lock = || {
        let t = Instant::now();
        while !lock.exists() {
            assert!(t.elapsed() < Duration::from_secs(60), "the scheduler never took its lock");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut first = start();
    wait_for_lock();
    let (code, err) = wait_with_timeout(start(), Duration::from_secs(60));
    assert_ne!(code, Some(0));
    assert!(err.contains("another scheduler holds the lock"), "{err}");
    // SIGKILL: no cleanup runs, the lock file and its pid stay behind.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(lock.exists(), "SIGKILL leaves the lock file");
    let mut third = start();
    // It takes the lock: its own pid replaces the stale one in the file.
    let t = Instant::now();
    while std::fs::read_to_string(&lock).unwrap_or_default().trim() != third.id().to_string() {
        assert!(third.try_wait().unwrap().is_none(), "a stale lock file blocked a new scheduler");
        assert!(t.elapsed() < Duration::from_secs(60), "the new scheduler never took the lock");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(third.id() as i32, libc::SIGTERM) };
    assert_eq!(wait_with_timeout(third, Duration::from_secs(60)).0, Some(0));
}

fn wait_with_timeout(mut child: std::process::Child, t: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return (s.code(), err);
        }
        if start.elapsed() > t {
            let _ = child.kill();
            panic!("timed out");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn releases_read_partitioned_parquet_from_s3_and_write_to_s3() {
    const SECRET: &str = "dpflow-planted-secret-7f3a9c1e";
    let Some(weed) = Weed::start_with_secret(SECRET) else { return };
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", weed.s3)),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "dpflow".into()),
        // A planted secret: credentials come from the standard AWS variables
        // only, and must appear in no output, log or published file, even at
        // the most verbose log level.
        ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
        ("AWS_REGION", "us-east-1".into()),
        ("RUST_LOG", "trace".into()),
    ];
    let run_with = |args: &[&str], env: &[(&str, String)]| {
        let mut c = dpflow();
        c.args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "{args:?} printed the secret key");
        (out.status.success(), stdout.to_string(), stderr.to_string())
    };
    let cmd = |args: &[&str]| {
        let (ok, stdout, stderr) = run_with(args, &env);
        assert!(ok, "{args:?}: {stderr}");
        stdout
    };
    // Benchmark data from the bench crate's generator, written locally and
    // uploaded with a plain S3 PUT (dpflow itself only reads it from S3).
    let dom = dir.path().join("bench.yaml");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for part in 0..3u64 {
        let local = dir.path().join(format!("part-{part}.parquet"));
        rt.block_on(dpflow_bench::bench_data::write_bench_data(
            5000,
            local.to_str().unwrap(),
            part,
            Some(dom.to_str().unwrap()),
            1 << 16,
        ))
        .unwrap();
        let put = weed
            .curl()
            // Retried: a freshly started SeaweedFS may still be growing volumes.
            .args([
                "-sS",
                "-f",
                "--retry",
                "5",
                "--retry-all-errors",
                "--retry-delay",
                "1",
                "-X",
                "PUT",
                "--data-binary",
            ])
            .arg(format!("@{}", local.display()))
            .arg(format!("http://127.0.0.1:{}/dpflow/census/part-{part}.parquet", weed.s3))
            .output()
            .unwrap();
        assert!(put.status.success(), "upload part {part}: {}", String::from_utf8_lossy(&put.stderr));
    }
    let inspect = cmd(&["inspect", "s3://dpflow/census/", "--domain", dom.to_str().unwrap(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(v["rows"], 15000);
    let p = dir.path().join("s3.yaml");
    let yaml = [
        "name: census",
        "ledger: ledger.sqlite",
        "create_ledger_if_missing:",
        "  census: {epsilon: 10, delta: 1.0e-6}",
        "dataset: {name: census, sources: [\"s3://dpflow/census/\"], format: parquet, domain: bench.yaml}",
        "budget: {epsilon: 1.0, delta: 1.0e-6}",
        "output: \"s3://dpflow/releases/{date}\"",
        "steps:",
        "  - sql: {name: by_sex, query: \"SELECT sex, dp_count(*) AS n FROM census GROUP BY sex\", budget: {epsilon: 0.2}, output: by_sex.csv}",
        "  - synthesize: {name: syn, mechanism: independent, budget: {epsilon: 0.5, delta: 1.0e-6}, output: syn.parquet}",
    ]
    .join("\n");
    std::fs::write(&p, yaml).unwrap();
    let out = cmd(&["run", p.to_str().unwrap(), "--release-id", "s3-test"]);
    assert!(out.contains("release complete: s3://dpflow/releases/"), "{out}");
    // Read the published synthetic data back from S3.
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let back = cmd(&[
        "inspect",
        &format!("s3://dpflow/releases/{date}/syn.parquet"),
        "--domain",
        dom.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&back).unwrap();
    assert!(v["rows"].as_u64().unwrap() > 10000);
    // Rerun: already complete (idempotent), nothing spent.
    let again = cmd(&["run", p.to_str().unwrap(), "--release-id", "s3-test"]);
    assert!(again.contains("already complete"), "{again}");
    let l = Ledger::open(dir.path().join("ledger.sqlite")).unwrap();
    assert_eq!(l.history(None).unwrap().len(), 1);
    // Nothing written holds the secret: the ledger and the published files.
    let manifest = weed
        .curl()
        .args(["-sS", "-f", &format!("http://127.0.0.1:{}/dpflow/releases/{date}/manifest.json", weed.s3)])
        .output()
        .unwrap();
    assert!(manifest.status.success());
    let manifest = String::from_utf8_lossy(&manifest.stdout).to_string();
    assert!(manifest.contains("ledger_charge"), "{manifest}");
    assert!(!manifest.contains(SECRET));
    assert!(
        !std::fs::read(dir.path().join("ledger.sqlite")).unwrap().windows(SECRET.len()).any(|w| w == SECRET.as_bytes())
    );
    // A failure prints no secret either: a server that refuses connections.
    let mut down = env.clone();
    down[0].1 = format!("http://127.0.0.1:{}", free_port());
    let (ok, _, stderr) = run_with(&["run", p.to_str().unwrap(), "--release-id", "s3-down"], &down);
    assert!(!ok && !stderr.is_empty());
}

#[test]
fn impute_step_releases_statistics_of_imputed_data_charged_to_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // x is missing for every 5th row; donors match on g and k.
    let mut s = String::from("g,k,x\n");
    for i in 0..400 {
        let x = if i % 5 == 0 { String::new() } else { ((i * 7) % 50).to_string() };
        s += &format!("{},{},{x}\n", ["a", "b", "c"][i % 3], i % 5);
    }
    std::fs::write(d.join("data.csv"), s).unwrap();
    std::fs::write(
        d.join("domain.yaml"),
        "columns:\n  - {name: g, kind: categorical, values: [a, b, c]}\n  - {name: k, kind: integer, bounds: [0, 4]}\n  - {name: x, kind: integer, bounds: [0, 49], nullable: true}\n",
    )
    .unwrap();
    let spec = |input: &str| {
        format!(
            "input: {input}\ndomain: domain.yaml\nimpute: [x]\nmatch:\n  - {{column: g}}\n  - {{column: k, kind: ordinal}}\nmetric: euclidean\nbudget: {{epsilon: 5.0}}\nqueries:\n  - name: mean_x\n    mean: {{value: x, lo: 0, hi: 49}}\n"
        )
    };
    std::fs::write(d.join("impute.yaml"), spec("data.csv")).unwrap();
    std::fs::write(d.join("other.csv"), "g,k,x\na,0,1\n").unwrap();
    std::fs::write(d.join("impute-other.yaml"), spec("other.csv")).unwrap();
    let pipeline = |spec_file: &str| {
        format!(
            "name: imp\nledger: ledger.sqlite\ncreate_ledger_if_missing:\n  small: {{epsilon: 10.0}}\ndataset: {{name: small, sources: [data.csv], domain: domain.yaml}}\nbudget: {{epsilon: 3.0}}\noutput: out/{{release_id}}\nsteps:\n  - impute: {{name: imputed, spec: {spec_file}, budget: {{epsilon: 1.0}}, output: imputed.csv}}\n"
        )
    };
    // A spec reading another file would charge the wrong dataset: refused at validation.
    std::fs::write(d.join("bad.yaml"), pipeline("impute-other.yaml")).unwrap();
    let out = dpflow().args(["validate", d.join("bad.yaml").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("impute.spec") && err.contains("not one of"), "{err}");
    // The good one: two released numbers (count, mean) at ε = 1 each (the step's override).
    let p = d.join("good.yaml");
    std::fs::write(&p, pipeline("impute.yaml")).unwrap();
    // (No --unsafe-seed: a pipeline charges its ledger, and seeded noise may not be charged.)
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = std::fs::read_to_string(d.join("out/r1/imputed.csv")).unwrap();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[0], "mean_x");
    // Unseeded noise: the mean is NULL when the noisy count is below 1, else clamped to its bounds.
    if !row[1].is_empty() {
        let mean: f64 = row[1].parse().unwrap();
        assert!((0.0..=49.0).contains(&mean), "the mean is clamped to its bounds: {mean}");
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("out/r1/manifest.json")).unwrap()).unwrap();
    let step = &manifest["steps"][0];
    assert_eq!(step["kind"], "impute");
    assert_eq!(step["mechanisms"].as_array().unwrap().len(), 2);
    let l = Ledger::open(d.join("ledger.sqlite")).unwrap();
    let h = l.history(None).unwrap();
    assert_eq!(h.len(), 1);
}

/// libfaketime, which moves the wall clock of a process it is preloaded
/// into (Debian's `libfaketime`); `None` when it is not installed (a panic
/// when DPFLOW_REQUIRE_FAKETIME is set, as in CI).
fn libfaketime() -> Option<PathBuf> {
    let found =
        ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("DPFLOW_REQUIRE_FAKETIME").is_none(),
            "DPFLOW_REQUIRE_FAKETIME is set but libfaketime is not installed (apt-get install faketime)"
        );
        eprintln!("libfaketime is not installed (apt-get install faketime): clock-jump test not run");
    }
    found
}

/// The wall clock of a running scheduler jumps back 10 s (during a release),
/// then forward an hour (an NTP step, a resumed VM), through libfaketime's
/// offset file; the monotonic clock is left alone, as it is on a real machine. The
/// scheduler must never start a slot twice or out of order (after the jump
/// back, the slots it already ran are in the future again), must not burst
/// through the hour of slots it "missed" after the jump forward, and must
/// follow the new clock; every release is committed once and the ledger
/// holds exactly the releases the scheduler started.
#[test]
fn scheduler_never_reruns_or_bursts_when_the_wall_clock_jumps() {
    let Some(faketime) = libfaketime() else { return };
    let dir = tempfile::tempdir().unwrap();
    // SQL only, every two seconds: fast releases, plenty of budget.
    let p = world(dir.path(), 100.0, Some("*/2 * * * * *"), "");
    let yaml: String = std::fs::read_to_string(&p)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("synthesize"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&p, yaml.replace("budget: {epsilon: 0.3, delta: 1.0e-6}", "budget: {epsilon: 0.1}")).unwrap();
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let state = dir.path().join("state");
    let log = dir.path().join("scheduler.log");
    let mut child = dpflow()
        .args(["schedule", p.to_str().unwrap(), "--state-dir", state.to_str().unwrap()])
        .env("LD_PRELOAD", &faketime)
        .env("FAKETIME_TIMESTAMP_FILE", &offset)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ledger_path = dir.path().join("ledger.sqlite");
    let committed = || -> Vec<String> {
        let Ok(l) = Ledger::open(&ledger_path) else { return vec![] };
        l.history(Some("small")).unwrap().into_iter().map(|c| c.release_id).collect()
    };
    let wait_for = |n: usize| {
        let t = Instant::now();
        while committed().len() < n {
            assert!(t.elapsed() < Duration::from_secs(90), "fewer than {n} releases: {:?}", committed());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for(2);
    // Back 10 s while a release runs: when it ends, the slots just run are in
    // the future again (a jump during the sleep is absorbed by the wait for
    // the slot already chosen).
    let starts = || std::fs::read_to_string(&log).unwrap_or_default().matches("starting release ").count();
    let (n, t) = (starts(), Instant::now());
    while starts() == n {
        assert!(t.elapsed() < Duration::from_secs(30), "no release started");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&offset, "-10\n").unwrap();
    let before_back = committed().len();
    std::thread::sleep(Duration::from_secs(5));
    let after_back = committed().len();
    assert!(after_back <= before_back + 1, "releases ran while the clock replayed their slots: {:?}", committed());
    // Forward an hour: about 1,800 slots are skipped, not run.
    std::fs::write(&offset, "+3600\n").unwrap();
    let jumped = chrono::Utc::now() + chrono::Duration::seconds(3600);
    let t = Instant::now();
    wait_for(after_back + 2);
    std::thread::sleep(Duration::from_secs(4));
    let real = t.elapsed().as_secs_f64();
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(60), "the scheduler did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let ids = committed();
    let after_forward = ids.len() - after_back;
    assert!(
        (after_forward as f64) <= real / 2.0 + 3.0,
        "{after_forward} releases in {real:.1} s after the jump forward: a burst of missed slots"
    );
    // Slot times in ledger order: strictly increasing (no slot twice, none out
    // of order), and the last ones on the new clock.
    let slot = |id: &str| {
        chrono::NaiveDateTime::parse_from_str(id.trim_start_matches("small-"), "%Y%m%dT%H%M%S").unwrap().and_utc()
    };
    let slots: Vec<_> = ids.iter().map(|id| slot(id)).collect();
    assert!(slots.windows(2).all(|w| w[0] < w[1]), "slots out of order or repeated: {ids:?}");
    assert!(
        *slots.last().unwrap() >= jumped - chrono::Duration::seconds(2),
        "the scheduler did not follow the clock: {ids:?}"
    );
    let ledger = Ledger::open(&ledger_path).unwrap();
    assert!(ledger.history(Some("small")).unwrap().iter().all(|c| c.status == ChargeStatus::Committed));
    // The scheduler started each slot once, and only the ones in the ledger.
    let text = std::fs::read_to_string(&log).unwrap();
    let mut started: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("starting release ").nth(1))
        .filter_map(|r| r.split_whitespace().next())
        .collect();
    let n = started.len();
    started.sort_unstable();
    started.dedup();
    assert_eq!(started.len(), n, "a slot was started twice:\n{text}");
    assert_eq!(n, ids.len(), "started releases and ledger charges differ:\n{text}");
}

/// A napsu-mq step whose inference fails after the measurement (here:
/// 5 sets asked of 1 chain × 4 NUTS draws, no longer chains, unconverged
/// draws accepted, so the failure is certain): the pipeline's charge is spent and recorded as
/// failed, nothing is published, and — post-processing of DP output — the
/// message says what failed and where the saved noisy statistics are, and
/// they re-run for free with `dpflow synth --from-record`.
#[test]
fn a_napsu_inference_failure_keeps_the_noisy_statistics_and_spends_the_charge() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        2.0,
        None,
        "  - synthesize: {name: na, mechanism: napsu-mq, queries: \"g,k; k,x\", multiple: 5, inference: nuts, \
         nuts_chains: 1, nuts_warmup: 10, nuts_draws: 4, nuts_max_draws: 4, allow_unconverged: true, \
         budget: {epsilon: 0.05, delta: 1.0e-6}, output: na.parquet}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 0.5,");
    std::fs::write(&p, &text).unwrap();
    // The NUTS keys are checked before anything is charged.
    let bad = text.replace("nuts_draws: 4", "nuts_draws: 2");
    std::fs::write(d.join("bad.yaml"), bad).unwrap();
    let out = dpflow().args(["validate", d.join("bad.yaml").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nuts_draws") && err.contains("four draws"), "{err}");
    // So are their upper bounds: a thread per chain and the draws' memory.
    for (from, to, says) in [
        ("nuts_chains: 1", "nuts_chains: 1000", "between 1 and 64"),
        ("nuts_max_draws: 4", "nuts_max_draws: 900000000", "GiB"),
        ("nuts_max_draws: 4", "nuts_max_draws: 3", "at least the draws per chain"),
    ] {
        std::fs::write(d.join("bad.yaml"), text.replace(from, to)).unwrap();
        let out = dpflow().args(["validate", d.join("bad.yaml").to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{to}: {err}");
    }

    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("step na: napsu-mq inference failed") && err.contains("NUTS kept 4"), "{err}");
    let kept = d.join("out/r1/_staging/r1.failed-1/na.parquet.napsu.json");
    assert!(err.contains(kept.to_str().unwrap()), "{err}");
    assert!(published_files(&d.join("out/r1")).is_empty(), "nothing is published");
    let kept_dir: Vec<_> =
        std::fs::read_dir(kept.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(kept_dir, vec![std::ffi::OsString::from("na.parquet.napsu.json")], "only the statistics are kept");
    assert_eq!(mode(kept.parent().unwrap()) & 0o777, 0o700, "curator-only");
    assert!(!d.join("out/r1/_staging/r1").exists(), "staging is cleared");
    let l = Ledger::open(d.join("ledger.sqlite")).unwrap();
    let h = l.history(None).unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].status, ChargeStatus::Failed, "the charge is spent, not refunded");
    // The statistics re-run for free.
    let syn = d.join("free.parquet");
    let out = dpflow()
        .args(["synth", "--from-record", kept.to_str().unwrap(), "--out", syn.to_str().unwrap(), "--multiple", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(syn.exists());
    let h = Ledger::open(d.join("ledger.sqlite")).unwrap().history(None).unwrap();
    assert_eq!(h.len(), 1, "no new charge: {h:?}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    assert_eq!(record["ledger_charge"], 1, "the kept record names the charge that paid for it");
    // Release ids cannot name a kept directory (a run would clear it as its staging).
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1.failed-1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(".failed-"), "{err}");
    assert!(kept.exists());
}

/// A pipeline killed after its napsu-mq step saved the noisy statistics is
/// not resumed (that would measure again under the same reservation): the
/// rerun settles the charge as failed and keeps the statistics instead, in
/// a directory of its own when the usual one is taken.
#[test]
fn a_release_interrupted_after_napsu_measured_is_settled_not_measured_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        2.0,
        None,
        "  - synthesize: {name: na, mechanism: napsu-mq, queries: \"g,k; k,x\", inference: nuts, \
         nuts_chains: 1, nuts_warmup: 5000000, nuts_draws: 4, budget: {epsilon: 0.05, delta: 1.0e-6}, \
         output: na.parquet}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 0.5,");
    std::fs::write(&p, &text).unwrap();
    let kill_after_measuring = |release: &str| {
        let mut child = dpflow()
            .args(["run", p.to_str().unwrap(), "--release-id", release])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let staged = d.join(format!("out/{release}/_staging/{release}/na.parquet.napsu.json"));
        let t = std::time::Instant::now();
        while !staged.exists() && t.elapsed() < std::time::Duration::from_secs(120) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // The statistics are saved; the sampler's five million warm-up steps are still running.
        std::thread::sleep(std::time::Duration::from_millis(300));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(staged.exists(), "the statistics were saved before the kill");
    };
    kill_after_measuring("r1");
    let h = Ledger::open(d.join("ledger.sqlite")).unwrap().history(None).unwrap();
    assert_eq!((h.len(), h[0].status), (1, ChargeStatus::Reserved));
    // The usual kept directory is taken by something else.
    std::fs::create_dir_all(d.join("out/r1/_staging/r1.failed-1")).unwrap();
    std::fs::write(d.join("out/r1/_staging/r1.failed-1/other"), "x").unwrap();

    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("interrupted before it finished"), "{err}");
    let kept = d.join("out/r1/_staging/r1.failed-1-2/na.parquet.napsu.json");
    assert!(err.contains(kept.to_str().unwrap()), "{err}");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    assert_eq!(record["ledger_charge"], 1);
    assert_eq!(std::fs::read_to_string(d.join("out/r1/_staging/r1.failed-1/other")).unwrap(), "x");
    assert!(!d.join("out/r1/_staging/r1").exists(), "staging is cleared");
    assert!(published_files(&d.join("out/r1")).is_empty(), "nothing is published");
    let h = Ledger::open(d.join("ledger.sqlite")).unwrap().history(None).unwrap();
    assert_eq!(h.len(), 1, "not measured again: {h:?}");
    assert_eq!(h[0].status, ChargeStatus::Failed, "the charge is spent, not refunded");

    // The decision does not rest on staging: with the staged statistics gone
    // (moved staging, a cleaned bucket), the open reservation is still settled.
    kill_after_measuring("r2");
    std::fs::remove_dir_all(d.join("out/r2/_staging/r2")).unwrap();
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r2"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no napsu-mq statistics were found"), "{err}");
    let h = Ledger::open(d.join("ledger.sqlite")).unwrap().history(None).unwrap();
    assert_eq!(h.len(), 2, "not measured again: {h:?}");
    assert!(h.iter().all(|c| c.status == ChargeStatus::Failed), "{h:?}");
}

/// The analyze step combines a napsu-mq step's sets with the rule and the
/// standard-error filter it names (post-processing: no charge of its own),
/// and refuses bad settings before anything is charged.
#[test]
fn an_analyze_step_takes_a_rule_and_a_standard_error_filter() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: na, mechanism: napsu-mq, queries: \"g,k; k,x\", multiple: 4, \
         budget: {epsilon: 1.0, delta: 1.0e-6}, output: na.parquet}\n  - analyze: {name: m, synthetic: na, \
         analyses: [{estimator: mean, column: k}], rule: dips, max_std_error: 1000, output: m.csv}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 1.5,");
    std::fs::write(&p, &text).unwrap();
    for (from, to, says) in [
        ("rule: dips", "rule: rubin", "fully-synthetic, dips or single"),
        ("max_std_error: 1000", "max_std_error: -1", "positive number"),
        // The rule against the step's number of sets, before any charge.
        ("rule: dips", "rule: single", "takes one set but step \"na\" writes 4"),
        ("multiple: 4", "multiple: 1", "combines at least 2 sets"),
        // Formulas and columns, before the synthesis they analyse is charged.
        ("column: k}", "column: kk}", "`kk` is not a column"),
        ("estimator: mean, column: k}", "estimator: ols, formula: \"x ~ ~ g\"}", "more than one `~`"),
        ("estimator: mean, column: k}", "estimator: logistic, column: k}", "does not take `column`"),
    ] {
        std::fs::write(d.join("bad.yaml"), text.replace(from, to)).unwrap();
        let out = dpflow().args(["validate", d.join("bad.yaml").to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{to}: {err}");
    }
    // A relation the queries do not hold is a warning, not an error: g and x
    // each meet k, never each other.
    let out = dpflow().args(["validate", p.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("WARNING"));
    std::fs::write(
        d.join("warn.yaml"),
        text.replace("estimator: mean, column: k}", "estimator: ols, formula: \"x ~ g + k\"}"),
    )
    .unwrap();
    let out = dpflow().args(["validate", d.join("warn.yaml").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no query of napsu-mq step \"na\" holds `g` with `x`") && err.contains("Add `g,x`"), "{err}");
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = std::fs::read_to_string(d.join("out/r1/m.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let col = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    assert_eq!((col("rule"), col("m")), ("dips", "4"), "{csv}");
    let est: f64 = col("estimate").parse().unwrap();
    assert!((0.0..=4.0).contains(&est), "{csv}");
    // A cap below every standard error leaves every set out: no estimate.
    std::fs::write(&p, text.replace("max_std_error: 1000", "max_std_error: 1.0e-12")).unwrap();
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r2"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let csv = std::fs::read_to_string(d.join("out/r2/m.csv")).unwrap_or_default();
    assert!(!out.status.success() || !csv.contains(",4,dips"), "{err}\n{csv}");
}

/// `dpflow validate` refuses each edit (from → to) of a pipeline `text`
/// with a message naming `says`.
fn refused_at_load(d: &std::path::Path, text: &str, edits: &[(&str, &str, &str)]) {
    for (from, to, says) in edits {
        std::fs::write(d.join("bad.yaml"), text.replace(from, to)).unwrap();
        let out = dpflow().args(["validate", d.join("bad.yaml").to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{to}: {err}");
    }
}

/// A 002 synthesizer's step is charged its pure ε. With the pipeline's
/// other steps (0.1 + 0.2), a step of (ε = 1.3, δ = 10⁻⁶) does not fit in a
/// budget of 1.5; before the fix the plan recorded the ρ that (1.3, 10⁻⁶)
/// allows a zCDP mechanism, far less, and accepted it (seen failing). Its
/// public inputs are checked at load: a sampling mechanism needs rows, and
/// there is no model to write.
#[test]
fn a_dips_step_is_charged_its_pure_epsilon_and_checked_before_the_charge() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: dips, mechanism: modips, multiple: 3, rows: 200, \
         budget: {epsilon: 1.3, delta: 1.0e-6}, output: dips.parquet}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 1.5,");
    std::fs::write(&p, &text).unwrap();
    let out = dpflow().args(["validate", p.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("budget"), "a pure ε = 1.3 step fit in the 1.5 budget: {err}");
    let text = text.replace("budget: {epsilon: 1.3,", "budget: {epsilon: 1.0,");
    std::fs::write(&p, &text).unwrap();
    refused_at_load(
        d,
        &text,
        &[
            ("mechanism: modips, multiple: 3, rows: 200,", "mechanism: binomial-beta, multiple: 3,", "rows"),
            ("output: dips.parquet}", "output: dips.parquet, model_output: m.json}", "model"),
        ],
    );
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(d.join("out/r1/dips.parquet").exists());
}

/// A sequential-regression step (002 §3.2.3) runs end to end in a
/// pipeline; its public inputs (rows, no model file) are checked at load.
#[test]
fn a_sequential_regression_step_runs_and_is_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: seq, mechanism: sequential-regression, multiple: 2, rows: 150, \
         budget: {epsilon: 1.0}, output: seq.parquet}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 1.5,");
    std::fs::write(&p, &text).unwrap();
    refused_at_load(
        d,
        &text,
        &[
            ("multiple: 2, rows: 150,", "multiple: 2,", "rows"),
            ("output: seq.parquet}", "output: seq.parquet, model_output: m.json}", "model"),
            ("rows: 150,", "rows: 150, dips_ridge: 1.0e13,", "ridge"),
            ("rows: 150,", "rows: 150, dips_numeric: linear, missing: adaptive,", "complete-row"),
        ],
    );
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(d.join("out/r1/seq.parquet").exists());
    // Over rows, k and x are linear regressions on their raw values: integers in their bounds.
    let linear = text.replace("rows: 150,", "rows: 150, dips_numeric: linear,").replace("seq.parquet", "seq.csv");
    std::fs::write(&p, linear).unwrap();
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r2"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = std::fs::read_to_string(d.join("out/r2/seq.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 300);
    for r in &rows {
        let (k, x): (i64, i64) = (r[1].parse().unwrap(), r[2].parse().unwrap());
        assert!((0..=4).contains(&k) && (0..=49).contains(&x), "{r:?}");
    }
}

/// A modips-glom step (002 §4.3.1: k and x bivariate normal within the
/// cells of g) runs end to end on the raw values with its `dips_prior`;
/// its public inputs are checked at load, and the 002 settings are
/// refused on a mechanism that does not take them.
#[test]
fn a_modips_glom_step_runs_on_raw_values_and_is_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: glom, mechanism: modips-glom, multiple: 2, rows: 150, dips_prior: 0.5, \
         budget: {epsilon: 1.0}, output: glom.csv}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 1.5,");
    std::fs::write(&p, &text).unwrap();
    refused_at_load(
        d,
        &text,
        &[
            ("multiple: 2, rows: 150,", "multiple: 2,", "rows"),
            ("output: glom.csv}", "output: glom.csv, model_output: m.json}", "model"),
            ("dips_prior: 0.5", "dips_prior: 0", "prior"),
            ("dips_prior: 0.5", "dips_ridge: 2", "does not take dips_ridge"),
            ("dips_prior: 0.5", "dips_prior: 0.5, missing: adaptive", "complete-row"),
            (
                "modips-glom, multiple: 2, rows: 150, dips_prior: 0.5",
                "modips-normal, multiple: 2, rows: 150",
                "one numeric",
            ),
            ("mechanism: mst,", "mechanism: mst, dips_prior: 0.5,", "does not take dips_prior"),
            ("dips_prior: 0.5", "dips_prior: 0.5, midpoints: true", "midpoints"),
        ],
    );
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = std::fs::read_to_string(d.join("out/r1/glom.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("g,k,x,_set"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 300);
    for r in &rows {
        assert!(["a", "b", "c"].contains(&r[0]), "{r:?}");
        let (k, x): (i64, i64) = (r[1].parse().unwrap(), r[2].parse().unwrap());
        assert!((0..=4).contains(&k) && (0..=49).contains(&x), "{r:?}");
    }
}

/// A dataset's declared MCAR missingness reaches the synthesize steps: a
/// complete-row MST step's manifest entry reports the ground-truth ε̄
/// (000 §5.2: below the nominal ε), a reproduce step says why it has none.
/// The synthesizers' other settings are pipeline keys, checked at load:
/// rates that name no column, a setting the mechanism does not take, and a
/// value out of its range are refused before anything runs.
#[test]
fn declared_missingness_reaches_the_manifest_and_synth_settings_are_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: cr, mechanism: mst, missing: complete-row, midpoints: true, \
         budget: {epsilon: 0.5, delta: 1.0e-6}, output: cr.parquet}\n  - synthesize: {name: pb, mechanism: privbayes, \
         degree: 1, budget: {epsilon: 0.3}, output: pb.parquet}",
    );
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("budget: {epsilon: 0.3, delta: 1.0e-6}\n", "budget: {epsilon: 1.5, delta: 1.0e-6}\n")
        .replace(
            "domain: domain.yaml}",
            "domain: domain.yaml, missingness: {mechanism: mcar, rates: {g: 0.2, k: 0.1, x: 0.3}}}",
        );
    std::fs::write(&p, &text).unwrap();
    refused_at_load(
        d,
        &text,
        &[
            ("rates: {g: 0.2, k: 0.1, x: 0.3}", "rates: {g: 0.2, colour: 0.1}", "colour"),
            ("mechanism: mcar, rates: {g: 0.2, k: 0.1, x: 0.3}", "mechanism: mcar", "rates"),
            ("degree: 1,", "degree: 0,", "--degree"),
            (
                "mechanism: mst, missing: complete-row,",
                "mechanism: mst, missing: complete-row, rounds: 3,",
                "does not take rounds",
            ),
            ("mechanism: mst, missing: complete-row,", "mechanism: mst, impute_share: 0.3,", "impute_share"),
            ("mechanism: mst, missing: complete-row,", "mechanism: aim, confidence: 1.5,", "--confidence"),
        ],
    );
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/r1/manifest.json")).unwrap()).unwrap();
    let step = |name: &str| manifest["steps"].as_array().unwrap().iter().find(|s| s["step"] == name).unwrap().clone();
    let cr = step("cr");
    let amp = &cr["amplification"];
    let (eps, nominal) = (amp["epsilon"].as_f64().unwrap(), amp["nominal_epsilon"].as_f64().unwrap());
    assert!(eps < nominal && eps > 0.0, "{amp}");
    assert_eq!(amp["rates"]["x"], 0.3);
    assert!(cr["amplification_scope"].as_str().unwrap().contains("do not add up"), "{cr}");
    assert!(step("pb")["amplification_note"].as_str().unwrap().contains("null"), "{}", step("pb"));
}

/// A DP-MisGAN step (issue 18) runs in a pipeline, is charged its (ε, δ)
/// as such, and a ρ budget or a contradicting strategy is refused at load.
#[test]
fn a_dp_misgan_step_runs_and_is_charged_its_epsilon_delta() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: gan, mechanism: dp-misgan, rows: 50, \
         budget: {epsilon: 1.0, delta: 1.0e-7}, output: gan.parquet}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 1.5,");
    std::fs::write(&p, &text).unwrap();
    refused_at_load(
        d,
        &text,
        &[
            ("budget: {epsilon: 1.0, delta: 1.0e-7}, output: gan", "budget: {rho: 0.1}, output: gan", "(ε, δ) budget"),
            ("rows: 50,", "rows: 50, missing: complete-row,", "fixes its own missing-data strategy"),
        ],
    );
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(d.join("out/r1/gan.parquet").exists());
    let ledger = Ledger::open(d.join("ledger.sqlite")).unwrap();
    let charge = ledger.charge_for_release("small", "r1").unwrap().expect("the release is charged");
    let gan: Vec<_> = charge.mechanisms.iter().filter(|m| m.target.contains("(gan)")).collect();
    assert_eq!(gan.len(), 1, "{:?}", charge.mechanisms);
    assert_eq!(gan[0].mechanism, "dp-misgan");
    assert_eq!(gan[0].loss, dpflow::privacy::PrivacyLoss::Approx { epsilon: 1.0, delta: 1.0e-7 });
}

/// A KaminoI step (issue 18) runs end to end in a pipeline and is charged its
/// (ε, δ); a ρ budget, a model file and a contradicting missing-data strategy
/// are refused at load, before anything is charged.
#[test]
fn a_kaminoi_step_runs_and_is_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = world(
        d,
        5.0,
        None,
        "  - synthesize: {name: kam, mechanism: kaminoi, rows: 120, \
         budget: {epsilon: 1.0, delta: 1.0e-7}, output: kam.parquet}",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("budget: {epsilon: 0.3,", "budget: {epsilon: 1.5,");
    std::fs::write(&p, &text).unwrap();
    refused_at_load(
        d,
        &text,
        &[
            ("budget: {epsilon: 1.0, delta: 1.0e-7}, output: kam", "budget: {rho: 0.1}, output: kam", "(ε, δ) budget"),
            ("output: kam.parquet}", "output: kam.parquet, model_output: m.json}", "model"),
            ("rows: 120,", "rows: 120, missing: complete-row,", "fixes its own missing-data strategy"),
        ],
    );
    let out = dpflow().args(["run", p.to_str().unwrap(), "--release-id", "r1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(d.join("out/r1/kam.parquet").exists());
    // The ledger holds the step as the (ε, δ) its RDP curve converts to, not as a
    // zCDP ρ read off the budget (a ρ would be spent again by the ε-unit ledger's
    // own conversion, and a wrong δ composes wrongly across releases).
    let ledger = Ledger::open(d.join("ledger.sqlite")).unwrap();
    let charge = ledger.charge_for_release("small", "r1").unwrap().expect("the release is charged");
    assert_eq!(charge.status, ChargeStatus::Committed);
    let kam: Vec<_> =
        charge.mechanisms.iter().filter(|m| m.target.contains("kam") || m.mechanism.contains("kamino")).collect();
    assert!(!kam.is_empty(), "{:?}", charge.mechanisms);
    for m in kam {
        assert_eq!(m.loss, dpflow::privacy::PrivacyLoss::Approx { epsilon: 1.0, delta: 1.0e-7 }, "{m:?}");
    }
}
