//! Cluster mode (issue 21): the same release in this process, on a
//! standalone Ballista cluster (scheduler and executor inside the test), and
//! on a loopback cluster of one scheduler and two executor processes gives
//! the same exact marginals and helper aggregates, one ledger charge, and,
//! with `--unsafe-seed`, the same released outputs; an executor killed
//! mid-job changes nothing; a scheduler killed mid-job fails the release
//! cleanly (charged, as every failure after a protected read) and a rerun
//! completes.
#![cfg(feature = "cluster")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use dpflow::dataset::{CodeSource, Dataset};
use dpflow::io::{ClusterSpec, session_context, session_context_on};
use dpflow::privacy::{ChargeStatus, Ledger};
use dpflow_udfs::marginal::NullMode;

use crate::common;
use common::free_port;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dpflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dpflow"))
}

fn adult() -> Dataset {
    let r = root();
    Dataset::open(
        "adult",
        r.join("sample_data/adult/adult.data").to_str().unwrap(),
        Some(dpflow::io::InputFormat::Csv),
        r.join("sample_data/adult/adult.domain.yaml").to_str().unwrap(),
    )
    .unwrap()
}

/// Every row of the Parquet or CSV files given, as text, sorted: what a
/// release holds whatever order its partitions were written in.
async fn rows_of(path: &Path) -> Vec<String> {
    let ctx = datafusion::prelude::SessionContext::new();
    let p = path.to_str().unwrap();
    let df = if p.ends_with(".csv") {
        ctx.read_csv(p, Default::default()).await.unwrap()
    } else {
        ctx.read_parquet(p, Default::default()).await.unwrap()
    };
    let text = pretty_format_batches(&df.collect().await.unwrap()).unwrap().to_string();
    let mut rows: Vec<String> = text.lines().skip(3).filter(|l| l.starts_with('|')).map(String::from).collect();
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_marginals_are_the_same_in_process_and_on_a_standalone_cluster() {
    let ds = adult();
    let cols = ["workclass", "education", "sex", "race", "income", "age"];
    let mut sets = Vec::new();
    for (i, a) in cols.iter().enumerate() {
        sets.push((vec![a.to_string()], NullMode::Cells));
        for b in &cols[i + 1..] {
            sets.push((vec![a.to_string(), b.to_string()], NullMode::Cells));
            sets.push((vec![a.to_string(), b.to_string()], NullMode::Observed));
        }
    }
    let local = session_context();
    let target = ClusterSpec::parse("standalone", Some(5)).unwrap().connect().await.unwrap();
    let cluster = session_context_on(Some(&target));
    for source in [CodeSource::Plain, CodeSource::CompleteRows] {
        let before = target.jobs_submitted();
        let here = ds.exact_marginals_from(&local, &sets, &source).await.unwrap();
        assert_eq!(target.jobs_submitted(), before, "in-process counting submits nothing");
        let there = ds.exact_marginals_from(&cluster, &sets, &source).await.unwrap();
        assert_eq!(target.jobs_submitted(), before + 1, "one job counts every marginal");
        assert_eq!(here.len(), sets.len());
        assert!(here == there, "{source:?}: the cluster's exact marginals differ");
        // Not vacuous: the one-way marginal of workclass holds every row.
        let total: u64 = here[0].counts.iter().sum();
        assert_eq!(total, if matches!(source, CodeSource::Plain) { 32_561 } else { 30_162 });
    }
}

/// A catalog over Adult without a ledger (seeded sessions only), with the
/// cluster line given.
fn catalog(dir: &Path, cluster: Option<&str>) -> PathBuf {
    let r = root();
    let mut text = format!(
        "query_budget: {{epsilon: 1.0}}\ntables:\n  adult:\n    location: {}\n    domain: {}\n    format: csv\n",
        r.join("sample_data/adult/adult.data").display(),
        r.join("sample_data/adult/adult.domain.yaml").display()
    );
    if let Some(c) = cluster {
        text += &format!("cluster: {c}\n");
    }
    let path = dir.join(format!("catalog-{}.yaml", cluster.map_or("local", |_| "cluster")));
    std::fs::write(&path, text).unwrap();
    path
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_sql_reads_run_on_the_cluster_and_answer_as_in_process() {
    use dpflow::sql::{Catalog, SqlEngine};
    let dir = tempfile::tempdir().unwrap();
    let queries = [
        "SELECT sex, race, dp_count(*) AS n, dp_sum(age, 17, 90) AS s FROM adult GROUP BY sex, race ORDER BY sex, race",
        "SELECT dp_avg(age, 17, 90) AS a, dp_quantile(age, 0.5, 17, 90) AS m FROM adult",
        "SELECT income, dp_var(\"hours-per-week\", 1, 99) AS v FROM adult WHERE age > 30 GROUP BY income ORDER BY income",
    ];
    let answer = |cluster: Option<&'static str>| {
        let path = catalog(dir.path(), cluster);
        async move {
            let mut e = SqlEngine::open(Catalog::load(&path).unwrap(), Some(21)).await.unwrap();
            let mut out = Vec::new();
            let target = dpflow_udfs::cluster::target_of(e.context());
            let jobs = || target.as_ref().map_or(0, |t| t.jobs_submitted());
            for q in queries {
                let before = jobs();
                let r = e.query(q, None).await.unwrap();
                let jobs = jobs() - before;
                out.push((pretty_format_batches(&r.batches).unwrap().to_string(), jobs > 0));
            }
            out
        }
    };
    let here = answer(None).await;
    let there = answer(Some("standalone")).await;
    for ((a, _), (b, on_cluster)) in here.iter().zip(&there) {
        assert_eq!(a, b);
        assert!(*on_cluster, "the query's exact aggregates ran in this process:\n{b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sql_synthesis_and_sampling_release_the_same_on_a_standalone_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // DP SQL: with the same seed, identical answers mean identical exact helper
    // aggregates (the noise is integer noise added to them, or their ratio).
    let queries = [
        "SELECT sex, race, dp_count(*) AS n FROM adult GROUP BY sex, race ORDER BY sex, race",
        "SELECT income, dp_avg(\"hours-per-week\", 1, 99) AS h, dp_sum(age, 17, 90) AS s FROM adult GROUP BY income ORDER BY income",
        "SELECT dp_quantile(age, 0.5, 17, 90) AS median, dp_var(age, 17, 90) AS v FROM adult",
    ];
    for q in queries {
        let sql = |catalog: &Path| {
            run_ok(dpflow().args(["sql", "--catalog", catalog.to_str().unwrap(), "--unsafe-seed", "11", "-e", q]))
        };
        let here = sql(&catalog(d, None));
        let there = sql(&catalog(d, Some("standalone")));
        assert_eq!(here, there, "{q}");
        assert!(here.lines().count() >= 3, "{here}");
    }
    // Synthesis (MST) and sampling: the same model, the same rows.
    let r = root();
    let synth = |tag: &str, cluster: &[&str]| {
        let out = d.join(format!("{tag}.parquet"));
        let model = d.join(format!("{tag}.json"));
        let mut cmd = dpflow();
        cmd.args(["synth", "--input"])
            .arg(r.join("sample_data/adult/adult.data"))
            .arg("--domain")
            .arg(r.join("sample_data/adult/adult.domain.yaml"))
            .args(["--mechanism", "mst", "--epsilon", "1", "--delta", "1e-9", "--iters", "30", "--rows", "5000"])
            .args(["--unsafe-seed", "5", "--out"])
            .arg(&out)
            .arg("--model-out")
            .arg(&model)
            .args(cluster);
        run_ok(&mut cmd);
        (out, model)
    };
    let (out_a, model_a) = synth("local", &[]);
    let (out_b, model_b) = synth("standalone", &["--cluster", "standalone", "--cluster-partitions", "3"]);
    assert_eq!(std::fs::read(&model_a).unwrap(), std::fs::read(&model_b).unwrap(), "the released model");
    let rows_a = rows_of(&out_a).await;
    assert_eq!(rows_a.len(), 5000);
    assert_eq!(rows_a, rows_of(&out_b).await, "the synthetic rows");
    let sample = |tag: &str, cluster: &[&str]| {
        let out = d.join(format!("sample-{tag}.parquet"));
        run_ok(
            dpflow()
                .args(["sample", "--model"])
                .arg(&model_a)
                .args(["--rows", "200000", "--seed", "3", "--out"])
                .arg(&out)
                .args(cluster),
        );
        out
    };
    let s_a = rows_of(&sample("local", &[])).await;
    assert_eq!(s_a.len(), 200_000);
    assert_eq!(s_a, rows_of(&sample("standalone", &["--cluster", "standalone", "--cluster-partitions", "7"])).await);
}

#[test]
fn a_cluster_that_does_not_answer_is_refused_before_any_charge() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = root();
    std::fs::write(
        d.join("p.yaml"),
        format!(
            "name: nobody\nledger: ledger.sqlite\ncreate_ledger_if_missing:\n  adult: {{epsilon: 5.0, delta: 1.0e-6}}\n\
             dataset: {{name: adult, sources: [{}], format: csv, domain: {}}}\n\
             budget: {{epsilon: 1.0}}\noutput: out/{{release_id}}\ncluster: df://127.0.0.1:{}\nsteps:\n  \
             - sql: {{name: n, query: \"SELECT dp_count(*) AS n FROM adult\", budget: {{epsilon: 1.0}}, output: n.csv}}\n",
            r.join("sample_data/adult/adult.data").display(),
            r.join("sample_data/adult/adult.domain.yaml").display(),
            free_port()
        ),
    )
    .unwrap();
    let out = dpflow().arg("run").arg(d.join("p.yaml")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no dpflow cluster scheduler answers"), "{err}");
    // The ledger may exist (created for the demo), but holds no charge.
    if let Ok(l) = Ledger::open(d.join("ledger.sqlite")) {
        assert!(l.history(Some("adult")).unwrap().is_empty());
    }
    // A bad address is a load error naming the key.
    let text = std::fs::read_to_string(d.join("p.yaml")).unwrap().replace("cluster: df://", "cluster: http://");
    std::fs::write(d.join("p.yaml"), text).unwrap();
    let out = dpflow().arg("validate").arg(d.join("p.yaml")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster") && err.contains("df://HOST:PORT"), "{err}");
}

/// A job timeout fails a release whose cluster job runs longer, after its
/// charge (which stays spent, as every failure after a protected read); the
/// same pipeline with a timeout its job meets releases as usual.
#[test]
fn a_cluster_job_past_its_timeout_fails_the_release_charged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = root();
    let pipeline = |timeout: &str| {
        format!(
            "name: timeout\nledger: ledger.sqlite\ncreate_ledger_if_missing:\n  adult: {{epsilon: 5.0, delta: 1.0e-6}}\n\
             dataset: {{name: adult, sources: [{}], format: csv, domain: {}}}\n\
             budget: {{epsilon: 1.0}}\noutput: out/{{release_id}}\ncluster: {{scheduler: standalone, job_timeout: {timeout}}}\nsteps:\n  \
             - sql: {{name: n, query: \"SELECT sex, dp_count(*) AS n FROM adult GROUP BY sex\", budget: {{epsilon: 1.0}}, output: n.csv}}\n",
            r.join("sample_data/adult/adult.data").display(),
            r.join("sample_data/adult/adult.domain.yaml").display(),
        )
    };
    std::fs::write(d.join("p.yaml"), pipeline("1ms")).unwrap();
    let out = dpflow().arg("run").arg(d.join("p.yaml")).args(["--release-id", "short"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Like any failure after a protected read, its cause is not shown
    // (whether a job outlasts its timeout can depend on the data).
    assert!(err.contains("failed after reading protected data") && err.contains("status failed"), "{err}");
    std::fs::write(d.join("p.yaml"), pipeline("10m")).unwrap();
    let out = dpflow().arg("run").arg(d.join("p.yaml")).args(["--release-id", "long"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let l = Ledger::open(d.join("ledger.sqlite")).unwrap();
    let got: Vec<(String, ChargeStatus)> =
        l.history(Some("adult")).unwrap().into_iter().map(|c| (c.release_id, c.status)).collect();
    assert_eq!(
        got,
        [("short#failed-1".to_string(), ChargeStatus::Failed), ("long".to_string(), ChargeStatus::Committed)]
    );
}

/// A scheduler and executors as separate `dpflow cluster` processes.
struct Processes {
    scheduler: Option<Child>,
    scheduler_port: u16,
    executors: Vec<Child>,
    work_dirs: Vec<PathBuf>,
    work: tempfile::TempDir,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for c in self.executors.iter_mut().chain(self.scheduler.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Processes {
    fn start(executors: usize) -> Processes {
        let mut p = Processes {
            scheduler: None,
            scheduler_port: free_port(),
            executors: Vec::new(),
            work_dirs: Vec::new(),
            work: tempfile::tempdir().unwrap(),
        };
        p.start_scheduler();
        for _ in 0..executors {
            p.start_executor();
        }
        p.wait_ready(executors);
        p
    }

    fn address(&self) -> String {
        format!("df://127.0.0.1:{}", self.scheduler_port)
    }

    fn start_scheduler(&mut self) {
        let child = dpflow()
            .args(["cluster", "scheduler", "--bind", "127.0.0.1", "--external-host", "127.0.0.1", "--port"])
            .arg(self.scheduler_port.to_string())
            .args(["--executor-timeout", "6"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.scheduler = Some(child);
    }

    fn start_executor(&mut self) {
        let k = self.executors.len();
        let work = self.work.path().join(format!("executor-{k}-{}", free_port()));
        let child = dpflow()
            .args(["cluster", "executor", "--scheduler", &self.address()])
            .args(["--bind", "127.0.0.1", "--external-host", "127.0.0.1", "--cores", "1", "--heartbeat", "1"])
            .arg("--port")
            .arg(free_port().to_string())
            .arg("--grpc-port")
            .arg(free_port().to_string())
            .arg("--work-dir")
            .arg(&work)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.executors.push(child);
        self.work_dirs.push(work);
    }

    /// The executors still running: (index, pid).
    fn live(&mut self) -> Vec<(usize, u32)> {
        self.executors
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| matches!(c.try_wait(), Ok(None)).then(|| (i, c.id())))
            .collect()
    }

    /// Waits until the scheduler answers and `n` executors have registered
    /// (a job of `n` partitions that each wait a little runs on all of them).
    fn wait_ready(&self, n: usize) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let spec = ClusterSpec::parse(&self.address(), Some(n)).unwrap();
        let t = Instant::now();
        rt.block_on(async {
            loop {
                if let Ok(target) = spec.connect().await {
                    let ctx = session_context_on(Some(&target));
                    let plan = ctx.sql("SELECT 1 AS one").await.unwrap().create_physical_plan().await.unwrap();
                    let ok =
                        tokio::time::timeout(Duration::from_secs(20), dpflow_udfs::cluster::collect(plan, &ctx)).await;
                    if matches!(ok, Ok(Ok(_))) {
                        break;
                    }
                }
                assert!(t.elapsed() < Duration::from_secs(90), "the loopback cluster did not come up");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        // Executors register within a heartbeat of starting.
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// CPU seconds a process has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Bench data (16 columns, four Parquet files under `bench/`, so that a scan
/// is four tasks) and a release pipeline over it: DP SQL, MST and AIM.
fn bench_world(dir: &Path, rows: u64) -> PathBuf {
    let data = dir.join("bench");
    std::fs::create_dir_all(&data).unwrap();
    let dom = dir.join("bench.yaml");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for part in 0..4u64 {
        rt.block_on(dpflow_bench::bench_data::write_bench_data(
            rows / 4,
            data.join(format!("part-{part}.parquet")).to_str().unwrap(),
            3 + part,
            Some(dom.to_str().unwrap()),
            1 << 15,
        ))
        .unwrap();
    }
    let p = dir.join("bench-pipeline.yaml");
    std::fs::write(
        &p,
        "name: bench\nledger: ledger.sqlite\ncreate_ledger_if_missing:\n  bench: {epsilon: 100.0, delta: 1.0e-3}\n\
         dataset: {name: bench, sources: [bench/], format: parquet, domain: bench.yaml}\n\
         budget: {epsilon: 2.0, delta: 1.0e-6}\noutput: out/{release_id}\nsteps:\n\
         \x20 - sql: {name: by_sex_race, query: \"SELECT sex, race, dp_count(*) AS n, dp_avg(age, 0, 99) AS a FROM bench GROUP BY sex, race ORDER BY sex, race\", budget: {epsilon: 0.5}, output: by_sex_race.csv}\n\
         \x20 - synthesize: {name: mst, mechanism: mst, budget: {epsilon: 0.7, delta: 1.0e-7}, iters: 30, rows: 20000, output: mst.parquet, model_output: mst.json}\n\
         \x20 - synthesize: {name: aim, mechanism: aim, workload: \"marginals:sex,race;race,state;sex,age\", budget: {epsilon: 0.8, delta: 1.0e-7}, iters: 30, rows: 20000, output: aim.parquet, model_output: aim.json}\n",
    )
    .unwrap();
    p
}

/// The published files of a release directory, by name.
fn published(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.ends_with(".csv") || n.ends_with(".parquet") || n.ends_with(".json") && n != "manifest.json"
        })
        .collect();
    v.sort();
    v
}

/// Runs the pipeline as release `id`, optionally on `cluster`, and calls
/// `during` with the child while it runs (to inject faults). Pipelines always
/// charge a ledger, so they never take `--unsafe-seed`: their outputs differ
/// by their noise, and what must be equal is checked below through the exact
/// marginals and the seeded commands.
fn release(pipeline: &Path, id: &str, cluster: Option<&str>, during: impl FnOnce(&Child)) -> (bool, String) {
    let mut cmd = dpflow();
    cmd.arg("run").arg(pipeline).args(["--release-id", id]);
    if let Some(c) = cluster {
        cmd.args(["--cluster", c, "--cluster-partitions", "4"]);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    during(&child);
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(900) {
            let _ = child.kill();
            panic!("release {id} did not finish");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// The same files, each with as many rows (the values carry independent noise).
async fn same_shape(a: &Path, b: &Path) {
    let (fa, fb) = (published(a), published(b));
    let names = |f: &[PathBuf]| f.iter().map(|p| p.file_name().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(names(&fa), names(&fb));
    assert!(fa.len() >= 5, "{fa:?}");
    for (x, y) in fa.iter().zip(&fb) {
        if !x.to_string_lossy().ends_with(".json") {
            assert_eq!(rows_of(x).await.len(), rows_of(y).await.len(), "{}", x.display());
        }
    }
}

fn charges(ledger: &Path) -> Vec<(String, ChargeStatus)> {
    let l = Ledger::open(ledger).unwrap();
    l.history(Some("bench")).unwrap().into_iter().map(|c| (c.release_id, c.status)).collect()
}

/// Whether process `pid` is still running (not exited, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| !r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Waits until one of the processes `live` (index, pid) has used `seconds`
/// more CPU (it is running tasks), or `done()` says the work is over, at most
/// two minutes. The index of the busy one, if any.
fn wait_any_busy(live: &[(usize, u32)], seconds: f64, done: impl Fn() -> bool) -> Option<usize> {
    let start: Vec<f64> = live.iter().map(|&(_, pid)| cpu_seconds(pid)).collect();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        for (&(i, pid), s) in live.iter().zip(&start) {
            if cpu_seconds(pid) >= s + seconds {
                return Some(i);
            }
        }
        if done() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Every 1- and 2-way marginal of the bench data's first eight columns.
fn bench_sets() -> Vec<(Vec<String>, NullMode)> {
    let cols = ["age", "sex", "race", "state", "education", "marital", "occupation", "hours"];
    let mut sets = Vec::new();
    for (i, a) in cols.iter().enumerate() {
        sets.push((vec![a.to_string()], NullMode::Cells));
        for b in &cols[i + 1..] {
            sets.push((vec![a.to_string(), b.to_string()], NullMode::Cells));
        }
    }
    sets
}

#[test]
fn a_loopback_cluster_computes_and_releases_what_one_process_does_and_survives_a_lost_executor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pipeline = bench_world(d, 300_000);
    let bench = Dataset::open(
        "bench",
        &format!("{}/", d.join("bench").display()),
        Some(dpflow::io::InputFormat::Parquet),
        d.join("bench.yaml").to_str().unwrap(),
    )
    .unwrap();
    let sets = bench_sets();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let here = rt.block_on(bench.exact_marginals_from(&session_context(), &sets, &CodeSource::Plain)).unwrap();

    // One scheduler and two executors, each its own process.
    let mut cluster = Processes::start(2);
    let spec = ClusterSpec::parse(&cluster.address(), Some(4)).unwrap();
    let on_cluster = |rt: &tokio::runtime::Runtime| {
        let target = rt.block_on(spec.connect()).unwrap();
        session_context_on(Some(&target))
    };
    let ctx = on_cluster(&rt);
    let there = rt.block_on(bench.exact_marginals_from(&ctx, &sets, &CodeSource::Plain)).unwrap();
    assert!(here == there, "the loopback cluster's exact marginals differ");
    // The executors keep exact partial counts in their work directories: owner-only.
    for w in &cluster.work_dirs {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(w).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", w.display());
    }

    // The same seeded releases (no ledger): DP SQL and MST.
    let catalog = d.join("bench-catalog.yaml");
    std::fs::write(
        &catalog,
        "query_budget: {epsilon: 1.0}\ntables:\n  bench: {location: bench/, format: parquet, domain: bench.yaml}\n",
    )
    .unwrap();
    let q =
        "SELECT sex, race, dp_count(*) AS n, dp_avg(age, 0, 99) AS a FROM bench GROUP BY sex, race ORDER BY sex, race";
    let sql = |extra: &[&str]| {
        run_ok(
            dpflow().args(["sql", "--catalog", catalog.to_str().unwrap(), "--unsafe-seed", "4", "-e", q]).args(extra),
        )
    };
    assert_eq!(sql(&[]), sql(&["--cluster", &cluster.address()]));
    let mst = |tag: &str, extra: &[&str]| {
        let out = d.join(format!("mst-{tag}.parquet"));
        run_ok(
            dpflow()
                .args(["synth", "--input", &format!("{}/", d.join("bench").display())])
                .args(["--input-format", "parquet"])
                .args(["--domain", d.join("bench.yaml").to_str().unwrap()])
                .args(["--mechanism", "mst", "--epsilon", "1", "--delta", "1e-9", "--iters", "30", "--rows", "20000"])
                .args(["--unsafe-seed", "6", "--out", out.to_str().unwrap()])
                .args(extra),
        );
        out
    };
    let a = rt.block_on(rows_of(&mst("here", &[])));
    assert_eq!(a, rt.block_on(rows_of(&mst("there", &["--cluster", &cluster.address()]))));

    // The pipeline (DP SQL, MST, AIM) in this process and on the cluster:
    // one committed charge each.
    let t = Instant::now();
    let (ok, err) = release(&pipeline, "here", None, |_| {});
    assert!(ok, "{err}");
    eprintln!("release in this process: {:?}", t.elapsed());
    let t = Instant::now();
    let (ok, err) = release(&pipeline, "there", Some(&cluster.address()), |_| {});
    eprintln!("release on the cluster: {:?}", t.elapsed());
    assert!(ok, "{err}");
    rt.block_on(same_shape(&d.join("out/here"), &d.join("out/there")));

    // An executor killed (SIGKILL) while it runs tasks: the job finishes on
    // the other, with the same exact marginals.
    // (If the job ends before the victim is seen busy, it runs again.)
    let victim = cluster.executors[1].id();
    let mut killed_mid_job = false;
    for _ in 0..5 {
        let job = rt.spawn({
            let (bench, sets, ctx) = (bench.clone(), sets.clone(), ctx.clone());
            async move { bench.exact_marginals_from(&ctx, &sets, &CodeSource::Plain).await }
        });
        let c0 = (cpu_seconds(cluster.executors[0].id()), cpu_seconds(victim));
        let busy = wait_any_busy(&[(1, victim)], 0.05, || job.is_finished()).is_some();
        eprintln!(
            "busy {busy}; cpu before {c0:?}, now ({}, {})",
            cpu_seconds(cluster.executors[0].id()),
            cpu_seconds(victim)
        );
        if busy && !job.is_finished() {
            cluster.executors[1].kill().unwrap();
            let _ = cluster.executors[1].wait();
            killed_mid_job = true;
        }
        let t = Instant::now();
        let after = rt.block_on(job).unwrap().unwrap();
        assert!(here == after, "exact marginals differ (executor killed: {killed_mid_job})");
        if killed_mid_job {
            eprintln!("marginals finished {:?} after the executor was killed", t.elapsed());
            break;
        }
    }
    assert!(killed_mid_job, "no job lasted long enough to lose an executor in it");

    // A whole release with an executor lost mid-job (a fresh one replaces it
    // first): whichever live executor is seen busy first is killed. (If the
    // release ends before that, it runs again under another id.)
    cluster.start_executor();
    cluster.wait_ready(2);
    let mut lost_ids = Vec::new();
    for k in 0..3 {
        let id = format!("lost-executor-{k}");
        let mut killed = None;
        let (ok, err) = release(&pipeline, &id, Some(&cluster.address()), |client| {
            let client = client.id();
            let live = cluster.live();
            if let Some(i) = wait_any_busy(&live, 0.05, || !running(client))
                && running(client)
            {
                let _ = cluster.executors[i].kill();
                let _ = cluster.executors[i].wait();
                killed = Some(i);
            }
        });
        assert!(ok, "{err}");
        eprintln!(
            "release {id}: executor killed: {killed:?}; jobs resubmitted: {}",
            err.matches("submitting it again").count()
        );
        rt.block_on(same_shape(&d.join("out/here"), &d.join(format!("out/{id}"))));
        lost_ids.push(id);
        if killed.is_some() {
            break;
        }
        eprintln!("release {k} ended before an executor was seen busy; again");
    }
    let all = charges(&d.join("ledger.sqlite"));
    let committed = |id: &str| all.iter().filter(|(r, s)| r == id && *s == ChargeStatus::Committed).count();
    for id in ["here", "there"].into_iter().chain(lost_ids.iter().map(String::as_str)) {
        assert_eq!(committed(id), 1, "{all:?}");
    }
    assert_eq!(all.len(), 2 + lost_ids.len(), "{all:?}");
    assert!(cluster.live().len() == 1, "no executor was lost mid-release in {} releases", lost_ids.len());

    // The scheduler killed mid-job: the release fails cleanly and is charged
    // as failed (it had read protected data), nothing is published; a rerun
    // on a restarted cluster completes under a new release id.
    cluster.start_executor();
    cluster.wait_ready(2);
    let t = Instant::now();
    let (ok, err) = release(&pipeline, "lost-scheduler", Some(&cluster.address()), |client| {
        let client = client.id();
        let live = cluster.live();
        assert!(wait_any_busy(&live, 0.05, || !running(client)).is_some(), "the release ended before any task ran");
        let s = cluster.scheduler.as_mut().unwrap();
        let _ = s.kill();
        let _ = s.wait();
    });
    assert!(!ok, "a release whose scheduler died must fail");
    eprintln!("the release failed {:?} after it started", t.elapsed());
    assert!(!err.contains("panicked"), "{err}");
    assert!(!d.join("out/lost-scheduler/manifest.json").exists());
    let all = charges(&d.join("ledger.sqlite"));
    let failed: Vec<_> = all.iter().filter(|(_, s)| *s == ChargeStatus::Failed).collect();
    assert_eq!(failed.len(), 1, "{all:?}");
    assert!(failed[0].0.starts_with("lost-scheduler#failed"), "{all:?}");
    assert_eq!(all.len(), 3 + lost_ids.len(), "{all:?}");
    // The same release id runs again on a restarted cluster: it completes
    // under one new charge; the failed one stays spent.
    drop(cluster);
    let cluster = Processes::start(2);
    let (ok, err) = release(&pipeline, "lost-scheduler", Some(&cluster.address()), |_| {});
    assert!(ok, "{err}");
    rt.block_on(same_shape(&d.join("out/here"), &d.join("out/lost-scheduler")));
    let all = charges(&d.join("ledger.sqlite"));
    assert_eq!(all.len(), 4 + lost_ids.len(), "{all:?}");
    assert_eq!(all.iter().filter(|(r, s)| r == "lost-scheduler" && *s == ChargeStatus::Committed).count(), 1);
}
