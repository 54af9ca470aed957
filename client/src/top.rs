//! `tessera top`: the status table, live. On a terminal each frame
//! replaces the last and `q` quits (the terminal is put in non-canonical,
//! no-echo mode while `top` runs and restored after); otherwise frames are
//! printed one after another, so it works in a pipe or a log.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use futures::StreamExt;
use tessera_proto::manager::v1 as pb;

use tessera_contract::units::duration_arg;

use crate::{CliError, SocketArg, connect as client, runtime};

/// `tessera top` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Refresh interval.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration_arg)]
    pub interval: Duration,
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

/// Keys that quit `tessera top`.
pub fn quits(key: u8) -> bool {
    matches!(key, b'q' | b'Q')
}

/// Reads keys from `input` until one [`quits`], then says so on `quit`;
/// returns without a word when the input ends or fails.
pub fn watch_keys(mut input: impl Read, quit: tokio::sync::oneshot::Sender<()>) {
    let mut key = [0u8; 1];
    while let Ok(1) = input.read(&mut key) {
        if quits(key[0]) {
            let _ = quit.send(());
            return;
        }
    }
}

/// The terminal on stdin, switched to reading key by key without echo;
/// restored when dropped.
struct KeyMode {
    saved: nix::sys::termios::Termios,
}

impl KeyMode {
    /// `None` when stdin is not a terminal (nothing to read keys from).
    fn enter() -> Option<KeyMode> {
        use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices};
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut keys = saved.clone();
        // Signals (Ctrl-C) stay on.
        keys.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO);
        keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &keys).ok()?;
        Some(KeyMode { saved })
    }
}

impl Drop for KeyMode {
    fn drop(&mut self) {
        use nix::sys::termios::{self, SetArg};
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

/// Runs `tessera top`.
pub fn top(args: &TopArgs) -> Result<(), CliError> {
    let every = args.interval;
    let interval_ms = u32::try_from(every.as_millis()).unwrap_or(u32::MAX);
    let tty = std::io::stdout().is_terminal();
    let rt = runtime()?;
    // `q` on a terminal: a thread reads keys (it blocks on stdin, so it is
    // left behind when top returns); Ctrl-C then also ends top here, so
    // the terminal is restored.
    let keys = KeyMode::enter();
    let (quit_tx, mut quit) = tokio::sync::oneshot::channel();
    if keys.is_some() {
        let _ = std::thread::Builder::new()
            .name("tessera-top-keys".into())
            .spawn(move || watch_keys(std::io::stdin(), quit_tx));
    }
    let interactive = keys.is_some();
    let result = rt.block_on(async {
        let mut c = client::connect(&args.socket.socket).await?;
        let mut stream = c
            .watch_node_status(pb::WatchNodeStatusRequest { interval_ms })
            .await?
            .into_inner();
        let mut shown = 0u64;
        let mut last = tokio::time::Instant::now() - every;
        let ctrl_c = async {
            if interactive {
                let _ = tokio::signal::ctrl_c().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(ctrl_c);
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                Ok(()) = &mut quit => return Ok(()),
                () = &mut ctrl_c => return Ok(()),
            };
            let Some(status) = next else { break };
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
    });
    drop(keys);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_quits_and_other_keys_do_not() {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        watch_keys(&b"x j\nq"[..], tx);
        assert_eq!(rx.try_recv(), Ok(()));
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        watch_keys(&b"Q"[..], tx);
        assert_eq!(rx.try_recv(), Ok(()));
        // Input that ends without a q quits nothing.
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        watch_keys(&b"abc"[..], tx);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn the_interval_is_a_duration_in_the_shared_syntax() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            top: TopArgs,
        }
        let c = Cli::try_parse_from(["top", "--interval", "250ms"]).unwrap();
        assert_eq!(c.top.interval, Duration::from_millis(250));
        let e = Cli::try_parse_from(["top", "--interval", "5"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("bad duration \"5\""), "{e}");
    }

    #[test]
    fn frames_clear_the_screen_only_on_a_terminal() {
        assert_eq!(frame_prefix(true, true), "\x1b[H\x1b[2J");
        assert_eq!(frame_prefix(true, false), "\x1b[H\x1b[2J");
        assert_eq!(frame_prefix(false, true), "");
        assert_eq!(frame_prefix(false, false), "\n");
    }
}
