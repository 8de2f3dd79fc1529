//! `easd bench proxy`: a TCP forwarder that delays every chunk by a fixed one-way latency, to put simulated
//! hosts on loopback (netem is not available everywhere; this needs no privileges).
//!
//! Each direction of each connection is a reader that stamps every chunk it reads with `now + delay` and a writer
//! that sends each chunk at its stamp, in order. Chunks in flight do not wait for each other, so the link keeps its
//! bandwidth and only gains latency — like a longer wire, not a slower one. Tokio's timer has millisecond
//! granularity: a 1 ms delay is 1–2 ms.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(clap::Args, Debug)]
pub struct ProxyArgs {
    /// Address to accept connections on, e.g. 127.0.0.1:41001.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where to forward them, e.g. 127.0.0.1:51001.
    #[arg(long)]
    pub upstream: String,
    /// One-way delay added to every chunk, in milliseconds (each direction).
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Stop after this many seconds (a benchmark's proxy never outlives it).
    #[arg(long)]
    pub max_seconds: Option<f64>,
}

pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let delay = Duration::from_secs_f64(args.delay_ms.max(0.0) / 1000.0);
    eprintln!("proxy {} -> {} with {:?} one-way", args.listen, args.upstream, delay);
    let serve = serve(listener, args.upstream, delay);
    match args.max_seconds {
        Some(s) => {
            let _ = tokio::time::timeout(Duration::from_secs_f64(s), serve).await;
            Ok(())
        }
        None => serve.await,
    }
}

async fn serve(listener: TcpListener, upstream: String, delay: Duration) -> anyhow::Result<()> {
    loop {
        let (inbound, _) = listener.accept().await.context("accepting a connection")?;
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let outbound = match TcpStream::connect(&upstream).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("proxy: cannot reach {upstream}: {e}");
                    return;
                }
            };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            tokio::join!(delayed_copy(in_read, out_write, delay), delayed_copy(out_read, in_write, delay));
        });
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read; closes `to` after the last one.
async fn delayed_copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_arrive_in_order_and_no_sooner_than_the_delay() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy.local_addr().unwrap();
        let delay = Duration::from_millis(20);
        tokio::spawn(serve(proxy, upstream_addr.to_string(), delay));
        // An echo server behind the proxy.
        tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                s.write_all(&buf[..n]).await.unwrap();
            }
        });
        let mut client = TcpStream::connect(proxy_addr).await.unwrap();
        let sent = Instant::now();
        client.write_all(b"hello ").await.unwrap();
        client.write_all(b"world").await.unwrap();
        let mut got = vec![0u8; 11];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello world");
        assert!(sent.elapsed() >= 2 * delay, "a round trip crosses the proxy twice: {:?}", sent.elapsed());
    }
}
