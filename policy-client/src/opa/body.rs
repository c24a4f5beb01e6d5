//! The bodies of requests to OPA: a query's input, written in place; a
//! document sent from its pieces.

use serde_json::Value;

use crate::engine::EncodedJson;

/// `{"input": ...}` without copying the input.
#[derive(serde::Serialize)]
pub(super) struct QueryBody<'a> {
    pub(super) input: &'a Value,
}

pub(super) enum Body {
    /// JSON already serialized.
    Encoded(EncodedJson),
    /// An RFC 6902 patch document.
    JsonPatch(Value),
    Text(String),
}

/// A request body sending the pieces of an [`EncodedJson`] one after the
/// other, its exact length announced (so `Content-Length` is set, not chunked
/// encoding).
pub(super) struct PiecesBody {
    pieces: std::sync::Arc<[bytes::Bytes]>,
    next: usize,
    remaining: u64,
}

impl PiecesBody {
    pub(super) fn new(json: &EncodedJson) -> Self {
        PiecesBody {
            pieces: json.shared_pieces(),
            next: 0,
            remaining: json.len() as u64,
        }
    }
}

impl http_body::Body for PiecesBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = &mut *self;
        while let Some(piece) = this.pieces.get(this.next) {
            this.next += 1;
            if !piece.is_empty() {
                this.remaining -= piece.len() as u64;
                return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(piece.clone()))));
            }
        }
        std::task::Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}
