//! Reading the HTTP API's answers into eve-core's types.
//!
//! The API writes every struct field name in camelCase (`runId`, `nextSeq`; see eve-server's
//! "One dialect"), while eve-core's types keep the snake_case form stores persist. [`from_api`]
//! is the inverse of the server's renaming: it renames only the keys of objects read as a
//! struct (or a struct variant), and only to a field of that struct, so map keys and payloads
//! (raw JSON: a tool's input and output, a webhook's body) keep the keys their authors chose.

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde_json::{Map, Value};

/// The struct name serde_json gives a raw JSON value; its content is read as it is.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// `value`, an answer of the HTTP API, as a `T` of eve-core (see the module docs).
///
/// # Errors
/// When `value` is not a `T`.
pub fn from_api<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    T::deserialize(Snake(value))
}

/// `name` as the server's camelCase renaming writes it (`next_seq` → `nextSeq`).
fn camel(name: &str) -> String {
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

/// An object read as a struct of `fields`: each key renamed to the field it is the camelCase
/// form of (keys naming no field are left as they are, for the struct to refuse or ignore).
fn renamed(map: Map<String, Value>, fields: &'static [&'static str]) -> Map<String, Value> {
    map.into_iter()
        .map(|(k, v)| {
            let field = fields
                .iter()
                .find(|f| **f == k)
                .or_else(|| fields.iter().find(|f| camel(f) == k));
            (field.map_or(k, |f| (*f).to_owned()), v)
        })
        .collect()
}

/// A value of the API being read: its nested values are read the same way.
struct Snake(Value);

type Error = serde_json::Error;

impl<'de> de::Deserializer<'de> for Snake {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::new(map)),
            Value::Array(items) => visitor.visit_seq(Items(items.into_iter())),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::new(renamed(map, fields))),
            other => Snake(other).deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name == RAW_VALUE_TOKEN {
            // A payload: read as it is, its keys untouched.
            return self.0.deserialize_newtype_struct(name, visitor);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Snake(other)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(variant) => visitor.visit_enum(variant.into_deserializer()),
            Value::Object(map) if map.len() == 1 => {
                let (variant, content) = map.into_iter().next().expect("one entry");
                visitor.visit_enum(Variant { variant, content })
            }
            other => Err(de::Error::invalid_type(
                de::Unexpected::Other(&format!("{other}")),
                &"an enum: a string or an object of one key",
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// An object's entries, each value read as a [`Snake`].
struct Entries {
    entries: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl Entries {
    fn new(map: Map<String, Value>) -> Self {
        Self {
            entries: map.into_iter(),
            value: None,
        }
    }
}

impl<'de> de::MapAccess<'de> for Entries {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((k, v)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(v);
        seed.deserialize(Value::String(k)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value asked for before its key"))?;
        seed.deserialize(Snake(v))
    }
}

/// An array's items, each read as a [`Snake`].
struct Items(std::vec::IntoIter<Value>);

impl<'de> de::SeqAccess<'de> for Items {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Snake(v)))
            .transpose()
    }
}

/// An externally tagged enum's variant (`{"StepCompleted": {…}}`).
struct Variant {
    variant: String,
    content: Value,
}

impl<'de> de::EnumAccess<'de> for Variant {
    type Error = Error;
    type Variant = Snake;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Snake), Error> {
        let v = seed.deserialize(Value::String(self.variant))?;
        Ok((v, Snake(self.content)))
    }
}

impl<'de> de::VariantAccess<'de> for Snake {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eve_core::StoredEvent;

    #[test]
    fn renames_struct_fields_back_and_leaves_payloads_alone() {
        // What the server sends: struct field names in camelCase, payloads as their authors
        // wrote them (one key of each form here).
        let wire = serde_json::json!([
            {"seq": 1, "at": 5, "event": {"StepFailed": {
                "cmd": 0, "name": "n", "attempt": 1, "error": "e", "fatal": false, "retryAt": 9}}},
            {"seq": 2, "at": 6, "event": {"StepCompleted": {
                "cmd": 0, "name": "n", "attempt": 2, "output": {"service_name": 1, "nextSeq": 2}}}},
        ]);
        let got: Vec<StoredEvent> = from_api(wire).expect("reads");
        assert_eq!(
            serde_json::to_value(&got).expect("serializes"),
            serde_json::json!([
                {"seq": 1, "at": 5, "event": {"StepFailed": {
                    "cmd": 0, "name": "n", "attempt": 1, "error": "e", "fatal": false, "retry_at": 9}}},
                {"seq": 2, "at": 6, "event": {"StepCompleted": {
                    "cmd": 0, "name": "n", "attempt": 2, "output": {"service_name": 1, "nextSeq": 2}}}},
            ])
        );
    }
}
