//! The one local HTTP receiver both peers deliver to: plain HTTP/1.1 on a
//! free loopback port in this process, answering 200 at once. It records
//! each arrival of each message by the `seq` the bench gave it (`data.seq`
//! of the JSON body: pushonce's webhook puts the event's params in `data`,
//! the Svix payload is posted in that shape), so a message that arrives
//! twice is counted whatever ids the sender put in its headers; the id it
//! carried (`webhook-id` or `svix-id`) is kept beside each arrival.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// Every arrival so far: by message `seq`, the time since the bench's start
/// and the sender's message id header.
type Arrivals = Arc<Mutex<HashMap<String, Vec<Arrival>>>>;

/// One arrival of a message.
#[derive(Debug, Clone)]
pub(super) struct Arrival {
    /// Since the bench's start.
    pub at: Duration,
    /// Its `webhook-id` or `svix-id` header (empty when neither).
    pub id: String,
}

/// The receiver, serving until the bench ends.
pub(super) struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What arrived.
    arrivals: Arrivals,
    /// Requests whose body named no `data.seq`.
    unnamed: Arc<Mutex<u64>>,
}

impl Receiver {
    /// Starts the receiver on a free loopback port; times are taken from `base`.
    pub async fn start(base: Instant) -> anyhow::Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let arrivals: Arrivals = Arc::default();
        let unnamed = Arc::new(Mutex::new(0));
        let (seen, bad) = (arrivals.clone(), unnamed.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, bad) = (seen.clone(), bad.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<Incoming>| {
                        let (seen, bad) = (seen.clone(), bad.clone());
                        async move {
                            let id = ["webhook-id", "svix-id"]
                                .iter()
                                .find_map(|h| req.headers().get(*h)?.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let body = req.into_body().collect().await?.to_bytes();
                            let at = base.elapsed();
                            match seq_of(&body) {
                                Some(seq) => seen
                                    .lock()
                                    .unwrap()
                                    .entry(seq)
                                    .or_default()
                                    .push(Arrival { at, id }),
                                None => *bad.lock().unwrap() += 1,
                            }
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::new())))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Receiver {
            addr,
            arrivals,
            unnamed,
        })
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Distinct messages of run `tag` that arrived, all arrivals of them,
    /// and the time of the latest arrival.
    pub fn count(&self, tag: &str) -> (usize, usize, Duration) {
        let prefix = format!("{tag}-");
        let seen = self.arrivals.lock().unwrap();
        let mut distinct = 0;
        let mut all = 0;
        let mut last = Duration::ZERO;
        for (_, times) in seen.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            distinct += 1;
            all += times.len();
            last = last.max(times.iter().map(|a| a.at).max().unwrap_or_default());
        }
        (distinct, all, last)
    }

    /// The arrivals of run `tag`, by `seq`.
    pub fn of(&self, tag: &str) -> HashMap<String, Vec<Arrival>> {
        let prefix = format!("{tag}-");
        let seen = self.arrivals.lock().unwrap();
        seen.iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Requests so far whose body named no `data.seq`.
    pub fn unnamed(&self) -> u64 {
        *self.unnamed.lock().unwrap()
    }
}

/// `data.seq` of a JSON body.
fn seq_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(v.get("data")?.get("seq")?.as_str()?.to_string())
}
