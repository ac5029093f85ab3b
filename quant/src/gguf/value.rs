//! Metadata values: the 13 GGUF value types, typed arrays and a compact string array.

use std::fmt;

/// The on-disk value type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's short name ("u32", "str", "arr").
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "str",
            Array => "arr",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Encoded size of one value, for the fixed-size types.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can take (a length or a header of zeros).
    pub(crate) fn min_encoded_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            _ => self.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array. Nested arrays (`Array::Array`) are legal GGUF and gguf-py reads
/// them, but llama.cpp refuses files that contain them.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StringArray),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn type_id(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// "u32", "str", "array of str": what a type-mismatch message calls this value.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type()),
            v => v.type_id().name().to_owned(),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A display form with at most `max_elems` array elements (per nesting level) and
    /// strings cut to `max_chars` characters, like gguf-dump. `Display` uses 5 and 60.
    pub fn summary(&self, max_elems: usize, max_chars: usize) -> Summary<'_> {
        Summary { value: SummaryOf::Value(self), max_elems, max_chars }
    }
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many arrays deep this is: 1 for a flat array.
    pub fn depth(&self) -> usize {
        match self {
            Array::Array(v) => 1 + v.iter().map(Array::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    pub fn summary(&self, max_elems: usize, max_chars: usize) -> Summary<'_> {
        Summary { value: SummaryOf::Array(self), max_elems, max_chars }
    }
}

/// Strings of a string array, stored back to back in one buffer.
///
/// A 150k-entry vocabulary is then two allocations rather than 150k, and the index costs
/// 8 bytes per string, no more than the string's length prefix in the file: decoding never
/// allocates more than the file holds.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct StringArray {
    data: String,
    /// End of each string in `data`; string i spans ends[i-1]..ends[i].
    ends: Vec<usize>,
}

impl StringArray {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `count` strings totalling `bytes` bytes.
    pub fn with_capacity(count: usize, bytes: usize) -> Self {
        StringArray { data: String::with_capacity(bytes), ends: Vec::with_capacity(count) }
    }

    pub fn push(&mut self, s: &str) {
        self.data.push_str(s);
        self.ends.push(self.data.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Sum of the strings' lengths in bytes.
    pub fn total_bytes(&self) -> usize {
        self.data.len()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = match i.checked_sub(1) {
            Some(prev) => *self.ends.get(prev)?,
            None => 0,
        };
        self.data.get(start..end)
    }

    pub fn iter(&self) -> StringArrayIter<'_> {
        StringArrayIter { array: self, front: 0, back: self.len() }
    }

    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = StringArray::new();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl<S: AsRef<str>> From<Vec<S>> for StringArray {
    fn from(v: Vec<S>) -> Self {
        let bytes = v.iter().map(|s| s.as_ref().len()).sum();
        let mut a = StringArray::with_capacity(v.len(), bytes);
        for s in &v {
            a.push(s.as_ref());
        }
        a
    }
}

impl<S: AsRef<str>> From<&[S]> for StringArray {
    fn from(v: &[S]) -> Self {
        v.iter().collect()
    }
}

impl<'a> IntoIterator for &'a StringArray {
    type Item = &'a str;
    type IntoIter = StringArrayIter<'a>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

pub struct StringArrayIter<'a> {
    array: &'a StringArray,
    front: usize,
    back: usize,
}

impl<'a> Iterator for StringArrayIter<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        if self.front >= self.back {
            return None;
        }
        let s = self.array.get(self.front);
        self.front += 1;
        s
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back.saturating_sub(self.front);
        (n, Some(n))
    }
}

impl DoubleEndedIterator for StringArrayIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.array.get(self.back)
    }
}

impl ExactSizeIterator for StringArrayIter<'_> {}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => { $(
        impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$v(x) }
        }
        impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Array { Array::$v(x) }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value { Value::Array(Array::$v(x)) }
        }
        impl From<&[$t]> for Value {
            fn from(x: &[$t]) -> Value { Value::Array(Array::$v(x.to_vec())) }
        }
    )* };
}

from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}

impl From<StringArray> for Value {
    fn from(a: StringArray) -> Value {
        Value::Array(Array::String(a))
    }
}

impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Value {
        Value::Array(Array::String(v.into()))
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into()))
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<Array>> for Value {
    fn from(v: Vec<Array>) -> Value {
        Value::Array(Array::Array(v))
    }
}

/// A value shown the way gguf-dump shows it: long arrays as their first few elements and a
/// count, long strings cut short.
pub struct Summary<'a> {
    value: SummaryOf<'a>,
    max_elems: usize,
    max_chars: usize,
}

enum SummaryOf<'a> {
    Value(&'a Value),
    Array(&'a Array),
}

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value {
            SummaryOf::Value(v) => write_value(f, v, self.max_elems, self.max_chars),
            SummaryOf::Array(a) => write_array(f, a, self.max_elems, self.max_chars),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_value(f, self, 5, 60)
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_array(f, self, 5, 60)
    }
}

fn write_value(f: &mut fmt::Formatter<'_>, v: &Value, max_elems: usize, max_chars: usize) -> fmt::Result {
    match v {
        Value::U8(x) => write!(f, "{x}"),
        Value::I8(x) => write!(f, "{x}"),
        Value::U16(x) => write!(f, "{x}"),
        Value::I16(x) => write!(f, "{x}"),
        Value::U32(x) => write!(f, "{x}"),
        Value::I32(x) => write!(f, "{x}"),
        // Debug switches to exponent notation for tiny values such as an rms epsilon.
        Value::F32(x) => write!(f, "{x:?}"),
        Value::Bool(x) => write!(f, "{x}"),
        Value::String(s) => write_str(f, s, max_chars),
        Value::Array(a) => write_array(f, a, max_elems, max_chars),
        Value::U64(x) => write!(f, "{x}"),
        Value::I64(x) => write!(f, "{x}"),
        Value::F64(x) => write!(f, "{x:?}"),
    }
}

fn write_str(f: &mut fmt::Formatter<'_>, s: &str, max_chars: usize) -> fmt::Result {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => write!(f, "{:?}…", s.get(..cut).unwrap_or("")),
        None => write!(f, "{s:?}"),
    }
}

fn write_array(f: &mut fmt::Formatter<'_>, a: &Array, max_elems: usize, max_chars: usize) -> fmt::Result {
    fn list<T>(
        f: &mut fmt::Formatter<'_>,
        items: impl Iterator<Item = T>,
        len: usize,
        max: usize,
        mut one: impl FnMut(&mut fmt::Formatter<'_>, T) -> fmt::Result,
    ) -> fmt::Result {
        f.write_str("[")?;
        for (i, item) in items.take(max).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            one(f, item)?;
        }
        if len > max {
            if max > 0 {
                f.write_str(", ")?;
            }
            write!(f, "… {len} items")?;
        }
        f.write_str("]")
    }
    let n = a.len();
    let m = max_elems;
    match a {
        Array::U8(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::I8(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::U16(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::I16(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::U32(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::I32(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::F32(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x:?}")),
        Array::Bool(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::String(v) => list(f, v.iter(), n, m, |f, s| write_str(f, s, max_chars)),
        Array::Array(v) => list(f, v.iter(), n, m, |f, inner| write_array(f, inner, max_elems, max_chars)),
        Array::U64(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::I64(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x}")),
        Array::F64(v) => list(f, v.iter(), n, m, |f, x| write!(f, "{x:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).map(ValueType::id), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }

    #[test]
    fn string_array_indexing() {
        let a: StringArray = ["", "ab", "", "ü€"].into_iter().collect();
        assert_eq!(a.len(), 4);
        assert_eq!(a.get(0), Some(""));
        assert_eq!(a.get(1), Some("ab"));
        assert_eq!(a.get(3), Some("ü€"));
        assert_eq!(a.get(4), None);
        assert_eq!(a.iter().rev().collect::<Vec<_>>(), ["ü€", "", "ab", ""]);
        assert_eq!(a.total_bytes(), 7);
    }

    #[test]
    fn summaries_cut_long_values() {
        let v = Value::from((0..100u32).collect::<Vec<_>>());
        assert_eq!(v.to_string(), "[0, 1, 2, 3, 4, … 100 items]");
        assert_eq!(Value::from("a\"b").to_string(), r#""a\"b""#);
        assert_eq!(Value::from("x".repeat(100)).summary(5, 3).to_string(), r#""xxx"…"#);
        assert_eq!(Value::F32(1e-5).to_string(), "1e-5");
        let nested = Value::from(vec![Array::I32(vec![1, 2]), Array::String(StringArray::new())]);
        assert_eq!(nested.to_string(), "[[1, 2], []]");
        assert_eq!(nested.type_description(), "array of arr");
    }
}
