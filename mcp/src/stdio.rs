//! MCP's stdio transport, eve's way: newline-delimited JSON-RPC whose every incoming line passes
//! [`wire::check`](crate::wire::check) before rmcp sees it, and a protocol writer that owns
//! stdout while fd 1 points at stderr for everything else the process prints.

use crate::wire::{self, Checked, Rejection};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::future::Future;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// A server transport over a pair of byte streams carrying one JSON-RPC message per line.
pub(crate) struct LineTransport<R, W> {
    read: BufReader<R>,
    /// The line read so far; kept across cancelled `receive` calls (rmcp polls it in a select).
    line: Vec<u8>,
    /// Dropping the rest of a line already rejected as too long.
    discarding: bool,
    limit: usize,
    write: Arc<Mutex<W>>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub(crate) fn new(read: R, write: W, limit: usize) -> Self {
        Self {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            limit,
            write: Arc::new(Mutex::new(write)),
        }
    }

    /// Reads up to the next newline into `self.line`, never holding more than `limit` bytes.
    /// `Ok(true)`: a line; `Ok(false)`: end of input. A line over the limit is dropped (its
    /// rest skipped) and reported as `InvalidData`.
    async fn read_line(&mut self) -> io::Result<bool> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(false);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let over = !self.discarding && self.line.len() + take > self.limit + 2;
            if !self.discarding && !over {
                self.line.extend_from_slice(&available[..take]);
            }
            self.read.consume(take);
            if over {
                self.line.clear();
                self.discarding = newline.is_none();
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            if newline.is_some() {
                if self.discarding {
                    self.discarding = false;
                    continue;
                }
                return Ok(true);
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let bytes = serde_json::to_vec(&item).map_err(io::Error::other);
        let written = bytes.map(|b| write_line(&self.write, b));
        async move { written?.await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let checked = match self.read_line().await {
                Ok(true) => {
                    let line = std::mem::take(&mut self.line);
                    let line = line.strip_suffix(b"\n").unwrap_or(&line);
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    wire::check(line, self.limit)
                }
                Ok(false) => return None,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    Checked::Reply(Rejection::too_long(self.limit))
                }
                Err(e) => {
                    tracing::error!(error = %e, "reading MCP messages failed");
                    return None;
                }
            };
            match checked {
                Checked::Message(m) => return Some(*m),
                Checked::Ignore => {}
                Checked::Reply(r) => {
                    tracing::info!(code = r.code.0, message = %r.message, "rejected an MCP message");
                    if write_line(&self.write, r.to_bytes()).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.lock().await.shutdown().await
    }
}

/// Writes one line in a task of its own, so that a cancelled caller never leaves half a message
/// on the stream; lines never interleave (the writer is locked, in FIFO order).
fn write_line<W: AsyncWrite + Unpin + Send + 'static>(
    write: &Arc<Mutex<W>>,
    mut bytes: Vec<u8>,
) -> impl Future<Output = io::Result<()>> + Send + 'static {
    bytes.push(b'\n');
    let write = write.clone();
    let task = tokio::spawn(async move {
        let mut w = write.lock().await;
        w.write_all(&bytes).await?;
        w.flush().await
    });
    async move { task.await.map_err(io::Error::other)? }
}

/// The protocol's writer: a new descriptor for what fd 1 is now (close-on-exec, so children
/// never hold the client's pipe open), after which fd 1 points at stderr. Whatever the process
/// prints from here on (`println!`, a dependency, a child process inheriting stdout) lands on
/// stderr instead of corrupting the MCP stream.
#[cfg(unix)]
pub(crate) fn take_stdout() -> io::Result<tokio::fs::File> {
    use std::io::Write;
    std::io::stdout().flush()?;
    let protocol = rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 3)?;
    rustix::stdio::dup2_stdout(std::io::stderr())?;
    Ok(tokio::fs::File::from_std(std::fs::File::from(protocol)))
}
