//! ACLs on the ZooKeeper port (server/src/acl.rs, server/src/zk/conn.rs):
//! ZooKeeper's `digest` authentication and every permission enforced for
//! ZooKeeper clients, in Baton's one ACL model shared with the native port.
//!
//! z10: with the `zookeeper-client` crate: a `digest` ACL and an `auth`
//! ACL made by an authenticated session; a session without auth gets
//! `NoAuth` on get, set, children, getACL, getAllChildrenNumber, create and
//! delete of a child and setACL, while `exists` works; another session with the same password
//! reads, a wrong password does not; `ip` ACLs, empty ACLs and `auth`
//! without an identity are `InvalidAcl`; a malformed auth or another scheme
//! is `AuthFailed`; whoAmI names the digest user; getACL hides digest
//! hashes from a reader without ADMIN; `--superuser digest:super:HASH` is
//! ZooKeeper's superDigest; a native client is held to a ZooKeeper-made ACL.
//! z20: zkCli.sh scripts (`addauth digest`, `create ... digest:...`,
//! `auth::cdrwa`, `ip:`), their output asserted.
//! z30: on a TLS cluster with password users (its ZooKeeper port takes
//! TLS only; a client certificate's name is an `x509:` identity): a Baton user's password via
//! `digest` on the ZooKeeper port gives `user:NAME` rights; a native login
//! gives the `digest:` identity, so ZooKeeper-made ACLs apply to it.

use std::time::Duration;

use baton_client::{acl as bacl, CreateOptions};
use baton_tests::Cluster;
use zookeeper_client as zk;

/// ZooKeeper's digest of "alice:pw": base64(SHA-1("alice:pw")) (`printf
/// alice:pw | openssl sha1 -binary | base64`; acl.rs unit-tests it).
const ALICE_HASH: &str = "V55/p2T0OpjQ+low3NVAH4aLvm0=";
/// ZooKeeper's own test vector: "super:test" (zookeeper-server/pom.xml).
const SUPER_DIGEST: &str = "digest:super:D/InIHSb7yEEbrWz8b9l71RjZJU=";

/// Every ZooKeeper call here is bounded.
const OP: Duration = Duration::from_secs(15);

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(OP, f).await.unwrap_or_else(|_| panic!("{what}: no answer within {OP:?}"))
}

async fn connect(ep: &str, auth: Option<&str>) -> zk::Client {
    let c = bounded("connect", zk::Client::connector().with_session_timeout(Duration::from_secs(6)).connect(ep))
        .await
        .expect("zookeeper-client connects to the ZooKeeper port");
    if let Some(a) = auth {
        bounded("auth", c.auth("digest", a.as_bytes())).await.expect("digest auth");
    }
    c
}

fn alice_acl(perms: zk::Permission) -> zk::Acl {
    zk::Acl::new(perms, zk::AuthId::new("digest", &format!("alice:{ALICE_HASH}")))
}

fn with(acls: &[zk::Acl]) -> zk::CreateOptions<'_> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::new(acls))
}

fn anyone() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn ids(acl: &[zk::Acl]) -> Vec<(String, String)> {
    acl.iter().map(|a| (a.scheme().to_string(), a.id().to_string())).collect()
}

fn no_auth<T: std::fmt::Debug>(r: Result<T, zk::Error>, what: &str) {
    assert_eq!(r.map(|_| ()).expect_err(what), zk::Error::NoAuth, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn z10_digest_acls_are_enforced_for_zookeeper_clients() {
    let superuser = format!("--superuser={SUPER_DIGEST}");
    let c = Cluster::start_zk(3, &[&superuser]).await;
    let ep = c.zk_endpoints()[0].clone();

    // A authenticates as alice; whoAmI names the user, as ZooKeeper's does.
    let a = connect(&ep, Some("alice:pw")).await;
    let who = bounded("whoami", a.list_auth_users()).await.expect("whoami");
    assert!(who.iter().any(|u| (u.scheme(), u.user()) == ("digest", "alice")), "{who:?}");
    let all = [alice_acl(zk::Permission::ALL)];
    bounded("create", a.create("/secret", b"s", &with(&all))).await.expect("create with a digest ACL");
    bounded("create", a.create("/secret/child", b"", &anyone())).await.expect("alice creates a child");
    bounded("create", a.create("/mine", b"m", &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all())))
        .await
        .expect("create with auth::cdrwa");
    let (acl, _) = bounded("getACL", a.get_acl("/mine")).await.expect("alice reads /mine's ACL");
    assert_eq!(acl, vec![alice_acl(zk::Permission::ALL)], "`auth` became alice's digest identity");
    let (acl, _) = bounded("getACL", a.get_acl("/secret")).await.expect("alice reads /secret's ACL");
    assert_eq!(acl, all.to_vec(), "with ADMIN the hash shows");

    // B has no auth: every permission is refused, exists is not.
    let b = connect(&ep, None).await;
    no_auth(bounded("get", b.get_data("/secret")).await, "B get");
    no_auth(bounded("get", b.get_data("/mine")).await, "B get /mine");
    no_auth(bounded("set", b.set_data("/secret", b"x", None)).await, "B set");
    no_auth(bounded("children", b.list_children("/secret")).await, "B children");
    no_auth(bounded("children2", b.get_children("/secret")).await, "B children2");
    no_auth(bounded("getACL", b.get_acl("/secret")).await, "B getACL");
    no_auth(bounded("getAllChildrenNumber", b.count_descendants_number("/secret")).await, "B descendants");
    assert_eq!(bounded("getAllChildrenNumber", a.count_descendants_number("/secret")).await.expect("alice counts"), 1);
    no_auth(bounded("create child", b.create("/secret/b", b"", &anyone())).await, "B create child");
    no_auth(bounded("delete child", b.delete("/secret/child", None)).await, "B delete child");
    no_auth(
        bounded("setACL", b.set_acl("/secret", &[zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone())], None)).await,
        "B setACL",
    );
    let stat = bounded("exists", b.check_stat("/secret")).await.expect("exists needs no permission");
    assert_eq!(stat.map(|s| s.data_length), Some(1));
    // ACLs Baton does not enforce, or cannot expand, are refused before
    // anything is written: INVALID_ACL, as ZooKeeper answers.
    let ip = [zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("ip", "127.0.0.1"))];
    let r = bounded("create ip", b.create("/ip", b"", &with(&ip))).await;
    assert_eq!(r.map(|_| ()).expect_err("ip ACL"), zk::Error::InvalidAcl);
    let r = bounded(
        "create auth",
        b.create("/noauth", b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all())),
    )
    .await;
    assert_eq!(r.map(|_| ()).expect_err("auth ACL without an identity"), zk::Error::InvalidAcl);
    bounded("create", b.create("/open", b"", &anyone())).await.expect("an open node");
    let r = bounded("setACL ip", b.set_acl("/open", &ip, None)).await;
    assert_eq!(r.expect_err("setACL ip"), zk::Error::InvalidAcl);
    let bad_digest = [zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", "alice"))];
    let r = bounded("setACL bad digest", b.set_acl("/open", &bad_digest, None)).await;
    assert_eq!(r.expect_err("digest without a hash"), zk::Error::InvalidAcl);
    let r =
        bounded("setACL auth", b.set_acl("/open", &[zk::Acl::new(zk::Permission::ALL, zk::AuthId::authed())], None))
            .await;
    assert_eq!(r.expect_err("setACL auth without an identity"), zk::Error::InvalidAcl);
    // Inside a multi too.
    let mut m = b.new_multi_writer();
    m.add_create("/ipm", b"", &with(&ip)).expect("multi create");
    assert!(bounded("multi", m.commit()).await.is_err(), "a multi with an ip ACL fails");
    assert!(bounded("exists", b.check_stat("/ipm")).await.expect("exists").is_none());
    assert!(bounded("exists", b.check_stat("/ip")).await.expect("exists").is_none());
    let (acl, _) = bounded("getACL", b.get_acl("/open")).await.expect("getACL");
    assert_eq!(acl, vec![zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone())], "nothing changed");

    // C authenticates with alice's password: reads both; D with a wrong one
    // is someone else (ZooKeeper's digest auth always succeeds).
    let cc = connect(&ep, Some("alice:pw")).await;
    let (data, _) = bounded("get", cc.get_data("/secret")).await.expect("C reads /secret");
    assert_eq!(data, b"s");
    let (data, _) = bounded("get", cc.get_data("/mine")).await.expect("C reads /mine");
    assert_eq!(data, b"m");
    bounded("set", cc.set_data("/secret", b"s2", None)).await.expect("C writes /secret");
    let d = connect(&ep, Some("alice:wrong")).await;
    no_auth(bounded("get", d.get_data("/secret")).await, "wrong password get");
    no_auth(bounded("set", d.set_data("/secret", b"x", None)).await, "wrong password set");

    // A reader without ADMIN sees digest hashes as `x` (ZooKeeper's getACL).
    let readable = [alice_acl(zk::Permission::ALL), zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone())];
    bounded("setACL", a.set_acl("/secret", &readable, None)).await.expect("alice opens reads");
    let (acl, _) = bounded("getACL", b.get_acl("/secret")).await.expect("B reads the ACL now");
    let shown = vec![("digest".to_string(), "alice:x".to_string()), ("world".into(), "anyone".into())];
    assert_eq!(ids(&acl), shown, "the hash is hidden from a reader without ADMIN");
    let (acl, _) = bounded("getACL", a.get_acl("/secret")).await.expect("alice reads the ACL");
    assert_eq!(acl, readable.to_vec());
    let (data, _) = bounded("get", b.get_data("/secret")).await.expect("B reads now");
    assert_eq!(data, b"s2");
    no_auth(bounded("set", b.set_data("/secret", b"x", None)).await, "B still may not write");
    bounded("setACL", a.set_acl("/secret", &all, None)).await.expect("alice closes reads");

    // The superDigest: may do everything.
    let s = connect(&ep, Some("super:test")).await;
    bounded("set", s.set_data("/mine", b"root", None)).await.expect("super writes /mine");
    bounded("delete", s.delete("/secret/child", None)).await.expect("super deletes alice's child");

    // A native client is held to the same ACLs.
    let native = c.client().await;
    let r = native.get("/secret").await;
    assert!(matches!(r, Err(baton_client::Error::NoAuth(_))), "native get: {r:?}");
    let r = native.set("/mine", "x", None).await;
    assert!(matches!(r, Err(baton_client::Error::NoAuth(_))), "native set: {r:?}");
    let _ = native.close().await;

    // Malformed auth, another scheme: AUTH_FAILED, and the session ends.
    for (scheme, bytes) in [("digest", &b"no-colon"[..]), ("digest", b":pw"), ("ip", b"127.0.0.1"), ("sasl", b"x")] {
        let e = connect(&ep, None).await;
        let r = bounded("bad auth", e.auth(scheme, bytes)).await;
        assert_eq!(r.expect_err("refused"), zk::Error::AuthFailed, "{scheme} {bytes:?}");
        assert!(bounded("after auth failed", e.get_data("/open")).await.is_err(), "the session is over");
    }
    // The member serves on.
    let (data, _) = bounded("get", a.get_data("/secret")).await.expect("alice still reads");
    assert_eq!(data, b"s2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn z20_zkcli_addauth_digest_and_acls() {
    let c = Cluster::start_zk(3, &[]).await;
    let ep = c.zk_endpoints()[0].clone();
    let owner = format!(
        "\
addauth digest alice:pw
create /cli hello digest:alice:{ALICE_HASH}:cdrwa
create /cli/kid k
create /cli2 x auth::cdrwa
getAcl /cli2
whoami
create /cliip x ip:127.0.0.1:cdrwa
get /cli
quit
"
    );
    let out = baton_tests::zkcli(&ep, &owner).await;
    let has = |out: &str, s: &str| assert!(out.contains(s), "zkCli output lacks {s:?}:\n{out}");
    has(&out, "Created /cli\n");
    has(&out, "Created /cli/kid\n");
    has(&out, "Created /cli2\n");
    has(&out, &format!("'digest,'alice:{ALICE_HASH}\n: cdrwa"));
    has(&out, "digest: alice");
    has(&out, "Acl is not valid : /cliip");
    assert!(out.lines().any(|l| l.trim() == "hello"), "alice reads /cli:\n{out}");

    let stranger = "\
get /cli
set /cli nope
ls /cli
delete /cli/kid
create /cli/other x
setAcl /cli world:anyone:cdrwa
stat /cli
create /strange x auth::cdrwa
quit
"
    .to_string();
    let out = baton_tests::zkcli(&ep, &stranger).await;
    has(&out, "Insufficient permission : /cli");
    has(&out, "Insufficient permission : /cli/kid");
    has(&out, "Insufficient permission : /cli/other");
    assert!(out.matches("Insufficient permission").count() >= 6, "get, set, ls, delete, create, setAcl:\n{out}");
    has(&out, "dataLength = 5");
    has(&out, "Acl is not valid : /strange");
    assert!(!out.lines().any(|l| l.trim() == "hello"), "the stranger read /cli:\n{out}");

    let wrong = "\
addauth digest alice:nope
get /cli
addauth digest alice:pw
get /cli2
quit
"
    .to_string();
    let out = baton_tests::zkcli(&ep, &wrong).await;
    has(&out, "Insufficient permission : /cli");
    assert!(out.lines().any(|l| l.trim() == "x"), "with the right password too, /cli2 reads:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn z30_one_login_serves_both_ports() {
    let c = Cluster::start_tls_zk(3, &["--superuser=x509:admin"]).await;
    // The ZooKeeper port takes TLS only, as the client port: a plaintext
    // connect gets no answer, just a close.
    let port = c.zk_endpoints()[0].clone();
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&port).await.expect("connect");
        let connect = baton_proto::jute::ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: 0,
            timeout_ms: 6000,
            session_id: 0,
            passwd: vec![0; 16],
            read_only: false,
        }
        .encode();
        let mut frame = (connect.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&connect);
        let _ = s.write_all(&frame).await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
        assert!(read.is_ok() && got.is_empty(), "a plaintext ZooKeeper client got {got:?}");
    }
    // ZooKeeper clients here speak through a TLS tunnel with a client
    // certificate: its name is an identity of theirs.
    let ep = c.zk_tls_tunnel(&port, "zk-tunnel").await;
    let admin = c.client().await;
    admin.add_user("carol", "carol-pw").await.expect("add carol");
    admin.add_user("alice", "pw").await.expect("add alice");
    admin
        .create_with_acl("/native", "n", CreateOptions::persistent(), bacl::parse("user:carol:rwcda").expect("acl"))
        .await
        .expect("a node for carol, made natively");

    // carol's password on the ZooKeeper port: user:carol rights.
    let carol = connect(&ep, Some("carol:carol-pw")).await;
    let who = bounded("whoami", carol.list_auth_users()).await.expect("whoami");
    let who: Vec<(String, String)> = who.iter().map(|u| (u.scheme().to_string(), u.user().to_string())).collect();
    assert!(who.contains(&("user".into(), "carol".into())), "{who:?}");
    assert!(who.contains(&("digest".into(), "carol".into())), "{who:?}");
    assert!(who.contains(&("x509".into(), "zk-tunnel".into())), "the certificate's name: {who:?}");
    let (data, _) = bounded("get", carol.get_data("/native")).await.expect("carol reads /native");
    assert_eq!(data, b"n");
    bounded("set", carol.set_data("/native", b"n2", None)).await.expect("carol writes /native");
    // A wrong password is a digest identity only: no user:carol.
    let fake = connect(&ep, Some("carol:wrong")).await;
    let who = bounded("whoami", fake.list_auth_users()).await.expect("whoami");
    assert!(!who.iter().any(|u| u.scheme() == "user"), "{who:?}");
    no_auth(bounded("get", fake.get_data("/native")).await, "wrong password");

    // A node made through the ZooKeeper port with a digest ACL.
    let z = connect(&ep, Some("alice:pw")).await;
    bounded("create", z.create("/zk-made", b"z", &with(&[alice_acl(zk::Permission::ALL)])))
        .await
        .expect("create with a digest ACL");
    // Native clients: a stranger and another user are refused; alice's
    // native login has the digest identity and reads.
    let stranger = c.guest("guest-s", None).await.expect("guest connects");
    let r = stranger.get("/zk-made").await;
    assert!(matches!(r, Err(baton_client::Error::NoAuth(_))), "stranger: {r:?}");
    let carol_native = c.guest("guest-c", Some(("carol", "carol-pw"))).await.expect("guest connects");
    let r = carol_native.get("/zk-made").await;
    assert!(matches!(r, Err(baton_client::Error::NoAuth(_))), "carol: {r:?}");
    let alice_native = c.guest("guest-a", Some(("alice", "pw"))).await.expect("guest connects");
    let ids = alice_native.whoami().await.expect("whoami");
    assert!(ids.contains(&format!("digest:alice:{ALICE_HASH}")), "{ids:?}");
    let (data, _) = alice_native.get("/zk-made").await.expect("alice reads natively");
    assert_eq!(&data[..], b"z");
    alice_native.set("/zk-made", "z2", None).await.expect("alice writes natively");
    let (data, _) = bounded("get", z.get_data("/zk-made")).await.expect("read back");
    assert_eq!(data, b"z2");
    for cl in [stranger, carol_native, alice_native, admin] {
        let _ = cl.close().await;
    }
}
