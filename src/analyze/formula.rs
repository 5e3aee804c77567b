//! Model formulas in the notation of R and statsmodels: `y ~ a + b`,
//! `income == '>50K' ~ age + race + sex`, `y ~ x - 1` (no intercept).
//!
//! The response is a column, or a column compared with a value (`==`),
//! which gives a 0/1 response for logistic regression. Terms are column
//! names (bare, or in backticks when they hold other characters); whether a
//! term is numeric or categorical follows from the column's type
//! ([`super::design`]). `1` / `+ 1` keeps the intercept (the default),
//! `0` / `+ 0` / `- 1` removes it. Interactions and transformations are not
//! supported: derive such columns before the analysis.

use super::AnalyzeError;

/// A parsed formula.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Formula {
    /// The left-hand side.
    pub response: Response,
    /// The predictor columns, in order, without repeats.
    pub terms: Vec<String>,
    /// Whether the model has an intercept.
    pub intercept: bool,
}

/// The left-hand side of a formula.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Response {
    /// The response column.
    pub column: String,
    /// `column == value`: the response is 1 where the column equals `value`
    /// (compared as text), 0 elsewhere.
    pub equals: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Name(String),
    Text(String),
    Number(String),
    Plus,
    Minus,
    Tilde,
    Equals,
}

fn bad(formula: &str, problem: impl Into<String>) -> AnalyzeError {
    AnalyzeError::Formula { formula: formula.to_string(), problem: problem.into() }
}

fn tokens(formula: &str) -> Result<Vec<Token>, AnalyzeError> {
    let mut out = Vec::new();
    let mut chars = formula.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '+' => out.push(Token::Plus),
            '-' => out.push(Token::Minus),
            '~' => out.push(Token::Tilde),
            '=' => {
                if chars.next_if(|&(_, c)| c == '=').is_none() {
                    return Err(bad(formula, format!("`=` at character {} must be `==`", i + 1)));
                }
                out.push(Token::Equals);
            }
            '`' | '\'' | '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some((_, e)) if e == c => break,
                        Some((_, e)) => s.push(e),
                        None => return Err(bad(formula, format!("the quote at character {} is not closed", i + 1))),
                    }
                }
                out.push(if c == '`' { Token::Name(s) } else { Token::Text(s) });
            }
            c if c.is_ascii_digit() => {
                let mut s = c.to_string();
                while let Some((_, d)) = chars.next_if(|&(_, d)| d.is_ascii_alphanumeric() || d == '.' || d == '_') {
                    s.push(d);
                }
                if s.chars().all(|d| d.is_ascii_digit()) {
                    out.push(Token::Number(s));
                } else {
                    out.push(Token::Name(s));
                }
            }
            c if c.is_alphanumeric() || c == '_' || c == '.' => {
                let mut s = c.to_string();
                while let Some((_, d)) = chars.next_if(|&(_, d)| d.is_alphanumeric() || d == '_' || d == '.') {
                    s.push(d);
                }
                out.push(Token::Name(s));
            }
            c => {
                return Err(bad(
                    formula,
                    format!(
                        "`{c}` at character {} is not supported (terms are column names joined by `+`; put other \
                         names in backticks)",
                        i + 1
                    ),
                ));
            }
        }
    }
    Ok(out)
}

impl Formula {
    /// Parses a formula; errors say which part is wrong and what is allowed.
    pub fn parse(formula: &str) -> Result<Self, AnalyzeError> {
        let toks = tokens(formula)?;
        let tilde = match toks.iter().filter(|t| **t == Token::Tilde).count() {
            1 => toks.iter().position(|t| *t == Token::Tilde).unwrap_or_default(),
            0 => return Err(bad(formula, "it has no `~` (write `response ~ term + term`)")),
            _ => return Err(bad(formula, "it has more than one `~`")),
        };
        let response = match &toks[..tilde] {
            [Token::Name(c)] => Response { column: c.clone(), equals: None },
            [Token::Name(c), Token::Equals, Token::Text(v) | Token::Name(v) | Token::Number(v)] => {
                Response { column: c.clone(), equals: Some(v.clone()) }
            }
            [] => return Err(bad(formula, "the response (left of `~`) is missing")),
            _ => {
                return Err(bad(formula, "the response must be a column, or `column == 'value'` for a 0/1 response"));
            }
        };
        let rhs = &toks[tilde + 1..];
        if rhs.is_empty() {
            return Err(bad(formula, "there are no terms right of `~` (write `~ 1` for an intercept only)"));
        }
        let mut terms: Vec<String> = Vec::new();
        let mut intercept = true;
        let mut sign = Token::Plus;
        let mut rest = rhs;
        if let [Token::Minus, tail @ ..] = rhs {
            sign = Token::Minus;
            rest = tail;
        }
        let mut expect_term = true;
        for t in rest {
            if !expect_term {
                match t {
                    Token::Plus | Token::Minus => {
                        sign = t.clone();
                        expect_term = true;
                        continue;
                    }
                    _ => return Err(bad(formula, "terms must be joined by `+`")),
                }
            }
            match (t, &sign) {
                (Token::Name(n), Token::Plus) => {
                    if n == &response.column {
                        return Err(bad(formula, format!("`{n}` is both the response and a term")));
                    }
                    if terms.contains(n) {
                        return Err(bad(formula, format!("the term `{n}` is repeated")));
                    }
                    terms.push(n.clone());
                }
                (Token::Name(n), Token::Minus) => {
                    return Err(bad(formula, format!("removing a term (`- {n}`) is not supported; leave it out")));
                }
                (Token::Number(n), Token::Minus) if n == "0" => {
                    return Err(bad(formula, "`- 0` means nothing; write `- 1` or `+ 0` to drop the intercept"));
                }
                // `+ 0` and `- 1` remove the intercept; `+ 1` keeps it.
                (Token::Number(n), s) if n == "0" || n == "1" => intercept = (n == "1") == (*s == Token::Plus),
                _ => return Err(bad(formula, format!("expected a column name at term {}", terms.len() + 1))),
            }
            expect_term = false;
        }
        if expect_term {
            return Err(bad(formula, "it ends with `+` or `-`"));
        }
        if terms.is_empty() && !intercept {
            return Err(bad(formula, "the model has neither terms nor an intercept"));
        }
        Ok(Formula { response, terms, intercept })
    }

    /// Every column the formula reads: the response, then the terms.
    pub fn columns(&self) -> Vec<String> {
        std::iter::once(self.response.column.clone()).chain(self.terms.iter().cloned()).collect()
    }

    /// The relations a model of marginals over `scopes` cannot carry for
    /// this formula: each term that no scope holds together with the
    /// response, or the response itself when no scope holds it (an
    /// intercept-only model, a mean or a proportion).
    ///
    /// A max-entropy model fitted to those marginals (NAPSU-MQ, 003 §4)
    /// relates a term to the response only through the other columns, so
    /// every synthetic set shares that bias and a correctly sampled
    /// posterior still gives intervals that miss the real coefficient
    /// (measured: `benches/results/napsu/twinify.md`, the twelve queries
    /// against the same with race × income and sex × income added).
    pub fn unmodelled(&self, scopes: &[Vec<String>]) -> Vec<String> {
        let y = &self.response.column;
        let holds = |c: &str| scopes.iter().any(|s| s.iter().any(|a| a == y) && s.iter().any(|a| a == c));
        if self.terms.is_empty() {
            return if holds(y) { vec![] } else { vec![y.clone()] };
        }
        self.terms.iter().filter(|t| !holds(t)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Formula {
        Formula::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn a_term_is_unmodelled_unless_one_scope_holds_it_with_the_response() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let scopes = vec![s(&["age", "income"]), s(&["race", "sex", "income"]), s(&["race", "hours"])];
        // hours meets race, and race meets income, but no scope holds hours with income.
        assert_eq!(f("income ~ age + race + sex + hours").unmodelled(&scopes), s(&["hours"]));
        assert_eq!(f("income == '>50K' ~ sex").unmodelled(&scopes), s(&[]));
        assert_eq!(f("hours ~ race + age").unmodelled(&scopes), s(&["age"]));
        // Intercept-only (a mean or a proportion): the response must be in some scope.
        assert_eq!(f("hours ~ 1").unmodelled(&scopes), s(&[]));
        assert_eq!(f("gain ~ 1").unmodelled(&scopes), s(&["gain"]));
        assert_eq!(f("income ~ age").unmodelled(&[]), s(&["age"]));
    }

    #[test]
    fn terms_intercepts_and_responses_parse_as_r_and_statsmodels_read_them() {
        let a = f("y ~ a + b");
        assert_eq!(
            (a.response.column.as_str(), a.terms.clone(), a.intercept),
            ("y", vec!["a".into(), "b".into()], true)
        );
        assert!(!f("y ~ a - 1").intercept);
        assert!(!f("y ~ 0 + a").intercept);
        assert!(!f("y ~ a + 0").intercept);
        assert!(f("y ~ 1 + a").intercept);
        assert!(f("y ~ 1").terms.is_empty());
        let b = f("income == '>50K' ~ age + `marital status` + sex");
        assert_eq!(b.response.equals.as_deref(), Some(">50K"));
        assert_eq!(b.terms, vec!["age", "marital status", "sex"]);
        assert_eq!(f("y == 1 ~ x").response.equals.as_deref(), Some("1"));
        assert_eq!(f("y ~ x").columns(), vec!["y", "x"]);
    }

    #[test]
    fn bad_formulas_say_what_is_wrong() {
        for (s, want) in [
            ("y a + b", "no `~`"),
            ("y ~ a ~ b", "more than one"),
            (" ~ a", "response"),
            ("y ~ ", "no terms"),
            ("y ~ a + a", "repeated"),
            ("y ~ y", "both the response"),
            ("y ~ a +", "ends with"),
            ("y ~ a - b", "not supported"),
            ("y ~ a * b", "`*`"),
            ("y ~ a b", "joined by `+`"),
            ("y = 1 ~ a", "`==`"),
            ("y ~ 'a", "not closed"),
            ("y ~ 0", "neither"),
        ] {
            let e = Formula::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
