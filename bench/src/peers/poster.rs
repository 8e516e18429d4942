//! The load: `n` messages posted from `c` concurrent tasks in this process,
//! each POST retried with the same idempotency key (Svix's
//! `idempotency-key` header, pushonce's `biz_id`) until it is answered 2xx —
//! while a server is killed, refused connections and 5xx answers are retried (a
//! 4xx other than 408, 409 and 429 ends the run), so
//! every message is accepted exactly as a client would make sure of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;

/// Builds the request of the message with `seq`.
pub(super) type MakeRequest =
    Arc<dyn Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder + Send + Sync>;

/// A load run in progress.
pub(super) struct Posting {
    /// By `seq`: when its POST was answered 2xx, since the bench's start.
    pub answered: Arc<Mutex<HashMap<String, Duration>>>,
    /// POSTs that failed and were sent again.
    pub retries: Arc<AtomicUsize>,
    /// The posting tasks.
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Posting {
    /// Starts posting messages `<tag>-0` … `<tag>-<n-1>`; gives up on a
    /// message after `deadline`.
    pub fn start(
        n: usize,
        c: usize,
        tag: &str,
        base: Instant,
        deadline: Duration,
        make: MakeRequest,
    ) -> anyhow::Result<Posting> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(c)
            .timeout(Duration::from_secs(30))
            .build()?;
        let answered: Arc<Mutex<HashMap<String, Duration>>> = Arc::default();
        let retries = Arc::new(AtomicUsize::new(0));
        let next = Arc::new(AtomicUsize::new(0));
        let tasks = (0..c)
            .map(|_| {
                let (client, answered, retries, next, make) = (
                    client.clone(),
                    answered.clone(),
                    retries.clone(),
                    next.clone(),
                    make.clone(),
                );
                let tag = tag.to_string();
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let seq = format!("{tag}-{i}");
                        let start = Instant::now();
                        loop {
                            let error = match make(&client, &seq).send().await {
                                Ok(r) if r.status().is_success() => {
                                    let _ = r.bytes().await;
                                    answered.lock().unwrap().insert(seq.clone(), base.elapsed());
                                    break;
                                }
                                Ok(r) => {
                                    let status = r.status();
                                    let text =
                                        format!("{status}: {}", r.text().await.unwrap_or_default());
                                    // A refusal of the request itself is not retried
                                    // (a replay in flight, 409, and throttling are).
                                    if status.is_client_error()
                                        && ![408, 409, 429].contains(&status.as_u16())
                                    {
                                        bail!("{seq} refused: {text}");
                                    }
                                    text
                                }
                                Err(e) => format!("{e}"),
                            };
                            if start.elapsed() > deadline {
                                bail!("{seq} not accepted after {deadline:?}; last: {error}");
                            }
                            retries.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect();
        Ok(Posting {
            answered,
            retries,
            tasks,
        })
    }

    /// Messages answered 2xx so far.
    pub fn accepted(&self) -> usize {
        self.answered.lock().unwrap().len()
    }

    /// Waits for every posting task; the first error if one gave up.
    pub async fn finish(self) -> anyhow::Result<Arc<Mutex<HashMap<String, Duration>>>> {
        for task in self.tasks {
            task.await??;
        }
        Ok(self.answered)
    }
}
