//! [`RateLimitBody`]: the response body of the layer's service, either the inner service's
//! body or a short text the layer wrote itself (a 429, 503, 500 or 413).
//!
//! An enum rather than a `Default` bound on the inner body, so that the layer's own answers
//! can say what happened, and so that any body type works (axum's, `Full`, hyper's).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use projected::BodyProj;
pub use projected::RateLimitBody;

/// pin-project-lite's generated projection type carries no docs; it stays private here.
#[allow(missing_docs)]
mod projected {
    use bytes::Bytes;
    use pin_project_lite::pin_project;

    pin_project! {
        /// A response body: the inner service's, or the layer's own message.
        #[project = BodyProj]
        pub enum RateLimitBody<B> {
            /// The inner service answered.
            Inner {
                #[pin]
                body: B,
            },
            /// The layer answered with this text (taken when sent).
            Message {
                text: Option<Bytes>,
            },
        }
    }
}

impl<B> RateLimitBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        Self::Inner { body }
    }

    /// A body of `text`.
    pub fn message(text: impl Into<Bytes>) -> Self {
        Self::Message {
            text: Some(text.into()),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            BodyProj::Inner { body } => body.poll_frame(cx),
            BodyProj::Message { text } => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Inner { body } => body.is_end_stream(),
            Self::Message { text } => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Inner { body } => body.size_hint(),
            Self::Message { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}
