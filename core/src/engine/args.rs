//! Tool arguments checked against a tool's input type, with errors that name the field.
//!
//! [`check`] deserializes the arguments as the input type (exactly what the body will get, so
//! nothing the type accepts is refused and nothing it refuses is let through) and, when that
//! fails, says where and what in one line:
//!
//! - a wrong type: `amount: expected a number, got the string "ten"`;
//! - a value out of range: `retries: expected an integer from 0 to 255, got the number 300`;
//! - a value not offered: `priority: expected one of "low", "normal", "high", got the string
//!   "urgent"`;
//! - a missing field: `order_id: missing; the arguments must have it`;
//! - an unknown field (an input type that denies them): `colour: not a field of these
//!   arguments (expected one of "color", "size")`;
//! - the root: `the arguments must be a JSON object, got an array`, and any other error of the
//!   whole input `at the root: …`.
//!
//! Paths are written `items[2].name`: object keys joined by `.`, array indexes in brackets.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Checks that `args` is a JSON object that `I` deserializes from.
///
/// # Errors
/// One line naming the field path and what is wrong with it (see the module docs).
pub(crate) fn check<I: DeserializeOwned>(args: &Value) -> Result<(), String> {
    if !args.is_object() {
        return Err(format!(
            "the arguments must be a JSON object, got {}",
            describe(args)
        ));
    }
    serde_path_to_error::deserialize::<_, I>(args)
        .map(drop)
        .map_err(|e| explain(args, e.path(), &e.inner().to_string()))
}

/// The one-line explanation of serde's `message` about the value at `path` of `args`.
fn explain(args: &Value, path: &serde_path_to_error::Path, message: &str) -> String {
    let segments = segments(path);
    // A missing or unknown field is reported at the object that holds it.
    if let Some(field) = quoted_after(message, "missing field ") {
        let at = join(&segments, &field);
        return format!("{at}: missing; the arguments must have it");
    }
    if let Some(field) = quoted_after(message, "unknown field ") {
        // The path already ends at the unknown key.
        let at = match segments.last() {
            Some(Step::Key(k)) if *k == field => render(&segments),
            _ => join(&segments, &field),
        };
        let expected = message
            .split_once(", expected ")
            .map(|(_, e)| format!(" (expected {})", quote_names(e)))
            .unwrap_or_default();
        return format!("{at}: not a field of these arguments{expected}");
    }
    let found = lookup(args, &segments);
    let got = found.map(describe);
    let what = if let Some(rest) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
    {
        let expected = rest.split_once(", expected ").map(|(_, e)| e);
        match (expected, &got) {
            (Some(e), Some(got)) => format!("expected {}, got {got}", expected_phrase(e)),
            (Some(e), None) => format!("expected {}, got {}", expected_phrase(e), rest),
            (None, _) => message.to_owned(),
        }
    } else if let Some(rest) = message.strip_prefix("unknown variant ") {
        // serde lists the variants as "one of `a`, `b`, `c`", "`a` or `b`" or "`a`".
        let expected = rest
            .split_once(", expected ")
            .map(|(_, e)| quote_names(e))
            .unwrap_or_else(|| "one of the values the input schema lists".into());
        let got = got.unwrap_or_else(|| rest.split(',').next().unwrap_or(rest).to_owned());
        format!("expected {expected}, got {got}")
    } else if let Some(rest) = message.strip_prefix("invalid length ") {
        match rest.split_once(", expected ") {
            Some((n, e)) => format!("expected {e}, got {n} items"),
            None => message.to_owned(),
        }
    } else {
        message.to_owned()
    };
    if segments.is_empty() {
        format!("at the root: {what}")
    } else {
        format!("{}: {what}", render(&segments))
    }
}

/// A step of a path into the arguments.
enum Step {
    Key(String),
    Index(usize),
}

fn segments(path: &serde_path_to_error::Path) -> Vec<Step> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(Step::Index(*index)),
            Segment::Map { key } => Some(Step::Key(key.clone())),
            Segment::Enum { variant } => Some(Step::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// `items[2].name`; the root is empty.
fn render(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        match s {
            Step::Key(k) if out.is_empty() => out.push_str(k),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The path of `field` inside the object at `steps`.
fn join(steps: &[Step], field: &str) -> String {
    let parent = render(steps);
    if parent.is_empty() {
        field.to_owned()
    } else {
        format!("{parent}.{field}")
    }
}

/// The value at `steps` of `args`, if it is there.
fn lookup<'a>(args: &'a Value, steps: &[Step]) -> Option<&'a Value> {
    steps.iter().try_fold(args, |v, s| match s {
        Step::Key(k) => v.get(k.as_str()),
        Step::Index(i) => v.get(*i),
    })
}

/// The text between the backquotes after `prefix` at the start of `message`.
fn quoted_after(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?.strip_prefix('`')?;
    rest.split_once('`').map(|(name, _)| name.to_owned())
}

/// serde's `` `a`, `b` `` as `"a", "b"`.
fn quote_names(list: &str) -> String {
    list.replace('`', "\"")
}

/// What serde says it expected, in words for a model: `f64` is a number, `u8` an integer
/// from 0 to 255, `struct Input` an object, and so on.
fn expected_phrase(expected: &str) -> String {
    let range = |lo: i128, hi: i128| format!("an integer from {lo} to {hi}");
    match expected {
        "f32" | "f64" => "a number".into(),
        "u8" => range(0, u8::MAX.into()),
        "u16" => range(0, u16::MAX.into()),
        "u32" => range(0, u32::MAX.into()),
        "u64" | "u128" | "usize" => "an integer of 0 or more".into(),
        "i8" => range(i8::MIN.into(), i8::MAX.into()),
        "i16" => range(i16::MIN.into(), i16::MAX.into()),
        "i32" => range(i32::MIN.into(), i32::MAX.into()),
        "i64" | "i128" | "isize" => "an integer".into(),
        "a borrowed string" => "a string".into(),
        "a character" | "a char" => "a string of one character".into(),
        "a sequence" => "an array".into(),
        "a map" => "an object".into(),
        "unit" => "null".into(),
        e if e.starts_with("struct ") || e.starts_with("map") => "an object".into(),
        e if e.starts_with("tuple") || e.starts_with("a tuple") => {
            format!("an array ({e})")
        }
        // serde_json's word for an enum given neither a variant name nor a tagged object.
        "string or map" => "one of the values the input schema lists".into(),
        e if e.starts_with("enum ") => "one of the values the input schema lists".into(),
        e => quote_names(e),
    }
}

/// A JSON value in words: `null`, `the boolean true`, `the number 5`, `the string "ten"`
/// (long strings cut), `an array`, `an object`.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => {
            const MAX: usize = 60;
            if s.chars().count() > MAX {
                let cut: String = s.chars().take(MAX).collect();
                format!("the string {:?}…", cut)
            } else {
                format!("the string {s:?}")
            }
        }
        Value::Array(a) if a.is_empty() => "an empty array".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde::Deserialize;
    use serde_json::json;

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Refund {
        order_id: String,
        amount: f64,
        #[serde(default)]
        retries: u8,
        #[serde(default)]
        priority: Option<Priority>,
        #[serde(default)]
        items: Vec<Item>,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Priority {
        Low,
        Normal,
        High,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Toggle {
        mode: Mode,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        On,
        Off,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Item {
        sku: String,
        count: u32,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        color: String,
    }

    fn err(args: serde_json::Value) -> String {
        check::<Refund>(&args).unwrap_err()
    }

    #[test]
    fn a_wrong_type_names_the_field() {
        assert_eq!(
            err(json!({"order_id": "o1", "amount": "ten"})),
            r#"amount: expected a number, got the string "ten""#
        );
        assert_eq!(
            err(json!({"order_id": 7, "amount": 1.0})),
            "order_id: expected a string, got the number 7"
        );
        assert_eq!(
            err(json!({"order_id": "o1", "amount": null})),
            "amount: expected a number, got null"
        );
    }

    #[test]
    fn a_value_out_of_range_names_the_field() {
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "retries": 300})),
            "retries: expected an integer from 0 to 255, got the number 300"
        );
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "retries": -1})),
            "retries: expected an integer from 0 to 255, got the number -1"
        );
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "retries": 1.5})),
            "retries: expected an integer from 0 to 255, got the number 1.5"
        );
    }

    #[test]
    fn a_value_not_offered_names_the_field() {
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "priority": "urgent"})),
            r#"priority: expected one of "low", "normal", "high", got the string "urgent""#
        );
        assert_eq!(
            check::<Toggle>(&json!({"mode": "auto"})).unwrap_err(),
            r#"mode: expected "on" or "off", got the string "auto""#
        );
        assert_eq!(
            check::<Toggle>(&json!({"mode": 1})).unwrap_err(),
            "mode: expected one of the values the input schema lists, got the number 1"
        );
    }

    #[test]
    fn nested_paths_are_written_with_dots_and_brackets() {
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "items": [
                {"sku": "a", "count": 1},
                {"sku": "b", "count": "two"}
            ]})),
            r#"items[1].count: expected an integer from 0 to 4294967295, got the string "two""#
        );
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "items": [{"count": 1}]})),
            "items[0].sku: missing; the arguments must have it"
        );
        assert_eq!(
            err(json!({"order_id": "o1", "amount": 1, "items": {"sku": "a"}})),
            "items: expected an array, got an object"
        );
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        assert_eq!(
            err(json!({"amount": 1})),
            "order_id: missing; the arguments must have it"
        );
        assert_eq!(
            check::<Strict>(&json!({"colour": "red"})).unwrap_err(),
            r#"colour: not a field of these arguments (expected "color")"#
        );
        assert_eq!(
            err(
                json!({"order_id": "o1", "amount": 1, "items": [{"sku": "a", "count": 1, "size": 2}]})
            ),
            r#"items[0].size: not a field of these arguments (expected "sku" or "count")"#
        );
    }

    #[test]
    fn the_root_says_so() {
        assert_eq!(
            err(json!(["o1", 1])),
            "the arguments must be a JSON object, got an array"
        );
        assert_eq!(
            err(json!("o1")),
            r#"the arguments must be a JSON object, got the string "o1""#
        );
        assert_eq!(
            err(json!(null)),
            "the arguments must be a JSON object, got null"
        );

        /// An input type that refuses the whole object.
        #[derive(Debug)]
        struct Never;
        impl<'de> Deserialize<'de> for Never {
            fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
                Err(serde::de::Error::custom("these arguments are never right"))
            }
        }
        assert_eq!(
            check::<Never>(&json!({})).unwrap_err(),
            "at the root: these arguments are never right"
        );
    }

    #[test]
    fn valid_arguments_pass() {
        assert!(check::<Refund>(&json!({"order_id": "o1", "amount": 10})).is_ok());
        assert!(check::<Refund>(
            &json!({"order_id": "o1", "amount": 2.5, "retries": 3, "priority": "high", "items": [{"sku": "a", "count": 2}]})
        )
        .is_ok());
    }
}
