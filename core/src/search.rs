//! Run attributes and the run search language.
//!
//! A body labels its run with [`attributes`](crate::RunRecord::attributes) through
//! [`WorkflowCtx::set_attributes`](crate::engine::WorkflowCtx::set_attributes), journaled as
//! [`Event::AttributesSet`](crate::Event::AttributesSet). Every store keeps the run's current
//! attributes in its record and indexes them by `(key, value)`.
//!
//! A [`RunSearch`] (`eve runs list --query`, `GET /v1/runs?query=`) selects runs by their input
//! and attributes:
//!
//! ```text
//! input.service = "api" and attr.region = "eu" and attr.cost >= 10
//! ```
//!
//! - paths: `input.<field>.<field>…` (a JSON path into the run's input object) and
//!   `attr.<key>`;
//! - operators: `=`, `!=`, `<`, `<=`, `>`, `>=`;
//! - values: JSON literals: a quoted string, a number, `true`, `false`;
//! - predicates joined by `and` (all must hold).
//!
//! Numbers compare numerically (`1` equals `1.0`), strings lexicographically by bytes, booleans
//! only with `=` and `!=`. A predicate whose path is absent or holds a value of another type
//! does not match, whatever the operator (`!=` included).

use crate::error::StoreError;
use serde_json::{Number, Value};
use std::collections::BTreeMap;
use std::fmt;

/// A run's attributes: key → string, number or boolean.
pub type Attributes = BTreeMap<String, Value>;

/// At most this many attributes per run (and per `set_attributes` call).
pub const MAX_ATTRIBUTES: usize = 32;
/// At most this many bytes per attribute key.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 64;
/// At most this many bytes per attribute value (a string's UTF-8 bytes, a number's text).
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 256;

/// Why a [`WorkflowCtx::set_attributes`](crate::engine::WorkflowCtx::set_attributes) patch was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttributeError {
    /// The patch is not a JSON object (or does not serialize).
    #[error("attributes must be a JSON object of key → string, number, boolean or null: {0}")]
    NotAnObject(String),
    /// A key is empty, too long or uses other characters than letters, digits, `_` and `-`.
    #[error("attribute key {key:?}: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value is an object or an array, or is too long.
    #[error("attribute {key:?}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// The run would hold more than [`MAX_ATTRIBUTES`] attributes.
    #[error("a run holds at most {limit} attributes; this patch would leave {count}: remove some with null")]
    TooMany {
        /// How many the run would hold.
        count: usize,
        /// [`MAX_ATTRIBUTES`].
        limit: usize,
    },
}

impl From<AttributeError> for StoreError {
    fn from(e: AttributeError) -> Self {
        StoreError::InvalidInput(e.to_string())
    }
}

/// One patch: `(key, Some(value))` sets, `(key, None)` removes. Keys in the object's order
/// (sorted: serde_json's map is a `BTreeMap`).
pub type AttributePatch = Vec<(String, Option<Value>)>;

fn check_key(key: &str) -> Result<(), AttributeError> {
    let bad = |reason: &str| AttributeError::InvalidKey {
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    if key.is_empty() {
        return Err(bad("must not be empty"));
    }
    if key.len() > MAX_ATTRIBUTE_KEY_BYTES {
        return Err(bad(&format!("longer than {MAX_ATTRIBUTE_KEY_BYTES} bytes")));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(bad(
            "use only ASCII letters, digits, '_' and '-' (so that `attr.<key>` names it in a query)",
        ));
    }
    Ok(())
}

/// A number in its canonical form: integral values within ±2^53 become integers (so `10.0` and
/// `10` are the same attribute value and index entry), others stay as they are.
pub fn canonical_number(n: &Number) -> Number {
    if n.is_i64() || n.is_u64() {
        return n.clone();
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => Number::from(f as i64),
        _ => n.clone(),
    }
}

/// Checks a patch (a JSON object of key → string, number, boolean, or `null` to remove) and
/// returns it with numbers in [canonical form](canonical_number).
///
/// # Errors
/// [`AttributeError`] naming the key and what is wrong.
pub fn parse_patch(patch: &Value) -> Result<AttributePatch, AttributeError> {
    let Value::Object(map) = patch else {
        return Err(AttributeError::NotAnObject(format!(
            "got {}",
            type_name(patch)
        )));
    };
    if map.len() > MAX_ATTRIBUTES {
        return Err(AttributeError::TooMany {
            count: map.len(),
            limit: MAX_ATTRIBUTES,
        });
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        check_key(k)?;
        let bad = |reason: String| AttributeError::InvalidValue {
            key: k.clone(),
            reason,
        };
        let v = match v {
            Value::Null => None,
            Value::Bool(_) => Some(v.clone()),
            Value::Number(n) => {
                let n = canonical_number(n);
                if n.to_string().len() > MAX_ATTRIBUTE_VALUE_BYTES {
                    return Err(bad(format!(
                        "longer than {MAX_ATTRIBUTE_VALUE_BYTES} bytes"
                    )));
                }
                Some(Value::Number(n))
            }
            Value::String(s) => {
                if s.len() > MAX_ATTRIBUTE_VALUE_BYTES {
                    return Err(bad(format!(
                        "a string of {} bytes, longer than {MAX_ATTRIBUTE_VALUE_BYTES}",
                        s.len()
                    )));
                }
                Some(v.clone())
            }
            Value::Array(_) | Value::Object(_) => {
                return Err(bad(format!(
                    "is {}: values are strings, numbers or booleans (null removes the key)",
                    type_name(v)
                )))
            }
        };
        out.push((k.clone(), v));
    }
    Ok(out)
}

/// Applies a patch: set keys overwrite, `None` removes.
pub fn apply_patch(attrs: &mut Attributes, patch: &AttributePatch) {
    for (k, v) in patch {
        match v {
            Some(v) => {
                attrs.insert(k.clone(), v.clone());
            }
            None => {
                attrs.remove(k);
            }
        }
    }
}

/// The text an index stores for a (canonical) attribute value: its compact JSON, so `"1"` and
/// `1` differ and `10.0` is `10`.
pub fn index_value(v: &Value) -> String {
    match v {
        Value::Number(n) => canonical_number(n).to_string(),
        other => other.to_string(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What a predicate looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchPath {
    /// A JSON path into the run's input (field names).
    Input(Vec<String>),
    /// An attribute.
    Attr(String),
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// One `path op value` of a [`RunSearch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Predicate {
    /// What it looks at.
    pub path: SearchPath,
    /// How it compares.
    pub op: CmpOp,
    /// With what (a string, a canonical number or a boolean).
    pub value: Value,
}

impl Predicate {
    /// Whether `found` (the value at the path, if any) satisfies the predicate. Absent values
    /// and values of another type never match.
    pub fn holds(&self, found: Option<&Value>) -> bool {
        use std::cmp::Ordering;
        let Some(found) = found else { return false };
        let ord: Option<Ordering> = match (found, &self.value) {
            (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) => a.partial_cmp(&b),
                _ => None,
            },
            (Value::String(a), Value::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
            (Value::Bool(a), Value::Bool(b)) => match self.op {
                CmpOp::Eq | CmpOp::Ne => Some(a.cmp(b)),
                _ => None,
            },
            _ => None,
        };
        let Some(ord) = ord else { return false };
        match self.op {
            CmpOp::Eq => ord == Ordering::Equal,
            CmpOp::Ne => ord != Ordering::Equal,
            CmpOp::Lt => ord == Ordering::Less,
            CmpOp::Le => ord != Ordering::Greater,
            CmpOp::Gt => ord == Ordering::Greater,
            CmpOp::Ge => ord != Ordering::Less,
        }
    }
}

/// A parsed run search: predicates that must all hold (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSearch {
    text: String,
    predicates: Vec<Predicate>,
}

impl fmt::Display for RunSearch {
    /// The text it was parsed from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for RunSearch {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, StoreError> {
        RunSearch::parse(s)
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    Word(String),
    Op(CmpOp),
    Lit(Value),
}

impl RunSearch {
    /// Parses a search.
    ///
    /// # Errors
    /// `InvalidInput` naming the offending token and its byte offset.
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        let toks = tokenize(text)?;
        if toks.is_empty() {
            return Err(bad(
                text,
                0,
                "an empty query; write e.g. attr.region = \"eu\"",
            ));
        }
        let mut predicates = Vec::new();
        let mut i = 0;
        loop {
            // path
            let (at, path) = match toks.get(i) {
                Some((at, Tok::Word(w))) => (*at, parse_path(text, *at, w)?),
                Some((at, t)) => {
                    return Err(bad(
                        text,
                        *at,
                        &format!("expected a path (input.… or attr.…), found {}", show(t)),
                    ))
                }
                None => {
                    return Err(bad(
                        text,
                        text.len(),
                        "the query ends after `and`; expected a path",
                    ))
                }
            };
            let _ = at;
            let op = match toks.get(i + 1) {
                Some((_, Tok::Op(op))) => *op,
                Some((at, t)) => {
                    return Err(bad(
                        text,
                        *at,
                        &format!(
                            "expected an operator (=, !=, <, <=, >, >=), found {}",
                            show(t)
                        ),
                    ))
                }
                None => {
                    return Err(bad(
                        text,
                        text.len(),
                        "the query ends after a path; expected an operator",
                    ))
                }
            };
            let value = match toks.get(i + 2) {
                Some((_, Tok::Lit(v))) => v.clone(),
                Some((at, t)) => {
                    return Err(bad(
                        text,
                        *at,
                        &format!(
                            "expected a value (a quoted string, a number, true or false), found {}",
                            show(t)
                        ),
                    ))
                }
                None => {
                    return Err(bad(
                        text,
                        text.len(),
                        "the query ends after an operator; expected a value",
                    ))
                }
            };
            predicates.push(Predicate { path, op, value });
            match toks.get(i + 3) {
                None => break,
                Some((_, Tok::Word(w))) if w.eq_ignore_ascii_case("and") => i += 4,
                Some((at, t)) => {
                    return Err(bad(
                        text,
                        *at,
                        &format!("expected `and` or the end, found {}", show(t)),
                    ))
                }
            }
        }
        Ok(RunSearch {
            text: text.to_owned(),
            predicates,
        })
    }

    /// Its predicates, in the order written.
    pub fn predicates(&self) -> &[Predicate] {
        &self.predicates
    }

    /// Whether a predicate looks at the input (so the run's input must be read to evaluate it).
    pub fn needs_input(&self) -> bool {
        self.predicates
            .iter()
            .any(|p| matches!(p.path, SearchPath::Input(_)))
    }

    /// The first `attr.<key> = value` predicate, which a store's `(key, value)` index can
    /// answer ([`crate::RunQuery::attribute`]).
    pub fn attr_equality(&self) -> Option<(String, Value)> {
        self.predicates.iter().find_map(|p| match (&p.path, p.op) {
            (SearchPath::Attr(k), CmpOp::Eq) => Some((k.clone(), p.value.clone())),
            _ => None,
        })
    }

    /// Whether every attribute predicate holds for `attrs` (input predicates are ignored).
    pub fn matches_attributes(&self, attrs: &Attributes) -> bool {
        self.predicates.iter().all(|p| match &p.path {
            SearchPath::Attr(k) => p.holds(attrs.get(k)),
            SearchPath::Input(_) => true,
        })
    }

    /// Whether every input predicate holds for `input` (attribute predicates are ignored).
    pub fn matches_input(&self, input: &Value) -> bool {
        self.predicates.iter().all(|p| match &p.path {
            SearchPath::Input(path) => {
                let found = path.iter().try_fold(input, |v, f| v.get(f.as_str()));
                p.holds(found)
            }
            SearchPath::Attr(_) => true,
        })
    }

    /// Whether every predicate holds.
    pub fn matches(&self, attrs: &Attributes, input: &Value) -> bool {
        self.matches_attributes(attrs) && self.matches_input(input)
    }
}

fn bad(text: &str, at: usize, what: &str) -> StoreError {
    StoreError::InvalidInput(format!("invalid query at byte {at} of {text:?}: {what}"))
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Word(w) => format!("`{w}`"),
        Tok::Op(op) => format!("operator `{}`", op_text(*op)),
        Tok::Lit(v) => format!("value {v}"),
    }
}

fn op_text(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "=",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    }
}

fn parse_path(text: &str, at: usize, w: &str) -> Result<SearchPath, StoreError> {
    if matches!(w, "true" | "false") {
        return Err(bad(text, at, &format!("expected a path, found value {w}")));
    }
    let mut parts = w.split('.');
    let root = parts.next().unwrap_or_default();
    let rest: Vec<String> = parts.map(str::to_owned).collect();
    if rest.iter().any(String::is_empty) {
        return Err(bad(text, at, &format!("`{w}` has an empty field name")));
    }
    match root {
        "input" if !rest.is_empty() => Ok(SearchPath::Input(rest)),
        "attr" if rest.len() == 1 => {
            check_key(&rest[0]).map_err(|e| bad(text, at, &e.to_string()))?;
            Ok(SearchPath::Attr(rest[0].clone()))
        }
        "attr" => Err(bad(
            text,
            at,
            &format!("`{w}`: write attr.<key> (attributes are flat)"),
        )),
        _ => Err(bad(
            text,
            at,
            &format!("unknown path `{w}`; paths start with input. or attr."),
        )),
    }
}

fn tokenize(text: &str) -> Result<Vec<(usize, Tok)>, StoreError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        match c {
            b'=' => {
                out.push((start, Tok::Op(CmpOp::Eq)));
                i += if b.get(i + 1) == Some(&b'=') { 2 } else { 1 };
            }
            b'!' if b.get(i + 1) == Some(&b'=') => {
                out.push((start, Tok::Op(CmpOp::Ne)));
                i += 2;
            }
            b'<' | b'>' => {
                let eq = b.get(i + 1) == Some(&b'=');
                let op = match (c, eq) {
                    (b'<', false) => CmpOp::Lt,
                    (b'<', true) => CmpOp::Le,
                    (_, false) => CmpOp::Gt,
                    (_, true) => CmpOp::Ge,
                };
                out.push((start, Tok::Op(op)));
                i += if eq { 2 } else { 1 };
            }
            b'"' => {
                // A JSON string: find the closing quote, honouring escapes.
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                if j >= b.len() {
                    return Err(bad(text, start, "a string that is never closed"));
                }
                let lit = &text[i..=j];
                let v: Value = serde_json::from_str(lit)
                    .map_err(|e| bad(text, start, &format!("bad string {lit}: {e}")))?;
                out.push((start, Tok::Lit(v)));
                i = j + 1;
            }
            b'-' | b'0'..=b'9' => {
                let mut j = i + 1;
                while j < b.len() && matches!(b[j], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    j += 1;
                }
                let lit = &text[i..j];
                let v: Value = serde_json::from_str(lit)
                    .map_err(|_| bad(text, start, &format!("`{lit}` is not a JSON number")))?;
                let Value::Number(n) = v else {
                    return Err(bad(text, start, &format!("`{lit}` is not a JSON number")));
                };
                out.push((start, Tok::Lit(Value::Number(canonical_number(&n)))));
                i = j;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let mut j = i + 1;
                while j < b.len()
                    && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'_' | b'-' | b'.'))
                {
                    j += 1;
                }
                let w = &text[i..j];
                match w {
                    "true" => out.push((start, Tok::Lit(Value::Bool(true)))),
                    "false" => out.push((start, Tok::Lit(Value::Bool(false)))),
                    "null" => {
                        return Err(bad(
                            text,
                            start,
                            "null is not a value to compare with; values are strings, numbers, true or false",
                        ))
                    }
                    _ => out.push((start, Tok::Word(w.to_owned()))),
                }
                i = j;
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(bad(text, start, &format!("unexpected character {ch:?}")));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_and_matches() {
        let q =
            RunSearch::parse(r#"input.service = "api" and attr.region = "eu" and attr.cost >= 10"#)
                .unwrap();
        assert_eq!(q.predicates().len(), 3);
        assert_eq!(q.attr_equality(), Some(("region".into(), json!("eu"))));
        let attrs: Attributes = [
            ("region".to_owned(), json!("eu")),
            ("cost".to_owned(), json!(12.5)),
        ]
        .into_iter()
        .collect();
        assert!(q.matches(&attrs, &json!({"service": "api"})));
        assert!(!q.matches(&attrs, &json!({"service": "web"})));
        assert!(!q.matches(&attrs, &json!({})));
        let q = RunSearch::parse("attr.cost < 10.0 AND input.a.b != \"x\"").unwrap();
        assert!(!q.matches(&attrs, &json!({"a": {"b": "y"}})));
        let q = RunSearch::parse("attr.cost = \"12.5\"").unwrap();
        assert!(
            !q.matches_attributes(&attrs),
            "a type mismatch does not match"
        );
        let q = RunSearch::parse("attr.cost != \"12.5\"").unwrap();
        assert!(!q.matches_attributes(&attrs), "not even with !=");
        let q = RunSearch::parse("input.n = 10.0").unwrap();
        assert!(q.matches_input(&json!({"n": 10})));
        let q = RunSearch::parse("input.ok = true and input.s > \"b\"").unwrap();
        assert!(q.matches_input(&json!({"ok": true, "s": "c"})));
    }

    #[test]
    fn refuses_bad_queries_naming_the_token() {
        for (q, needle) in [
            ("", "empty"),
            ("region = \"eu\"", "unknown path `region`"),
            ("attr.region \"eu\"", "expected an operator"),
            ("attr.region = eu", "expected a value"),
            ("attr.region = \"eu\" or attr.x = 1", "expected `and`"),
            ("attr.region = \"eu\" and", "ends after `and`"),
            ("attr.a.b = 1", "attributes are flat"),
            ("attr.x = \"open", "never closed"),
            ("attr.x = [1]", "unexpected character '['"),
            ("attr.x = null", "null is not a value"),
        ] {
            let e = RunSearch::parse(q).unwrap_err();
            assert!(matches!(e, StoreError::InvalidInput(_)), "{q}: {e}");
            assert!(e.to_string().contains(needle), "{q}: {e}");
        }
        let e = RunSearch::parse("attr.a = 1 and x < 2").unwrap_err();
        assert!(e.to_string().contains("at byte 15"), "{e}");
    }

    #[test]
    fn patches_are_checked_and_merged() {
        let p = parse_patch(&json!({"region": "eu", "cost": 10.0, "gone": null})).unwrap();
        let mut attrs = Attributes::new();
        attrs.insert("gone".into(), json!(1));
        apply_patch(&mut attrs, &p);
        assert_eq!(
            serde_json::to_value(&attrs).unwrap(),
            json!({"region": "eu", "cost": 10})
        );
        assert_eq!(index_value(&json!(10)), "10");
        assert_eq!(index_value(&json!("10")), "\"10\"");
        assert!(matches!(
            parse_patch(&json!({"a": {"b": 1}})),
            Err(AttributeError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse_patch(&json!({"a": [1]})),
            Err(AttributeError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse_patch(&json!({"a b": 1})),
            Err(AttributeError::InvalidKey { .. })
        ));
        assert!(matches!(
            parse_patch(&json!([1])),
            Err(AttributeError::NotAnObject(_))
        ));
        assert!(matches!(
            parse_patch(&json!({"a": "x".repeat(MAX_ATTRIBUTE_VALUE_BYTES + 1)})),
            Err(AttributeError::InvalidValue { .. })
        ));
    }
}
