//! One casing for every response: [`Camel`] serializes a value with every struct field name in
//! camelCase (`run_id` → `runId`), whatever the type's own serde form.
//!
//! Types of eve-core keep their snake_case serde form because stores persist it (the journal's
//! events, session log entries); the API renames at its edge instead. Only the names of Rust
//! struct fields are renamed: map keys (a `serde_json::Value` object, a `BTreeMap`), enum
//! variant names and string values (`not_found`, `already_requested`) pass through as they are,
//! and so do payloads, which are raw JSON (`serde_json::value::RawValue`): a tool's input or
//! output keeps the keys its author chose.

use serde::ser::{self, Serialize, Serializer};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The struct name serde_json gives a raw JSON value (`RawValue`'s `Serialize` writes a struct of
/// this name with one field of the same name); its field must reach serde_json unrenamed.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// `T`, serialized with camelCase struct field names (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Camel<T>(pub(crate) T);

impl<T: Serialize> Serialize for Camel<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(CamelSerializer(s))
    }
}

/// `name` in camelCase: `next_seq` → `nextSeq`; names without `_` are returned as they are.
///
/// Struct field names are `&'static str` and few (the fields of the types the API sends), so
/// each renamed one is made once and kept for the life of the process.
pub(crate) fn camel_name(name: &'static str) -> &'static str {
    if !name.contains('_') {
        return name;
    }
    static NAMES: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    names
        .entry(name)
        .or_insert_with(|| Box::leak(to_camel(name).into_boxed_str()))
}

/// `name` in camelCase, as [`camel_name`] renames it (`next_seq` → `nextSeq`), made anew: for
/// names that are not `&'static` (the OpenAPI description renames eve-core's schema properties
/// with it, so the description and the wire agree by construction).
pub(crate) fn to_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = !out.is_empty();
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Forwards everything to `S`, wrapping each nested value in [`Camel`] and renaming struct
/// fields.
struct CamelSerializer<S>(S);

/// A compound serializer of `S` whose elements are wrapped in [`Camel`].
struct Wrap<T>(T);

/// A struct serializer of `S` that renames its fields, unless it is serde_json's raw value.
struct Struct<T> {
    inner: T,
    raw: bool,
}

macro_rules! forward {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, v: $ty) -> Result<S::Ok, S::Error> {
            self.0.$method(v)
        })*
    };
}

impl<S: Serializer> Serializer for CamelSerializer<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Wrap<S::SerializeSeq>;
    type SerializeTuple = Wrap<S::SerializeTuple>;
    type SerializeTupleStruct = Wrap<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Wrap<S::SerializeTupleVariant>;
    type SerializeMap = Wrap<S::SerializeMap>;
    type SerializeStruct = Struct<S::SerializeStruct>;
    type SerializeStructVariant = Wrap<S::SerializeStructVariant>;

    forward!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );

    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_none()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Camel(v))
    }

    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_variant(name, index, variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        v: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Camel(v))
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0
            .serialize_newtype_variant(name, index, variant, &Camel(v))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.0.serialize_seq(len).map(Wrap)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(Wrap)
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(Wrap)
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0
            .serialize_tuple_variant(name, index, variant, len)
            .map(Wrap)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(Wrap)
    }

    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        Ok(Struct {
            inner: self.0.serialize_struct(name, len)?,
            raw: name == RAW_VALUE_TOKEN,
        })
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.0
            .serialize_struct_variant(name, index, variant, len)
            .map(Wrap)
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! wrap_elements {
    ($($trait:ident :: $method:ident),* $(,)?) => {
        $(impl<T: ser::$trait> ser::$trait for Wrap<T> {
            type Ok = T::Ok;
            type Error = T::Error;

            fn $method<V: ?Sized + Serialize>(&mut self, v: &V) -> Result<(), T::Error> {
                self.0.$method(&Camel(v))
            }

            fn end(self) -> Result<T::Ok, T::Error> {
                self.0.end()
            }
        })*
    };
}

wrap_elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

impl<T: ser::SerializeMap> ser::SerializeMap for Wrap<T> {
    type Ok = T::Ok;
    type Error = T::Error;

    /// Map keys are data (ids, header names, a payload's keys): never renamed.
    fn serialize_key<K: ?Sized + Serialize>(&mut self, key: &K) -> Result<(), T::Error> {
        self.0.serialize_key(key)
    }

    fn serialize_value<V: ?Sized + Serialize>(&mut self, v: &V) -> Result<(), T::Error> {
        self.0.serialize_value(&Camel(v))
    }

    fn end(self) -> Result<T::Ok, T::Error> {
        self.0.end()
    }
}

impl<T: ser::SerializeStruct> ser::SerializeStruct for Struct<T> {
    type Ok = T::Ok;
    type Error = T::Error;

    fn serialize_field<V: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        v: &V,
    ) -> Result<(), T::Error> {
        if self.raw {
            self.inner.serialize_field(key, v)
        } else {
            self.inner.serialize_field(camel_name(key), &Camel(v))
        }
    }

    fn skip_field(&mut self, key: &'static str) -> Result<(), T::Error> {
        self.inner.skip_field(key)
    }

    fn end(self) -> Result<T::Ok, T::Error> {
        self.inner.end()
    }
}

impl<T: ser::SerializeStructVariant> ser::SerializeStructVariant for Wrap<T> {
    type Ok = T::Ok;
    type Error = T::Error;

    fn serialize_field<V: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        v: &V,
    ) -> Result<(), T::Error> {
        self.0.serialize_field(camel_name(key), &Camel(v))
    }

    fn skip_field(&mut self, key: &'static str) -> Result<(), T::Error> {
        self.0.skip_field(key)
    }

    fn end(self) -> Result<T::Ok, T::Error> {
        self.0.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::{
        CallId, Event, Execution, Payload, RunId, SessionEntry, SessionEvent, SessionId,
        StoredEvent, Timestamp,
    };
    use serde_json::json;

    #[test]
    fn names() {
        assert_eq!(camel_name("run_id"), "runId");
        assert_eq!(camel_name("cancel_requested"), "cancelRequested");
        assert_eq!(camel_name("a_b_c"), "aBC");
        assert_eq!(camel_name("status"), "status");
        assert_eq!(camel_name("already"), "already");
        assert_eq!(to_camel("_private"), "private");
    }

    #[test]
    fn fields_are_renamed_but_payloads_map_keys_and_values_are_not() {
        let input = Payload::from_json(r#"{"order_id":"A-1","nested":{"snake_key":[1]}}"#).unwrap();
        let e = StoredEvent {
            seq: 0,
            at: Timestamp(5),
            event: Event::RunStarted {
                workflow_id: "m::f".into(),
                deployment_id: "d".into(),
                tool: "refund_order".into(),
                input,
                session_id: SessionId::new("s_1"),
                call_id: CallId::new("c_1"),
                execution: Execution::Background,
                traceparent: None,
                reset_from: None,
            },
        };
        let v = serde_json::to_value(Camel(&e)).unwrap();
        assert_eq!(
            v,
            json!({"seq": 0, "at": 5, "event": {"RunStarted": {
                "workflowId": "m::f", "deploymentId": "d", "tool": "refund_order",
                "input": {"order_id": "A-1", "nested": {"snake_key": [1]}},
                "sessionId": "s_1", "callId": "c_1", "execution": "background"}}})
        );
        // The same bytes through serde_json's writer (the raw value is copied, not parsed).
        let text = serde_json::to_string(&Camel(&e)).unwrap();
        assert!(text.contains(r#""input":{"order_id":"A-1","nested":{"snake_key":[1]}}"#));

        let entry = SessionEntry {
            session_id: SessionId::new("s"),
            seq: 1,
            at: Timestamp(0),
            run_id: RunId::new("r"),
            call_id: CallId::new("c"),
            event: SessionEvent::InputAnswered {
                request_id: "q".into(),
                answered_by: Some("ops_key".into()),
            },
        };
        let v = serde_json::to_value(Camel(&entry)).unwrap();
        assert_eq!(
            v["event"],
            json!({"type": "input.answered", "data": {"requestId": "q", "answeredBy": "ops_key"}})
        );
        assert_eq!(v["sessionId"], "s");
        let map: std::collections::BTreeMap<&str, u8> = [("snake_key", 1)].into();
        assert_eq!(
            serde_json::to_value(Camel(json!({"a_b": map}))).unwrap(),
            json!({"a_b": {"snake_key": 1}})
        );
    }
}
