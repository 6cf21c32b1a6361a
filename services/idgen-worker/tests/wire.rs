//! The worker over a real socket, the bytes written by hand: request bodies that arrive in
//! pieces, chunked, pipelined behind one another, too large in pieces, or behind
//! `Expect: 100-continue`; and many connections at once. These are the paths where the connection
//! waits for its body and wakes (the accept loop polls a connection again at once when it wakes
//! itself, `idgen_server::repoll`): each must still get its answer, and every ID is unique.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use idgen_worker::Worker;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A development worker on a free port; its address once it issues.
async fn worker(dir: &std::path::Path) -> std::net::SocketAddr {
    let worker = Worker::build(&common::config_in(dir), 1).await.unwrap();
    let address = worker.listeners.service.local_addr().unwrap();
    tokio::spawn(worker.serve(std::future::pending()));
    // The keeper claims in a task of its own: wait until an ID comes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut stream = connect(address).await;
        stream.write_all(&post("/v1/ids", "{}")).await.unwrap();
        if read_response(&mut stream).await.0 == 200 {
            return address;
        }
        assert!(tokio::time::Instant::now() < deadline, "the worker never issued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn connect(address: std::net::SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(address).await.unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One response from `stream`: its status and its body as JSON. Bytes past it stay unread in the
/// socket only if they had not arrived yet; tests that pipeline read with [`read_responses`].
async fn read_response(stream: &mut TcpStream) -> (u16, Value) {
    read_responses(stream, 1).await.remove(0)
}

/// `count` responses from `stream`, in order.
async fn read_responses(stream: &mut TcpStream, count: usize) -> Vec<(u16, Value)> {
    let mut buffer = Vec::new();
    let mut responses = Vec::new();
    let read = async {
        while responses.len() < count {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buffer[..end]).unwrap().to_owned();
                let status: u16 = head[9..12].parse().unwrap();
                if status == 100 {
                    buffer.drain(..end + 4); // an interim answer: no body, the real one follows
                    continue;
                }
                let length: usize = head
                    .lines()
                    .find_map(|line| {
                        line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                    })
                    .expect("every answer has a length")
                    .parse()
                    .unwrap();
                if buffer.len() >= end + 4 + length {
                    let body = serde_json::from_slice(&buffer[end + 4..end + 4 + length]).unwrap();
                    buffer.drain(..end + 4 + length);
                    responses.push((status, body));
                    continue;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed before the answer");
            buffer.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.expect("no answer in 10 s");
    responses
}

fn id_of(body: &Value) -> u64 {
    body["id"].as_str().unwrap().parse().unwrap()
}

/// A head with the given headers and no body yet.
fn head(path: &str, headers: &str) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n{headers}\r\n").into_bytes()
}

async fn pause() {
    tokio::time::sleep(Duration::from_millis(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_in_pieces_chunked_pipelined_or_behind_expect_are_each_answered() {
    let dir = tempfile::tempdir().unwrap();
    let address = worker(dir.path()).await;

    // The body after the head, in two writes.
    let mut stream = connect(address).await;
    stream.write_all(&head("/v1/ids", "Content-Length: 2\r\n")).await.unwrap();
    pause().await;
    stream.write_all(b"{").await.unwrap();
    pause().await;
    stream.write_all(b"}").await.unwrap();
    let (status, body) = read_response(&mut stream).await;
    assert_eq!(status, 200, "{body}");
    let first = id_of(&body);

    // Chunked, one chunk per write, on the same connection.
    stream.write_all(&head("/v1/ids:batch", "Transfer-Encoding: chunked\r\n")).await.unwrap();
    for chunk in ["{\"cou", "nt\": ", "3}"] {
        pause().await;
        stream.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes()).await.unwrap();
    }
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let (status, body) = read_response(&mut stream).await;
    assert_eq!(status, 200, "{body}");
    let batch: Vec<u64> =
        body["ids"].as_array().unwrap().iter().map(|id| id.as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(batch.len(), 3);
    assert!(batch[0] > first && batch.windows(2).all(|w| w[0] < w[1]), "{batch:?} after {first}");

    // Three requests in one write: three answers, in order.
    let mut pipelined = post("/v1/ids", "{}");
    pipelined.extend(post("/v1/ids", ""));
    pipelined.extend(post("/v1/ids", "{\"count\": 1}"));
    stream.write_all(&pipelined).await.unwrap();
    let answers = read_responses(&mut stream, 3).await;
    assert_eq!((answers[0].0, answers[1].0), (200, 200), "{answers:?}");
    assert!(id_of(&answers[0].1) > batch[2] && id_of(&answers[1].1) > id_of(&answers[0].1));
    assert_eq!((answers[2].0, answers[2].1["error"]["code"].as_str()), (400, Some("unknown_field")), "{answers:?}");

    // Expect: 100-continue, the body sent only after the interim answer.
    let mut stream = connect(address).await;
    stream.write_all(&head("/v1/ids", "Content-Length: 2\r\nExpect: 100-continue\r\n")).await.unwrap();
    let mut interim = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut interim)).await.unwrap().unwrap();
    assert!(interim.starts_with(b"HTTP/1.1 100"), "{:?}", String::from_utf8_lossy(&interim));
    stream.write_all(b"{}").await.unwrap();
    let (status, body) = read_response(&mut stream).await;
    assert_eq!(status, 200, "{body}");

    // A body over the limit: refused from its length before it is sent, or, chunked, once the
    // pieces that came pass it. The worker still answers the next connection.
    let mut stream = connect(address).await;
    stream.write_all(&head("/v1/ids", "Content-Length: 6000\r\n")).await.unwrap();
    let (status, body) = read_response(&mut stream).await;
    assert_eq!((status, body["error"]["code"].as_str()), (413, Some("body_too_large")), "{body}");
    let mut stream = connect(address).await;
    stream.write_all(&head("/v1/ids", "Transfer-Encoding: chunked\r\n")).await.unwrap();
    for _ in 0..3 {
        pause().await;
        stream.write_all(format!("7d0\r\n{}\r\n", " ".repeat(2000)).as_bytes()).await.unwrap();
    }
    let (status, body) = read_response(&mut stream).await;
    assert_eq!((status, body["error"]["code"].as_str()), (413, Some("body_too_large")), "{body}");
    let mut stream = connect(address).await;
    stream.write_all(&post("/v1/ids", "{}")).await.unwrap();
    assert_eq!(read_response(&mut stream).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_at_once_each_get_increasing_ids_and_none_repeats() {
    const CONNECTIONS: usize = 32;
    const REQUESTS: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let address = worker(dir.path()).await;
    let clients = (0..CONNECTIONS).map(|client| {
        tokio::spawn(async move {
            let mut stream = connect(address).await;
            let mut ids = Vec::with_capacity(REQUESTS);
            for request in 0..REQUESTS {
                // Every third request split after its head, so some connections wait for a body.
                if (client + request) % 3 == 0 {
                    stream.write_all(&head("/v1/ids", "Content-Length: 2\r\n")).await.unwrap();
                    tokio::task::yield_now().await;
                    stream.write_all(b"{}").await.unwrap();
                } else {
                    stream.write_all(&post("/v1/ids", "{}")).await.unwrap();
                }
                let (status, body) = read_response(&mut stream).await;
                assert_eq!(status, 200, "{body}");
                ids.push(id_of(&body));
            }
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "one connection's IDs go up");
            ids
        })
    });
    let mut seen = HashSet::new();
    for client in clients {
        for id in client.await.unwrap() {
            assert!(seen.insert(id), "{id} was issued twice");
        }
    }
    assert_eq!(seen.len(), CONNECTIONS * REQUESTS);
}
