//! The codec of every easd.v1 client and server: tonic-prost's, except for who is blamed when a message does not
//! decode.
//!
//! tonic-prost answers every protobuf decode error with `INTERNAL`. A *request* that does not decode (a `prompt`
//! holding invalid UTF-8, random bytes) is the caller's fault, so a server answers it with `INVALID_ARGUMENT`,
//! naming the message type; a *response* that does not decode is still the server's fault, so a client keeps
//! `INTERNAL`. Which side a type is on is stated once per message type ([`WireMessage`]): a new RPC whose types
//! are not listed does not compile.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::v1;

/// Who sends a message type over the wire, and so who is to blame when it does not decode.
pub trait WireMessage: prost::Message + Default + Send + 'static {
    /// The message's full protobuf name, for error messages.
    const NAME: &'static str;
    /// True for RPC requests (sent by clients), false for responses (sent by servers).
    const IS_REQUEST: bool;

    /// The status for a message of this type that does not decode.
    fn decode_failure(error: &Status) -> Status {
        let message = format!("malformed {} message: {}", Self::NAME, error.message());
        if Self::IS_REQUEST { Status::invalid_argument(message) } else { Status::internal(message) }
    }
}

macro_rules! wire_messages {
    ($is_request:literal: $($ty:ident),+ $(,)?) => {
        $(impl WireMessage for v1::$ty {
            const NAME: &'static str = concat!("easd.v1.", stringify!($ty));
            const IS_REQUEST: bool = $is_request;
        })+
    };
}

wire_messages!(true: InfoRequest, ProposeRequest, VerifyRequest, PrefillRequest, KeepAliveRequest, ReleaseRequest, GenerateRequest);
wire_messages!(false: ModelInfo, DraftToken, VerifyResponse, PrefillProgress, KeepAliveResponse, ReleaseResponse, CoordinatorInfo, GenerateEvent);

/// [`ProstCodec`] whose decoder reports undecodable requests as `INVALID_ARGUMENT` (see the module docs).
#[derive(Debug, Clone)]
pub struct EasdCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for EasdCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for EasdCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: WireMessage,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = EasdDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        EasdDecoder { inner: ProstCodec::<T, U>::raw_decoder(BufferSettings::default()) }
    }
}

/// Decodes `U` with prost; a failure gets `U`'s [`WireMessage::decode_failure`] status.
#[derive(Debug)]
pub struct EasdDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: WireMessage> Decoder for EasdDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|e| U::decode_failure(&e))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undecodable_request_is_the_callers_fault_and_a_response_the_servers() {
        let prost_error = Status::internal("failed to decode Protobuf message: invalid varint");
        let request = v1::GenerateRequest::decode_failure(&prost_error);
        assert_eq!(request.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            request.message(),
            "malformed easd.v1.GenerateRequest message: failed to decode Protobuf message: invalid varint"
        );
        assert_eq!(v1::GenerateEvent::decode_failure(&prost_error).code(), tonic::Code::Internal);
    }
}
