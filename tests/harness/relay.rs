//! A TCP relay between a Redis replica and its primary that can stop
//! forwarding the primary's replication stream while still passing the
//! replica's acknowledgements: the primary keeps seeing the replica
//! `online` at a stale offset, and writes it acknowledged never reach the
//! replica — what a partition during a failover does, and what `DEBUG
//! SLEEP` or `CLIENT PAUSE` do not (their bytes wait in socket buffers).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running relay; stops when dropped.
pub struct ReplicationRelay {
    port: u16,
    forward: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl ReplicationRelay {
    /// Listens on a free loopback port and relays every connection to
    /// `127.0.0.1:<upstream>`, forwarding both ways until [`Self::hold`].
    pub async fn start(upstream: u16) -> anyhow::Result<ReplicationRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let forward = Arc::new(AtomicBool::new(true));
        let flag = forward.clone();
        let task = tokio::spawn(async move {
            while let Ok((replica, _)) = listener.accept().await {
                let Ok(primary) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                tokio::spawn(relay(replica, primary, flag.clone()));
            }
        });
        Ok(ReplicationRelay {
            port,
            forward,
            task,
        })
    }

    /// The port a replica names in `REPLICAOF 127.0.0.1 <port>`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on the primary's stream is read and dropped; the replica's
    /// acknowledgements still pass.
    pub fn hold(&self) {
        self.forward.store(false, Ordering::SeqCst);
    }
}

impl Drop for ReplicationRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(replica: TcpStream, primary: TcpStream, forward: Arc<AtomicBool>) {
    let (mut from_replica, mut to_replica) = replica.into_split();
    let (mut from_primary, mut to_primary) = primary.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_replica, &mut to_primary).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from_primary.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) if forward.load(Ordering::SeqCst) => {
                if to_replica.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            Ok(_) => {}
        }
    }
    up.abort();
}
