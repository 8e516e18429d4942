//! The bodies of outbound requests and responses: each under its size cap,
//! a request body marking its request written when it first goes out, a
//! response body under the between-bytes timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::Pending;

/// Reads and discards a request body, up to `limit` bytes.
pub(super) async fn drain(mut body: WasiBody, limit: u64) {
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    seen += d.len() as u64;
                    if seen > limit {
                        return;
                    }
                }
            }
            Err(_) => return,
        }
    }
}

/// A request body that fails once more than `cap` bytes went through, and
/// marks its request written on the first poll (hyper polls it only once the
/// connection, and TLS, is up; an empty body is still polled once).
pub(super) struct CappedBody {
    /// The guest's body.
    pub(super) inner: WasiBody,
    /// Bytes passed so far.
    pub(super) seen: u64,
    /// Most bytes allowed.
    pub(super) cap: u64,
    /// The state-changing request this body belongs to, if it is one.
    pub(super) pending: Option<Arc<Pending>>,
    /// Told on the first poll (taken then): the request is going out, and
    /// the wait for its response head starts.
    pub(super) started: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        if let Some(started) = this.started.take() {
            let _ = started.send(());
            if let Some(p) = &this.pending {
                p.written();
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.seen += d.len() as u64;
                    if this.seen > this.cap {
                        return Poll::Ready(Some(Err(HttpError::HttpRequestBodySize(Some(
                            this.seen,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Every body is polled at least once, so its first poll marks the
        // moment bytes go out (the response head's timeout counts from it,
        // and a state-changing request counts as written from it).
        self.started.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body under the size cap and the between-bytes timeout; a
/// transport error becomes `connection-terminated` (no host text).
pub(super) struct ResponseBody {
    /// hyper's body.
    pub(super) inner: hyper::body::Incoming,
    /// Bytes read so far.
    pub(super) seen: u64,
    /// Most bytes allowed.
    pub(super) cap: u64,
    /// Longest wait between two frames.
    pub(super) between: Duration,
    /// The running between-bytes timer.
    pub(super) sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(_))) => Poll::Ready(Some(Err(HttpError::ConnectionTerminated))),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.seen += d.len() as u64;
                    if this.seen > this.cap {
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(
                            this.seen,
                        )))));
                    }
                }
                let deadline = tokio::time::Instant::now() + this.between;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}
