//! dpflow's benchmark and experiment drivers, used by the `dpflow-bench`
//! binary and the scripts in `benches/`. Not part of the product: nothing
//! here is a private release.
#![warn(missing_docs)]

pub mod bench_data;
pub mod dips_case;
pub mod dips_study;
pub mod dips_study4;
pub mod knn_experiment;
pub mod napsu_adult;
pub mod napsu_toy;
pub mod pgm;

/// Peak resident set size of this process, in MB.
pub fn peak_rss_mb() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    if rc == 0 { u.ru_maxrss as f64 / 1024.0 } else { f64::NAN }
}
