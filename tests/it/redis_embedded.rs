//! The embedded Redis: the host starts its own `redis-server` (unix socket in
//! the data directory, or a loopback port when the socket path is too long),
//! with AOF on, and what was accepted survives a stop and a start; one
//! server per data directory, however it was started.

use std::process::{Command, Stdio};
use std::time::Duration;

use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, TaskStatus};
use pushonce::store::{RedisTarget, Store};
use pushonce_tests::fixtures::accept_request;
use pushonce_tests::process::pushonce_bin;
use pushonce_tests::redis::server_info;
use pushonce_tests::wait_until;

fn request(key: &str) -> AcceptRequest {
    AcceptRequest {
        channel: "inbox".into(),
        biz_type: String::new(),
        biz_id: String::new(),
        payload: "{}".into(),
        ..accept_request(key)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_redis_listens_on_a_socket_and_keeps_data_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let target = RedisTarget::Embedded {
        data_dir: dir.path().join("redis"),
    };
    let store = Store::open(&target).await.unwrap();
    assert!(store.url().starts_with("redis+unix://"), "{}", store.url());
    let permits = Permits::new(store.manager().await.unwrap(), PermitConfig::default());
    permits.prepare().await.unwrap();
    let id = match permits.accept(&request("embedded-1")).await.unwrap() {
        Acceptance::Accepted { task_id } => task_id,
        other => panic!("{other:?}"),
    };
    let mut conn = store.manager().await.unwrap();
    let aof: String = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async::<Vec<String>>(&mut conn)
        .await
        .unwrap()
        .remove(1);
    assert_eq!(aof, "yes");
    store.shutdown().await;

    let store = Store::open(&target).await.unwrap();
    let permits = Permits::new(store.manager().await.unwrap(), PermitConfig::default());
    let task = permits
        .task(&id)
        .await
        .unwrap()
        .expect("task survived the restart");
    assert_eq!(task.status, TaskStatus::Queued);
    store.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_too_deep_for_a_socket_falls_back_to_a_loopback_port() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
    let store = Store::open(&RedisTarget::Embedded { data_dir: deep })
        .await
        .unwrap();
    assert!(
        store.url().starts_with("redis://127.0.0.1:"),
        "{}",
        store.url()
    );
    let mut conn = store.manager().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    store.shutdown().await;
}

#[test]
fn without_redis_server_the_error_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(pushonce_bin().unwrap())
        .args(["worker", "--dev-sender", "--data-dir"])
        .arg(dir.path().join("redis"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.jsonl"))
        .env("PATH", dir.path())
        .env_remove("PUSHONCE_REDIS_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server) or set a Redis URL"),
        "{stderr}"
    );
}

/// The process id of the Redis answering at `url` (a new connection), or
/// `None` when none answers.
async fn server_pid(url: &str) -> Option<u32> {
    server_info(url, "process_id").await?.parse().ok()
}

/// One embedded Redis per data directory: a second start on a directory
/// whose server runs is refused with an error naming the directory's lock,
/// the first server keeps its socket, and once it has stopped the
/// directory can be used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_embedded_redis_on_a_held_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = RedisTarget::Embedded {
        data_dir: dir.path().join("redis"),
    };
    let first = Store::open(&target).await.unwrap();
    let pid = server_pid(first.url()).await;
    assert!(pid.is_some(), "the first server answers");

    let text = match Store::open(&target).await {
        Ok(second) => {
            let url = second.url().to_string();
            second.shutdown().await;
            panic!("a second server started on a held data directory: {url}");
        }
        Err(e) => e,
    };
    assert!(
        text.to_string().contains("is in use")
            && text.to_string().contains("redis.lock")
            && text.to_string().contains("fuser -v"),
        "{text}"
    );
    assert_eq!(
        server_pid(first.url()).await,
        pid,
        "the socket still reaches the first server"
    );

    first.shutdown().await;
    let again = Store::open(&target).await.unwrap();
    again.shutdown().await;
}

/// A `redis-server` left running by a process killed with `kill -9` (here a
/// `pushonce worker --dev-sender` on its embedded Redis) still holds its
/// data directory: a new start there is refused rather than a second server
/// appending to the same AOF; once that server is stopped, it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_server_left_behind_by_a_killed_process_still_holds_its_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("redis");
    let mut worker = Command::new(pushonce_bin().unwrap())
        .args(["worker", "--dev-sender", "--data-dir"])
        .arg(&data_dir)
        .arg("--ledger")
        .arg(dir.path().join("ledger.jsonl"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("redis+unix://{}", data_dir.join("redis.sock").display());
    let url_ref = &url;
    let started = wait_until(Duration::from_secs(20), || async move {
        server_pid(url_ref).await.is_some()
    })
    .await;
    let _ = worker.kill();
    let _ = worker.wait();
    started.expect("the worker's embedded Redis answers");
    let left_behind = server_pid(&url).await;

    let target = RedisTarget::Embedded {
        data_dir: data_dir.clone(),
    };
    let refused = match Store::open(&target).await {
        Ok(store) => {
            store.shutdown().await;
            None
        }
        Err(e) => Some(e.to_string()),
    };
    // Stop the server left behind (SIGTERM: it writes its AOF and exits)
    // whatever the outcome.
    if let Some(pid) = left_behind {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    assert!(left_behind.is_some(), "the server outlived the worker");
    let refused = refused.expect("a second server beside the one left behind");
    assert!(refused.contains("is in use"), "{refused}");

    let lock = data_dir.join("redis.lock");
    let lock_ref = &lock;
    wait_until(Duration::from_secs(10), || async move {
        let file = std::fs::File::open(lock_ref).unwrap();
        file.try_lock().is_ok()
    })
    .await
    .expect("the lock is free once that server stopped");
    let store = Store::open(&target).await.unwrap();
    store.shutdown().await;
}
