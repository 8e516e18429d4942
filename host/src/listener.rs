//! The HTTP listener: hyper's HTTP/1 connection builder over the axum
//! router, with what `axum::serve` lacks — a header-read timeout (a client
//! that has not sent a whole request head in time is disconnected, so slow
//! or stalled clients cannot hold connections) and a cap on connections
//! served at once (a connection over the cap is closed at once, the others
//! keep being served). Shutdown is graceful: stop accepting, let the
//! requests in flight finish.
//!
//! When the cap is near (its last tenth), idle keep-alive connections —
//! ones that were answered and are waiting for their next request — are
//! closed first (hyper's graceful shutdown: an idle connection closes at
//! once, one mid-request finishes it), so waiting clients make room for new
//! ones instead of new ones being refused. The same holds per client
//! address: one at its own cap has an idle connection closed for a new one.
//!
//! hyper answers a request it cannot parse (a bad request line, a URI too
//! long, a head too large) itself, with an empty 400, 414 or 431, before
//! the router sees it; [`ProblemIo`] turns those answers into problem+json
//! like every other error of the API.
//!
//! Every request carries a [`Client`] extension: the peer's and the
//! listener's addresses (rate limits per client address, the loopback
//! checks of a host without tokens).

use crate::api::guard::Client;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc, watch};

use crate::config::HttpConfig;

/// Serves `app` on `listener` until `stop` turns true, then finishes the
/// requests in flight.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    config: &HttpConfig,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let per_client = Arc::new(PerClient {
        max: config.max_connections_per_client.max(1),
        open: std::sync::Mutex::default(),
    });
    let local = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let open = Arc::new(OpenConnections::default());
    // Used slots from which idle keep-alive connections are closed, and how
    // many at a time: the cap's last tenth.
    let tenth = (config.max_connections / 10).max(1);
    let near = config.max_connections.saturating_sub(tenth);
    // Each connection's task holds a sender: all gone = all finished.
    let (finished_tx, mut finished_rx) = mpsc::channel::<()>(1);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        // Bounds the bytes a connection buffers for its head (431 beyond);
        // all heads at once: at most `max_connections` times this.
        .max_buf_size(config.max_head_bytes);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause, keep serving.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let Some(client_slot) = PerClient::take(&per_client, peer.ip())
            .or_else(|| make_room(&per_client, &open, peer.ip()))
        else {
            tracing::debug!(
                client = %peer.ip(),
                max = per_client.max,
                "per-client connection cap reached: closing a new connection"
            );
            drop(stream);
            continue;
        };
        let slot = slots.clone().try_acquire_owned();
        let used = config.max_connections - slots.available_permits();
        if slot.is_err() || used >= near {
            let closed = open.close_idle(tenth);
            tracing::debug!(
                used,
                max = config.max_connections,
                closed,
                "connection cap near: closing idle keep-alive connections"
            );
        }
        let Ok(slot) = slot else {
            tracing::debug!(
                max = config.max_connections,
                "connection cap reached: closing a new connection"
            );
            drop(stream);
            continue;
        };
        let (id, state) = open.add(peer.ip());
        let conn = builder.serve_connection(
            TokioIo::new(ProblemIo::new(stream)),
            TowerToHyperService::new(WithClient {
                app: app.clone(),
                client: Client { peer, local },
                state: state.clone(),
            }),
        );
        let (mut stop, open, finished) = (stop.clone(), open.clone(), finished_tx.clone());
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let mut closing = false;
            let result = loop {
                tokio::select! {
                    result = conn.as_mut() => break result,
                    _ = stopped(&mut stop), if !closing => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    _ = state.close.notified(), if !closing => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            open.remove(id);
            drop(slot);
            drop(client_slot);
            drop(finished);
        });
    }
    drop(listener);
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    drop(finished_tx);
    let _ = finished_rx.recv().await;
}

/// The open connections, so that idle ones can be closed first when the cap
/// is near.
#[derive(Default)]
struct OpenConnections {
    /// By an id of their own.
    conns: std::sync::Mutex<HashMap<u64, Arc<ConnState>>>,
    /// The next id.
    next: AtomicU64,
}

impl OpenConnections {
    /// Registers a new connection of client address `ip`.
    fn add(&self, ip: std::net::IpAddr) -> (u64, Arc<ConnState>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            ip: Some(ip),
            ..ConnState::default()
        });
        self.lock().insert(id, state.clone());
        (id, state)
    }

    /// Forgets a connection that ended.
    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Tells up to `n` idle keep-alive connections (answered, no request
    /// in flight, not told already) to close; how many were told.
    fn close_idle(&self, n: usize) -> usize {
        self.close_idle_where(n, |_| true)
    }

    /// [`OpenConnections::close_idle`] among the connections of client
    /// address `ip` only.
    fn close_idle_of(&self, ip: std::net::IpAddr, n: usize) -> usize {
        self.close_idle_where(n, |state| state.ip == Some(ip))
    }

    fn close_idle_where(&self, n: usize, of: impl Fn(&ConnState) -> bool) -> usize {
        let conns = self.lock();
        let mut told = 0;
        for state in conns.values() {
            if told == n {
                break;
            }
            if of(state)
                && state.answered.load(Ordering::Acquire)
                && state.in_flight.load(Ordering::Acquire) == 0
                && !state.told.swap(true, Ordering::AcqRel)
            {
                // Stored if the task is not waiting yet: it sees it next.
                state.close.notify_one();
                told += 1;
            }
        }
        told
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the listener knows of one connection.
#[derive(Default)]
struct ConnState {
    /// The client's address.
    ip: Option<std::net::IpAddr>,
    /// At least one request was received on it (a keep-alive connection).
    answered: AtomicBool,
    /// Requests on it not answered yet.
    in_flight: AtomicUsize,
    /// Told to close already.
    told: AtomicBool,
    /// Wakes its task to close it.
    close: Notify,
}

/// One request in flight on a connection; counted down when dropped.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn start(state: &Arc<ConnState>) -> InFlight {
        state.answered.store(true, Ordering::Release);
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Connections open per client address, capped at `max`.
struct PerClient {
    /// The cap per address.
    max: usize,
    /// Open connections by address (addresses with none are removed).
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PerClient {
    /// One more connection of `ip`, or `None` when it has `max` already.
    fn take(this: &Arc<PerClient>, ip: std::net::IpAddr) -> Option<ClientSlot> {
        let mut open = this.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= this.max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            of: this.clone(),
            ip,
        })
    }

    /// One more connection of `ip` over its cap, while one of its idle
    /// connections (told to close) is on its way out.
    fn take_over(this: &Arc<PerClient>, ip: std::net::IpAddr) -> ClientSlot {
        let mut open = this.open.lock().unwrap_or_else(|e| e.into_inner());
        *open.entry(ip).or_insert(0) += 1;
        ClientSlot {
            of: this.clone(),
            ip,
        }
    }
}

/// Room for one more connection of `ip`, which has its cap of them open:
/// one of its idle keep-alive connections is told to close (at once, as it
/// is idle) and the new one takes its place, so a client that keeps idle
/// connections (a provider pushing receipts from one address, a pooling
/// load balancer) is not refused new ones; `None` when none of its
/// connections is idle (all are mid-request or never sent one).
fn make_room(
    per_client: &Arc<PerClient>,
    open: &OpenConnections,
    ip: std::net::IpAddr,
) -> Option<ClientSlot> {
    if open.close_idle_of(ip, 1) == 0 {
        return None;
    }
    tracing::debug!(client = %ip, "per-client connection cap reached: closing one of its idle keep-alive connections for a new one");
    Some(PerClient::take_over(per_client, ip))
}

/// One open connection of a client address; given back when dropped.
struct ClientSlot {
    of: Arc<PerClient>,
    ip: std::net::IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.of.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The router, with each request given its connection's [`Client`], and
/// counted in flight on its connection until answered.
#[derive(Clone)]
struct WithClient {
    app: Router,
    client: Client,
    state: Arc<ConnState>,
}

impl<B> tower_service::Service<axum::http::Request<B>> for WithClient
where
    Router: tower_service::Service<axum::http::Request<B>>,
    <Router as tower_service::Service<axum::http::Request<B>>>::Future: Send + 'static,
{
    type Response = <Router as tower_service::Service<axum::http::Request<B>>>::Response;
    type Error = <Router as tower_service::Service<axum::http::Request<B>>>::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower_service::Service::<axum::http::Request<B>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, mut req: axum::http::Request<B>) -> Self::Future {
        req.extensions_mut().insert(self.client);
        let in_flight = InFlight::start(&self.state);
        let answer = self.app.call(req);
        Box::pin(async move {
            let answer = answer.await;
            drop(in_flight);
            answer
        })
    }
}

/// Resolves once `stop` is (or turns) true, or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// A connection's stream that rewrites hyper's own error answers (400, 414,
/// 431 without a `content-type`: every answer of the router has one) into
/// problem+json answers; everything else passes through untouched.
struct ProblemIo {
    /// The client's connection.
    inner: TcpStream,
    /// A rewritten answer still to be written, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
}

impl ProblemIo {
    fn new(inner: TcpStream) -> ProblemIo {
        ProblemIo {
            inner,
            pending: None,
        }
    }

    /// Writes what is left of a rewritten answer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ProblemIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ProblemIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if let Some(answer) = problem_answer(buf) {
            this.pending = Some((answer, 0));
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    /// Vectored like the socket (hyper then writes a head and a body
    /// without copying them together); hyper's error answers are a head
    /// alone, in the first slice.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        let first = bufs.iter().find(|b| !b.is_empty());
        if let Some(answer) = first.and_then(|b| problem_answer(b)) {
            this.pending = Some((answer, 0));
            return Poll::Ready(Ok(first.map_or(0, |b| b.len())));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The problem+json answer replacing `written` when it is one of hyper's
/// own error answers (400, 414 or 431 without a `content-type`).
fn problem_answer(written: &[u8]) -> Option<Vec<u8>> {
    use axum::http::StatusCode;
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&written[..end]).ok()?;
    let (status, detail) = match head.strip_prefix("HTTP/1.1 ")?.get(..3)? {
        "400" => (
            StatusCode::BAD_REQUEST,
            "the request line or a header could not be parsed",
        ),
        "414" => (StatusCode::URI_TOO_LONG, "the request URI is too long"),
        "431" => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "the request head has too many or too large header fields",
        ),
        _ => return None,
    };
    if head.to_ascii_lowercase().contains("\r\ncontent-type:") {
        return None;
    }
    let problem = crate::api::ApiError::Http { status, detail }.problem();
    let body = serde_json::to_vec(&problem).ok()?;
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default(),
        crate::api::problem::PROBLEM_JSON,
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::problem_answer;

    #[test]
    fn only_hypers_own_error_answers_are_rewritten() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let answer = String::from_utf8(problem_answer(hyper_400).unwrap()).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains("content-type: application/problem+json"),
            "{answer}"
        );
        assert!(
            answer.ends_with(
                "\"status\":400,\"detail\":\"the request line or a header could not be parsed\"}"
            ),
            "{answer}"
        );
        let router_400 =
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(problem_answer(router_400).is_none());
        assert!(problem_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(problem_answer(b"HTTP/1.1 400 Bad Req").is_none());
    }
}
