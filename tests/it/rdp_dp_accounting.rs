//! Issue 18 item 1: the RDP accountant for the Poisson-subsampled Gaussian
//! mechanism against Google's dp-accounting 0.6.0 on a grid of sampling
//! rates, noise multipliers, step counts and all 156 default orders
//! (expected values: `tests/data/rdp/dp_accounting.json`, produced by
//! `benches/privacy/dp_accounting_reference.py`). Agreement: 1e-6 relative,
//! for every RDP value and for ε at δ = 1e-5 and 1e-9.

use dpflow::privacy::rdp::{default_orders, epsilon, sampled_gaussian_curve};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    dp_accounting: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    q: f64,
    sigma: f64,
    steps: u64,
    orders: Vec<f64>,
    /// None where dp-accounting's series did not converge (+∞).
    rdp: Vec<Option<f64>>,
    epsilon: std::collections::BTreeMap<String, f64>,
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/rdp/dp_accounting.json"))
        .expect("tests/data/rdp/dp_accounting.json");
    serde_json::from_str(&text).expect("reference JSON")
}

#[test]
fn rdp_values_match_dp_accounting_to_1e_6_relative() {
    let r = reference();
    assert_eq!(r.dp_accounting, "0.6.0");
    assert_eq!(r.cases.len(), 32);
    let mut compared = 0;
    for c in &r.cases {
        assert_eq!(c.orders, default_orders(), "order grid");
        let ours = sampled_gaussian_curve(c.q, c.sigma, c.steps, &c.orders).unwrap();
        for ((a, mine), theirs) in ours.iter().zip(&c.rdp) {
            match theirs {
                None => assert!(mine.is_infinite(), "q={} σ={} α={a}: ours {mine}, theirs ∞", c.q, c.sigma),
                Some(t) => {
                    let rel = ((mine - t) / t).abs();
                    assert!(
                        rel <= 1e-6,
                        "q={} σ={} T={} α={a}: ours {mine}, theirs {t} (rel {rel:e})",
                        c.q,
                        c.sigma,
                        c.steps
                    );
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 4_800, "{compared}");
}

#[test]
fn epsilon_matches_dp_accounting_to_1e_6_relative() {
    for c in &reference().cases {
        let ours = sampled_gaussian_curve(c.q, c.sigma, c.steps, &c.orders).unwrap();
        for (d, theirs) in &c.epsilon {
            let delta: f64 = d.parse().unwrap();
            let (mine, _) = epsilon(&ours, delta);
            let rel = ((mine - theirs) / theirs).abs();
            assert!(rel <= 1e-6, "q={} σ={} T={} δ={delta}: ours {mine}, theirs {theirs}", c.q, c.sigma, c.steps);
        }
    }
}
