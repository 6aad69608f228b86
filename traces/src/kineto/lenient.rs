//! Field types that accept whatever a profiler wrote: a value of the expected type becomes
//! `Some`, anything else is skipped (consumed without allocating) and becomes `None`, so one
//! odd event cannot fail the import of a million good ones.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON number as written: integers stay exact, fractions stay floats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Number {
    /// A non-negative integer.
    Unsigned(u64),
    /// A negative integer.
    Signed(i64),
    /// Anything with a fraction or exponent.
    Float(f64),
}

impl Number {
    /// As an unsigned integer (floats rounded; negative or non-finite values give `None`).
    pub(crate) fn as_u64(self) -> Option<u64> {
        match self {
            Number::Unsigned(value) => Some(value),
            Number::Signed(value) => u64::try_from(value).ok(),
            Number::Float(value) if (0.0..1.8e19).contains(&value) => Some(value.round() as u64),
            Number::Float(_) => None,
        }
    }

    /// As an identifier (thread ids are sometimes written as negative 32-bit numbers: keep
    /// their bit pattern).
    pub(crate) fn as_id(self) -> Option<u64> {
        match self {
            Number::Signed(value) => Some(value as u64),
            other => other.as_u64(),
        }
    }

    /// Microseconds (Chrome trace `ts` / `dur`) to integer nanoseconds.
    pub(crate) fn micros_to_nanos(self) -> Option<i64> {
        match self {
            Number::Unsigned(value) => i64::try_from(value).ok()?.checked_mul(1000),
            Number::Signed(value) => value.checked_mul(1000),
            Number::Float(value) if value.is_finite() && value.abs() < 9.2e15 => {
                Some((value * 1000.0).round() as i64)
            }
            Number::Float(_) => None,
        }
    }
}

/// Skips a map's remaining entries.
fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Skips a sequence's remaining elements.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// A number, or `None` for anything else (a numeric string counts as its number).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LenientNumber(pub Option<Number>);

impl<'de> Deserialize<'de> for LenientNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientNumber;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<LenientNumber, E> {
                Ok(LenientNumber(Some(Number::Unsigned(v))))
            }
            fn visit_i64<E>(self, v: i64) -> Result<LenientNumber, E> {
                Ok(LenientNumber(Some(if v >= 0 { Number::Unsigned(v as u64) } else { Number::Signed(v) })))
            }
            fn visit_f64<E>(self, v: f64) -> Result<LenientNumber, E> {
                Ok(LenientNumber(Some(Number::Float(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<LenientNumber, E> {
                let v = v.trim();
                Ok(LenientNumber(
                    v.parse::<u64>()
                        .map(Number::Unsigned)
                        .or_else(|_| v.parse::<i64>().map(Number::Signed))
                        .or_else(|_| v.parse::<f64>().map(Number::Float))
                        .ok(),
                ))
            }
            fn visit_bool<E>(self, _: bool) -> Result<LenientNumber, E> {
                Ok(LenientNumber(None))
            }
            fn visit_unit<E>(self) -> Result<LenientNumber, E> {
                Ok(LenientNumber(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<LenientNumber, A::Error> {
                drain_seq(seq).map(|()| LenientNumber(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LenientNumber, A::Error> {
                drain_map(map).map(|()| LenientNumber(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A string, or `None` for anything else.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LenientString(pub Option<String>);

impl<'de> Deserialize<'de> for LenientString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E>(self, v: &str) -> Result<LenientString, E> {
                Ok(LenientString(Some(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<LenientString, E> {
                Ok(LenientString(Some(v)))
            }
            fn visit_u64<E>(self, _: u64) -> Result<LenientString, E> {
                Ok(LenientString(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<LenientString, E> {
                Ok(LenientString(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<LenientString, E> {
                Ok(LenientString(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<LenientString, E> {
                Ok(LenientString(None))
            }
            fn visit_unit<E>(self) -> Result<LenientString, E> {
                Ok(LenientString(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<LenientString, A::Error> {
                drain_seq(seq).map(|()| LenientString(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LenientString, A::Error> {
                drain_map(map).map(|()| LenientString(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A JSON array of lenient values (`Input Dims`, `Input type`), or `None` for any other value
/// (skipped). Elements that are not what `T` expects become `T`'s own `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LenientList<T>(pub Option<Vec<T>>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for LenientList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = LenientList<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LenientList<T>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(LenientList(Some(items)))
            }
            fn visit_str<E>(self, _: &str) -> Result<LenientList<T>, E> {
                Ok(LenientList(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<LenientList<T>, E> {
                Ok(LenientList(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<LenientList<T>, E> {
                Ok(LenientList(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<LenientList<T>, E> {
                Ok(LenientList(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<LenientList<T>, E> {
                Ok(LenientList(None))
            }
            fn visit_unit<E>(self) -> Result<LenientList<T>, E> {
                Ok(LenientList(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LenientList<T>, A::Error> {
                drain_map(map).map(|()| LenientList(None))
            }
        }
        deserializer.deserialize_any(V(std::marker::PhantomData))
    }
}

/// One argument of an `Input Dims` list: its sizes if it is a flat list of non-negative
/// integers (`[]` included: a scalar, a zero-dimensional tensor or an untracked input), else
/// `None` (a tensor list's nested sizes, a string, a missing entry).
pub(crate) fn sizes(dims: &LenientList<LenientNumber>) -> Option<Vec<u64>> {
    dims.0.as_ref()?.iter().map(|n| n.0.and_then(Number::as_u64)).collect()
}

/// The element count of the first argument of an `Input Dims` list (`[[8, 1024], [], ...]` ->
/// 8192); `None` when it is not a non-empty flat list of sizes (`[]` is a scalar or an
/// untracked input, not a zero-dimensional size).
pub(crate) fn first_tensor_elements(dims: &LenientList<LenientList<LenientNumber>>) -> Option<u64> {
    let first = sizes(dims.0.as_ref()?.first()?)?;
    if first.is_empty() {
        return None;
    }
    first.iter().try_fold(1u64, |product, &size| product.checked_mul(size))
}

/// A list of ranks, written as a JSON array (`[0, 1]`) or as a string of one
/// (`"[0, 1]"`, as `Process Group Ranks` is).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RankList(pub Option<Vec<u32>>);

impl RankList {
    fn parse(text: &str) -> Option<Vec<u32>> {
        let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
        if inner.trim().is_empty() {
            return Some(Vec::new());
        }
        inner.split(',').map(|part| part.trim().parse::<u32>().ok()).collect()
    }
}

impl<'de> Deserialize<'de> for RankList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RankList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of ranks")
            }
            fn visit_str<E>(self, v: &str) -> Result<RankList, E> {
                Ok(RankList(RankList::parse(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RankList, A::Error> {
                let mut ranks = Some(Vec::new());
                while let Some(LenientNumber(value)) = seq.next_element()? {
                    let rank = value.and_then(Number::as_u64).and_then(|v| u32::try_from(v).ok());
                    ranks = match (ranks, rank) {
                        (Some(mut list), Some(rank)) => {
                            list.push(rank);
                            Some(list)
                        }
                        _ => None,
                    };
                }
                Ok(RankList(ranks))
            }
            fn visit_u64<E>(self, _: u64) -> Result<RankList, E> {
                Ok(RankList(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<RankList, E> {
                Ok(RankList(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<RankList, E> {
                Ok(RankList(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<RankList, E> {
                Ok(RankList(None))
            }
            fn visit_unit<E>(self) -> Result<RankList, E> {
                Ok(RankList(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RankList, A::Error> {
                drain_map(map).map(|()| RankList(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// An object deserialized as `T`, or `None` for any other JSON value (skipped).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ObjectOr<T>(pub Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOr<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = ObjectOr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ObjectOr<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|t| ObjectOr(Some(t)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ObjectOr<T>, A::Error> {
                drain_seq(seq).map(|()| ObjectOr(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<ObjectOr<T>, E> {
                Ok(ObjectOr(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<ObjectOr<T>, E> {
                Ok(ObjectOr(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<ObjectOr<T>, E> {
                Ok(ObjectOr(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<ObjectOr<T>, E> {
                Ok(ObjectOr(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<ObjectOr<T>, E> {
                Ok(ObjectOr(None))
            }
            fn visit_unit<E>(self) -> Result<ObjectOr<T>, E> {
                Ok(ObjectOr(None))
            }
        }
        deserializer.deserialize_any(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_values() {
        let n: LenientNumber = serde_json::from_str("12.5").unwrap();
        assert_eq!(n.0.and_then(Number::micros_to_nanos), Some(12_500));
        let n: LenientNumber = serde_json::from_str("{\"a\": [1, 2]}").unwrap();
        assert_eq!(n.0, None);
        let n: LenientNumber = serde_json::from_str("\"42\"").unwrap();
        assert_eq!(n.0, Some(Number::Unsigned(42)));
        let s: LenientString = serde_json::from_str("[1, \"x\"]").unwrap();
        assert_eq!(s.0, None);
        type Dims = LenientList<LenientList<LenientNumber>>;
        let dims: Dims = serde_json::from_str("[[8, 1024, 3], [], [2]]").unwrap();
        assert_eq!(first_tensor_elements(&dims), Some(24_576));
        let all: Vec<_> = dims.0.as_ref().unwrap().iter().map(sizes).collect();
        assert_eq!(all, vec![Some(vec![8, 1024, 3]), Some(vec![]), Some(vec![2])]);
        let dims: Dims = serde_json::from_str("[[], [4]]").unwrap();
        assert_eq!(first_tensor_elements(&dims), None);
        let dims: Dims = serde_json::from_str("[[[1, 2], [3]], \"x\"]").unwrap();
        assert_eq!(first_tensor_elements(&dims), None);
        assert_eq!(dims.0.as_ref().unwrap().iter().map(sizes).collect::<Vec<_>>(), vec![None, None]);
        let types: LenientList<LenientString> = serde_json::from_str("[\"float\", 3, \"Scalar\"]").unwrap();
        let types: Vec<_> = types.0.unwrap().into_iter().map(|t| t.0).collect();
        assert_eq!(types, vec![Some("float".to_string()), None, Some("Scalar".to_string())]);
        let ranks: RankList = serde_json::from_str("\"[0, 1, 5]\"").unwrap();
        assert_eq!(ranks.0, Some(vec![0, 1, 5]));
        let ranks: RankList = serde_json::from_str("[3, 4]").unwrap();
        assert_eq!(ranks.0, Some(vec![3, 4]));
        let ranks: RankList = serde_json::from_str("\"[0, x]\"").unwrap();
        assert_eq!(ranks.0, None);
    }
}
