//! The embedded Redis: the host starts its own `redis-server` (unix socket in
//! the data directory, or a loopback port when the socket path is too long),
//! with AOF on, and what was accepted survives a stop and a start.

use std::process::Command;

use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, TaskStatus};
use pushonce::store::{RedisTarget, Store};
use pushonce_tests::fixtures::accept_request;
use pushonce_tests::process::pushonce_bin;

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
