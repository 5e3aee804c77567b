//! `dpflow serve` with real clients (issue #22): psql (simple protocol) and
//! psycopg (extended protocol) run DP queries, EXPLAIN, refused and
//! over-budget queries and read their SQLSTATEs; logins, roles and
//! statements that reach files are refused without a charge; concurrent
//! clients on two server processes sharing one ledger never overspend and
//! lose no charge.
//!
//! The clients are external programs. Without `psql` or Python's psycopg a
//! test says so and passes, unless `DPFLOW_REQUIRE_PG_CLIENTS=1` (set by
//! `.ci/run`, which installs both).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dpflow::privacy::{Budget, ChargeStatus, Ledger};

const PASSWORD: &str = "correct horse battery";

fn dpflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dpflow"))
}

fn have(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Whether the client is installed; if not, the test is skipped unless CI requires it.
fn client_available(what: &str, ok: bool) -> bool {
    if !ok {
        assert!(
            std::env::var("DPFLOW_REQUIRE_PG_CLIENTS").is_err(),
            "{what} is required (DPFLOW_REQUIRE_PG_CLIENTS is set) but not installed"
        );
        eprintln!(
            "SKIPPED: {what} is not installed (apt-get install postgresql-client; pip install 'psycopg[binary]')"
        );
    }
    ok
}

/// A catalog over the sample data, a ledger and a users file.
struct World {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    catalog: PathBuf,
    users: PathBuf,
    ledger: PathBuf,
}

/// `adult` and `penguins` in the catalog (each with budget `total`); analysts
/// alice and bob with role `census` (the tables `census`), carol with role
/// `bio` (penguins); grants as given.
fn world(query_budget: f64, total: f64, grants: &[(&str, &str, f64)], census: &str) -> World {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_data");
    let ledger = dir.join("ledger.sqlite");
    let catalog = dir.join("catalog.yaml");
    std::fs::write(
        &catalog,
        format!(
            "ledger: {}\nquery_budget: {{epsilon: {query_budget}}}\ntables:\n  adult:\n    location: {}\n    domain: {}\n    \
             format: csv\n    privacy_unit: row\n  penguins:\n    location: {}\n    domain: {}\n    privacy_unit: row\n",
            ledger.display(),
            root.join("adult/adult.data").display(),
            root.join("adult/adult.domain.yaml").display(),
            root.join("penguins/penguins.csv").display(),
            root.join("penguins/penguins.domain.yaml").display(),
        ),
    )
    .unwrap();
    let l = Ledger::create(&ledger).unwrap();
    l.add_dataset("adult", "row", Budget::Pure { epsilon: total }).unwrap();
    l.add_dataset("penguins", "row", Budget::Pure { epsilon: total }).unwrap();
    for (ds, who, eps) in grants {
        l.grant(ds, who, Budget::Pure { epsilon: *eps }).unwrap();
    }
    let users = dir.join("users.yaml");
    std::fs::write(&users, format!("roles:\n  census: {{tables: [{census}]}}\n  bio: {{tables: [penguins]}}\n"))
        .unwrap();
    for (name, role) in [("alice", "census"), ("bob", "census"), ("carol", "bio")] {
        let mut c = dpflow()
            .args(["serve", "add-user", "--users", users.to_str().unwrap(), "--name", name, "--roles", role])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(c.stdin.take().unwrap(), "{PASSWORD}").unwrap();
        assert!(c.wait().unwrap().success());
    }
    World { _dir: d, dir, catalog, users, ledger }
}

/// A `dpflow serve` process on a free loopback port.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(w: &World, name: &str) -> Server {
    serve_with(w, name, &[])
}

// The child is killed and waited for in `Server`'s drop.
#[allow(clippy::zombie_processes)]
fn serve_with(w: &World, name: &str, extra: &[&str]) -> Server {
    let log = w.dir.join(format!("{name}.log"));
    let mut child = dpflow()
        .args(["serve", "--catalog", w.catalog.to_str().unwrap(), "--users", w.users.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--audit", w.dir.join("audit.jsonl").to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("listening on 127.0.0.1:").nth(1) {
            let port = rest.split_whitespace().next().unwrap().parse().unwrap();
            return Server { child, port };
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("server did not start: {text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn psql(port: u16, user: &str, password: &str, sql: &str) -> Output {
    psql_with(port, user, password, sql, "sslmode=disable")
}

fn psql_with(port: u16, user: &str, password: &str, sql: &str, options: &str) -> Output {
    Command::new("psql")
        .arg(format!("host=127.0.0.1 port={port} user={user} dbname=dpflow connect_timeout=20 {options}"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-c", sql])
        .env("PGPASSWORD", password)
        .output()
        .unwrap()
}

/// The SQLSTATE psql printed (`ERROR:  PD001: ...`), or "" on success.
fn sqlstate(o: &Output) -> String {
    if o.status.success() {
        return String::new();
    }
    let err = String::from_utf8_lossy(&o.stderr);
    err.split("ERROR:  ").nth(1).and_then(|r| r.split(':').next()).unwrap_or("none").to_string()
}

fn charges(ledger: &Path) -> Vec<dpflow::privacy::ChargeRow> {
    Ledger::open(ledger).unwrap().history(None).unwrap()
}

#[test]
fn psql_runs_dp_queries_explain_and_reads_sqlstates() {
    if !client_available("psql", have("psql", &["--version"])) {
        return;
    }
    // alice: 1.0 of adult's 1.6; bob: 5.0 (capped by what is left of 1.6).
    let w = world(0.5, 1.6, &[("adult", "alice", 1.0), ("adult", "bob", 5.0)], "adult");
    let s = serve(&w, "s");
    let q = "SELECT sex, dp_count(*) AS n FROM adult GROUP BY sex ORDER BY sex";
    let o = psql(s.port, "alice", PASSWORD, q);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[0].starts_with("Female|") && rows[1].starts_with("Male|"), "{out}");
    // EXPLAIN: the mechanism and its noise scale, nothing charged.
    let o = psql(s.port, "alice", PASSWORD, &format!("EXPLAIN {q}"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("discrete_laplace"), "{o:?}");
    // A refused query: its own SQLSTATE, nothing charged.
    assert_eq!(sqlstate(&psql(s.port, "alice", PASSWORD, "SELECT age FROM adult")), "PD001");
    // alice's second query fits her grant; the third does not (PD101), though adult has 0.6 left.
    assert_eq!(sqlstate(&psql(s.port, "alice", PASSWORD, q)), "");
    let o = psql(s.port, "alice", PASSWORD, q);
    assert_eq!(sqlstate(&o), "PD101");
    assert!(String::from_utf8_lossy(&o.stderr).contains("larger grant"), "{o:?}");
    // What is left, as the analyst sees it.
    let o = psql(s.port, "alice", PASSWORD, "SELECT dataset, remaining, dataset_remaining FROM dp_budget()");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let parts: Vec<&str> = out.trim().split('|').collect();
    assert_eq!(parts[0], "adult", "{out}");
    assert!(parts[1].parse::<f64>().unwrap().abs() < 1e-9 && (parts[2].parse::<f64>().unwrap() - 0.6).abs() < 1e-9);
    assert!(String::from_utf8_lossy(&psql(s.port, "bob", PASSWORD, "SHOW dp_budget").stdout).contains("adult|"));
    // bob has grant left but the dataset's total caps him: one query, then PD100.
    assert_eq!(sqlstate(&psql(s.port, "bob", PASSWORD, q)), "");
    assert_eq!(sqlstate(&psql(s.port, "bob", PASSWORD, q)), "PD100");
    let c = charges(&w.ledger);
    assert_eq!(c.len(), 3, "one charge per answered query: {c:?}");
    assert!(c.iter().all(|c| c.status == ChargeStatus::Committed));
    let who: Vec<_> = c.iter().map(|c| c.analyst.as_deref().unwrap()).collect();
    assert_eq!(who, ["alice", "alice", "bob"]);
    // The audit log: a line per statement, never the SQL or a value.
    let audit = std::fs::read_to_string(w.dir.join("audit.jsonl")).unwrap();
    assert_eq!(audit.lines().count(), 9, "{audit}");
    assert!(!audit.contains("SELECT") && !audit.contains("Female"), "{audit}");
    assert!(audit.contains("\"sqlstate\":\"PD101\"") && audit.contains("\"route\":\"explain\""), "{audit}");
}

/// Issue 20, item 5, served: an analyst calls `dp_marginals()` on a table of
/// their role (charged to them, once), never on another's.
#[test]
fn an_analyst_releases_noisy_marginals_of_their_own_tables_only() {
    if !client_available("psql", have("psql", &["--version"])) {
        return;
    }
    let w = world(0.5, 5.0, &[("penguins", "carol", 2.0)], "adult");
    let s = serve(&w, "s");
    let q = "SELECT marginal, species, count, ci_low, ci_high FROM dp_marginals('penguins', 'species', epsilon => 0.5) \
             ORDER BY species";
    let o = psql(s.port, "carol", PASSWORD, q);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows[0].starts_with("species|Adelie|") && rows[2].starts_with("species|Gentoo|"), "{out}");
    // adult is not in carol's role: her session has no such table (nothing charged).
    let o = psql(s.port, "carol", PASSWORD, "SELECT * FROM dp_marginals('adult', 'sex', epsilon => 0.5)");
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no table"), "{o:?}");
    let c = charges(&w.ledger);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].dataset.as_str(), c[0].analyst.as_deref()), ("penguins", Some("carol")));
}

#[test]
fn logins_roles_and_statements_that_reach_files_are_refused_and_charge_nothing() {
    if !client_available("psql", have("psql", &["--version"])) {
        return;
    }
    let w = world(0.5, 5.0, &[("adult", "alice", 5.0), ("penguins", "carol", 5.0)], "adult");
    let s = serve(&w, "s");
    for (user, pw) in [("alice", "wrong password"), ("mallory", PASSWORD)] {
        let o = psql(s.port, user, pw, "SELECT 1");
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("authentication failed"), "{o:?}");
    }
    let cases = [
        ("SELECT dp_count(*) FROM penguins", "42501"),
        ("SELECT dp_count(*) FROM adult a JOIN penguins p ON a.age = p.year", "42501"),
        ("SELECT * FROM read_parquet('/etc/passwd')", "42P01"),
        ("SELECT * FROM '/etc/passwd'", "42P01"),
        ("COPY adult TO '/tmp/dpflow-serve-test.csv'", "42501"),
        ("CREATE TABLE t AS SELECT 1", "42501"),
        ("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'", "42601"),
        ("INSERT INTO adult SELECT * FROM adult", "42501"),
        ("SELECT dp_count(*) FROM adult; SELECT dp_count(*) FROM adult", "0A000"),
        // Functions DataFusion's default features add (pulled in by the pg_catalog crate)
        // are not row-safe: refused on protected rows.
        ("SELECT dp_count(*) FROM adult WHERE md5(sex) = 'x'", "PD004"),
        // An unbound placeholder: refused before the charge (DataFusion would fail after the read).
        ("SELECT n FROM (SELECT dp_count(*) AS n FROM adult) t WHERE n > $1", "PD011"),
        ("SELECT dp_count(*) FROM adult WHERE array_length(make_array(age, age)) = 2", "PD004"),
        ("SELECT * FROM pg_catalog.pg_tables WHERE tablename = 'penguins'", ""),
        ("SET datafusion.execution.target_partitions = 1", ""),
    ];
    for (sql, code) in cases {
        let o = psql(s.port, "alice", PASSWORD, sql);
        assert_eq!(sqlstate(&o), code, "{sql}: {o:?}");
        assert!(!String::from_utf8_lossy(&o.stdout).contains("penguins"), "{sql}: another role's table is invisible");
    }
    assert!(!Path::new("/tmp/dpflow-serve-test.csv").exists());
    // alice's catalog view lists adult only; carol sees penguins only.
    let o = psql(
        s.port,
        "alice",
        PASSWORD,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "adult");
    assert_eq!(sqlstate(&psql(s.port, "carol", PASSWORD, "SELECT dp_count(*) FROM adult")), "42501");
    assert_eq!(sqlstate(&psql(s.port, "carol", PASSWORD, "SELECT dp_count(*) FROM penguins")), "");
    // bob has no grant on adult: refused before anything is read.
    assert_eq!(sqlstate(&psql(s.port, "bob", PASSWORD, "SELECT dp_count(*) FROM adult")), "PD102");
    let c = charges(&w.ledger);
    assert_eq!(c.len(), 1, "only carol's answered query is charged: {c:?}");
    assert_eq!(c[0].analyst.as_deref(), Some("carol"));
}

fn psycopg_available() -> bool {
    client_available("python3 with psycopg", have("python3", &["-c", "import psycopg"]))
}

#[test]
fn psycopg_uses_the_extended_protocol_and_reads_sqlstates() {
    if !psycopg_available() {
        return;
    }
    let w = world(0.25, 5.0, &[("adult", "alice", 0.6)], "adult");
    let s = serve(&w, "s");
    let script = format!(
        r#"
import psycopg, json
c = psycopg.connect(host="127.0.0.1", port={port}, user="alice", password="{PASSWORD}", dbname="dpflow", sslmode="disable")
out = {{}}
cur = c.cursor()
cur.execute("SELECT sex, dp_count(*) AS n, dp_avg(age, 17, 90) AS a FROM adult GROUP BY sex ORDER BY sex")
out["types"] = [d.type_code for d in cur.description]
out["rows"] = [[r[0], r[1], r[2]] for r in cur.fetchall()]
cur.execute("EXPLAIN SELECT dp_count(*) FROM adult")
out["explain"] = [r[1] for r in cur.fetchall()]
for sql in ["SELECT age FROM adult", "SELECT dp_count(*) FROM adult WHERE age > %s"]:
    try:
        cur.execute(sql, (30,) if "%s" in sql else None)
    except psycopg.Error as e:
        out.setdefault("errors", []).append(e.sqlstate)
    c.rollback()
cur = psycopg.ClientCursor(c)
cur.execute("SELECT dp_count(*) FROM adult WHERE age > %s", (30,))
out["client_cursor"] = cur.fetchall()[0][0] > 0
c.rollback()
try:
    cur.execute("SELECT dp_count(*) FROM adult")
except psycopg.Error as e:
    out.setdefault("errors", []).append(e.sqlstate)
print(json.dumps(out))
"#,
        port = s.port
    );
    let o = Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["types"], serde_json::json!([25, 20, 701]), "text, int8, float8: {v}");
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    assert_eq!(v["explain"][0], "discrete_laplace");
    assert_eq!(v["errors"], serde_json::json!(["PD001", "0A000", "PD101"]), "{v}");
    assert_eq!(v["client_cursor"], true);
    assert_eq!(charges(&w.ledger).len(), 2);
}

/// Two server processes on one ledger, 10 clients × 12 queries (reduced from
/// the 50 × 100 of `benches/serve/run.sh`): every query is answered or
/// refused for budget, nobody overspends, and every answer has its charge.
#[test]
fn concurrent_clients_on_two_servers_never_overspend_or_lose_a_charge() {
    if !psycopg_available() {
        return;
    }
    // alice's and bob's grants (0.6 each) exceed what the dataset holds (1.0) together.
    let w = world(0.05, 1.0, &[("penguins", "alice", 0.6), ("penguins", "bob", 0.6)], "adult, penguins");
    let (a, b) = (serve(&w, "a"), serve(&w, "b"));
    let o = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/serve/load.py"))
        .args(["--ports", &format!("{},{}", a.port, b.port), "--users", "alice,bob", "--password-env", "LOAD_PW"])
        .args(["--clients", "10", "--queries", "12", "--sql", "SELECT dp_count(*) FROM penguins"])
        .env("LOAD_PW", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let outcomes = r["outcomes"].as_object().unwrap();
    let answered = outcomes.get("answered").and_then(|v| v.as_u64()).unwrap_or(0);
    let total: u64 = outcomes.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(total, 120, "every query answered or refused: {r}");
    assert!(outcomes.keys().all(|k| ["answered", "PD100", "PD101"].contains(&k.as_str())), "{r}");
    assert_eq!(answered, 20, "exactly 1.0 / 0.05 queries fit the dataset: {r}");
    let l = Ledger::open(&w.ledger).unwrap();
    let c = l.history(None).unwrap();
    assert_eq!(c.len() as u64, answered, "one committed charge per answer");
    assert!(c.iter().all(|c| c.status == ChargeStatus::Committed));
    assert!(l.status("penguins").unwrap().spent <= 1.0 + 1e-9);
    for who in ["alice", "bob"] {
        let s = l.analyst_status("penguins", who).unwrap();
        assert!(s.spent <= 0.6 + 1e-9, "{who} overspent: {}", s.spent);
        assert_eq!(
            r["answered_per_user"][who].as_u64().unwrap(),
            c.iter().filter(|c| c.analyst.as_deref() == Some(who)).count() as u64
        );
    }
}

#[test]
fn tls_with_channel_binding_and_no_plain_tcp_off_loopback() {
    if !client_available("psql", have("psql", &["--version"]))
        || !client_available("openssl", have("openssl", &["version"]))
    {
        return;
    }
    let w = world(0.5, 5.0, &[("adult", "alice", 5.0)], "adult");
    let (cert, key) = (w.dir.join("cert.pem"), w.dir.join("key.pem"));
    let o = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-keyout", key.to_str().unwrap(), "-out", cert.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let s = serve_with(&w, "tls", &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    // SCRAM-SHA-256-PLUS: the login is bound to this server's certificate.
    let o = psql_with(
        s.port,
        "alice",
        PASSWORD,
        "SELECT dp_count(*) FROM adult",
        "sslmode=require channel_binding=require",
    );
    assert!(o.status.success(), "{o:?}");
    // With TLS configured, a plain connection gets no session (libpq already
    // refuses the channel-bound login pgwire offers it; other clients get our error).
    let o = psql(s.port, "alice", PASSWORD, "SELECT dp_count(*) FROM adult");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && (err.contains("requires TLS") || err.contains("non-SSL")), "{o:?}");
    let o = psql_with(
        s.port,
        "alice",
        PASSWORD,
        "SELECT dp_count(*) FROM adult",
        "sslmode=disable channel_binding=disable",
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("requires TLS"), "{o:?}");
    assert_eq!(charges(&w.ledger).len(), 1);
    // Plain TCP on a non-loopback address is refused unless explicitly allowed.
    let o = dpflow()
        .args(["serve", "--catalog", w.catalog.to_str().unwrap(), "--users", w.users.to_str().unwrap()])
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("without TLS"), "{o:?}");
}

/// PostgreSQL's JDBC driver (what DBeaver uses): metadata from pg_catalog, then a DP query.
#[test]
fn jdbc_reads_the_catalog_like_dbeaver_and_runs_a_dp_query() {
    let jar = Path::new("/usr/share/java/postgresql.jar");
    if !client_available("java, javac and PostgreSQL's JDBC driver", have("javac", &["-version"]) && jar.exists()) {
        return;
    }
    let w = world(0.5, 5.0, &[("adult", "alice", 5.0)], "adult");
    let s = serve(&w, "s");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/JdbcProbe.java");
    let o = Command::new("javac").args(["-d", w.dir.to_str().unwrap()]).arg(&src).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let cp = format!("{}:{}", w.dir.display(), jar.display());
    let o =
        Command::new("java").args(["-cp", &cp, "JdbcProbe", &s.port.to_string(), "alice", PASSWORD]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"product PostgreSQL") && lines.contains(&"schema public"), "{out}");
    assert!(lines.contains(&"table adult") && !out.contains("penguins"), "{out}");
    assert!(lines.contains(&"columns 15"), "{out}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("row ")).count(), 2, "{out}");
    assert_eq!(charges(&w.ledger).len(), 1);
}

/// A query that fails after reading protected data: charged to the analyst,
/// reported with `PD200` and no detail, and its audit line names the charge.
#[test]
fn a_failure_after_reading_is_charged_and_audited_without_the_data() {
    if !client_available("psql", have("psql", &["--version"])) {
        return;
    }
    let w = world(0.5, 5.0, &[("adult", "alice", 5.0)], "adult, broken");
    let mut csv = String::from("age\n30\n40,31337\n");
    for i in 0..50 {
        csv += &format!("{}\n", 20 + i);
    }
    std::fs::write(w.dir.join("broken.csv"), csv).unwrap();
    std::fs::write(
        w.dir.join("broken.domain.yaml"),
        "columns:\n  - {name: age, kind: integer, bounds: [0, 120], bins: {width: 10}}\n",
    )
    .unwrap();
    let mut cat = std::fs::read_to_string(&w.catalog).unwrap();
    cat += &format!(
        "  broken:\n    location: {}\n    domain: {}\n    format: csv\n    privacy_unit: row\n",
        w.dir.join("broken.csv").display(),
        w.dir.join("broken.domain.yaml").display()
    );
    std::fs::write(&w.catalog, cat).unwrap();
    let l = Ledger::open(&w.ledger).unwrap();
    l.add_dataset("broken", "row", Budget::Pure { epsilon: 5.0 }).unwrap();
    l.grant("broken", "alice", Budget::Pure { epsilon: 5.0 }).unwrap();
    let s = serve(&w, "s");
    let o = psql(s.port, "alice", PASSWORD, "SELECT dp_count(*) FROM broken");
    assert_eq!(sqlstate(&o), "PD200", "{o:?}");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("31337"));
    let c = charges(&w.ledger);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].status, c[0].analyst.as_deref()), (ChargeStatus::Failed, Some("alice")));
    assert!((l.analyst_status("broken", "alice").unwrap().spent - 0.5).abs() < 1e-9, "never refunded");
    let audit = std::fs::read_to_string(w.dir.join("audit.jsonl")).unwrap();
    assert!(
        audit.contains(&format!("\"charge_id\":{}", c[0].id)) && audit.contains("\"sqlstate\":\"PD200\""),
        "{audit}"
    );
    assert!(!audit.contains("31337"));
}

/// pandas through SQLAlchemy (its psycopg dialect asks pg_catalog on connect,
/// with query parameters): a DP answer as a DataFrame, and the table list.
#[test]
fn sqlalchemy_and_pandas_read_a_dp_answer() {
    if !client_available(
        "python3 with sqlalchemy, pandas and psycopg",
        have("python3", &["-c", "import sqlalchemy, pandas, psycopg"]),
    ) {
        return;
    }
    let w = world(0.5, 5.0, &[("adult", "alice", 5.0)], "adult");
    let s = serve(&w, "s");
    let script = format!(
        r#"
import json, sqlalchemy as sa, pandas as pd
e = sa.create_engine("postgresql+psycopg://alice:{pw}@127.0.0.1:{port}/dpflow?sslmode=disable")
with e.connect() as c:
    df = pd.read_sql(sa.text("SELECT sex, dp_count(*) AS n FROM adult GROUP BY sex ORDER BY sex"), c)
print(json.dumps({{"sex": list(df["sex"]), "n_dtype": str(df["n"].dtype), "tables": sa.inspect(e).get_table_names()}}))
"#,
        pw = PASSWORD.replace(' ', "%20"),
        port = s.port
    );
    let o = Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["sex"], serde_json::json!(["Female", "Male"]));
    assert_eq!(v["n_dtype"], "int64");
    assert_eq!(v["tables"], serde_json::json!(["adult"]));
    assert_eq!(charges(&w.ledger).len(), 1);
}
