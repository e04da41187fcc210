//! Writing a GGUF file, version 3, little-endian, as the GGUF specification
//! (ggml's `docs/gguf.md`) lays it out:
//!
//! 1. the header: the magic `GGUF`, the version (u32 3), the tensor count
//!    and the metadata count (u64 each);
//! 2. the metadata: each key a string (u64 length, UTF-8 bytes), its value
//!    type (u32) and its value; an array is its element type (u32), its
//!    length (u64) and the elements;
//! 3. the tensor index: each tensor's name, its dimension count (u32), its
//!    dimensions innermost first (u64 each: a row-major `(rows, cols)`
//!    matrix is written `[cols, rows]`), its ggml type (u32) and the offset
//!    of its data from the start of the data section (u64, a multiple of
//!    the alignment);
//! 4. zero padding to the alignment (32, `general.alignment`'s default),
//!    then each tensor's data, padded to the alignment.
//!
//! Tensors are encoded one at a time as they are written, so the file is
//! never held in memory whole.

use std::io::Write;

use half::{bf16, f16};

/// GGUF's default alignment of the data section and of each tensor in it.
pub const ALIGNMENT: u64 = 32;
/// Values in one Q8_0 block: an f16 scale then 32 signed bytes.
const Q8_0_BLOCK: usize = 32;

/// A metadata value, of the types an export needs.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// GGUF's value type ids (`enum gguf_type`).
const TYPE_U32: u32 = 4;
const TYPE_I32: u32 = 5;
const TYPE_F32: u32 = 6;
const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

/// How a tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    /// Blocks of 32 values: an f16 scale `d = max|x| / 127` and 32 signed
    /// bytes `round(x / d)` (ggml's `quantize_row_q8_0_ref`).
    Q8_0,
}

impl TensorType {
    /// ggml's type id (`enum ggml_type`).
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 8,
            Self::BF16 => 30,
        }
    }

    /// ggml's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of `n` values; for Q8_0, `n` is a multiple of 32.
    fn size(self, n: usize) -> u64 {
        (match self {
            Self::F32 => 4 * n,
            Self::F16 | Self::BF16 => 2 * n,
            Self::Q8_0 => n / Q8_0_BLOCK * (2 + Q8_0_BLOCK),
        }) as u64
    }

    /// Whether a tensor whose rows hold `cols` values can be stored so:
    /// Q8_0 blocks never straddle rows.
    pub fn fits(self, cols: usize) -> bool {
        self != Self::Q8_0 || cols.is_multiple_of(Q8_0_BLOCK)
    }

    fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            Self::F32 => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Self::F16 => values
                .iter()
                .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
            Self::BF16 => values
                .iter()
                .for_each(|v| out.extend(bf16::from_f32(*v).to_le_bytes())),
            Self::Q8_0 => {
                for block in values.chunks(Q8_0_BLOCK) {
                    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(f16::from_f32(d).to_le_bytes());
                    out.extend(block.iter().map(|v| ((v * id).round() as i8) as u8));
                }
            }
        }
    }
}

/// One tensor of the index: its GGUF name, its row-major shape and type.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub ty: TensorType,
}

/// Writes a GGUF of `metadata` and `tensors` to `w`; `data(i)` gives
/// tensor `i`'s values in row-major order, asked for in index order.
pub fn write<W: Write, E: From<std::io::Error>>(
    w: &mut W,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorEntry],
    mut data: impl FnMut(usize) -> Result<Vec<f32>, E>,
) -> Result<(), E> {
    let mut head = Vec::new();
    head.extend(b"GGUF");
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut head, key);
        put_value(&mut head, value);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut head, &t.name);
        head.extend((t.shape.len() as u32).to_le_bytes());
        for &dim in t.shape.iter().rev() {
            head.extend((dim as u64).to_le_bytes());
        }
        head.extend(t.ty.ggml_id().to_le_bytes());
        head.extend(offset.to_le_bytes());
        offset += padded(t.ty.size(t.shape.iter().product()));
    }
    head.resize(padded(head.len() as u64) as usize, 0);
    w.write_all(&head)?;
    let mut bytes = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let values = data(i)?;
        let n: usize = t.shape.iter().product();
        assert_eq!(values.len(), n, "tensor `{}` has {n} values", t.name);
        bytes.clear();
        t.ty.encode(&values, &mut bytes);
        bytes.resize(padded(bytes.len() as u64) as usize, 0);
        w.write_all(&bytes)?;
    }
    Ok(())
}

fn padded(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U32(v) => {
            out.extend(TYPE_U32.to_le_bytes());
            out.extend(v.to_le_bytes());
        }
        MetaValue::F32(v) => {
            out.extend(TYPE_F32.to_le_bytes());
            out.extend(v.to_le_bytes());
        }
        MetaValue::Bool(v) => {
            out.extend(TYPE_BOOL.to_le_bytes());
            out.push(u8::from(*v));
        }
        MetaValue::Str(s) => {
            out.extend(TYPE_STRING.to_le_bytes());
            put_str(out, s);
        }
        MetaValue::Strs(items) => {
            out.extend(TYPE_ARRAY.to_le_bytes());
            out.extend(TYPE_STRING.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|s| put_str(out, s));
        }
        MetaValue::I32s(items) => {
            out.extend(TYPE_ARRAY.to_le_bytes());
            out.extend(TYPE_I32.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|v| out.extend(v.to_le_bytes()));
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use candle_core::quantized::gguf_file::{Content, Value};

    use super::*;

    /// A file written here reads back with candle's GGUF reader: metadata,
    /// dimensions, and values (f32 exactly, the others within their
    /// rounding).
    #[test]
    fn written_file_reads_back_with_candle() {
        let values: Vec<f32> = (0..96).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let tensors: Vec<TensorEntry> = [
            TensorType::F32,
            TensorType::F16,
            TensorType::BF16,
            TensorType::Q8_0,
        ]
        .iter()
        .map(|&ty| TensorEntry {
            name: format!("t.{}", ty.name()),
            shape: vec![3, 32],
            ty,
        })
        .collect();
        let metadata = vec![
            (
                "general.architecture".to_owned(),
                MetaValue::Str("llama".into()),
            ),
            ("a.u32".to_owned(), MetaValue::U32(7)),
            ("a.f32".to_owned(), MetaValue::F32(1e-5)),
            ("a.bool".to_owned(), MetaValue::Bool(true)),
            (
                "a.strs".to_owned(),
                MetaValue::Strs(vec!["x".into(), "yz".into()]),
            ),
            ("a.i32s".to_owned(), MetaValue::I32s(vec![1, -3])),
        ];
        let mut file = Vec::new();
        write::<_, std::io::Error>(&mut file, &metadata, &tensors, |_| Ok(values.clone())).unwrap();
        assert_eq!(&file[..8], b"GGUF\x03\x00\x00\x00");
        let mut reader = std::io::Cursor::new(&file);
        let content = Content::read(&mut reader).unwrap();
        let md = &content.metadata;
        assert!(matches!(md["a.u32"], Value::U32(7)));
        assert!(matches!(md["a.f32"], Value::F32(v) if v == 1e-5));
        assert!(matches!(md["a.bool"], Value::Bool(true)));
        assert_eq!(md["a.strs"].to_vec().unwrap().len(), 2);
        assert!(matches!(md["a.i32s"].to_vec().unwrap()[1], Value::I32(-3)));
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (t, tol) in tensors.iter().zip([0.0, 2e-3, 2e-2, amax / 127.0]) {
            assert_eq!(content.tensor_infos[&t.name].shape.dims(), [3, 32]);
            let got = content
                .tensor(&mut reader, &t.name, &Device::Cpu)
                .unwrap()
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let diff = got
                .iter()
                .zip(&values)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= tol, "{}: {diff} > {tol}", t.name);
        }
    }

    #[test]
    fn q8_0_rounds_to_the_block_scale_and_keeps_zero_blocks() {
        let mut out = Vec::new();
        TensorType::Q8_0.encode(&[0.0; 32], &mut out);
        assert_eq!(out, vec![0u8; 34]);
        let mut block = vec![0f32; 32];
        block[0] = 1.27;
        block[1] = -0.6;
        out.clear();
        TensorType::Q8_0.encode(&block, &mut out);
        assert_eq!(f16::from_le_bytes([out[0], out[1]]), f16::from_f32(0.01));
        assert_eq!(out[2] as i8, 127);
        assert_eq!(out[3] as i8, -60);
        assert!(!TensorType::Q8_0.fits(48) && TensorType::Q8_0.fits(64));
    }
}
