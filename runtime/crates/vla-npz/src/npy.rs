//! The `.npy` format (versions 1.0, 2.0 and 3.0): the magic, the header dict literal
//! (`{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`) and the raw data behind
//! it. The header is untrusted text, so it is parsed by a small, depth-limited reader for
//! the Python literal subset numpy writes, and its claims are checked against the bytes
//! actually present before anything is allocated for the data.

use std::path::Path;

use crate::array::element_count;
use crate::{Array, DType, NpzError};

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy pads the header so the data starts on a 64-byte boundary (mmap-friendly).
const ALIGN: usize = 64;
/// Nesting deeper than this is not a numpy header; the limit keeps recursion bounded.
const MAX_LITERAL_DEPTH: usize = 16;

/// What a parsed header says and where the data starts.
#[derive(Debug)]
pub(crate) struct NpyHeader {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data_offset: usize,
}

/// Parses an in-memory `.npy` file. The array takes its name from the label's file stem
/// (`obs/image.npy` -> `image`); errors name the label as the file.
pub fn read_npy(bytes: &[u8], label: &str) -> Result<Array, NpzError> {
    let name = array_name_for(label);
    let header = parse_header(bytes, label, &name)?;
    Array::with_origin(
        name,
        header.dtype,
        header.shape,
        bytes[header.data_offset..].to_vec(),
        label.to_string(),
    )
}

/// Reads and parses a `.npy` file.
pub fn open_npy(path: impl AsRef<Path>) -> Result<Array, NpzError> {
    let path = path.as_ref();
    let label = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpzError::Io {
        file: label.clone(),
        action: "reading",
        source,
    })?;
    read_npy(&bytes, &label)
}

/// Encodes an array as a complete `.npy` file (version 1.0 unless the header needs 2.0).
pub fn write_npy(array: &Array) -> Vec<u8> {
    let mut out = npy_header(array);
    out.extend_from_slice(array.bytes());
    out
}

/// Parses a `.npy` held in an owned buffer (an inflated zip entry) without copying the data.
pub(crate) fn read_npy_owned(
    mut bytes: Vec<u8>,
    file: &str,
    name: &str,
) -> Result<Array, NpzError> {
    let header = parse_header(&bytes, file, name)?;
    bytes.drain(..header.data_offset);
    Array::with_origin(
        name.to_string(),
        header.dtype,
        header.shape,
        bytes,
        file.to_string(),
    )
}

pub(crate) fn read_npy_slice(bytes: &[u8], file: &str, name: &str) -> Result<Array, NpzError> {
    let header = parse_header(bytes, file, name)?;
    Array::with_origin(
        name.to_string(),
        header.dtype,
        header.shape,
        bytes[header.data_offset..].to_vec(),
        file.to_string(),
    )
}

pub(crate) fn array_name_for(label: &str) -> String {
    Path::new(label)
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .filter(|stem| !stem.is_empty())
        .unwrap_or_else(|| label.to_string())
}

/// The magic, version, length and padded header dict of `array`, ready for its data.
pub(crate) fn npy_header(array: &Array) -> Vec<u8> {
    let shape = match array.shape() {
        [] => "()".to_string(),
        [only] => format!("({only},)"),
        dims => {
            let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
            format!("({})", dims.join(", "))
        }
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        array.dtype().descr()
    );
    // Version 1.0 stores the header length in a u16; longer headers (very high rank)
    // need 2.0's u32.
    let v1_unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    let (major, length_field) = if v1_unpadded.next_multiple_of(ALIGN) - 10 <= usize::from(u16::MAX)
    {
        (1u8, 2usize)
    } else {
        (2u8, 4usize)
    };
    let prefix = MAGIC.len() + 2 + length_field;
    let total = (prefix + dict.len() + 1).next_multiple_of(ALIGN);
    let header_len = total - prefix;

    let mut out = Vec::with_capacity(total + array.bytes().len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[major, 0]);
    if major == 1 {
        // Fits: checked when choosing the version.
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// Parses and validates the header; on success the data is exactly
/// `bytes[data_offset..]`, sized for `shape` and `dtype`.
pub(crate) fn parse_header(bytes: &[u8], file: &str, array: &str) -> Result<NpyHeader, NpzError> {
    let bad = |reason: String| NpzError::BadNpy {
        file: file.to_string(),
        array: array.to_string(),
        reason,
    };
    let unsupported = |reason: String| NpzError::UnsupportedNpy {
        file: file.to_string(),
        array: array.to_string(),
        reason,
    };

    if bytes.len() < MAGIC.len() + 2 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(bad(format!(
            "no .npy magic (\\x93NUMPY) at the start of {} bytes",
            bytes.len()
        )));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_start, header_len) = match (major, minor) {
        (1, 0) if bytes.len() >= 10 => (
            10usize,
            usize::from(u16::from_le_bytes([bytes[8], bytes[9]])),
        ),
        (2 | 3, 0) if bytes.len() >= 12 => {
            let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (12, usize::try_from(len).unwrap_or(usize::MAX))
        }
        (1..=3, 0) => {
            return Err(bad(format!(
                "truncated in the header length ({} bytes)",
                bytes.len()
            )))
        }
        _ => return Err(unsupported(format!("format version {major}.{minor}"))),
    };
    let data_offset = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| {
            bad(format!(
                "header claims {header_len} bytes but only {} follow",
                bytes.len() - header_start
            ))
        })?;
    let text = std::str::from_utf8(&bytes[header_start..data_offset])
        .map_err(|err| bad(format!("header is not text: {err}")))?;

    let fields =
        match Literal::parse(text).map_err(|reason| bad(format!("header dict: {reason}")))? {
            Literal::Dict(fields) => fields,
            other => return Err(bad(format!("header is {}, not a dict", other.kind()))),
        };
    let mut descr = None;
    let mut fortran_order = None;
    let mut shape = None;
    for (key, value) in fields {
        let Literal::Str(key) = key else {
            return Err(bad(format!("header key is {}, not a string", key.kind())));
        };
        let slot = match key.as_str() {
            "descr" => &mut descr,
            "fortran_order" => &mut fortran_order,
            "shape" => &mut shape,
            _ => return Err(bad(format!("unexpected header key {key:?}"))),
        };
        if slot.replace(value).is_some() {
            return Err(bad(format!("header key {key:?} appears twice")));
        }
    }

    let dtype = match descr.ok_or_else(|| bad("header has no 'descr'".to_string()))? {
        Literal::Str(descr) => DType::from_descr(&descr).map_err(unsupported)?,
        Literal::List(fields) => {
            return Err(unsupported(format!(
                "structured dtype (record array with {} fields)",
                fields.len()
            )))
        }
        other => return Err(bad(format!("'descr' is {}, not a string", other.kind()))),
    };
    match fortran_order.ok_or_else(|| bad("header has no 'fortran_order'".to_string()))? {
        Literal::Bool(false) => {}
        Literal::Bool(true) => {
            return Err(unsupported(
                "fortran_order is True (save a C-contiguous array: np.ascontiguousarray)"
                    .to_string(),
            ))
        }
        other => {
            return Err(bad(format!(
                "'fortran_order' is {}, not a bool",
                other.kind()
            )))
        }
    }
    let shape = match shape.ok_or_else(|| bad("header has no 'shape'".to_string()))? {
        Literal::Tuple(dims) => dims
            .into_iter()
            .map(|dim| match dim {
                Literal::Int(n) => usize::try_from(n)
                    .map_err(|_| bad(format!("shape dimension {n} is out of range"))),
                other => Err(bad(format!(
                    "shape dimension is {}, not an int",
                    other.kind()
                ))),
            })
            .collect::<Result<Vec<usize>, NpzError>>()?,
        other => return Err(bad(format!("'shape' is {}, not a tuple", other.kind()))),
    };

    let available = bytes.len() - data_offset;
    let needed = element_count(&shape).and_then(|count| count.checked_mul(dtype.size()));
    match needed {
        Some(needed) if needed == available => Ok(NpyHeader {
            dtype,
            shape,
            data_offset,
        }),
        Some(needed) if needed > available => Err(bad(format!(
            "shape {shape:?} of {dtype} needs {needed} bytes but only {available} follow the header"
        ))),
        Some(needed) => Err(bad(format!(
            "shape {shape:?} of {dtype} needs {needed} bytes but {available} follow the header \
             ({} trailing)",
            available - needed
        ))),
        None => Err(bad(format!(
            "shape {shape:?} of {dtype} overflows the address space ({available} bytes follow)"
        ))),
    }
}

/// The Python literal subset that appears in `.npy` headers.
#[derive(Debug)]
enum Literal {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
    Dict(Vec<(Literal, Literal)>),
}

impl Literal {
    fn kind(&self) -> &'static str {
        match self {
            Literal::Str(_) => "a string",
            Literal::Int(_) => "an int",
            Literal::Bool(_) => "a bool",
            Literal::None => "None",
            Literal::Tuple(_) => "a tuple",
            Literal::List(_) => "a list",
            Literal::Dict(_) => "a dict",
        }
    }

    /// Parses one literal that must span the whole text (surrounding whitespace allowed).
    fn parse(text: &str) -> Result<Literal, String> {
        let mut parser = Parser {
            text: text.as_bytes(),
            pos: 0,
        };
        let value = parser.value(0)?;
        parser.skip_whitespace();
        if parser.pos != parser.text.len() {
            return Err(format!(
                "unexpected text after the dict at byte {}",
                parser.pos
            ));
        }
        Ok(value)
    }
}

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn skip_whitespace(&mut self) {
        while self.pos < self.text.len() && self.text[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.text.get(self.pos).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(&format!("'{}'", byte as char)))
        }
    }

    fn unexpected(&self, wanted: &str) -> String {
        match self.text.get(self.pos) {
            Some(&byte) if byte.is_ascii_graphic() => {
                format!(
                    "expected {wanted} at byte {}, found '{}'",
                    self.pos, byte as char
                )
            }
            Some(&byte) => format!(
                "expected {wanted} at byte {}, found byte {byte:#04x}",
                self.pos
            ),
            None => format!("expected {wanted}, found the end of the header"),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Literal, String> {
        if depth > MAX_LITERAL_DEPTH {
            return Err(format!("nested deeper than {MAX_LITERAL_DEPTH} levels"));
        }
        match self.peek() {
            Some(b'{') => {
                self.pos += 1;
                let mut fields = Vec::new();
                self.sequence(b'}', |parser| {
                    let key = parser.value(depth + 1)?;
                    parser.expect(b':')?;
                    let value = parser.value(depth + 1)?;
                    fields.push((key, value));
                    Ok(())
                })?;
                Ok(Literal::Dict(fields))
            }
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.sequence(b']', |parser| {
                    items.push(parser.value(depth + 1)?);
                    Ok(())
                })?;
                Ok(Literal::List(items))
            }
            Some(b'(') => {
                self.pos += 1;
                let mut items = Vec::new();
                let commas = self.sequence(b')', |parser| {
                    items.push(parser.value(depth + 1)?);
                    Ok(())
                })?;
                // `(x)` is just x in Python; only `()` and `(x,)`/`(x, y)` are tuples.
                if items.len() == 1 && commas == 0 {
                    return Ok(items.remove(0));
                }
                Ok(Literal::Tuple(items))
            }
            Some(quote @ (b'\'' | b'"')) => {
                self.pos += 1;
                self.string(quote)
            }
            Some(b'-' | b'+' | b'0'..=b'9') => self.int(),
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'_') => {
                let start = self.pos;
                while self.pos < self.text.len()
                    && (self.text[self.pos].is_ascii_alphanumeric() || self.text[self.pos] == b'_')
                {
                    self.pos += 1;
                }
                match &self.text[start..self.pos] {
                    b"True" => Ok(Literal::Bool(true)),
                    b"False" => Ok(Literal::Bool(false)),
                    b"None" => Ok(Literal::None),
                    word => Err(format!(
                        "unknown name {:?} at byte {start}",
                        String::from_utf8_lossy(word)
                    )),
                }
            }
            _ => Err(self.unexpected("a value")),
        }
    }

    /// Parses `item, item, ...` up to `close` (trailing comma allowed); returns the number
    /// of commas seen.
    fn sequence(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), String>,
    ) -> Result<usize, String> {
        let mut commas = 0;
        loop {
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(commas);
            }
            item(self)?;
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    commas += 1;
                }
                Some(byte) if byte == close => {}
                _ => return Err(self.unexpected(&format!("',' or '{}'", close as char))),
            }
        }
    }

    fn string(&mut self, quote: u8) -> Result<Literal, String> {
        let start = self.pos;
        let mut out = Vec::new();
        loop {
            match self.text.get(self.pos) {
                None => return Err(format!("string starting at byte {start} is not closed")),
                Some(&byte) if byte == quote => {
                    self.pos += 1;
                    // Slicing happened on ASCII boundaries, so this is still valid UTF-8.
                    return Ok(Literal::Str(String::from_utf8_lossy(&out).into_owned()));
                }
                Some(b'\\') => {
                    let Some(&escaped) = self.text.get(self.pos + 1) else {
                        return Err(format!("string starting at byte {start} is not closed"));
                    };
                    out.push(match escaped {
                        b'n' => b'\n',
                        b't' => b'\t',
                        other => other,
                    });
                    self.pos += 2;
                }
                Some(&byte) => {
                    out.push(byte);
                    self.pos += 1;
                }
            }
        }
    }

    fn int(&mut self) -> Result<Literal, String> {
        let start = self.pos;
        let negative = match self.text[self.pos] {
            b'-' => {
                self.pos += 1;
                true
            }
            b'+' => {
                self.pos += 1;
                false
            }
            _ => false,
        };
        let digits_start = self.pos;
        let mut value: i128 = 0;
        while let Some(&digit @ b'0'..=b'9') = self.text.get(self.pos) {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(i128::from(digit - b'0')))
                .ok_or_else(|| format!("integer at byte {start} is too large"))?;
            self.pos += 1;
        }
        if self.pos == digits_start {
            return Err(self.unexpected("a digit"));
        }
        // Python 2 era numpy wrote longs as `3L`.
        if self.text.get(self.pos) == Some(&b'L') {
            self.pos += 1;
        }
        Ok(Literal::Int(if negative { -value } else { value }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_with_header(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[major, 0]);
        if major == 1 {
            out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn written_header_is_aligned_and_parses_back() {
        for shape in [vec![], vec![3], vec![2, 3, 4], vec![1; 40]] {
            let count = element_count(&shape).unwrap();
            let array = Array::from_f32("a", &shape, &vec![0.5; count]).unwrap();
            let header = npy_header(&array);
            assert_eq!(header.len() % ALIGN, 0, "{shape:?}");
            assert_eq!(*header.last().unwrap(), b'\n');
            let parsed = read_npy(&write_npy(&array), "a.npy").unwrap();
            assert_eq!(parsed, array);
        }
    }

    #[test]
    fn very_high_rank_switches_to_version_2() {
        let shape = vec![1usize; 30_000];
        let array = Array::from_u8("deep", &shape, &[9]).unwrap();
        let bytes = write_npy(&array);
        assert_eq!(bytes[6], 2);
        assert_eq!(read_npy(&bytes, "deep.npy").unwrap(), array);
    }

    #[test]
    fn accepts_numpy_spellings_of_the_header() {
        let cases = [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n",
            "{\"shape\": (2,), \"descr\": \"<f4\", \"fortran_order\": False}",
            "{'descr':'<f4','fortran_order':False,'shape':(2L,)}   \n",
        ];
        for dict in cases {
            let array = read_npy(&npy_with_header(1, dict, &[0; 8]), "x.npy").unwrap();
            assert_eq!(array.shape(), &[2], "{dict}");
            assert_eq!(array.dtype(), DType::F32);
        }
    }

    #[test]
    fn header_claims_are_checked_against_the_data() {
        let huge = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000000000), }";
        let err = read_npy(&npy_with_header(1, huge, &[0; 16]), "x.npy").unwrap_err();
        assert!(err.to_string().contains("only 16 follow"), "{err}");
        let overflow = "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }";
        let err = read_npy(&npy_with_header(1, overflow, &[]), "x.npy").unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
        let trailing = "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }";
        let err = read_npy(&npy_with_header(1, trailing, &[1, 2, 3]), "x.npy").unwrap_err();
        assert!(err.to_string().contains("1 trailing"), "{err}");
        let negative = "{'descr': '|u1', 'fortran_order': False, 'shape': (-1,), }";
        assert!(read_npy(&npy_with_header(1, negative, &[]), "x.npy").is_err());
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let cases = [
            ("{'descr': '<f4', 'shape': (1,), }", "no 'fortran_order'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "unexpected header key"),
            ("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "twice"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "not a bool"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", "not a tuple"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", "end of the header"),
            ("{'descr': '<f4, 'fortran_order': False}", "expected"),
            ("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "nested"),
            ("{'descr': '<f4', 'fortran_order': Nope, 'shape': (1,)}", "unknown name"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999999999999999999999,)}", "too large"),
        ];
        for (dict, needle) in cases {
            let err = read_npy(&npy_with_header(1, dict, &[0; 4]), "x.npy").unwrap_err();
            assert!(matches!(err, NpzError::BadNpy { .. }), "{dict}: {err}");
            assert!(err.to_string().contains(needle), "{dict}: {err}");
        }
    }

    #[test]
    fn unsupported_headers_say_what_is_unsupported() {
        let cases = [
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (1,)}",
                "big-endian",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (1,)}",
                "fortran_order",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
                "structured",
            ),
            (
                "{'descr': '<U3', 'fortran_order': False, 'shape': (1,)}",
                "supported dtypes",
            ),
        ];
        for (dict, needle) in cases {
            let err = read_npy(&npy_with_header(1, dict, &[0; 4]), "x.npy").unwrap_err();
            assert!(
                matches!(err, NpzError::UnsupportedNpy { .. }),
                "{dict}: {err}"
            );
            assert!(err.to_string().contains(needle), "{dict}: {err}");
        }
        let mut v4 = npy_with_header(1, "{}", &[]);
        v4[6] = 4;
        let err = read_npy(&v4, "x.npy").unwrap_err();
        assert!(err.to_string().contains("version 4.0"), "{err}");
    }

    #[test]
    fn truncated_prefix_and_header_are_reported() {
        let full = write_npy(&Array::from_u8("a", &[3], &[1, 2, 3]).unwrap());
        for len in 0..full.len() {
            let err = read_npy(&full[..len], "a.npy").unwrap_err();
            assert!(matches!(err, NpzError::BadNpy { .. }), "{len}: {err}");
        }
        let err = read_npy(b"", "obs/a.npy").unwrap_err();
        assert_eq!(
            err.to_string(),
            "obs/a.npy: array `a`: malformed .npy: no .npy magic (\\x93NUMPY) at the start of 0 bytes"
        );
    }
}
