//! The building blocks of the decoder, one a file, each with its forward
//! and, where candle's autograd would cost too much, a hand-written backward.

pub mod attention;
pub mod decoder;
pub mod fp8;
pub mod fused;
pub mod init;
pub mod lora;
pub mod nf4;
pub mod norm;
pub mod ops;
pub mod rope;
pub mod segments;
