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

/// Whether process `pid` runs (exists and is not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// A `redis-server` left running by a process killed with `kill -9` (here a
/// `pushonce worker --dev-sender` on its embedded Redis) still holds its
/// data directory; the next start there finds the lock's owner gone, stops
/// that server (`SHUTDOWN`: its AOF written) and starts its own on the same
/// data, instead of refusing until an operator finds and stops it. Two
/// servers never run on the directory at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_server_left_behind_by_a_killed_process_is_stopped_by_the_next_start() {
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
    if started.is_ok() {
        // Something written while the worker lived.
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("SET")
            .arg("written-before-the-kill")
            .arg("kept")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _ = worker.kill();
    let _ = worker.wait();
    started.expect("the worker's embedded Redis answers");
    let left_behind = server_pid(&url).await;
    assert!(left_behind.is_some(), "the server outlived the worker");

    let target = RedisTarget::Embedded {
        data_dir: data_dir.clone(),
    };
    let opened = Store::open(&target).await;
    if opened.is_err()
        && let Some(pid) = left_behind
    {
        // Not stopped by the start: stop it here, so no server outlives the test.
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let store = opened.expect("a start beside a server left behind by a killed process");
    let now = server_pid(store.url()).await;
    assert!(
        now.is_some() && now != left_behind,
        "a server of its own: {now:?}, left behind {left_behind:?}"
    );
    assert!(
        left_behind.is_some_and(|pid| !running(pid)),
        "the server left behind has stopped"
    );
    let client = redis::Client::open(store.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let kept: Option<String> = redis::cmd("GET")
        .arg("written-before-the-kill")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kept.as_deref(), Some("kept"), "its data carried over");
    store.shutdown().await;
}
