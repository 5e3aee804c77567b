//! Writing a compiled domain back as a spec file (e.g. the nullable domain
//! `dpflow missing inject` writes next to its output).

use super::{ColumnKind, Domain, SpecError};

/// The same domain with every column nullable.
pub fn with_all_nullable(domain: &Domain) -> Domain {
    let cols = domain
        .columns()
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.nullable = true;
            c
        })
        .collect();
    Domain::new(cols).expect("same columns")
}

fn q(s: &str) -> String {
    serde_json::to_string(s).expect("string")
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 9e15 { format!("{}", x as i64) } else { format!("{x:?}") }
}

/// A YAML spec that [`super::DomainSpec::parse`] reads back to `domain`
/// (aliases and canonical labels kept; integer edges written explicitly).
/// A column the spec format cannot express is a [`SpecError`] on its key
/// (file `"(written domain)"`).
pub fn to_yaml(domain: &Domain, name: Option<&str>) -> Result<String, SpecError> {
    let mut s = String::from("# Public domain written by dpflow.\n");
    if let Some(n) = name {
        s += &format!("name: {}\n", q(n));
    }
    s += "columns:\n";
    for (i, c) in domain.columns().iter().enumerate() {
        let mut parts = vec![format!("name: {}", q(&c.name))];
        match &c.kind {
            ColumnKind::Categorical { values, aliases } => {
                parts.push("kind: categorical".into());
                parts.push(format!("values: [{}]", values.iter().map(|v| q(v)).collect::<Vec<_>>().join(", ")));
                if !aliases.is_empty() {
                    parts.push(format!(
                        "aliases: {{{}}}",
                        aliases.iter().map(|(k, v)| format!("{}: {}", q(k), q(v))).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            ColumnKind::Integer { edges } => {
                parts.push("kind: integer".into());
                // Internally bins are half-open [e_i, e_{i+1}); the spec's explicit
                // edges close the last bin, so equal widths are written as bounds + width.
                let widths: Vec<i64> = edges.windows(2).map(|w| w[1] - w[0]).collect();
                let (lo, hi) = (edges[0], edges[edges.len() - 1] - 1);
                let uniform = widths.iter().all(|&w| w == widths[0]);
                let last_ok = widths.last().is_some_and(|&w| w > 1);
                if uniform && (hi - lo + 1) % widths[0] == 0 {
                    parts.push(format!("bounds: [{lo}, {hi}]"));
                    if widths[0] > 1 {
                        parts.push(format!("bins: {{width: {}}}", widths[0]));
                    }
                } else if last_ok {
                    let mut e = edges.clone();
                    *e.last_mut().expect("edges") -= 1;
                    parts.push(format!(
                        "bins: {{edges: [{}]}}",
                        e.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
                    ));
                } else {
                    return Err(SpecError {
                        file: "(written domain)".into(),
                        line: None,
                        key: format!("columns[{i}] ({}).bins", c.name),
                        message: "unequal integer bins ending in a one-value bin cannot be written as a spec".into(),
                    });
                }
            }
            ColumnKind::Float { edges } => {
                parts.push("kind: float".into());
                parts.push(format!(
                    "bins: {{edges: [{}]}}",
                    edges.iter().map(|x| num(*x)).collect::<Vec<_>>().join(", ")
                ));
            }
            ColumnKind::Boolean => parts.push("kind: boolean".into()),
        }
        parts.push(format!("nullable: {}", c.nullable));
        if !c.null_tokens.is_empty() {
            parts.push(format!("null_tokens: [{}]", c.null_tokens.iter().map(|t| q(t)).collect::<Vec<_>>().join(", ")));
        }
        if let Some(rule) = &c.not_applicable_when {
            parts.push(format!("not_applicable_when: {}", q(rule)));
        }
        let ood = serde_json::to_value(c.out_of_domain).expect("policy");
        parts.push(format!("out_of_domain: {}", ood.as_str().unwrap_or("error")));
        s += &format!("  - {{{}}}\n", parts.join(", "));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DomainSpec;

    #[test]
    fn round_trips_through_the_parser() {
        for file in [
            "sample_data/adult/domain.yaml",
            "sample_data/penguins/domain.yaml",
            "sample_data/nist-acs/ma2019.domain.yaml",
            "../shared/data/adult-coded/adult-domain.json",
        ] {
            if !std::path::Path::new(&format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).exists() {
                continue;
            }
            let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
            let spec = DomainSpec::load(&path).unwrap();
            let text = to_yaml(&spec.domain, spec.name.as_deref()).unwrap();
            let back = DomainSpec::parse(&text, "written.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(back.domain, spec.domain, "{file}");
            let all = with_all_nullable(&spec.domain);
            let back = DomainSpec::parse(&to_yaml(&all, None).unwrap(), "w.yaml").unwrap();
            assert!(back.domain.columns().iter().all(|c| c.nullable));
        }
    }
}
