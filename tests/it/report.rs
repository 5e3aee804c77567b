//! The release report (issue 20, item 1) of the Adult pipeline
//! (`pipelines/adult-nightly.yaml`, run into a temporary directory with its
//! own ledger): the HTML parses with html5ever without errors, holds every
//! released number of the release's CSV outputs and each stated interval,
//! and every noisy measurement's interval; headless Chromium renders it to a
//! PNG that is not blank, and its DOM holds the same numbers.
//!
//! Chromium is Debian's `chromium` package (installed by `.ci/run`); without
//! it the rendering part is skipped, unless `DPFLOW_REQUIRE_CHROMIUM=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

use dpflow::report::num;
use html5ever::tendril::TendrilSink;

/// Runs the Adult pipeline into `dir` and returns the release directory.
fn release(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("pipelines/adult-nightly.yaml"))
        .unwrap()
        .replace("../sample_data", &root.join("sample_data").display().to_string())
        .lines()
        .map(|l| {
            if l.starts_with("ledger:") {
                format!("ledger: {}", dir.join("ledger.sqlite").display())
            } else if l.starts_with("output:") {
                format!("output: {}/out/{{release_id}}", dir.display())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.join("p.yaml"), yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .args(["run", dir.join("p.yaml").to_str().unwrap(), "--release-id", "report-test"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir.join("out/report-test")
}

/// `dpflow report` reads a release's outputs only at `<manifest dir>/<name>`
/// with the recorded hash: from any working directory it rebuilds the
/// report; a manifest edited to name a file outside the release (`..`), or
/// whose hash does not match, is refused, and nothing of the file is shown.
fn tampered_manifests_cannot_redirect_dpflow_report(dir: &Path, rel: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let domain = root.join("sample_data/adult/adult.domain.yaml");
    let report = |manifest: &Path, out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_dpflow"))
            .current_dir("/")
            .args(["report", manifest.to_str().unwrap(), "--domain", domain.to_str().unwrap()])
            .args(["--ledger", dir.join("ledger.sqlite").to_str().unwrap(), "--out", out.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let again = dir.join("again.html");
    let ok = report(&rel.join("manifest.json"), &again);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(std::fs::read_to_string(&again).unwrap().contains("counts_by_sex_race.csv"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rel.join("manifest.json")).unwrap()).unwrap();
    // A "secret" beside the release, and a manifest that names it through `..` with its true hash.
    let secret = b"code,value\nsecret,424242\n";
    std::fs::write(rel.parent().unwrap().join("secret.csv"), secret).unwrap();
    let mut m = manifest.clone();
    m["steps"][0]["outputs"] = serde_json::json!(["../secret.csv"]);
    let step = m["steps"][0]["step"].clone();
    m["outputs"].as_array_mut().unwrap().push(serde_json::json!({
        "step": step, "url": format!("{}/../secret.csv", rel.display()),
        "sha256": hex::encode(<sha2::Sha256 as sha2::Digest>::digest(secret)), "bytes": secret.len(),
    }));
    let bad = rel.join("tampered-1.json");
    std::fs::write(&bad, serde_json::to_vec(&m).unwrap()).unwrap();
    let out = dir.join("tampered-1.html");
    let r = report(&bad, &out);
    assert!(!r.status.success() && !out.exists(), "a `..` output must be refused");
    assert!(String::from_utf8_lossy(&r.stderr).contains("`..`"), "{}", String::from_utf8_lossy(&r.stderr));
    // A recorded hash that does not match the file.
    let mut m = manifest.clone();
    for o in m["outputs"].as_array_mut().unwrap() {
        o["sha256"] = serde_json::json!("00".repeat(32));
    }
    let bad = rel.join("tampered-2.json");
    std::fs::write(&bad, serde_json::to_vec(&m).unwrap()).unwrap();
    let r = report(&bad, &dir.join("tampered-2.html"));
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("does not match the SHA-256"));
}

/// Every text the report must hold: each CSV cell, each stated interval,
/// each measurement's ± half-width.
fn expected_texts(rel: &Path) -> Vec<String> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rel.join("manifest.json")).unwrap()).unwrap();
    let mut want = Vec::new();
    for step in manifest["steps"].as_array().unwrap() {
        let columns = step["columns"].as_array().cloned().unwrap_or_default();
        for o in step["outputs"].as_array().unwrap() {
            let o = o.as_str().unwrap();
            if !o.ends_with(".csv") {
                continue;
            }
            let mut r = csv::Reader::from_path(rel.join(o)).unwrap();
            let headers: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
            for rec in r.records() {
                let rec = rec.unwrap();
                for (h, v) in headers.iter().zip(rec.iter()) {
                    want.push(v.to_string());
                    if let Some(w) =
                        columns.iter().find(|c| c["target"] == h.as_str()).and_then(|c| c["stated_half_width"].as_f64())
                    {
                        let x: f64 = v.parse().unwrap();
                        want.push(format!("[{}, {}]", num(x - w), num(x + w)));
                    }
                }
            }
        }
        let measurements = step["measurements"].as_array().cloned().unwrap_or_default();
        for m in &measurements {
            want.push(format!("± {}", num(m["ci_half_width"].as_f64().unwrap())));
        }
        // napsu-mq's published noisy statistics, each with its interval.
        for o in step["outputs"].as_array().unwrap().iter().filter_map(|o| o.as_str()) {
            if !o.ends_with(".napsu.json") {
                continue;
            }
            let r: serde_json::Value = serde_json::from_slice(&std::fs::read(rel.join(o)).unwrap()).unwrap();
            let st = &r["napsu"]["statistics"];
            let w = measurements[0]["ci_half_width"].as_f64().unwrap();
            for v in st["statistics"].as_array().unwrap() {
                let v = v.as_f64().unwrap();
                want.push(num(v));
                want.push(format!("[{}, {}]", num(v - w), num(v + w)));
            }
        }
    }
    assert!(want.len() > 40, "the release has numbers to check");
    want
}

/// The text of an HTML document's table cells, in order.
fn cells(html: &str) -> Vec<String> {
    let dom = html5ever::parse_document(markup5ever_rcdom::RcDom::default(), Default::default())
        .from_utf8()
        .read_from(&mut html.as_bytes())
        .unwrap();
    let errors = dom.errors.borrow().clone();
    assert!(errors.is_empty(), "html5ever parse errors: {errors:?}");
    let mut out = Vec::new();
    fn walk(h: &markup5ever_rcdom::Handle, in_cell: bool, acc: &mut String, out: &mut Vec<String>) {
        use markup5ever_rcdom::NodeData;
        match &h.data {
            NodeData::Element { name, .. } if &*name.local == "td" => {
                let mut s = String::new();
                for c in h.children.borrow().iter() {
                    walk(c, true, &mut s, out);
                }
                out.push(s.trim().to_string());
                return;
            }
            NodeData::Text { contents } if in_cell => acc.push_str(&contents.borrow()),
            _ => {}
        }
        for c in h.children.borrow().iter() {
            walk(c, in_cell, acc, out);
        }
    }
    walk(&dom.document, false, &mut String::new(), &mut out);
    out
}

fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()));
    if found.is_none() && std::env::var("DPFLOW_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
        panic!("DPFLOW_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)");
    }
    found
}

#[test]
fn the_adult_release_report_holds_every_number_and_renders() {
    let dir = tempfile::tempdir().unwrap();
    let rel = release(dir.path());
    let html = std::fs::read_to_string(rel.join("report.html")).unwrap();
    // Self-contained: nothing to fetch (the SVGs' xmlns is a name, not a fetch).
    for fetch in ["src=", "href=", "@import", "url(", "<script", "<link"] {
        assert!(!html.contains(fetch), "the report must not fetch anything: {fetch}");
    }
    let got = cells(&html);
    let want = expected_texts(&rel);
    let missing: Vec<&String> = want.iter().filter(|w| !got.iter().any(|g| g == *w)).collect();
    assert!(missing.is_empty(), "numbers missing from the report's tables: {missing:?}");

    tampered_manifests_cannot_redirect_dpflow_report(dir.path(), &rel);

    let Some(chrome) = chromium() else {
        eprintln!("skipped the rendering part: no chromium (set DPFLOW_REQUIRE_CHROMIUM=1 to require it)");
        return;
    };
    let url = format!("file://{}", rel.join("report.html").display());
    let common = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,2400"];
    let dom = Command::new(chrome).args(common).arg("--dump-dom").arg(&url).output().unwrap();
    assert!(dom.status.success(), "{}", String::from_utf8_lossy(&dom.stderr));
    let rendered = cells(&String::from_utf8(dom.stdout).unwrap());
    let missing: Vec<&String> = want.iter().filter(|w| !rendered.iter().any(|g| g == *w)).collect();
    assert!(missing.is_empty(), "numbers missing from Chromium's DOM: {missing:?}");
    // The screenshot: kept under the target directory for the record.
    let png = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("adult-report.png");
    let shot =
        Command::new(chrome).args(common).arg(format!("--screenshot={}", png.display())).arg(&url).output().unwrap();
    assert!(shot.status.success() && png.exists(), "{}", String::from_utf8_lossy(&shot.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = &buf[..info.buffer_size()];
    let channels = info.color_type.samples();
    assert_eq!((info.width, info.height), (1200, 2400));
    // Not blank: a real share of the pixels is ink (dark text, plot lines, table rules).
    let dark = px.chunks(channels).filter(|p| p[..3].iter().map(|&c| c as u32).sum::<u32>() < 3 * 160).count();
    let share = dark as f64 / (info.width * info.height) as f64;
    assert!(share > 0.005, "the screenshot looks blank: {:.4}% dark pixels", share * 100.0);
    eprintln!("screenshot: {} ({:.2}% dark pixels)", png.display(), share * 100.0);
}

/// `dpflow eval --report`: the curator report says NOT PRIVATE first and
/// last, is owner-only, parses without errors, and holds every per-pair TVD
/// of the JSON evaluation (whose means agree with the summary's).
#[test]
fn the_curator_report_is_labelled_owner_only_and_holds_the_heat_maps() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curator.html");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = Command::new(env!("CARGO_BIN_EXE_dpflow"))
        .current_dir(root)
        .args([
            "eval",
            "--real",
            "sample_data/nist-acs/ma2019.csv",
            "--synth",
            "tests/data/sdnist/mst.csv",
            "--domain",
            "tests/data/sdnist/kmarginal.domain.yaml",
            "--workload",
            "all-2way",
            "--format",
            "json",
            "--report",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let eval: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600, "owner-only");
    let html = std::fs::read_to_string(&out).unwrap();
    let banner = dpflow::report::curator::NOT_PRIVATE;
    let body = html.split("<body>").nth(1).unwrap();
    assert!(body.trim_start().starts_with("<p class=\"warn\">NOT PRIVATE"), "the banner comes first");
    assert_eq!(html.matches(banner).count(), 2, "the banner first and last");
    let got = cells(&html);
    let det = &eval["detail"];
    let (mut sum, mut n) = (0.0, 0);
    for row in det["two_way"].as_array().unwrap() {
        for v in row.as_array().unwrap().iter().filter_map(|v| v.as_f64()) {
            assert!(got.contains(&format!("{v:.4}")), "2-way TVD {v:.4} missing");
            sum += v;
            n += 1;
        }
    }
    // Each pair appears twice (the matrix is symmetric): the mean is the summary's 2-way TVD.
    assert!((sum / n as f64 - eval["tvd_2way"].as_f64().unwrap()).abs() < 1e-12);
    let one: Vec<f64> = det["one_way"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert!((one.iter().sum::<f64>() / one.len() as f64 - eval["tvd_1way"].as_f64().unwrap()).abs() < 1e-12);
    assert!(html.contains(&format!("{:.1} of 1000", eval["kmarginal"]["score"].as_f64().unwrap())));
    assert_eq!(html.matches("<svg").count(), 2, "the 2-way and 3-way heat maps");
}
