//! `tessera top`: the status table, live. On a terminal each frame
//! replaces the last; otherwise frames are printed one after another, so
//! it works in a pipe or a log.

use std::io::{IsTerminal, Write};

use futures::StreamExt;
use tessera_proto::manager::v1 as pb;

use tessera_contract::units::parse_duration;

use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera top` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Refresh interval.
    #[arg(long, default_value = "1s")]
    pub interval: String,
    /// Stop after this many frames (default: until interrupted).
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
}

/// What goes before a frame: clear the screen on a terminal, a separator
/// line otherwise.
pub fn frame_prefix(tty: bool, first: bool) -> &'static str {
    match (tty, first) {
        (true, _) => "\x1b[H\x1b[2J",
        (false, true) => "",
        (false, false) => "\n",
    }
}

/// Runs `tessera top`.
pub fn top(args: &TopArgs) -> Result<(), CliError> {
    let every = parse_duration(&args.interval)?;
    let interval_ms = u32::try_from(every.as_millis()).unwrap_or(u32::MAX);
    let tty = std::io::stdout().is_terminal();
    let rt = runtime()?;
    rt.block_on(async {
        let mut c = client::connect(&args.socket.socket).await?;
        let mut stream = c
            .watch_node_status(pb::WatchNodeStatusRequest { interval_ms })
            .await?
            .into_inner();
        let mut shown = 0u64;
        let mut last = tokio::time::Instant::now() - every;
        while let Some(status) = stream.next().await {
            let status = status?;
            // The manager also sends on every change; keep to the interval.
            if last.elapsed() < every / 2 && shown > 0 {
                continue;
            }
            last = tokio::time::Instant::now();
            let mut out = std::io::stdout().lock();
            let frame = format!(
                "{}{}",
                frame_prefix(tty, shown == 0),
                crate::status::render(&status)
            );
            if out
                .write_all(frame.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return Ok(()); // stdout closed (e.g. `| head`)
            }
            shown += 1;
            if args.count.is_some_and(|n| shown >= n) {
                return Ok(());
            }
        }
        Err(CliError::Usage(
            "the manager closed the stream (it is shutting down)".into(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_clear_the_screen_only_on_a_terminal() {
        assert_eq!(frame_prefix(true, true), "\x1b[H\x1b[2J");
        assert_eq!(frame_prefix(true, false), "\x1b[H\x1b[2J");
        assert_eq!(frame_prefix(false, true), "");
        assert_eq!(frame_prefix(false, false), "\n");
    }
}
