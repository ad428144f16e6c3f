//! Protobuf over gRPC with small buffers.
//!
//! tonic gives every stream an 8 KiB buffer to decode into and another to
//! encode from, kept for the stream's life. An agent's stream lives for
//! days and carries a heartbeat of a few dozen bytes every ten seconds, so
//! on a coordinator holding thousands of them those buffers were a sixth of
//! its memory. Here they start at 1 KiB and grow only for a message that
//! needs more (an inventory of many domains); a grown decode buffer keeps
//! its size for the stream's life, so the saving is whole on the encoding
//! side and on streams whose messages all stay small.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first capacity of a stream's buffers.
pub const BUFFER_BYTES: usize = 1024;
/// Encoded bytes gathered before a response stream yields them (tonic's default).
pub const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// tonic's prost codec with [`BUFFER_BYTES`] buffers; every generated
/// client and server of `hv.v1` uses it.
#[derive(Debug, Clone, Copy)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}
