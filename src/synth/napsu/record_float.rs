//! Optional diagnostics in the release record that may be NaN or infinite.
//!
//! JSON has no NaN or infinity, and `serde_json` writes both as `null`, which
//! reads back as "absent". Two diagnostics need them: an R̂ or ESS that is NaN
//! (a draw that was not finite) published under `allow_unconverged`, and a
//! Pareto k̂ of ∞ (an unfittable tail), where "absent" means the opposite
//! (equal weights, nothing to fit). So these fields write NaN and ±∞ as the
//! strings `"NaN"`, `"inf"` and `"-inf"`, and read numbers, those strings,
//! or `null` (absent: records written before this).

use serde::{Deserialize, Deserializer, Serializer};

/// Writes an optional float, with NaN and ±∞ as text.
pub fn serialize<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        None => s.serialize_none(),
        Some(x) if x.is_nan() => s.serialize_str("NaN"),
        Some(x) if x.is_infinite() => s.serialize_str(if *x > 0.0 { "inf" } else { "-inf" }),
        Some(x) => s.serialize_some(x),
    }
}

/// Reads an optional float written by [`serialize`] (or a plain number).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Number(f64),
        Text(String),
    }
    match Option::<Written>::deserialize(d)? {
        None => Ok(None),
        Some(Written::Number(x)) => Ok(Some(x)),
        Some(Written::Text(t)) => match t.as_str() {
            "NaN" => Ok(Some(f64::NAN)),
            "inf" => Ok(Some(f64::INFINITY)),
            "-inf" => Ok(Some(f64::NEG_INFINITY)),
            other => Err(serde::de::Error::custom(format!(
                "expected a number, \"NaN\", \"inf\" or \"-inf\", not {other:?}: was the record edited by hand?"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    struct Diag {
        #[serde(default, skip_serializing_if = "Option::is_none", with = "super")]
        k: Option<f64>,
    }

    fn round_trip(k: Option<f64>) -> (String, Option<f64>) {
        let text = serde_json::to_string(&Diag { k }).unwrap();
        let back: Diag = serde_json::from_str(&text).unwrap();
        (text, back.k)
    }

    /// NaN and ±∞ survive a round trip through JSON (plain `f64` reads back
    /// as absent); numbers stay numbers; absent stays absent, and `null`
    /// (records written before) reads as absent.
    #[test]
    fn nan_and_infinities_survive_the_record() {
        let (text, back) = round_trip(Some(f64::INFINITY));
        assert_eq!((text.as_str(), back), (r#"{"k":"inf"}"#, Some(f64::INFINITY)));
        assert_eq!(round_trip(Some(f64::NEG_INFINITY)).1, Some(f64::NEG_INFINITY));
        let (text, back) = round_trip(Some(f64::NAN));
        assert!(text == r#"{"k":"NaN"}"# && back.unwrap().is_nan(), "{text}");
        assert_eq!(round_trip(Some(1.0312)), (r#"{"k":1.0312}"#.to_string(), Some(1.0312)));
        assert_eq!(round_trip(None), ("{}".to_string(), None));
        assert_eq!(serde_json::from_str::<Diag>(r#"{"k":null}"#).unwrap().k, None);
        let e = serde_json::from_str::<Diag>(r#"{"k":"big"}"#).unwrap_err();
        assert!(e.to_string().contains("not \"big\""), "{e}");
        // What serde_json does without it: ∞ comes back absent.
        #[derive(Serialize, Deserialize)]
        struct Plain {
            k: Option<f64>,
        }
        let plain: Plain =
            serde_json::from_str(&serde_json::to_string(&Plain { k: Some(f64::INFINITY) }).unwrap()).unwrap();
        assert_eq!(plain.k, None);
    }
}
