//! Instances sharing a Redis share their delivery ledger: a `pushonce serve`
//! whose ledger is not the one the instance already on that Redis uses
//! (each on its default SQLite file in its own data dir, as two machines
//! would be) refuses to start, naming both ledgers and the fix; one naming
//! the same ledger starts; `allow_separate_ledgers = true` starts on its own
//! ledger; `/readyz` names a ledger that differs from the one Redis records
//! (after the record changed under a running instance).

use std::time::Duration;

use pushonce_tests::host::{Setup, TestHost};
use pushonce_tests::process::PushonceProcess;
use pushonce_tests::redis::RedisServer;
use reqwest::StatusCode;

/// Where the ledger's identity is recorded (default namespace).
const KEY: &str = "{po:meta}:ledger";

async fn recorded(redis: &RedisServer) -> String {
    let mut conn = redis.manager().await.unwrap();
    redis::cmd("GET")
        .arg(KEY)
        .query_async::<Option<String>>(&mut conn)
        .await
        .unwrap()
        .expect("the first instance recorded its ledger")
}

fn serve(dir: &std::path::Path, redis: &RedisServer, env: &[(&str, &str)]) -> PushonceProcess {
    let listen = format!(
        "127.0.0.1:{}",
        pushonce::store::free_loopback_port().unwrap()
    );
    let url = redis.url();
    let mut all = vec![("PUSHONCE_REDIS_URL", url.as_str())];
    all.extend_from_slice(env);
    PushonceProcess::serve_repository_config(dir, &listen, "", &all).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_on_another_ledger_is_refused_naming_both() {
    let redis = RedisServer::start().await.unwrap();
    let first = TestHost::start(&redis).await.unwrap();
    let theirs = recorded(&redis).await;

    // A second machine on its own default SQLite ledger.
    let dir = tempfile::tempdir().unwrap();
    let mut second = serve(dir.path(), &redis, &[]);
    let status = second.wait_exit(Duration::from_secs(60)).await.unwrap();
    let log = second.log();
    assert!(!status.success(), "started on a ledger of its own:\n{log}");
    for named in [
        theirs.as_str(),
        "is not the one the other instances on this Redis use",
        "give every instance the same ledger_url",
        "allow_separate_ledgers = true",
    ] {
        assert!(
            log.contains(named),
            "the refusal does not name {named:?}:\n{log}"
        );
    }
    assert_eq!(
        recorded(&redis).await,
        theirs,
        "the refused instance overwrote the record"
    );

    // An instance on a ledger of its own: refused in-process too, and with
    // the opt-in it starts and is ready.
    let own = tempfile::tempdir().unwrap();
    let own_ledger = format!("sqlite:{}", own.path().join("own.sqlite3").display());
    let own_setup = |allow: bool| Setup {
        ledger_url: Some(own_ledger.clone()),
        configure: Some(Box::new(move |c| c.allow_separate_ledgers = allow)),
        ..Setup::default()
    };
    let refused = TestHost::start_with(&redis, own_setup(false))
        .await
        .err()
        .expect("refused on its own ledger");
    assert!(format!("{refused:#}").contains(&theirs), "{refused:#}");
    let opted = TestHost::start_with(&redis, own_setup(true)).await.unwrap();
    let ready = opted.get("/readyz", None).await.unwrap();
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    first.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_naming_one_ledger_start_and_readyz_names_a_changed_record() {
    let redis = RedisServer::start().await.unwrap();
    let shared = tempfile::tempdir().unwrap();
    let ledger_url = format!("sqlite:{}", shared.path().join("ledger.sqlite3").display());
    let setup = || Setup {
        ledger_url: Some(ledger_url.clone()),
        ..Setup::default()
    };
    let a = TestHost::start_with(&redis, setup()).await.unwrap();
    let b = TestHost::start_with(&redis, setup()).await.unwrap();
    for host in [&a, &b] {
        let ready = host.get("/readyz", None).await.unwrap();
        assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    }

    // The record changes under them (another deployment's ledger wrote it
    // into a Redis restored from elsewhere, say): not ready, naming it.
    let mut conn = redis.manager().await.unwrap();
    let () = redis::cmd("SET")
        .arg(KEY)
        .arg("another-ledger-id")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ready = a.get("/readyz", None).await.unwrap();
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.body
    );
    assert!(
        ready.body.to_string().contains("another-ledger-id"),
        "{}",
        ready.body
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
